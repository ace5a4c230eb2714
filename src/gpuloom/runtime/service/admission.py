"""What the service refuses at submission (and fails at recovery): jobs that can never run, and
submissions over a limit.

Everything a round will need is checked here, so one job cannot fail the
rounds of everyone: sizes against the cluster (:func:`refuse_reason`), the
fields elastic sizing and Muri grouping read (:func:`check_policy_fields`),
and where the job's checkpoints go (:func:`check_checkpoint_dir`: under an
allowed root, creatable by the job's OS account).

**Limits** (:class:`SubmitLimits`, ``serve`` options; :class:`Limiter` applies
them), so that no user can make every round slow or fill the store:

* **submissions per second** per user: a token bucket (``rate`` per second,
  ``burst`` at once); over it: 429 with ``Retry-After``.  A request counts
  once, an array too;
* **pending jobs** per user (queued: waiting, standby), an array counting as
  its number of tasks: 403 naming the limit; the queue tree's ``max_pending``
  per queue likewise (:meth:`.queues.QueueAdmin.check_pending`);
* **array size**: at most ``max_array_size`` tasks, indices below it (Slurm's
  ``MaxArraySize``, default 1001): 422 on the ``array`` field.

Admin tokens are exempt from the rate and pending limits (an operator's bulk
work), not from the array size (it bounds what one request makes the server
store and walk).  The count and the insert happen under one lock, so
concurrent submissions cannot pass the limit together.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.cluster import Cluster
from ...core.lifecycle import JobState
from ..exec.identity import Account, creatable
from .deps import MAX_ARRAY, parse_array
from .errors import SubmitError

if TYPE_CHECKING:
    from ..state.store import Store

#: the states a pending limit counts: queued, holding nothing (the service's QUEUED_STATES)
PENDING = (JobState.WAITING_FOR_INITIAL_CONTACT.value, JobState.WAITING_FOR_INITIAL_RESOURCE.value,
           JobState.STANDBY.value)


def refuse_reason(cluster: Cluster, gpus: int, cpus: int | None, mem_mb: int | None) -> tuple[str, str] | None:
    """Why a job can never run on ``cluster`` (field, message), or None if it can."""
    if gpus > cluster.num_gpus:
        return "gpus", f"needs {gpus} GPUs, the cluster has {cluster.num_gpus}"
    if cpus is not None and cpus > cluster.total_cpus:
        return "cpus", f"needs {cpus} CPU cores, the cluster has {cluster.total_cpus}"
    if mem_mb is not None and mem_mb > cluster.total_mem_mb:
        return "mem", f"needs {mem_mb} MB of memory, the cluster has {cluster.total_mem_mb}"
    if gpus <= cluster.max_node_gpus:
        # fits on one node by GPUs: some node must also hold its CPU and memory
        ok = any(
            n.gpus >= gpus and (cpus is None or cpus <= n.cpus) and (mem_mb is None or mem_mb <= n.mem_mb)
            for n in cluster.nodes
        )
        if not ok and gpus <= min(n.gpus for n in cluster.nodes if n.gpus > 0):
            what = "cpus" if cpus is not None and all(cpus > n.cpus for n in cluster.nodes) else "mem"
            return what, (
                f"{gpus} GPUs with {cpus if cpus is not None else 'proportional'} cores and "
                f"{mem_mb if mem_mb is not None else 'proportional'} MB fit on no node"
            )
    return None


def check_submittable(cluster: Cluster, spec: dict) -> None:
    """Raise :class:`SubmitError` naming the field if ``spec`` can never run on ``cluster``."""
    reason = refuse_reason(cluster, int(spec["gpus"]), spec.get("cpus"), spec.get("mem_mb"))
    if reason is None and spec.get("gpu_type"):
        from ...core.fit import never_fits
        from ...core.job import JobSpec

        why = never_fits(JobSpec("submitted", 0.0, int(spec["gpus"]), 1.0, cpus=spec.get("cpus"),
                                 mem_mb=spec.get("mem_mb"), attrs={"gpu_type": spec["gpu_type"]}), cluster)
        if why is not None:
            reason = "gpu_type", why
    if reason is not None:
        raise SubmitError(f"job can never run on this cluster: {reason[1]}", reason[0])


# -- fields the policies read: checked against the cluster at submission ---------------------------
def check_policy_fields(cluster: Cluster, spec: dict) -> None:
    """Raise :class:`SubmitError` for elastic (``throughput``, ``min_gpus``) and Muri (``resource_times``,
    ``iteration_time``) fields the scheduler could not use on ``cluster``."""
    from ...perf.interleave import DEFAULT_RESOURCES, ProfileError, layout_for, stage_profile
    from ...perf.scaling import ScalingCurve, ScalingError

    gpus = int(spec["gpus"])
    lo = spec.get("min_gpus")
    if lo is not None:
        if lo > cluster.num_gpus:
            raise SubmitError(f"min_gpus {lo} is more than the cluster's {cluster.num_gpus} GPUs", "min_gpus", "unusable")
        if lo > gpus:
            raise SubmitError(f"min_gpus {lo} is more than the {gpus} GPUs asked for", "min_gpus", "unusable")
    table = spec.get("throughput")
    if table is not None:
        try:
            curve = ScalingCurve.parse(table, "throughput")
        except ScalingError as e:
            raise SubmitError(str(e), "throughput", "unusable") from None
        over = [n for n in curve.points if n > cluster.num_gpus]
        if over:
            raise SubmitError(f"throughput given at {over[0]} GPUs, the cluster has {cluster.num_gpus}", "throughput", "unusable")
        at = lo if lo is not None else min(gpus, curve.min_gpus)
        try:
            f = curve(at)
        except Exception as e:  # evaluation of the user's table
            raise SubmitError(f"throughput curve cannot be evaluated at {at} GPUs: {e}", "throughput", "unusable") from None
        if not f > 0:
            raise SubmitError(f"throughput is 0 at {at} GPUs: a job must make progress at its smallest size",
                              "throughput", "unusable")
    rt = spec.get("resource_times")
    if rt is not None:
        if not sum(rt) > 0:
            raise SubmitError("resource_times must not all be 0: an iteration takes time", "resource_times", "unusable")
        try:
            layout_for(len(rt), DEFAULT_RESOURCES)
            stage_profile(rt, spec.get("iteration_time"))
        except ProfileError as e:
            raise SubmitError(f"resource_times: {e}", "resource_times", "unusable") from None
    elif spec.get("iteration_time") is not None and not spec["iteration_time"] > 0:
        raise SubmitError("iteration_time must be > 0", "iteration_time", "unusable")


# -- where checkpoints may go ------------------------------------------------------------------------
def check_checkpoint_dir(path: str, roots: Sequence[str | Path], account: Account) -> None:
    """Raise :class:`SubmitError` unless ``path`` lies under one of ``roots`` (after resolving symbolic
    links) and ``account`` can create it (or write into it)."""
    if ".." in Path(path).parts:
        raise SubmitError(f"checkpoint_dir {path!r} must not contain '..'", "checkpoint_dir", "not_allowed")
    real = Path(os.path.realpath(path))
    for r in roots:
        root = Path(os.path.realpath(r))
        if real == root or root in real.parents:
            break
    else:
        allowed = ", ".join(str(r) for r in roots) or "(none)"
        raise SubmitError(f"checkpoint_dir {path!r} is outside the allowed roots ({allowed})", "checkpoint_dir", "not_allowed")
    why = creatable(real, account)
    if why is not None:
        raise SubmitError(f"checkpoint_dir {path!r} cannot be created by the job's account: {why}",
                          "checkpoint_dir", "not_allowed")


# -- limits on submissions ---------------------------------------------------------------------------
class LimitExceeded(Exception):
    """A submission over a limit: HTTP ``status`` (403, 429) with ``headers`` (``Retry-After``)."""

    def __init__(self, msg: str, status: int = 403, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(msg)
        self.status = status
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class SubmitLimits:
    """The service's submission limits (``serve`` options; see the module notes)."""

    max_pending: int = 5000  # queued jobs per user; an array counts as its tasks
    max_array_size: int = 1001  # tasks in one array, indices below it (Slurm's MaxArraySize)
    rate: float = 10.0  # submissions per second per user, sustained
    burst: int = 50  # submissions at once per user
    max_priority: int = 0  # the highest priority a user may give a job where no queue sets max_priority

    def __post_init__(self) -> None:
        from ...core.queues import MAX_PRIORITY

        if self.max_pending < 1:
            raise ValueError(f"--max-pending must be >= 1, got {self.max_pending}")
        if not 1 <= self.max_array_size <= MAX_ARRAY:
            raise ValueError(f"--max-array-size must be within 1..{MAX_ARRAY}, got {self.max_array_size}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"--submit-rate must be > 0 per second, got {self.rate}")
        if self.burst < 1:
            raise ValueError(f"--submit-burst must be >= 1, got {self.burst}")
        if not -MAX_PRIORITY <= self.max_priority <= MAX_PRIORITY:
            raise ValueError(f"--max-priority must be within ±{MAX_PRIORITY}, got {self.max_priority}")


def array_tasks(spec: Mapping[str, Any], max_size: int) -> int:
    """How many jobs ``spec`` makes (its array's tasks, else 1); :class:`SubmitError` on ``array`` over
    ``max_size`` tasks or with an index of ``max_size`` or more."""
    text = spec.get("array")
    if text is None:
        return 1
    try:
        tasks, _ = parse_array(text)
    except ValueError as e:
        raise SubmitError(str(e), "array", "bad_array") from None
    if len(tasks) > max_size or tasks[-1] >= max_size:
        what = f"{len(tasks)} tasks" if len(tasks) > max_size else f"index {tasks[-1]}"
        raise SubmitError(f"array: {what} is over this service's max_array_size of {max_size} (at most {max_size} "
                          f"tasks, indices 0-{max_size - 1}; serve --max-array-size)", "array", "max_array_size")
    return len(tasks)


class Limiter:
    """Applies :class:`SubmitLimits`: the rate (:meth:`rate`), then array size and pending jobs around the
    store's insert (:meth:`admitting`)."""

    def __init__(self, limits: SubmitLimits, monotonic: Callable[[], float]) -> None:
        self.limits = limits
        self.monotonic = monotonic
        self.buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, when)
        self._buckets_lock = threading.Lock()
        self.lock = threading.Lock()  # count + insert, for every limited submission

    def rate(self, user: str, admin: bool) -> None:
        """Take one token of ``user``'s bucket, or :class:`LimitExceeded` (429) saying when to retry."""
        if admin:
            return
        lim = self.limits
        now = self.monotonic()
        with self._buckets_lock:
            tokens, then = self.buckets.get(user, (float(lim.burst), now))
            tokens = min(float(lim.burst), tokens + (now - then) * lim.rate)
            if tokens < 1.0:
                self.buckets[user] = (tokens, now)
                wait = max(1, math.ceil((1.0 - tokens) / lim.rate))
                raise LimitExceeded(f"too many submissions: at most {lim.rate:g} per second per user (bursts of "
                                    f"{lim.burst}; serve --submit-rate/--submit-burst); retry in {wait} s, or "
                                    "submit many jobs as one array", 429, {"Retry-After": str(wait)})
            self.buckets[user] = (tokens - 1.0, now)

    @contextmanager
    def admitting(self, store: Store, spec: Mapping[str, Any], owner: str, admin: bool, key: str | None = None,
                  queue_check: Callable[[Mapping[str, Any], int], None] | None = None) -> Iterator[None]:
        """Check the array size, then (unless ``admin``, or ``key`` names a job already made: a retry) the
        owner's pending jobs and ``queue_check(spec, tasks)``; the body inserts while no other limited
        submission can count."""
        tasks = array_tasks(spec, self.limits.max_array_size)
        if admin:
            yield
            return
        with self.lock:
            if key is None or store.job_for_key(owner, key) is None:
                pending = store.count_of(PENDING, user=owner)
                cap = self.limits.max_pending
                if pending + tasks > cap:
                    raise LimitExceeded(f"user {owner!r} has {pending} pending jobs; with {tasks} more that is over "
                                        f"this service's max_pending of {cap} per user (serve --max-pending): wait "
                                        "for some to start or end, or cancel some")
                if queue_check is not None:
                    queue_check(spec, tasks)
            yield
