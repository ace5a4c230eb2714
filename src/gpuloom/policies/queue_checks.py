"""The queue stage's invariants, checked with the scheduler's round check in both faces.

:func:`check_queues` raises :class:`~gpuloom.core.plan.PlanError` when a plan

* puts a queue (with everything below it) over its limit;
* has the jobs admission calls guaranteed hold more than their queue's
  guarantee (each counted as asked for, or as held if less: a sizer may grow a
  job, a group shares its GPUs);
* leaves a leaf queue below its guarantee, with a waiting job that fits the rest
  of it, for a second round in a row while other queues hold GPUs beyond their
  guarantees that, with the free ones, could place that job: the place policy
  is asked for a placement on the plan without the borrowed work (jobs not
  called guaranteed) of every other queue over its guarantee.  One round of
  grace covers a reclaim in progress.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import filterfalse

from ..core.job import Job
from ..core.plan import Allocation, Plan, PlanError, changes
from ..core.queues import INF, QueueTree, usage
from .base import PlacePolicy, Request, View
from .free import FreeState
from .queue_base import Admission

_EPS = 1e-6


def above(u: Sequence[float], cap: Sequence[float]) -> bool:
    return u[0] > cap[0] + _EPS or u[1] > cap[1] + _EPS or u[2] > cap[2] + _EPS


def _show(t: Sequence[float]) -> str:
    parts = [f"{v:g} {r}" for v, r in zip(t, ("GPUs", "cores", "MB"), strict=True) if v != INF]
    return ", ".join(parts) or "nothing"


class GuaranteedAsks:
    """Per leaf, the GPUs its guaranteed jobs ask for, kept between rounds: the last round's sums with the
    jobs that left the guaranteed tier taken out and those that joined it added (whole numbers: exact in
    any order).  A leaf's guaranteed jobs hold at most what they ask for (each counted as asked for, or
    as held if less), so a leaf whose guaranteed jobs ask for no more than its guarantee cannot have them
    hold more: :func:`check_queues` sums what they hold only for the other leaves."""

    __slots__ = ("tree", "jobs", "asked", "last")

    def __init__(self) -> None:
        self.tree: QueueTree | None = None
        self.jobs: dict[Job, tuple[int, int]] = {}  # job -> (its leaf, GPUs asked): the jobs of ``last``
        self.asked: list[int] = []
        self.last: list[Job] | None = None  # the jobs of the last sums (a copy of the list)

    def update(self, tree: QueueTree, guaranteed: Sequence[Job], leaf_of: Callable[[Job], int]) -> list[int] | None:
        """The sums for ``guaranteed`` (None when a job is listed twice or asks for a fraction of a GPU)."""
        last = self.last
        self.last = None
        jobs, asked = self.jobs, self.asked
        if last is None or self.tree is not tree:  # (a job's leaf is its leaf in this tree)
            self.tree, jobs, asked = tree, {}, [0] * len(tree)
            self.jobs, self.asked = jobs, asked
            last, lo = [], 0
        else:
            # the two lists agree up to their first difference (admission keeps its tier from round to round,
            # jobs end within it and join it near its end): found by halving, each slice compared in C (a job
            # has no __eq__: lists compare by identity); what changed is in the two lists past it
            n = len(last) if len(last) < len(guaranteed) else len(guaranteed)
            lo = n if last[:n] == guaranteed[:n] else 0
            hi = lo if lo == n else n - 1
            while lo < hi:  # (last[:lo] is guaranteed[:lo]; they differ within [:hi + 1])
                mid = (lo + hi + 1) // 2
                if last[lo:mid] == guaranteed[lo:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            if lo == len(last) == len(guaranteed):
                self.last = last
                return asked
        gone, new = last[lo:], guaranteed[lo:]
        if gone:
            for j in filterfalse(set(new).__contains__, gone):  # (left the tier)
                q, g = jobs.pop(j)
                asked[q] -= g
        for j in filterfalse(jobs.__contains__, new):  # (joined the tier, in the list's order)
            g = j.spec.gpus
            if type(g) is not int:
                self.tree = None
                return None
            q = leaf_of(j)
            jobs[j] = (q, g)
            asked[q] += g
        if len(jobs) != len(guaranteed):  # (a job listed twice: the sums start again next time)
            self.tree = None
            return None
        self.last = list(guaranteed)
        return asked


def check_queues(tree: QueueTree, adm: Admission, starved_before: set[int], plan: Plan, view: View,
                 place: PlacePolicy, leaf_of: Callable[[Job], int], guarantees: bool = True,
                 jobs_of: Callable[[int], Iterable[Job]] | None = None,
                 smallest: Callable[[int], float] | None = None,
                 leaves: Mapping[str, int] | None = None, used: list[list[float]] | None = None,
                 free: float | None = None, asks: GuaranteedAsks | None = None) -> set[int]:
    """Check ``plan`` (module notes); returns the queues starved this round (to pass in next round).
    ``jobs_of(q)``: leaf ``q``'s active jobs, and ``smallest(q)``: the fewest GPUs one of its waiting jobs
    asks for, when the caller keeps them (else ``view.jobs`` is read); ``leaves``: each planned job's leaf,
    when the caller knows them (else ``leaf_of`` is asked); ``used``: what each queue holds in ``plan``
    (:func:`~gpuloom.core.queues.usage`), and ``free``: the GPUs it leaves free, when the caller knows them;
    ``asks``: what the guaranteed jobs asked for per leaf at the last round, when the caller keeps it."""
    allocs = plan.allocations
    if leaves is not None:
        leaf = leaves
    else:
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        leaf = {jid: leaf_of(by_id[jid]) for jid in allocs}
    u = used if used is not None else usage(tree, allocs, leaf)
    for n in range(len(tree)) if tree.limited else ():  # (no limit: every one is infinite)
        if above(u[n], tree.limit[n]):
            raise PlanError(f"queue {tree.queues[n].name!r} holds {_show(u[n])}, over its limit "
                            f"{_show(tree.limit[n])}")
    if not guarantees:
        return set()
    G = tree.guarantee
    ua = [0.0] * len(tree)
    # a leaf's guaranteed jobs hold at most what the leaf holds: only a leaf holding more than its guarantee
    # (with a margin far above the rounding of the sums) can have them over it
    over = {q for q in tree.leaves if u[q][0] > G[q][0] + _EPS / 2}
    if over and asks is not None:
        asked = asks.update(tree, adm.guaranteed, leaf_of)
        if asked is not None:  # (what they hold is at most what they ask for)
            over = {q for q in over if asked[q] > G[q][0]}
    if over:
        # (each job's leaf from the book's own dict when ``leaves`` reads it: ``where``; a job's GPU share as
        # job_share gives it, and the lesser of it and what the job asks, as min() picks it)
        where: Mapping[str, tuple[int, bool]] | None = getattr(leaf, "where", None)
        for j in adm.guaranteed:
            jid = j.id
            a = allocs.get(jid)
            if a is not None:
                q = where[jid][0] if where is not None else leaf[jid]
                if q in over:
                    share = a.num_gpus / (1 + len(a.group))
                    g = j.spec.gpus
                    ua[q] += g if g < share else share
    for q in tree.leaves:
        if q in over and ua[q] > G[q][0] + _EPS:
            raise PlanError(f"queue {tree.queues[q].name!r}: its guaranteed jobs hold {ua[q]:g} GPUs, more "
                            f"than its guarantee of {G[q][0]:g}")
    # (max(0.0, x) and min(a, b) written out below, with the same results: builtin min and max cost about a
    # thousand instructions a call in Python 3.11)
    lent = {q: x if (x := u[q][0] - G[q][0]) > 0.0 else 0.0 for q in tree.leaves}
    total_lent = sum(lent.values())
    starved: set[int] = set()
    if total_lent > 0:
        if free is not None:
            free_gpus: float = free
        else:  # GPUs held: a group's once
            shared = {a.gpu_ids for a in allocs.values() if a.group}
            free_gpus = (view.cluster.num_gpus - sum(a.num_gpus for a in allocs.values() if not a.group)
                         - sum(len(g) for g in shared))
        if jobs_of is None:
            waiting: dict[int, list[Job]] = {}
            for j in view.jobs:
                if j.id not in allocs:
                    waiting.setdefault(leaf_of(j), []).append(j)
            jobs_of = lambda q: waiting.get(q, ())  # noqa: E731
        for q in tree.leaves:
            room = G[q][0] - u[q][0]
            if room < 1 - _EPS:
                continue
            most = free_gpus + total_lent - lent[q]
            most = (most if most < room else room) + _EPS
            if smallest is not None and smallest(q) > most:
                continue
            best: Job | None = None  # the smallest waiting job that fits (the earliest of equals)
            for j in jobs_of(q):
                g = j.spec.gpus
                if g <= most and j.id not in allocs and (best is None or (g, j.index) < (best.spec.gpus, best.index)):
                    best = j
            if best is not None and _placeable(best, q, tree, adm, plan, view, place, leaf, u):
                starved.add(q)
    again = starved & starved_before
    if again:
        q = min(again)
        raise PlanError(f"queue {tree.queues[q].name!r} holds {u[q][0]:g} of its {G[q][0]:g} guaranteed GPUs "
                        f"and has waited two rounds while {total_lent - lent[q]:g} GPUs are lent to other queues")
    return starved


def _placeable(job: Job, q: int, tree: QueueTree, adm: Admission, plan: Plan, view: View, place: PlacePolicy,
               leaf: Mapping[str, int], u: list[list[float]]) -> bool:
    """Could ``job`` be placed if every other queue over its guarantee gave back its borrowed work?  (Asked of
    a copy of the place policy, the run's random generator put back after: a check changes nothing a round
    reads, so a run gives the same results with checks on or off.)"""
    lenders = {o for o in tree.leaves if o != q and u[o][0] > tree.guarantee[o][0] + _EPS}
    tier_a = {j.id for j in adm.guaranteed}
    where: Mapping[str, tuple[int, bool]] | None = getattr(leaf, "where", None)
    if where is not None:
        given = [a for jid, a in plan.allocations.items()
                 if jid not in tier_a and (w := where.get(jid)) is not None and w[0] in lenders]
    else:
        given = [a for jid, a in plan.allocations.items() if jid not in tier_a and leaf.get(jid) in lenders]
    free = kept_free(view, plan, given)
    state = view.rng.bit_generator.state
    try:
        return copy.copy(place).choose_for(Request((job,), job.spec.gpus, job.spec.cpus, job.spec.mem_mb), free,
                                       view) is not None
    finally:
        view.rng.bit_generator.state = state


def kept_free(view: View, plan: Plan, given: Sequence[Allocation]) -> FreeState:
    """What ``plan`` leaves free once the allocations ``given`` (of the plan) are given back: the free state
    the view keeps of its current allocations, with what the plan takes out of them released, what it puts in
    taken and ``given`` released, in O(changes + given); built from every kept allocation when the view keeps
    none, or an allocation among those is in a group (its GPUs count once)."""
    free, current, allocs = view.free, view.current, plan.allocations
    if free is not None and not free.outside:
        removed, added = changes(current, plan)
        gone = [current[jid] for jid in removed]
        new = [allocs[jid] for jid in added]
        if not any(a.group for a in gone) and not any(a.group for a in new) and not any(a.group for a in given):
            out = free.copy()
            for a in gone:
                out.release(a.parts)
            for a in new:
                out.take(a.parts)
            for a in given:
                out.release(a.parts)
            return out
    back = {id(a) for a in given}
    return FreeState.of(view.cluster, {jid: a for jid, a in allocs.items() if id(a) not in back})
