"""The quota stage after placement: what it tells the scheduler's reclaim (the queues still owed GPUs, the work
they lent), the limits it enforces on the plan, the pending reasons and counts it reports, and its invariants.

:class:`QuotaReclaim` sits between :class:`~.queue_state.QuotaState` and :class:`~.queues.QuotaQueues`
(admission); the invariants themselves are in :mod:`.queue_checks`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..core.job import Job
from ..core.plan import Allocation, Plan, changes, drop_job
from ..core.queues import summed_up_gpus, usage
from .base import PlacePolicy, View
from .queue_base import Owed
from .queue_checks import GuaranteedAsks, HeldSums, above, check_queues
from .queue_state import _EPS, QuotaState, job_priority

WAITING_FOR_RECLAIM = "WaitingForReclaim"
PRIORITY = "Priority"


class QuotaReclaim(QuotaState):
    """What the quota stage says of a placed plan: reclaim's questions, limits, reasons, invariants."""

    # -- after placement -------------------------------------------------------------------------
    def enforce(self, plan: Plan, view: View) -> Plan:
        """Drop placed jobs of any queue over its limit (a sizer grew them, a hook kept them): first those a
        hook kept without admission, then the latest admitted."""
        tree = self.tree
        if tree is None or not tree.limited:
            return plan
        self._last.finish()
        allocs = plan.allocations
        placed = [j for j in view.jobs if j.id in allocs]
        leaf = {j.id: self.leaf(j) for j in placed}
        u = usage(tree, allocs, leaf)
        over = {n for n in range(len(tree)) if above(u[n], tree.limit[n])}
        if not over:
            return plan
        new = dict(allocs)
        admitted = {j.id for j in self._last.ordered}
        # first what a hook kept without admission, then the latest admitted
        for j in [j for j in placed if j.id not in admitted] + self._last.ordered[::-1]:
            if not over:
                break
            a = new.get(j.id)
            q = leaf.get(j.id)
            if a is None or q is None or not over.intersection(tree.path[q]):
                continue
            drop_job(new, j.id)
            self.counters["dropped"] += 1
            u = usage(tree, new, leaf)
            over = {n for n in over if above(u[n], tree.limit[n])}
        return Plan(new)

    def owed(self, plan: Plan, view: View) -> list[Owed]:
        if not self.guarantees or self.tree is None:
            return []
        tree = self.tree
        allocs = plan.allocations
        g = self._gpus_from_book(plan, view) if self.incremental else None
        if g is None:
            g = [u[0] for u in self.usage_of(plan, view)]
        out = []
        smallest = self._smallest_left_out(plan, view)
        limited, guarantee = tree.limited, tree.guarantee
        for q in tree.leaves:
            room = guarantee[q][0] - g[q]
            if limited:  # (else every limit is infinite)
                room = min(room, *(tree.limit[n][0] - g[n] for n in tree.path[q]))
            if room < 1 - _EPS or (smallest is not None and smallest(q) > room + _EPS):
                continue  # (the book knows when no job of the queue left out fits what it is owed)
            jobs = _fitting(self._lists[q], allocs, room + _EPS)
            if not self.incremental:  # (listed whole now, as tests compare)
                jobs = iter(list(jobs))
            first = next(jobs, None)
            if first is not None:
                out.append(Owed(q, room, itertools.chain((first,), jobs)))
        return out

    def _gpus_from_book(self, plan: Plan, view: View) -> list[float] | None:
        """Per queue, the GPUs ``plan`` gives it, as :meth:`usage_of` sums them (the same additions in the same
        order: the same floats), without the cores and MB: what the book's leaves hold now with what ``plan``
        takes out and puts in, in O(changes + queues); None where :meth:`usage_of` would sum the allocations."""
        book = self._book_ready(view)
        if book is None or not book.exact:
            return None
        tree = self.tree
        assert tree is not None
        current, allocs = view.current, plan.allocations
        removed, added = changes(current, plan)
        where = book.where
        g = [0.0] * len(tree)
        for q, h in book.held.items():
            g[q] = h[0]
        for jid in removed:
            a = current.get(jid)
            w = where.get(jid)
            if a is None or w is None or a.group:
                return None
            g[w[0]] += -1.0 * a.num_gpus
        for jid in added:
            a = allocs.get(jid)
            w = where.get(jid)
            if a is None or w is None or a.group:
                return None
            g[w[0]] += 1.0 * a.num_gpus
        if tree.one_level:
            return g
        return summed_up_gpus(tree, g)

    def _smallest_left_out(self, plan: Plan, view: View) -> Callable[[int], float] | None:
        """When this round read the book: per leaf, the fewest GPUs one of its jobs ``plan`` leaves out asks for
        (those waiting, from the book, and those running now that the plan stops), else None.  Kept for the plan
        last asked of, as :meth:`_changed_usage` keeps its usage (owed and the round's check ask of the same
        plan; the book does not change in between)."""
        return self._smallest_memo(plan, view, self._smallest_of)

    def _smallest_of(self, plan: Plan, view: View) -> Callable[[int], float] | None:
        book = self._book
        if not self._from_book or book is None or not book.follows(view) or view.by_id is None:
            return None
        allocs, by_id, current = plan.allocations, view.by_id, view.current
        stopped: dict[int, float] = {}
        # (a plan that extends the current allocations stops only jobs it lists as taken out)
        extends = plan.base is current and len(allocs) == len(current) - len(plan.removed) + len(plan.added)
        for jid in plan.removed if extends else current:
            if jid not in allocs:
                q, g = book.where[jid][0], by_id[jid].spec.gpus
                if g < stopped.get(q, math.inf):
                    stopped[q] = g
        if not stopped:
            return book.smallest_waiting
        return lambda q: min(book.smallest_waiting(q), stopped.get(q, math.inf))

    def lent(self, allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        tree = self.tree
        if not self.guarantees or tree is None:
            return []
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        leaf = self.leaf_map([jid for jid in allocs if jid in by_id], view)
        held = [0.0] * len(tree)  # each leaf's GPUs, as usage() sums them (a leaf is on its own jobs' paths only)
        grouped = False
        for jid, q in leaf.items():
            a = allocs[jid]
            if a.group:
                grouped = True
                held[q] += a.num_gpus / (1 + len(a.group))
            else:  # (x / 1 is x, as a float: the same sums)
                held[q] += a.num_gpus
        g = tree.guarantee
        lenders = {q for q in tree.leaves if held[q] > g[q][0] + _EPS}
        # (for lent_since: with whole GPUs per job the sums are exact in any order)
        self._lent_memo = None if grouped else (allocs, held, lenders)
        if not lenders:
            return []
        adm = self._last
        kept = {j.id for j in adm.guaranteed}
        kept.update(guaranteed)
        over = [j for j in adm.over if j.id in allocs and leaf[j.id] in lenders and j.id not in kept]
        # placed without admission (a plan hook kept them): evicted first
        kept.update(j.id for j in adm.over)
        return over + [by_id[jid] for jid, q in leaf.items() if q in lenders and jid not in kept]

    def lent_since(self, before: Sequence[Job], gone: Sequence[Allocation], added: Sequence[Allocation],
                   allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        """:meth:`lent` from the last call's sums, in O(changes + queues): ``allocs`` is the mapping that call
        read, ``before`` what it gave, with ``gone`` taken out and ``added`` put in since.  Each leaf's GPUs are
        those sums with the changes; while no queue becomes a lender, the work lent is ``before`` without what
        left ``allocs``, what is now ``guaranteed`` and the queues no longer lenders (in its order, as
        :meth:`lent` gives it).  Otherwise (a group's share: fractions; a new lender) :meth:`lent`."""
        memo, tree = self._lent_memo, self.tree
        if (memo is None or memo[0] is not allocs or tree is None or any(a.group for a in gone)
                or any(a.group for a in added)):
            return self.lent(allocs, view, guaranteed)
        _, held, lenders = memo
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        for sign, allocations in ((-1, gone), (1, added)):
            for a in allocations:
                j = by_id.get(a.job_id)
                if j is not None:
                    held[self.leaf(j)] += sign * a.num_gpus
        g = tree.guarantee
        if any(held[q] > g[q][0] + _EPS for q in tree.leaves if q not in lenders):
            return self.lent(allocs, view, guaranteed)
        now = {q for q in lenders if held[q] > g[q][0] + _EPS}
        self._lent_memo = (allocs, held, now)
        kept = set(guaranteed)
        return [j for j in before if j.id in allocs and j.id not in kept and self.leaf(j) in now]

    def owed_again(self, owed: Sequence[Owed]) -> list[Owed]:
        again = [o for o in owed if o.queue in self._owed_before]
        self._owed_before = {o.queue for o in owed}
        return again

    def note_guaranteed(self, jobs: Sequence[Job]) -> None:
        adm = self._last
        ids = {j.id for j in jobs}
        adm.over[:] = [j for j in adm.over if j.id not in ids]  # (in place: a lazy walk appends to these lists)
        had = {x.id for x in adm.guaranteed}
        adm.guaranteed += [j for j in jobs if j.id not in had]
        for j in jobs:
            adm.held.pop(j.id, None)

    def pending_reasons(self, plan: Plan, view: View) -> Mapping[str, str]:
        adm = self._last
        adm.finish()
        allocs = plan.allocations
        out = dict(adm.held)
        if any(j.id in allocs for j in adm.over):
            for j in adm.guaranteed:
                if j.id not in allocs:
                    out[j.id] = WAITING_FOR_RECLAIM
        if self._prioritised:
            # a job that would fit in what higher-priority jobs of its queue hold waits for priority
            held_by: dict[int, list[tuple[float, float]]] = {}
            for j in adm.ordered:
                a = allocs.get(j.id)
                if a is not None:
                    held_by.setdefault(self.leaf(j), []).append((job_priority(j), a.num_gpus))
            if held_by:
                free = plan.free_gpus
                if free is None:
                    free = view.cluster.num_gpus - len({g for a in allocs.values() for g in a.gpu_ids})
                for j in view.jobs:
                    if j.id in allocs or j.id in out:
                        continue
                    p = job_priority(j)
                    higher = sum(g for pr, g in held_by.get(self.leaf(j), ()) if pr > p)
                    if higher and j.spec.gpus <= free + higher:
                        out[j.id] = PRIORITY
        return out

    def stats(self) -> dict[str, Any]:
        adm = self._last
        return {**self.counters, "guaranteed": len(adm.guaranteed), "borrowed": len(adm.over), "held": len(adm.held)}

    def next_change(self, view: View) -> float:
        """Admission reads only the jobs and the plan, so time alone changes nothing; except after a round
        that left a queue starved (:mod:`.queue_checks`) or still owed after the hooks: the next round must
        be computed, to reclaim over the hook and to check that the starvation did not last two rounds."""
        if self.dynamic or self._starved or self._owed_before:
            return view.now
        return math.inf

    def note_reclaim(self) -> None:
        self.counters["reclaim_passes"] += 1

    def forgive(self) -> None:
        """A plan hook kept this round's plan off nodes out of service (drained): GPUs the starvation check
        counts as lent may be there, where no queue can use them, so the round starts no two-round count."""
        self._starved = set()

    # -- invariants ------------------------------------------------------------------------------
    #: what the guaranteed jobs asked for per leaf at the last check (made at the first)
    _asks: GuaranteedAsks | None = None
    #: the check's own sums of what each leaf holds (check_listener), when a driver feeds them
    _sums: HeldSums | None = None

    def check_listener(self, tally: Any) -> HeldSums:
        """The round check's own sums of what each leaf holds, following the driver whose tally is ``tally``
        (:class:`~.queue_checks.HeldSums`: not the book's)."""
        self._sums = HeldSums(tally, self)
        return self._sums

    def check(self, plan: Plan, view: View, place: PlacePolicy) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` if a queue is over its limit, or a queue below its
        guarantee has waited two rounds in a row while GPUs it could use are lent (:mod:`.queue_checks`)."""
        tree = self.tree
        if tree is not None:
            smallest = self._smallest_left_out(plan, view)
            lists = self._lists
            # what each queue holds: the check's own sums with the plan's changes (no group: each job's GPUs are
            # its own, and the GPUs free are those no queue holds); else every allocation summed
            sums = self._sums
            kept = (sums.plan_usage(tree, plan, view, self.leaf, tree.limited)
                    if sums is not None and self.incremental else None)
            leaves: Mapping[str, int]
            u: list[list[float]] | None = None
            gpus: list[float] | None = None
            free: float | None = None
            if kept is not None:
                assert view.by_id is not None and sums is not None
                u, gpus = kept
                leaves = _Leaves(view.by_id, self.leaf)
                free = view.cluster.num_gpus - (sum(gpus) if sums.flat else sum([gpus[q] for q in tree.leaves]))
            else:
                leaves = self.leaf_map(plan.allocations, view)
            if self._asks is None:
                self._asks = GuaranteedAsks()
            self._starved = check_queues(tree, self._last, self._starved, plan, view, place, self.leaf,
                                         self.guarantees,
                                         None if smallest is None else (lambda q: (j for _, j in lists[q])),
                                         smallest, leaves, u, free, self._asks, gpus)


class _Leaves(Mapping[str, int]):
    """``{job id: its leaf}`` for the active jobs ``by_id``, looked up as asked (not built for every planned job)."""

    __slots__ = ("by_id", "leaf")

    def __init__(self, by_id: Mapping[str, Job], leaf: Callable[[Job], int]) -> None:
        self.by_id = by_id
        self.leaf = leaf

    def __getitem__(self, jid: str) -> int:
        return self.leaf(self.by_id[jid])

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)


def _fitting(jobs: Iterable[tuple[int, Job]], allocs: Collection[str], most: float) -> Iterator[Job]:
    """The jobs of ``jobs`` (rank, job) not in ``allocs`` asking at most ``most`` GPUs, lazily: a reader
    that stops early (reclaim once the room is used up) does not read a queue's whole backlog."""
    return (j for _, j in jobs if j.id not in allocs and j.spec.gpus <= most)


