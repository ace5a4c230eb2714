"""The service's API side (any thread): validate and store submissions, cancel, read per-node use.

What it writes goes to the store first (committed) and wakes the loop; the loop picks it up next round
(:mod:`.rounds`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lifecycle import JobState
from ...core.request import JobRequest
from .actuator import gpu_type_env
from .admission import check_submittable
from .deps import parse_array, resolve_dependency
from .errors import NotFound, PermissionDenied, SubmitError
from .states import FINAL_STATES, QUEUED_STATES

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from ...core.cluster import Cluster
    from ...driver import Driver
    from ..exec.clock import Clock
    from ..state.disk import DiskGuard
    from ..state.store import JobRow, Store
    from .control import Control
    from .security import Guard

S = JobState


class ApiSide:
    """:class:`~.service.Service`'s calls from the API: submissions, cancels, nodes."""

    # (set by Service.__init__ and assemble)
    store: Store
    cluster: Cluster
    clock: Clock
    driver: Driver
    disk: DiskGuard
    guard: Guard
    control: Control
    _wake: threading.Event
    _cancels: set[str]
    _cancel_lock: threading.Lock

    def validate(self, spec: Mapping[str, Any], user: str | None = None) -> None:
        check_submittable(self.cluster, dict(spec))
        self.guard.check_spec(self.cluster, dict(spec), user)

    def submit(self, spec: JobRequest | Mapping[str, Any], user: str, actor: str | None = None) -> int:
        """Store a validated spec (committed) and wake the loop; return the job id (an array's first task's)."""
        return self.submit_row(spec, user, actor).id

    def submit_row(self, spec: JobRequest | Mapping[str, Any], user: str, actor: str | None = None) -> JobRow:
        """:meth:`submit`, returning the (first) job's row as stored (:meth:`..state.store.Store.add_jobs_row`)."""
        spec = spec.stored() if isinstance(spec, JobRequest) else spec
        self.disk.check_submit()
        self.validate(spec, user)
        spec, tasks = self._expand(spec)
        _, row = self.store.add_jobs_row([spec] * (len(tasks) if tasks else 1), user,
                                         S.WAITING_FOR_INITIAL_CONTACT.value, now=self.clock.time(), array_tasks=tasks,
                                         actor=actor)
        self._wake.set()
        return row

    def _expand(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], list[int] | None]:
        """The spec as stored (array limit, resolved dependencies) and its array's task indices."""
        spec = dict(spec)
        tasks = None
        if spec.get("array") is not None:
            try:
                tasks, limit = parse_array(spec["array"])
            except ValueError as e:
                raise SubmitError(str(e), "array", "bad_array") from None
            if limit is not None:
                spec["array_limit"] = limit
        if spec.get("dependency"):
            spec["depends_on"] = resolve_dependency(self.store, spec["dependency"])
        return spec, tasks

    def submit_once(self, spec: JobRequest | Mapping[str, Any], user: str, key: str,
                    actor: str | None = None) -> tuple[int, bool]:
        """:meth:`submit` under an idempotency key: (job id, True) the first time, (the same id, False)
        when ``user`` retries with the same key."""
        spec = spec.stored() if isinstance(spec, JobRequest) else spec
        old = self.store.job_for_key(user, key)
        if old is not None:
            return old, False
        self.disk.check_submit()
        self.validate(spec, user)
        spec, tasks = self._expand(spec)
        ids, new = self.store.add_jobs_once([spec] * (len(tasks) if tasks else 1), user,
                                            S.WAITING_FOR_INITIAL_CONTACT.value, key, now=self.clock.time(),
                                            array_tasks=tasks, actor=actor)
        if new:
            self._wake.set()
        return ids[0], new

    def cancel(self, job_id: int, user: str, admin: bool) -> JobRow:
        row = self.store.get_job(job_id)
        if row is None:
            raise NotFound(job_id)
        if not admin and row.user != user:
            raise PermissionDenied(f"job {job_id} belongs to {row.user}; only its owner or an admin may cancel it")
        if row.state in FINAL_STATES:
            return row
        # queued: cancelled at once (compare-and-set against a concurrent launch)
        done = self.store.update_job(
            job_id,
            {"state": S.CANCELLED.value, "cancel_requested": True, "end_time": self.clock.time(),
             "reason": f"cancelled by {user}"},
            "cancel",
            {"by": user},
            expect_state=QUEUED_STATES,
            now=self.clock.time(),
        )
        if not done:
            self.store.update_job(job_id, {"cancel_requested": True}, "cancel-request", {"by": user},
                                  now=self.clock.time())
        self.request_cancel(str(job_id))
        self._wake.set()
        row = self.store.get_job(job_id)
        assert row is not None  # it was there above, and jobs are never deleted
        return row

    def request_cancel(self, jid: str) -> None:
        with self._cancel_lock:
            self._cancels.add(jid)

    def nodes(self) -> list[dict[str, Any]]:
        """Per-node use.  Reads a snapshot of the allocations without the loop's lock, so it
        answers at once even while a round waits for jobs to checkpoint."""
        current = dict(self.driver.current)  # a C-level copy: atomic under the GIL
        out = []
        t = self.clock.time()
        for i, n in enumerate(self.cluster.nodes):
            used_g: set[int] = set()
            cpus = mem = 0
            jobs = []
            for jid, a in current.items():
                for p in a.parts:
                    if p.node == i:
                        used_g.update(p.gpus)
                        cpus += p.cpus
                        mem += p.mem_mb
                        jobs.append(jid)
            out.append(
                {
                    "name": n.name,
                    "gpus": n.gpus,
                    "gpus_used": len(used_g),
                    "cpus": n.cpus,
                    "cpus_used": cpus,
                    "mem_mb": n.mem_mb,
                    "mem_mb_used": mem,
                    "gpu_type": n.gpu_type,
                    "gres": f"gpu:{gpu_type_env(n.gpu_type) or 'none'}:{n.gpus}",  # Slurm's form
                    "jobs": sorted(jobs, key=int),
                    **self.control.node_json(n.name, len(used_g), n.gpus, t),
                }
            )
        return out
