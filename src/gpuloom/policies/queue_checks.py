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

What each queue holds the check sums itself (:class:`HeldSums`: from the allocations the driver starts and
stops, and the plan's changes), never from the queue stage's own sums: a fault there would otherwise pass
the check that is meant to catch it.  (The waiting jobs a starved queue could place are read from the
stage's lists of each leaf's active jobs, and skipped by their fewest GPUs, when it keeps them.)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import filterfalse
from typing import Any

from ..core.job import Job
from ..core.plan import Allocation, Plan, PlanError, changes
from ..core.queues import INF, QueueTree, summed_up, summed_up_gpus, usage
from .base import PlacePolicy, Request, View
from .free import FreeState
from .queue_base import Admission

_EPS = 1e-6


def above(u: Sequence[float], cap: Sequence[float]) -> bool:
    return u[0] > cap[0] + _EPS or u[1] > cap[1] + _EPS or u[2] > cap[2] + _EPS


def _show(t: Sequence[float]) -> str:
    parts = [f"{v:g} {r}" for v, r in zip(t, ("GPUs", "cores", "MB"), strict=True) if v != INF]
    return ", ".join(parts) or "nothing"


class HeldSums:
    """The round check's own sums of what each leaf holds now: per leaf, the GPUs, cores and MB of the
    current allocations, kept as the driver starts and stops them (a :class:`~gpuloom.driver.Listener`), from
    the allocations themselves (not the queue stage's book).  Off until a check asks (a run without checks
    pays one test a change); the first check sums the current allocations, the next ones read the sums with
    the plan's own changes (:meth:`plan_usage`).  A group's share is a fraction whose sums depend on their
    order: once a job of a group is held the sums are given up (the check then sums every allocation)."""

    #: True: every :meth:`plan_usage` also sums the plan's allocations whole and raises where they differ
    verify = False

    __slots__ = ("tally", "stage", "tree", "version", "flat", "gpus", "cpus", "mem", "count", "grouped")

    def __init__(self, tally: Any, stage: Any) -> None:
        self.tally = tally  # the driver followed (its tally identifies its views)
        self.stage = stage  # its ``tree``, ``version`` and ``leaf``: which leaf a job is in
        self.tree: QueueTree | None = None  # the tree, and its version, the sums are for
        self.version: Any = None
        self.flat = True  # every leaf of the tree is its own path (one level)
        # per leaf, the GPUs, cores and MB held now; None: not kept (off, or the jobs' leaves changed)
        self.gpus: list[float] | None = None
        self.cpus: list[float] | None = None  # (None: not kept, the tree has no limit)
        self.mem: list[float] = []
        self.count = 0  # allocations summed
        self.grouped = False  # a job of a group was held: given up for good

    def on_admit(self, job: Job) -> None:
        pass

    def on_end(self, job: Job) -> None:
        pass

    def on_hold(self, job: Job, old: Allocation | None, new: Allocation | None) -> None:
        gpus = self.gpus
        if gpus is None:
            return
        if (old is not None and old.group) or (new is not None and new.group):
            self.gpus, self.grouped = None, True
            return
        # the job's leaf in the sums' tree, as the stage caches it on the job; else the stage's word, while the
        # stage still has that tree (the sums are for it: else they are summed again at the next check)
        c = job.extra.get("queue_leaf")
        tree = self.tree
        if c is not None and c[1] is tree and c[0] == self.version:
            q = c[2]
        else:
            stage = self.stage
            if stage.tree is not tree or stage.version != self.version:
                self.gpus = None
                return
            q = stage.leaf(job)
        cpus = self.cpus  # (cores and MB only under limits: the guarantees are in GPUs)
        if old is not None:
            gpus[q] -= old.num_gpus
            self.count -= 1
            if cpus is not None:
                cpus[q] -= old.cpus
                self.mem[q] -= old.mem_mb
        if new is not None:
            gpus[q] += new.num_gpus
            self.count += 1
            if cpus is not None:
                cpus[q] += new.cpus
                self.mem[q] += new.mem_mb

    def plan_usage(self, tree: QueueTree, plan: Plan, view: View, leaf_of: Callable[[Job], int],
                   whole: bool = True) -> tuple[list[list[float]] | None, list[float]] | None:
        """:func:`~gpuloom.core.queues.usage` of ``plan`` (when ``whole``, else None) and its GPUs per queue, from
        the sums of the current allocations and the allocations ``plan`` takes out and puts in (the same sums:
        whole numbers, exact in any order), in O(changes + queues); None when ``view`` is not one of the
        followed driver's, or the sums were given up."""
        stage = self.stage
        if self.grouped or self.tally is None or view.tally is not self.tally or stage.tree is not tree:
            return None
        current, allocs = view.current, plan.allocations
        by_id = view.by_id
        if by_id is None:
            return None
        gpus, cpus = self.gpus, self.cpus
        if (gpus is None or self.tree is not tree or self.version != stage.version or self.count != len(current)
                or (whole and cpus is None)):
            nq = len(tree)
            gpus, mem = [0.0] * nq, [0.0] * nq
            cpus = [0.0] * nq if whole else None
            for jid, a in current.items():
                if a.group:
                    self.gpus, self.grouped = None, True
                    return None
                q = leaf_of(by_id[jid])
                gpus[q] += a.num_gpus
                if cpus is not None:
                    cpus[q] += a.cpus
                    mem[q] += a.mem_mb
            self.gpus, self.cpus, self.mem = gpus, cpus, mem
            self.tree, self.version, self.count = tree, stage.version, len(current)
            self.flat = tree.one_level
        removed, added = changes(current, plan)
        g = gpus.copy()
        c, m = (cpus.copy(), self.mem.copy()) if whole and cpus is not None else ([], [])
        for jid in removed:
            a = current[jid]
            if a.group:
                return None
            q = leaf_of(by_id[jid])
            g[q] -= a.num_gpus
            if whole:
                c[q] -= a.cpus
                m[q] -= a.mem_mb
        for jid in added:
            a = allocs[jid]
            if a.group:
                return None
            q = leaf_of(by_id[jid])
            g[q] += a.num_gpus
            if whole:
                c[q] += a.cpus
                m[q] += a.mem_mb
        u: list[list[float]] | None = None
        if whole:
            u = [[g[n], c[n], m[n]] for n in range(len(tree))]
        if not self.flat:  # (up the tree: each node sums its leaves, in the leaves' order)
            g = summed_up_gpus(tree, g)
            if u is not None:
                u = summed_up(tree, u)
        if self.verify:
            sums = usage(tree, allocs, {jid: leaf_of(by_id[jid]) for jid in allocs})
            if [s[0] for s in sums] != g or (u is not None and u != sums):
                raise PlanError(f"the check's kept sums {g} differ from the plan's {[s[0] for s in sums]}")
        return u, g


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
                 free: float | None = None, asks: GuaranteedAsks | None = None,
                 gpus: Sequence[float] | None = None) -> set[int]:
    """Check ``plan`` (module notes); returns the queues starved this round (to pass in next round).
    ``jobs_of(q)``: leaf ``q``'s active jobs, and ``smallest(q)``: the fewest GPUs one of its waiting jobs
    asks for, when the caller keeps them (else ``view.jobs`` is read); ``leaves``: each planned job's leaf,
    when the caller knows them (else ``leaf_of`` is asked); ``used``: what each queue holds in ``plan``
    (:func:`~gpuloom.core.queues.usage`), and ``free``: the GPUs it leaves free, when the caller knows them;
    ``asks``: what the guaranteed jobs asked for per leaf at the last round, when the caller keeps it;
    ``gpus``: each queue's GPUs in ``plan`` (``used``'s first column), enough when the tree has no limit."""
    allocs = plan.allocations
    if leaves is not None:
        leaf = leaves
    else:
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        leaf = {jid: leaf_of(by_id[jid]) for jid in allocs}
    if gpus is None or tree.limited:
        u = used if used is not None else usage(tree, allocs, leaf)
        for n in range(len(tree)) if tree.limited else ():  # (no limit: every one is infinite)
            if above(u[n], tree.limit[n]):
                raise PlanError(f"queue {tree.queues[n].name!r} holds {_show(u[n])}, over its limit "
                                f"{_show(tree.limit[n])}")
        gpus = [x[0] for x in u]
    if not guarantees:
        return set()
    G = tree.guarantee
    # a leaf's guaranteed jobs hold at most what the leaf holds: only a leaf holding more than its guarantee
    # (with a margin far above the rounding of the sums) can have them over it; and what each leaf lends (held
    # beyond its guarantee), summed in the leaves' order.  (max(0.0, x) and min(a, b) written out below, with
    # the same results: builtin min and max cost about a thousand instructions a call in Python 3.11)
    over: set[int] = set()
    lent = [0.0] * len(tree)
    total_lent = 0.0
    for q in tree.leaves:
        held, guaranteed = gpus[q], G[q][0]
        if held > guaranteed + _EPS / 2:
            over.add(q)
        x = held - guaranteed
        if x > 0.0:
            lent[q] = x
            total_lent += x
    if over and asks is not None:
        asked = asks.update(tree, adm.guaranteed, leaf_of)
        if asked is not None:  # (what they hold is at most what they ask for)
            over = {q for q in over if asked[q] > G[q][0]}
    if over:
        ua = [0.0] * len(tree)
        # (a job's GPU share as job_share gives it, and the lesser of it and what the job asks, as min() picks it)
        for j in adm.guaranteed:
            jid = j.id
            a = allocs.get(jid)
            if a is not None:
                q = leaf[jid]
                if q in over:
                    share = a.num_gpus / (1 + len(a.group))
                    g = j.spec.gpus
                    ua[q] += g if g < share else share
        for q in tree.leaves:
            if q in over and ua[q] > G[q][0] + _EPS:
                raise PlanError(f"queue {tree.queues[q].name!r}: its guaranteed jobs hold {ua[q]:g} GPUs, more "
                                f"than its guarantee of {G[q][0]:g}")
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
            room = G[q][0] - gpus[q]
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
            if best is not None and _placeable(best, q, tree, adm, plan, view, place, leaf, gpus):
                starved.add(q)
    again = starved & starved_before
    if again:
        q = min(again)
        raise PlanError(f"queue {tree.queues[q].name!r} holds {gpus[q]:g} of its {G[q][0]:g} guaranteed GPUs "
                        f"and has waited two rounds while {total_lent - lent[q]:g} GPUs are lent to other queues")
    return starved


def _placeable(job: Job, q: int, tree: QueueTree, adm: Admission, plan: Plan, view: View, place: PlacePolicy,
               leaf: Mapping[str, int], gpus: Sequence[float]) -> bool:
    """Could ``job`` be placed if every other queue over its guarantee gave back its borrowed work?  (Asked of
    a copy of the place policy, the run's random generator put back after: a check changes nothing a round
    reads, so a run gives the same results with checks on or off.)"""
    lenders = {o for o in tree.leaves if o != q and gpus[o] > tree.guarantee[o][0] + _EPS}
    tier_a = {j.id for j in adm.guaranteed}
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
