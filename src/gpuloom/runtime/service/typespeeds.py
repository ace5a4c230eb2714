"""The service's measured speed per (job, GPU type): progress lines fed back into the throughput model.

On a cluster of several GPU types, a running job's rate on the type it runs on is
read from its ``GPULOOM_PROGRESS`` lines: iterations at two observations of this
run at least ``window_s`` apart, from the first one after it was promoted
(its first progress line), over the wall time between them.  The rate becomes
a speed relative to the job's reference: ``1 / iteration_time`` when the spec
gives one (its pace on the reference type, what its work estimate assumes),
else the first rate measured for the job.  The speed goes into the ``gpu_type``
factor's matrix for that job and type (:meth:`~gpuloom.perf.gputype.TypeSpeeds.measure`:
it wins over the declared row for its model), so every policy that asks the model
sees it from the next round on; a speed-aware stage (``--size gavel``,
``gavel-greedy``) then moves the job to the type where it runs fastest.  The job's
own speed (its remaining work) is updated at once, and each new or changed
figure (by more than ``tolerance``) is an event ``measured`` in the job's history.  A job prints
its own progress lines, so a speed is capped at ``max_speed`` (4x its reference pace): a job that
lies about its progress gains a bounded edge, not the cluster.

Measurements live in memory: after a restart they are taken again.  Types a job
has not run on keep the matrix's declared speed (neutral 1.0 without one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.job import Job
from ...core.lifecycle import JobState
from ...perf.gputype import GpuTypeFactor, TypeSpeeds, add_gpu_types
from ...perf.model import ThroughputModel

log = logging.getLogger("gpuloom.service")

_WORKING = (JobState.RUNNING_PROTECTED, JobState.RUNNING)


@dataclass(slots=True)
class _Run:
    run: object  # the actuator's record of this launch (identity: a new launch is a new run)
    type_: str
    t0: float
    iter0: int | None


def ensure_gpu_types(model: ThroughputModel) -> GpuTypeFactor | None:
    """The model's ``gpu_type`` factor; one with an empty matrix is added when the cluster has several GPU
    types (so measurements have somewhere to go); None on a cluster of one type without one."""
    f = model.get("gpu_type")
    if isinstance(f, GpuTypeFactor):
        return f
    if len(model.cluster.gpu_types) < 2:
        return None
    add_gpu_types(model, TypeSpeeds(source="measured by the service"))
    f = model.get("gpu_type")
    return f if isinstance(f, GpuTypeFactor) else None


class TypeMeter:
    """Measures running jobs per GPU type (see the module notes).

    It reads what it is given: the driver's active jobs and the model's factor, the launches
    (``running``: job id -> the actuator's record of its current launch), each job's last progress
    count (``last_progress``), the wall clock, and ``record(job id, detail)`` to log an event."""

    def __init__(self, model: ThroughputModel, last_progress: Callable[[str], int | None],
                 wall: Callable[[], float], record: Callable[[str, dict[str, Any]], None],
                 window_s: float = 3.0, tolerance: float = 0.05, max_speed: float = 4.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if not max_speed > 0:
            raise ValueError(f"max_speed must be > 0, got {max_speed}")
        self.max_speed = float(max_speed)
        self.factor = ensure_gpu_types(model)
        self.last_progress = last_progress
        self.wall = wall
        self.record = record
        self.window_s = float(window_s)
        self.tolerance = float(tolerance)
        self._runs: dict[str, _Run] = {}
        self._ref: dict[str, float] = {}  # job id -> its reference rate (it/s at speed 1.0)

    def observe(self, jobs: Mapping[str, Job], running: Mapping[str, object], speed: Callable[[Job, Any], float],
                now: float) -> list[tuple[str, str, float]]:
        """Take this round's measurements; returns the (job id, type, speed) that changed.  ``speed`` rates a
        job on its allocation (the driver's); ``now`` is service time (the jobs' clock)."""
        f = self.factor
        if f is None:
            return []
        wall = self.wall()
        changed: list[tuple[str, str, float]] = []
        for jid in [k for k in self._runs if k not in running]:
            del self._runs[jid]
        for jid in [k for k in self._ref if k not in jobs]:
            del self._ref[jid]
            f.matrix.forget(jid)
        for jid, run in running.items():
            job = jobs.get(jid)
            a = None if job is None else job.alloc
            lc = None if job is None else job.lifecycle
            if job is None or a is None or lc is None or lc.state not in _WORKING:
                continue
            types = {f.node_type[p.node] for p in a.parts}
            if len(types) != 1:
                continue  # spread over types: its rate is no one type's
            t = types.pop()
            it = self.last_progress(jid)
            st = self._runs.get(jid)
            if st is None or st.run is not run or st.type_ != t:
                self._runs[jid] = _Run(run, t, wall, it)
                continue
            if st.iter0 is None:
                st.t0, st.iter0 = wall, it
                continue
            dt = wall - st.t0
            if it is None or dt < self.window_s or it <= st.iter0:
                continue
            rate = (it - st.iter0) / dt
            ref = (1.0 / job.spec.iter_time) if job.spec.iter_time else self._ref.setdefault(jid, rate)
            self._ref.setdefault(jid, ref)
            # a job writes its own progress lines: what it can claim is bounded (its remaining work, its
            # standing under speed-aware policies), not trusted
            s = min(rate / ref, self.max_speed)
            old = f.matrix.measured(jid).get(t)
            if old is not None and abs(s - old) <= self.tolerance * max(old, 1e-12):
                continue
            f.matrix.measure(jid, t, s)
            job.advance(now)
            job.speed = speed(job, a)  # its remaining work now falls at what it was measured to do
            changed.append((jid, t, s))
            self.record(jid, {"gpu_type": t, "speed": round(s, 4), "iter_per_s": round(rate, 4)})
        return changed
