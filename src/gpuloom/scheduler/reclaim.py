"""Reclaim within a queue round: lent GPUs given back to the queues that own them.

Two passes (:meth:`Reclaim._two_pass`: the guaranteed jobs planned alone, then everything with them
pinned) when a guaranteed job was left out while borrowed work runs, and eviction
(:meth:`Reclaim._evict_for`: each job a queue is still owed placed on what the borrowed work leaves,
evicting it) for what a queue below its guarantee is still owed.  :mod:`.queued` decides when.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ..core.job import Job
from ..core.plan import Allocation, Plan, changes, drop_job
from ..policies import base as pb
from ..policies.free import FreeState
from ..policies.queue_base import Admission, Owed, QueuePolicy
from .rounds import Pipeline, Round


class Reclaim(Pipeline):
    """The reclaim steps of a queue round (on the pipeline, with the queue stage)."""

    queue: QueuePolicy
    reclaim_changes: bool
    reclaim_again: bool

    def _evict_for(self, owed: Sequence[Owed], rnd: Round, view: pb.View,
                   owed_before: Collection[int] | None = None) -> Round:
        """Place owed jobs (:class:`~gpuloom.policies.base.Owed`, queue by queue, each queue's in its order,
        within its room) where they fit as things are, else on what is left once the borrowed work of the
        queues over their guarantee is set aside (:meth:`~gpuloom.policies.queue_base.QueuePolicy.lent`),
        evicting the borrowed work in their way (latest in the cross-queue order first).  Only lenders
        give work back: a queue at or below its guarantee keeps what it holds.

        A lender evicted below its guarantee may be owed in turn: the queues owed are asked again
        (those given, and those not in ``owed_before``, the queues owed when the round got here: all of
        them by default) until a pass places nothing.  It ends: lenders only lose work, and a queue
        below its guarantee only takes up to it, so what a pass sees only shrinks.  Within a queue's
        pass, a job whose request has the shape of one that found no placement is not tried."""
        q = self.queue
        allocs = dict(rnd.plan.allocations)
        # a lone job's request is its spec's (static requests, no groups, no hook that changes one): the round's
        # requests are read only if asked for later (Round.requests; often never), each owed job asks its spec
        static = self.size.static_requests and not self.group.merges and not self.hooks
        # a pure choice gets nothing for more GPUs than are free (what the tail walk rests on too): not asked
        pure = self.place.pure_choose and self.reclaim_changes
        asked: dict[str, pb.Request] | None = None
        requests: list[pb.Request] = []
        if not static:
            asked = {j.id: r for r in rnd.requests for j in r.jobs}
            requests = list(rnd.requests)
        added: list[pb.Request] = []  # (static: the requests of the jobs placed)
        placed: list[Job] = []
        given = {o.queue for o in owed}
        before = given if owed_before is None else set(owed_before)
        free = _free_left(rnd.plan, view, self.reclaim_changes)  # kept up to date below
        theirs: list[Job] | None = None  # the lent work, and what is free without it: worked out when needed
        base = free
        base_lent: set[str] = set()  # the lent work base was made with (given back in it while planned)
        base_whole = False  # no allocation of it is in a group
        # the lent work last worked out, and the allocations taken out of allocs and put in since (lent_since)
        was: list[Job] | None = None
        gone_a: list[Allocation] = []
        new_a: list[Allocation] = []

        # the plans made here extend the driver's allocations when the round's does and no group is touched
        # (drop_job regroups co-runners): its lists with the jobs evicted and placed here (_rebased)
        current = view.current
        rebase = self.reclaim_changes and _extends(rnd.plan, current)
        evicted: list[str] = []

        def drop(b: Job) -> None:  # evict b (its co-runners keep the GPUs)
            nonlocal rebase
            a = allocs[b.id]
            drop_job(allocs, b.id)
            gone_a.append(a)
            evicted.append(b.id)
            if a.group:
                rebase = False
            free.release(a.parts, 1, gpus=not any(o in allocs for o in a.group))

        def plan_of() -> Plan:  # the plan of allocs as they are now
            if not rebase:
                return Plan(allocs)
            # (allocs is the round's plan in its order, less the jobs evicted, then the jobs placed: a job evicted
            # and placed again, its queue owed in turn, is among the latter)
            out, was = set(evicted), rnd.plan
            return _rebased(allocs, current, [*was.removed, *evicted],
                            [*(jid for jid in was.added if jid not in out), *(j.id for j in placed)])

        pending = list(owed)
        while pending:
            placed_before = len(placed)
            for o in pending:
                room = o.room
                refused: set[tuple[int, int | None, int | None]] = set()
                for j in o.jobs:
                    if j.id in allocs or j.spec.gpus > room + 1e-9:
                        continue
                    r = asked.get(j.id) if asked is not None else None
                    req = (pb.Request((j,), j.spec.gpus, j.spec.cpus, j.spec.mem_mb) if r is None else
                           pb.Request((j,), r.gpus, r.cpus, r.mem_mb))
                    shape = (req.gpus, req.cpus, req.mem_mb)
                    if shape in refused:
                        continue
                    parts = (None if pure and req.gpus > free.free_gpus else
                             self.place.choose_for(req, free, view))
                    if parts is None:
                        if theirs is None:
                            kept = [x.id for x in placed]
                            before_l = was
                            theirs = (q.lent_since(was, gone_a, new_a, allocs, view, kept)
                                      if was is not None and self.reclaim_changes else q.lent(allocs, view, kept))
                            was = theirs
                            gone_a.clear()
                            new_a.clear()
                            ids = {x.id for x in theirs}
                            if (theirs and base is not free and base_whole and before_l is not None
                                    and self.reclaim_changes and all(x in base_lent for x in ids)):
                                # base is what is free with the lent work of the last base still planned given
                                # back (placements were taken from both, evictions were of that work): take back
                                # what is no longer lent (the same state as built anew: counts and flags)
                                for b in before_l:
                                    if b.id not in ids:
                                        lent_a = allocs.get(b.id)
                                        if lent_a is not None:
                                            base.take(lent_a.parts)
                                base_lent = ids
                            else:
                                base = free
                            if theirs and base is free:
                                base = free.copy()
                                base_lent = ids
                                base_whole = True  # (no group among them: each allocation given back whole)
                                gone: set[tuple[int, ...]] = set()  # (a group's GPUs are given back once)
                                for b in theirs:
                                    lent_a = allocs[b.id]
                                    if lent_a.group:
                                        base_whole = False
                                        g_ids = lent_a.gpu_ids
                                        back = g_ids not in gone and not any(x in allocs and x not in ids
                                                                             for x in lent_a.group)
                                        base.release(lent_a.parts, 1, gpus=back)
                                        if back:
                                            gone.add(g_ids)
                                    else:  # (its GPUs are its own: given back once)
                                        base.release(lent_a.parts)
                        if theirs:
                            parts = (None if pure and req.gpus > base.free_gpus else
                                     self.place.choose_for(req, base, view))
                        if parts is None:
                            refused.add(shape)
                            continue
                        gpus = {g for p in parts for g in p.gpus}
                        nodes = {p.node for p in parts}
                        for b in reversed(theirs):
                            a = allocs.get(b.id)
                            if a is not None:
                                for p in a.parts:  # (shares a GPU: no tuple of its GPUs and no set made)
                                    if not gpus.isdisjoint(p.gpus):
                                        drop(b)
                                        break
                        for b in reversed(theirs):  # cores or memory still short: more borrowers leave those nodes
                            if free.fits(parts):
                                break
                            a = allocs.get(b.id)
                            if a is not None and nodes.intersection(a.nodes):
                                drop(b)
                        theirs = None  # (a lender may have fallen to its guarantee)
                    free.take(parts)
                    if base is not free:
                        base.take(parts)
                    room -= req.gpus
                    allocs[j.id] = a_j = Allocation(j.id, parts, (), req.key)
                    new_a.append(a_j)
                    placed.append(j)
                    if static:
                        added.append(req)
                    elif r is None or len(r.jobs) > 1:
                        requests.append(req)
                    if room < 1 - 1e-9 and self.reclaim_changes:
                        break  # (every job asks at least one GPU: none of the rest fits)
            if len(placed) == placed_before:
                break
            # an eviction may have left a lender below its guarantee: the queues owed now
            pending = [o for o in q.owed(plan_of(), view) if o.queue in given or o.queue not in before]
        if not placed:
            return rnd
        q.note_guaranteed(placed)
        if static:
            return Round(plan_of(), lazy=lambda: _with_requests(rnd.requests, added))
        return Round(plan_of(), requests)

    def _two_pass(self, adm: Admission, view: pb.View, lazy: bool = False, one: Round | None = None) -> Round:
        """Plan tier A alone on the whole cluster, then everything with tier A pinned where it landed.

        The second pass sees tier A's jobs as running on their first-pass
        allocations and borrowed work as running only where tier A left its GPUs
        free (the rest looks waiting: its ``alloc`` is hidden for the pass), so
        sticky placement keeps what the owners took and lent GPUs are reclaimed.
        Placement that is not sticky re-places everything, tier A first, as the
        first pass did.

        ``one``: the round's one-pass plan.  When tier A alone keeps every guaranteed job where it runs and
        places none that waits, and the running borrowed work is all pinned where it runs, the pinned view is
        the view itself (:func:`_pins_nothing`): the second pass would place as the one pass did, step by step
        over the same walk, so its plan is ``one``'s, taken as the second pass would give it (:func:`_again`).

        With ``lazy`` (a lazy walk: :meth:`_admitted_round`) both passes go through
        :func:`~gpuloom.policies.incremental.prefix_plan`, and the walk is read only until every
        running job was met (the borrowed work to pin is running), then as far as the second pass reads.
        """
        walk = adm.walk
        lazy = lazy and walk is not None and walk.more is not None
        known: list[Job] | None = None  # (lazy: the running borrowed jobs, when the stage knows them unread)
        if lazy:
            first_plan = self._walked(adm.guaranteed, view, None).plan
            known = self.queue.running_borrowed(adm, view)
            over: Sequence[Job] = (_running_read(walk, len(adm.guaranteed), len(view.current)) if known is None
                                   else known)
        else:
            adm.finish()
            first_plan = self._plan(adm.guaranteed, view).plan
            over = adm.over
        first = first_plan.allocations
        free = _free_left(first_plan, view, self.reclaim_changes)
        current: dict[str, Allocation] = dict(first)
        for j in over:
            a = view.current.get(j.id)
            if a is not None and not a.group and free.fits(a.parts):
                free.take(a.parts)
                current[j.id] = a
        if (lazy and one is not None and self.reclaim_again and self.reclaim_changes
                and _pins_nothing(first_plan, current, one.plan, view)):
            return _again(one, first_plan, current, view)
        swapped: list[tuple[Job, Any]] = []
        # (lazy: those read so far and, when the walk was not read to its last running job, the running ones
        # it holds further on; the others all wait, and still look so)
        for j in adm.ordered if known is None else [*adm.ordered, *over]:
            want = current.get(j.id)
            if j.alloc is not want:
                swapped.append((j, j.alloc))
                j.alloc = want
        try:
            # (the nodes out of service too: the second pass keeps off them as the first did)
            pinned = pb.View(view.now, view.cluster, view.jobs, current, view.model, view.rng, view.round_index,
                             view.extra, free, blocked=view.blocked)
            if lazy:
                # what looks waiting in the pinned view: what waits, and the running jobs not pinned (counting
                # too many is safe: the tail walk only stops later)
                if view.tally is not None and view.by_id is not None:
                    waiting = dict(view.tally.waiting)
                    for jid in view.current.keys() - current.keys():
                        shape = view.by_id[jid].shape
                        waiting[shape] = waiting.get(shape, 0) + 1
                    rnd = self._walked(walk, pinned, waiting)
                    second = rnd.plan
                    if self.reclaim_changes and _extends(second, current) and _extends(first_plan, view.current):
                        # the plan as one extending the driver's allocations: the jobs the first pass took out or
                        # placed, and those the second took out or placed (pinned jobs hold what they held)
                        again = set(second.removed)
                        rnd.plan = _rebased(second.allocations, view.current, [*first_plan.removed, *second.removed],
                                            [*(jid for jid in first_plan.added if jid not in again), *second.added],
                                            second.free_gpus)
                    return rnd
                adm.finish()
            return self._plan(adm.ordered, pinned)
        finally:
            for j, a in swapped:
                j.alloc = a

def _pins_nothing(first: Plan, pinned: Mapping[str, Allocation], one: Plan, view: pb.View) -> bool:
    """The second pass's view would be ``view`` itself: the first pass (``first``, tier A alone) extends the current
    allocations and adds none (each guaranteed job it placed runs there: the same object), and ``pinned`` (those
    and the running borrowed work pinned beside them, each the current allocation) holds every running job, so
    it is the current allocations; the free state made from them then has the view's counts and flags, no job
    looks waiting that does not, and no job's ``alloc`` is swapped.  The one-pass plan ``one`` and the first pass
    both extend the current allocations, as the second pass's plan is rebased only then."""
    current = view.current
    return (not first.added and len(pinned) == len(current) and _extends(first, current) and _extends(one, current)
            and view.tally is not None and view.by_id is not None)


def _again(one: Round, first: Plan, pinned: Mapping[str, Allocation], view: pb.View) -> Round:
    """The two-pass round when the second pass's view is the view (:func:`_pins_nothing`): its placement is the
    one-pass's (the same walk read in the same state, the same steps: a pure choice draws nothing), so its plan has
    ``one``'s allocations; in the second pass's dict order (the pinned allocations it started from, less those it
    took out, then those it added: ``Plan.add`` refuses a job twice, so an added job is new or was taken out first),
    rebased on the current allocations with the first pass's and its lists, as :meth:`Reclaim._two_pass` does."""
    plan = one.plan
    allocs, removed = plan.allocations, set(plan.removed)
    out = {jid: allocs[jid] for jid in pinned if jid not in removed}
    for jid in plan.added:
        out[jid] = allocs[jid]
    return Round(_rebased(out, view.current, [*first.removed, *plan.removed], plan.added, plan.free_gpus),
                 lazy=lambda: one.requests)


def _extends(plan: Plan, base: Mapping[str, Allocation]) -> bool:
    """``plan`` is an :meth:`~gpuloom.core.plan.Plan.extending` plan of ``base`` whose lists still add up."""
    return plan.base is base and len(plan.allocations) == len(base) - len(plan.removed) + len(plan.added)


def _rebased(allocs: dict[str, Allocation], current: Mapping[str, Allocation], removed: Iterable[str],
             added: Iterable[str], free_gpus: int | None = None) -> Plan:
    """A plan of ``allocs`` that extends ``current`` (the driver's allocations), so that what reads its changes
    (:func:`~gpuloom.core.plan.changes`, :func:`~gpuloom.core.plan.diff`, the queue usage) reads its lists, not
    every allocation.  ``removed``: every job of ``current`` whose allocation ``allocs`` may not keep (the same
    object); ``added``: every job whose allocation in ``allocs`` may not be ``current``'s, in the order of
    ``allocs`` (diff's order), each once.  A plain plan of ``allocs`` when the lists do not add up."""
    out_r = [jid for jid in dict.fromkeys(removed) if jid in current and allocs.get(jid) is not current[jid]]
    out_a = [jid for jid in added if jid in allocs and current.get(jid) is not allocs[jid]]
    if len(allocs) != len(current) - len(out_r) + len(out_a):
        return Plan(allocs, free_gpus)
    return Plan(allocs, free_gpus, base=current, added=out_a, removed=out_r)


def _with_requests(requests: list[pb.Request], more: list[pb.Request]) -> list[pb.Request]:
    """``requests``, then those of ``more`` (lone jobs' requests) whose job has none in ``requests``: the
    requests of a round :meth:`Scheduler._evict_for` added jobs to, as it would have listed them."""
    had = {j.id for r in requests for j in r.jobs}
    return requests + [r for r in more if r.jobs[0].id not in had]


def _running_read(walk: Any, skip: int, running: int) -> list[Job]:
    """The jobs of a lazy admission walk past its first ``skip`` (the guaranteed ones), read until it has
    yielded ``running`` running jobs in all (every running job: the rest all wait) or ends."""
    met = 0
    out: list[Job] = []
    for k, j in enumerate(walk):
        if j.alloc is not None:
            met += 1
        if k >= skip:
            out.append(j)
        if met >= running:
            break
    return out


def _free_left(plan: Plan, view: pb.View, from_changes: bool = True) -> FreeState:
    """What ``plan`` leaves free: with ``from_changes``, the free state the view keeps of its current
    allocations with what the plan takes out of them released and what it puts in taken
    (:func:`~gpuloom.core.plan.changes`: O(changes) for a plan extending them); else (or when an allocation
    it changes is in a group, whose GPUs count once) built from every allocation."""
    free, allocs, current = view.free, plan.allocations, view.current
    if from_changes and free is not None:
        removed, added = changes(current, plan)
        gone = [current[jid] for jid in removed]
        new = [allocs[jid] for jid in added]
        if not any(a.group for a in gone) and not any(a.group for a in new):
            out = free.copy()
            for a in gone:
                out.release(a.parts)
            for a in new:
                out.take(a.parts)
            return out
    return FreeState.of(view.cluster, allocs)


