"""Jobs sharing GPUs without coordination: the interleaving factor for processes as the service runs them.

Muri's model (:mod:`gpuloom.perf.interleave`) is its executor's: the members of a
group run in lock-step phases, every resource (data loading included) serves one
member at a time, and every member completes one iteration per cycle.  The
service does not run Muri's executor: it launches the members as ordinary
processes on the same GPUs, each pinned to *its own* cores (the group's
GPU-proportional cores split between them, which the sensitivity factor already
charges).  Their data loading therefore overlaps; only the GPU and the network
are taken in turns, and each process goes at its own pace.

:class:`SharedInterleaveFactor` (model option ``interleave_model=shared``) gives
that speed, as a fluid model of exclusive resources:

* member ``j`` alone on its allocation takes ``T_j`` per iteration: its profile's
  iteration time over the speed the other factors give it there (fewer cores
  lengthen its own stage); its *exclusive* stages (the GPU and network stages:
  :func:`exclusive_stages`) take what its profile says, the rest is its own;
* going at slowdown ``s_j`` it keeps exclusive resource ``r`` busy a share
  ``s_j d_jr`` of the time, ``d_jr = t_jr / T_j``; no resource can be busier
  than 1;
* the slowdowns are max-min fair (progressive filling): all members speed up
  together until a resource is full, the members using it stop there, the
  others go on (to 1, their speed alone).

So members whose exclusive stages fit in each other's gaps run at their solo
speed, two GPU-bound twins at half, and a short job next to a long one loses
little.  What it leaves out: waiting in line behind a long stage of another
job when the GPU is not full (jobs of very different step lengths lose a little
more than the model says), and interference inside the GPU (give
``interleave_overhead`` to charge it: it lengthens the exclusive stages).
Muri's grouping policy still chooses groups by Muri's cycle model
(:meth:`~gpuloom.perf.interleave.InterleaveFactor.group_time`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.job import Job
from ..core.plan import Allocation
from .interleave import InterleaveFactor, Profile, ProfileError

SoloSpeed = Callable[[Job, Allocation], float]


def exclusive_stages(k: int) -> tuple[int, ...]:
    """Indices of the stages taken in turns: GPU and network (Muri's 3 stages: 1, 2; 4 stages: 2, 3)."""
    if k <= 1:
        return (0,)
    if k == 4:
        return (2, 3)
    return tuple(range(1, k))


def fair_slowdowns(demands: Sequence[Sequence[float]]) -> list[float]:
    """Max-min fair slowdowns ``s_j`` in [0, 1] with ``sum_j s_j d_jr <= 1`` for every resource ``r``.

    ``demands[j][r]``: the share of time member ``j`` keeps resource ``r`` busy at its solo speed.
    """
    n = len(demands)
    if n == 0:
        return []
    R = max(len(d) for d in demands)
    d = [[float(x) for x in row] + [0.0] * (R - len(row)) for row in demands]
    s = [0.0] * n
    active = set(range(n))
    while active:
        # the level every active member can rise to: 1, or where a resource fills up
        level, full = 1.0, None
        for r in range(R):
            users = [j for j in active if d[j][r] > 0]
            if not users:
                continue
            used = sum(s[j] * d[j][r] for j in range(n) if j not in active)
            cap = (1.0 - used) / sum(d[j][r] for j in users)
            if cap < level:
                level, full = cap, r
        level = max(0.0, level)
        if full is None:
            for j in active:
                s[j] = level
            break
        frozen = {j for j in active if d[j][full] > 0}
        for j in frozen:
            s[j] = level
        active -= frozen
        for j in active:  # the others are at least there
            s[j] = level
    return s


class SharedInterleaveFactor(InterleaveFactor):
    """The ``interleave`` factor under ``interleave_model=shared`` (see the module notes).

    ``solo`` gives a job's speed on an allocation from every other factor (set by
    :func:`~gpuloom.perf.assembly.build_model`: the model's other factors); without
    it every member runs at its reference speed alone.
    """

    def __init__(self, *args: Any, solo: SoloSpeed | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.solo = solo

    def attach(self, model: Any) -> None:
        """Read members' solo speeds from ``model``'s other factors (those added later included)."""

        def solo(job: Job, alloc: Allocation) -> float:
            v = 1.0
            for f in model.factors:
                if f is not self:
                    v *= f(job, alloc)
                    if v <= 0:
                        return 0.0
            return v

        self.solo = solo

    def _member(self, job: Job | Any, alloc: Allocation) -> tuple[float, float, list[float]]:
        """(iteration time alone on ``alloc``'s GPUs and cores, the same with the group's overhead on its
        exclusive stages, those exclusive stage times) of a member."""
        prof: Profile = self._require(job)
        it = float(sum(prof))
        excl = [prof[i] for i in exclusive_stages(len(prof))]
        speed = 1.0
        if self.solo is not None and isinstance(job, Job):
            speed = self.solo(job, Allocation(job.id, alloc.parts, ()))
        if not speed > 0:
            return float("inf"), float("inf"), excl
        alone = max(it / speed, sum(excl))
        f = self.overhead_for(len(alloc.group) + 1)
        shared = [x * f for x in excl]
        return alone, alone - sum(excl) + sum(shared), shared

    def __call__(self, job: Job, alloc: Allocation) -> float:
        if not alloc.group:
            return 1.0
        if self._lookup is None:
            raise ProfileError(f"job {job.id}: interleave factor has no job lookup bound (call bind())")
        members: list[Any] = [job]
        for oid in alloc.group:
            try:
                members.append(self._lookup(oid))
            except KeyError:
                raise ProfileError(f"job {job.id}: co-runner {oid!r} is unknown to the interleave factor") from None
        demands = []
        own = (1.0, 1.0)
        for m in members:
            alone, T, excl = self._member(m, alloc)  # co-runners: the same GPUs, an even share of the cores
            if not T < float("inf"):  # cannot run there: it takes no turns
                if m is job:
                    return 0.0
                demands.append([0.0] * len(excl))
                continue
            if m is job:
                own = (alone, T)
            demands.append([x / T for x in excl])
        # its rate is s / T; alone it did 1 / alone
        return min(1.0, fair_slowdowns(demands)[0] * own[0] / own[1])
