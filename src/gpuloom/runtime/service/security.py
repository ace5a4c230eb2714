"""What keeps a shared service safe for its users: who runs jobs, where their files go, what is kept.

:class:`Guard` is the service's one place for it:

* **Files.**  The state directory is 0700 and everything in it private (the
  database, ``admin.token``, logs 0600): a job cannot read tokens, the
  database or other jobs' logs.  Default checkpoint directories live in the
  *job directory*, outside the state directory (jobs must reach them): with
  jobs running as other accounts that is ``/var/tmp/gpuloom-SERVICE_ID``
  (``--job-dir``; ``$GPULOOM_JOB_DIR_BASE`` replaces ``/var/tmp``), 0711 and owned by the server, and each job's directory in
  it is owned by the job's account, 0700.
* **Accounts** (:mod:`..exec.identity`): which OS account runs each user's jobs.
* **Submission checks** (:meth:`Guard.check_spec`): the fields the policies
  read, against the cluster; a given ``checkpoint_dir`` must lie under an
  allowed root (``--checkpoint-root``, default the job directory) and be
  creatable by the job's account.
* **Retention**: finished jobs older than ``keep_finished_s`` are deleted
  with their events and logs (checked once a minute).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...core.cluster import Cluster
from ..exec import joblogs
from ..exec.identity import Identities, IdentityError, private_dir
from .admission import check_checkpoint_dir, check_policy_fields
from .errors import SubmitError
from .states import FINAL_STATES

if TYPE_CHECKING:
    from ..exec.clock import Clock
    from ..state.store import Store

log = logging.getLogger("gpuloom.service")

JOB_DIR_BASE = "/var/tmp"  # where default job directories go when jobs run as other accounts
JOB_DIR_BASE_ENV = "GPULOOM_JOB_DIR_BASE"  # overrides it (a directory job accounts can enter)
PURGE_EVERY_S = 60.0


class Kept(Protocol):
    """What retention uses of the service: the store, the wall clock, where a job's log is."""

    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...
    def log_path(self, job_id: int | str) -> Path: ...


def default_job_dir(state_dir: Path, service_id: str, switch: bool) -> Path:
    """The job directory without ``--job-dir``: see the module notes."""
    base = os.environ.get(JOB_DIR_BASE_ENV) or JOB_DIR_BASE
    return Path(os.path.abspath(base)) / f"gpuloom-{service_id}" if switch else state_dir / "checkpoints"


class Guard:
    def __init__(self, state_dir: Path, service_id: str, identities: Identities | None = None,
                 job_dir: str | Path | None = None, checkpoint_roots: Sequence[str | Path] | None = None,
                 keep_finished_s: float | None = None) -> None:
        state_dir = Path(os.path.abspath(state_dir))  # never resolved later from another directory
        private_dir(state_dir, 0o700)
        self.state_dir = state_dir
        if identities is None:
            identities = Identities()
            identities.check()
        self.identities = identities
        if job_dir is None:
            job_dir = default_job_dir(state_dir, service_id, identities.switch)
        # jobs of other accounts enter it to reach their own directory; they list nothing
        self.job_dir = private_dir(os.path.abspath(job_dir), 0o711 if identities.switch else 0o700)
        self.roots = [Path(r) for r in checkpoint_roots] if checkpoint_roots else [self.job_dir]
        if keep_finished_s is not None and not keep_finished_s > 0:
            raise ValueError(f"keep_finished_s must be > 0, got {keep_finished_s}")
        self.keep_finished_s = keep_finished_s
        self._next_purge = 0.0

    def check_spec(self, cluster: Cluster, spec: dict[str, Any], user: str | None) -> None:
        """Raise :class:`SubmitError` naming the field for what a round could not use (module notes)."""
        check_policy_fields(cluster, spec)
        try:
            acc = self.identities.account(user or "")
        except IdentityError as e:
            raise SubmitError(str(e), "user", "not_allowed") from None
        path = spec.get("checkpoint_dir")
        if path is not None:
            check_checkpoint_dir(path, self.roots, acc)

    def maybe_purge(self, svc: Kept, mono: float) -> int:
        """Delete finished jobs older than ``keep_finished_s`` (at most once a minute); how many went."""
        if self.keep_finished_s is None or mono < self._next_purge:
            return 0
        self._next_purge = mono + PURGE_EVERY_S
        return self.purge(svc)

    def purge(self, svc: Kept) -> int:
        assert self.keep_finished_s is not None
        ids = svc.store.purge_jobs(svc.clock.time() - self.keep_finished_s, FINAL_STATES)
        for jid in ids:
            joblogs.remove(svc.log_path(jid))
        if ids:
            log.info("retention: removed %d finished job(s) older than %.0f s", len(ids), self.keep_finished_s)
        return len(ids)
