"""Queue room over time, for the backfill hook (:mod:`.backfill`): when a queue's limit (or, with strict
quotas, its guarantee) lets a waiting job in, and whether a job started now keeps a reserved job's room.

A job held by its queue's quota (``QueueAtQuota``) needs no GPUs that others take but room under the caps
on its queue's path.  :class:`QuotaRoom` keeps, per job in the round's profile (running, started by the
plan, reserved), what it asks of its queue (the queue stage's admission count: GPUs, cores, memory) from
when to when, and answers: the earliest time a job fits under every cap on its path for its whole
estimated run, and whether a job fits there over a given interval.  A reservation of queue room is
such an interval entered for the reserved job: a later job of the same queue (or of one under a capped
parent) that would still hold room at its start, and leave too little, is kept out.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from ..core.job import Job
from ..core.queues import INF
from .base import Stage, View
from .queues import QUEUE_AT_QUOTA, QuotaQueues

__all__ = ["QUEUE_AT_QUOTA", "QuotaRoom"]

_EPS = 1e-6
Triple = tuple[float, float, float]


class QuotaRoom:
    """The round's queue room (see the module notes); :meth:`of` gives None when no queue has a cap."""

    def __init__(self, stage: QuotaQueues, view: View) -> None:
        tree = stage.tree
        assert tree is not None
        self.stage, self.tree = stage, tree
        caps = [list(t) for t in tree.limit]
        if not stage.borrow:  # strict quotas: a leaf never holds more than its guarantee either
            for q in tree.leaves:
                caps[q] = [min(a, b) for a, b in zip(caps[q], tree.owed[q], strict=True)]
        self.caps: list[Triple] = [(c[0], c[1], c[2]) for c in caps]
        cl = view.cluster
        self.per_gpu = (cl.total_cpus / cl.num_gpus, cl.total_mem_mb / cl.num_gpus) if cl.num_gpus else (0.0, 0.0)
        #: per capped tree node: (what a job asks, from, until) of each job holding room under it
        self.entries: dict[int, list[tuple[Triple, float, float]]] = {}
        # per node, the use at times already asked (kept up to date as entries are added)
        self._use: dict[int, dict[float, list[float]]] = {}

    @classmethod
    def of(cls, stages: Sequence[Stage], view: View) -> QuotaRoom | None:
        """The room of the queue stage among ``stages`` when its tree caps some queue, else None."""
        for st in stages:
            if isinstance(st, QuotaQueues) and st.tree is not None and (st.tree.limited or not st.borrow):
                return cls(st, view)
        return None

    def capped(self, job: Job) -> tuple[int, ...]:
        """The nodes on ``job``'s queue path with a cap."""
        return tuple(n for n in self.tree.path[self.stage.leaf(job)] if min(self.caps[n]) < INF)

    def demand(self, job: Job) -> Triple:
        """What ``job`` counts against its queue (as admission counts it)."""
        s = job.spec
        g = float(s.gpus)
        return (g, float(s.cpus) if s.cpus is not None else g * self.per_gpu[0],
                float(s.mem_mb) if s.mem_mb is not None else g * self.per_gpu[1])

    def add(self, job: Job, start: float, end: float) -> None:
        """``job`` holds its queue room from ``start`` to ``end``."""
        if end <= start:
            return
        d = self.demand(job)
        for n in self.capped(job):
            self.entries.setdefault(n, []).append((d, start, end))
            for t, u in self._use.get(n, {}).items():
                if start <= t < end:
                    u[0] += d[0]
                    u[1] += d[1]
                    u[2] += d[2]

    def use(self, n: int, t: float) -> list[float]:
        """What the entries under node ``n`` hold at ``t``."""
        at = self._use.setdefault(n, {})
        u = at.get(t)
        if u is None:
            u = [0.0, 0.0, 0.0]
            for d, es, ee in self.entries.get(n, ()):
                if es <= t < ee:
                    u[0] += d[0]
                    u[1] += d[1]
                    u[2] += d[2]
            at[t] = u
        return u

    def fits(self, job: Job, start: float, end: float, at_start: bool = True) -> bool:
        """Whether ``job`` fits under every cap on its path from ``start`` to ``end``, beside the entries;
        without ``at_start``, only where an entry begins after ``start`` (a job started now: the queue stage
        admitted it, so what it checked is not checked again: only the reservations ahead)."""
        d = self.demand(job)
        for n in self.capped(job):
            c = self.caps[n]
            # use only grows where an entry begins: the interval's start and each such point in it
            later = {e[1] for e in self.entries.get(n, ()) if start < e[1] < end}
            for t in ({start, *later} if at_start else later):
                u = self.use(n, t)
                if u[0] + d[0] > c[0] + _EPS or u[1] + d[1] > c[1] + _EPS or u[2] + d[2] > c[2] + _EPS:
                    return False
        return True

    def earliest(self, job: Job, after: float, duration: float) -> float | None:
        """The earliest time from ``after`` at which ``job`` fits under its caps for ``duration``, or None (it
        asks more than a cap, or the room never frees: an entry without an end)."""
        nodes = self.capped(job)
        d = self.demand(job)
        # per node: starts and ends sorted with running sums, so the use at a time is two bisections
        sweeps = [_Sweep(self.entries.get(n, []), self.caps[n], d) for n in nodes]
        times = sorted({after, *(e[2] for n in nodes for e in self.entries.get(n, ()) if after < e[2] < INF)})
        for t in times:
            if all(sw.fits(t, t + duration) for sw in sweeps):
                return t
        return None


class _Sweep:
    """One node's entries as running sums over their starts and their ends (see :meth:`QuotaRoom.earliest`)."""

    def __init__(self, entries: Sequence[tuple[Triple, float, float]], cap: Triple, d: Triple) -> None:
        self.cap, self.d = cap, d
        by_start = sorted(entries, key=lambda e: e[1])
        by_end = sorted(entries, key=lambda e: e[2])
        self.starts = [e[1] for e in by_start]
        self.ends = [e[2] for e in by_end]
        self.began = _sums(e[0] for e in by_start)
        self.ended = _sums(e[0] for e in by_end)

    def use(self, t: float) -> Triple:
        b = self.began[bisect_right(self.starts, t)]
        e = self.ended[bisect_right(self.ends, t)]
        return (b[0] - e[0], b[1] - e[1], b[2] - e[2])

    def fits(self, start: float, end: float) -> bool:
        lo, hi = bisect_right(self.starts, start), bisect_left(self.starts, end)
        c, d = self.cap, self.d
        for t in (start, *self.starts[lo:hi]):
            u = self.use(t)
            if u[0] + d[0] > c[0] + _EPS or u[1] + d[1] > c[1] + _EPS or u[2] + d[2] > c[2] + _EPS:
                return False
        return True


def _sums(items: Iterable[Triple]) -> list[Triple]:
    """Running sums of ``items``, from (0, 0, 0)."""
    out = [(0.0, 0.0, 0.0)]
    for x in items:
        p = out[-1]
        out.append((p[0] + x[0], p[1] + x[1], p[2] + x[2]))
    return out
