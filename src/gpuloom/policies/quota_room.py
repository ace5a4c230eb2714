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

from collections.abc import Sequence

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
        #: (capped nodes on the job's path, what it asks, from, until)
        self.entries: list[tuple[tuple[int, ...], Triple, float, float]] = []

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
        nodes = self.capped(job)
        if nodes and end > start:
            self.entries.append((nodes, self.demand(job), start, end))

    def fits(self, job: Job, start: float, end: float) -> bool:
        """Whether ``job`` fits under every cap on its path from ``start`` to ``end``, beside the entries."""
        nodes = self.capped(job)
        if not nodes:
            return True
        d = self.demand(job)
        # use only grows where an entry begins: check the interval's start and each such point in it
        points = {start, *(e[2] for e in self.entries if start < e[2] < end)}
        for t in points:
            for n in nodes:
                c = self.caps[n]
                u = [d[0], d[1], d[2]]
                for en, ed, es, ee in self.entries:
                    if n in en and es <= t < ee:
                        u[0] += ed[0]
                        u[1] += ed[1]
                        u[2] += ed[2]
                if u[0] > c[0] + _EPS or u[1] > c[1] + _EPS or u[2] > c[2] + _EPS:
                    return False
        return True

    def earliest(self, job: Job, after: float, duration: float) -> float | None:
        """The earliest time from ``after`` at which ``job`` fits under its caps for ``duration``, or None (it
        asks more than a cap, or the room never frees: an entry without an end)."""
        times = sorted({after, *(e[3] for e in self.entries if after < e[3] < INF)})
        for t in times:
            if self.fits(job, t, t + duration):
                return t
        return None
