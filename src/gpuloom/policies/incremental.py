"""Rounds in time proportional to what changes, for stacks that declare what it takes.

A round sizes and places the whole ordered queue.  With tens of thousands of
jobs queued or thousands running, that walk costs more than everything else
in a simulation, though almost nothing in it changes from one round to the
next.  The shortcuts below give exactly the plan the whole walk gives, when the
stages declare the capabilities they rest on (``policies/base.py``): the
sizer keeps every job at its GPU count and sizes a lone job from its spec
(``fixed_gpus``, ``static_requests``), nothing groups, the place policy uses the
three-phase loop and keeps running jobs where they are (``sticky``), and the
order sorts by a key (:class:`~gpuloom.policies.order.KeyOrder`).  The driver
keeps a :class:`Tally` of its active jobs (``View.tally``) for them.

**Everything fits** (:func:`all_fit_plan`).  When the active jobs together ask
for no more GPUs than the cluster has, placement selects every request, keeps
every running job where it is (its request has not changed), and places the
waiting ones in order.  The round does just that: the plan extends the current
allocations (:meth:`~gpuloom.core.plan.Plan.extending`) with the waiting jobs,
so neither the round nor :func:`~gpuloom.core.plan.diff` touches the running
jobs.

**Backfilling past the prefix** (:class:`TailWalk`).  Otherwise the scheduler
sizes and places only the prefix of the ordered queue whose GPUs fill the
cluster (:mod:`gpuloom.scheduler`).  Placement's third phase (a request left
over takes what is still free, in order) must then go on over the rest of the
queue, the *tail*: no job there is selected, so a waiting one can only be
backfilled and a running one keeps its GPUs only if they are still free.  Two
facts let the walk stop early:

* the free state only shrinks during the third phase, and under a place policy
  with ``pure_choose`` a new request that gets nothing would get nothing from
  any smaller free state; with ``static_requests`` every waiting job of one
  *shape* (its spec's GPUs, cores, memory) asks the same.  So once one waiting
  job of a shape gets nothing (or asks for more GPUs than are free), every
  later one of that shape is skipped unseen;
* the tally counts the waiting jobs of each shape, so the walk knows how many
  of each are still ahead.  When none of a shape that can still be placed is
  left, only the running jobs of the tail matter: they are placed in their
  order (the order's ``sort_key``) without walking the waiting jobs between.

**Keeping without re-placing** (:func:`prefix_plan`).  On the prefix itself
the three phases still look at every job, though in a long queue almost all
of them are running jobs that placement keeps as they are (sticky, their
request unchanged).  When every running allocation was made by the stack from
its static request (``Tally.unkeyed == 0``: the same condition the all-fit
plan rests on) and the order is placed as given (preemptive, no ``arrange`` of
the place policy's own), the selected running jobs are exactly the ones kept:
one pass over the prefix finds them with phase 1's count, the plan extends the
current one less the running jobs not selected, and only those, the selected
waiting jobs and the tail are placed, in the phases' order.  A running job of
the tail is then kept without sizing it (``TailWalk.keep``).  The diff of
such a plan costs O(changes) (:func:`~gpuloom.core.plan.diff`).

**Arrivals after a quiet round** (:func:`appended_plan`).  When the last round
planned no action, its prefix filled the cluster, and since then jobs only
arrived, last in a static order (FIFO), the whole walk would redo the last
round's steps on the unchanged state, which end on the current allocations and
free resources, and then backfill the new jobs: the round places just them
(``View.appended``; the driver counts every other change).

The same holds after a round whose actions were all carried out, because
placement is a fixed point on its own plan.  Run the round again on the state
its plan left: phase 1 selects the same jobs (it counts GPUs, not states), and
the selected running jobs are kept, among them the selected jobs the last round
started.  Each later step then meets a free state no larger than the same step
of the last round met (in phase 2b, where those starts are now held from the
outset) or the same one (from phase 3 on): each job the last round placed or
kept is kept again where it was placed (its allocation's key is its
request's), and each job it refused is refused again (``pure_choose``: what got
nothing gets nothing from a smaller free state).  So the round ends on its own
plan and plans no action (``Driver.apply`` notes it;
``test_placement_is_a_fixed_point_on_its_own_plan`` checks it round by round).

**Keeps counted, not made.**  The keeps are cheap while the round has placed
nothing: the exact free state is then the current one less the released jobs
not passed yet (they ran side by side, and only they were taken back), so each
keep fits and is only counted in ``free_gpus``.  The buffers follow at the
next try, which must read them, whichever way moves fewer allocations: taking
back the jobs kept since the last try (:meth:`FreeState.take_back`, unchecked,
in one call), or starting again from the current state
(:meth:`FreeState.reset`) and releasing the jobs not passed yet.  The keeps
after the round's last try are never made.
(What this and the alternatives measured: docs/performance.md, "The simulator's rounds".)

Each job passed changes what the next try reads (the count of free GPUs on its
node decides best fit), so every try must see exactly which of the released
jobs it has passed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

from ..core.fit import GPU_TYPE_KEY, spec_types
from ..core.job import Job, Shape
from ..core.plan import Allocation, Part, Plan
from ..perf.gputype import runnable_types
from .free import FreeState

if TYPE_CHECKING:
    from .base import PlacePolicy, Request, View


class Tally:
    """What a driver keeps about its active jobs as they change, for the shortcuts above."""

    __slots__ = ("idle", "waiting", "demand", "unkeyed", "index_order", "_last_index")

    def __init__(self) -> None:
        self.idle: dict[str, Job] = {}  # active jobs holding nothing
        self.waiting: dict[Shape, int] = {}  # how many of them, by shape
        self.demand = 0  # GPUs the active jobs ask for (their specs')
        self.unkeyed = 0  # running allocations placement did not make from a request (no key)
        self.index_order = True  # jobs were admitted in Job.index order (View.jobs is sorted by it)
        self._last_index = -1

    def admitted(self, job: Job) -> None:
        self.demand += job.spec.gpus
        i = job.index
        if i <= self._last_index:
            self.index_order = False
        else:
            self._last_index = i

    def count_waiting(self, job: Job, sign: int) -> None:
        """``job`` starts (``sign=1``) or stops waiting."""
        if sign > 0:
            self.idle[job.id] = job
        else:
            del self.idle[job.id]
        shape = job.shape
        n = self.waiting.get(shape, 0) + sign
        if n:
            self.waiting[shape] = n
        else:
            del self.waiting[shape]

    def as_tuple(self) -> tuple:
        return (set(self.idle), self.waiting, self.demand, self.unkeyed, self.index_order)


def try_new(place: PlacePolicy, plan: Plan, req: Request, free: FreeState, view: View, refused: set[tuple],
            try_: Callable[[Plan, Request, FreeState, View], bool] | None = None) -> bool:
    """``place._try`` (or ``try_``), except that a new request of a shape refused before in this
    round is not tried again (under ``pure_choose``, on a free state that has only shrunk since)."""
    if try_ is None:
        try_ = place._try
    if not place.pure_choose or req.jobs[0].alloc is not None:  # (req.prev, without the property call)
        return try_(plan, req, free, view)
    shape: tuple = (req.gpus, req.cpus, req.mem_mb, len(req.jobs))
    gpu_types = view.model.get("gpu_type") is not None
    if req.types is not None or gpu_types or len(req.jobs) > 1 or GPU_TYPE_KEY in req.jobs[0].spec.attrs:
        # a request limited to some GPU types (its own, its jobs' asks, the types its jobs can run on)
        # is refused for those types only (a typed shape's last element is never a bare member count,
        # so the tail walk never counts it dead)
        if req.types is not None:
            shape = (req.gpus, req.cpus, req.mem_mb, (len(req.jobs), req.types))
        else:
            asks = tuple((spec_types(j.spec), runnable_types(j, view.model) if gpu_types else None) for j in req.jobs)
            if any(a is not None or b is not None for a, b in asks):
                shape = (req.gpus, req.cpus, req.mem_mb, (len(req.jobs), asks))
    if shape in refused:
        return False
    if try_(plan, req, free, view):
        return True
    refused.add(shape)
    return False


def all_fit_plan(ordered_waiting: Sequence[Job], request: Callable[[Job], Request], place: PlacePolicy,
                 view: View) -> tuple[Plan, list[Request]]:
    """Placement when every active job fits by GPU count (see the module notes): the current
    allocations kept, the waiting jobs placed in order, those refused tried once more."""
    assert view.free is not None
    plan = Plan.extending(view.current)
    free = view.free.copy()
    requests = [request(j) for j in ordered_waiting]
    refused: set[tuple] = set()
    done: list[bool] = []
    for r in requests:  # phase 2b (every request selected, every running one kept)
        done.append(try_new(place, plan, r, free, view, refused))
        if not done[-1] and not place.backfill:
            break
    for r, ok in zip(requests, done, strict=True) if place.backfill else ():  # phase 3
        if free.free_gpus <= 0:
            break
        if not ok and r.gpus <= free.free_gpus:
            try_new(place, plan, r, free, view, refused)
    plan.free_gpus = free.free_gpus
    return plan, requests


def appended_plan(appended: Sequence[Job], request: Callable[[Job], Request], place: PlacePolicy,
                  view: View) -> tuple[Plan, list[Request]]:
    """Placement when only ``appended`` jobs, last in the order, joined since a round that planned
    no action and whose prefix filled the cluster (``View.appended``): the current allocations
    kept, the new jobs backfilled in order on what is free (see ``Scheduler._appended_round``)."""
    assert view.free is not None
    plan = Plan.extending(view.current)
    free = view.free.copy()
    requests: list[Request] = []
    refused: set[tuple] = set()
    for j in appended:  # phase 3's end: the jobs before them leave the current free state
        if free.free_gpus <= 0:
            break
        req = request(j)
        requests.append(req)
        if req.gpus <= free.free_gpus:
            try_new(place, plan, req, free, view, refused)
    plan.free_gpus = free.free_gpus
    return plan, requests


def prefix_plan(ordered: Sequence[Job], request: Callable[[Job], Request], walk_of: Callable[[int], TailWalk],
                place: PlacePolicy, view: View, whole: bool = False) -> tuple[Plan, int, TailWalk] | None:
    """``place.place`` (preemptive) over the prefix of ``ordered`` that fills the cluster, then the
    tail walk, visiting only the jobs whose place can change (see the module notes); None when the
    prefix is the whole queue, unless ``whole`` (then the tail is empty, and the walk's ``filled`` is
    False).  Returns the plan, the prefix's length and the walk.

    Phase 1 selects by GPU count as the scheduler's prefix does (the same loop, so the prefix
    ends where the count reaches the cluster's GPUs).  With static requests and no allocation
    the stack did not make (``Tally.unkeyed == 0``), every running job's allocation has its
    request's key, so the sticky start keeps every selected running job as it is: the plan
    extends the current one (:meth:`~gpuloom.core.plan.Plan.extending`), less the running jobs
    not selected, whose resources are released.  The phases then go on in the same order as
    :meth:`~gpuloom.policies.base.PlacePolicy.place`: the selected waiting jobs in order (2b; there
    is no 2a: no selected running job's request changed), the rest of the prefix in order (3),
    the tail.
    """
    cap = view.cluster.num_gpus
    filled = True  # phase 1's count reached the cluster's GPUs before the end of ordered
    chosen: list[Job] = []  # the selected waiting jobs, in order
    rest: list[Job] = []  # the jobs not selected, in order
    kept: list[str] = []  # selected running jobs
    idle: list[Job] = []  # waiting jobs of the prefix
    keep_id = kept.append
    jobs = iter(ordered)  # (left at the prefix's end for the tail walk: ordered may be ActiveJobs)
    # every job met is in one of chosen, rest and kept (no count kept in the loop, nor positions:
    # most of a long prefix are running jobs kept, and phase 3 needs no selected job, see below)
    for j in jobs:
        g = j.spec.gpus
        if g <= cap:
            cap -= g
            if j.alloc is None:
                chosen.append(j)
                idle.append(j)
            else:
                keep_id(j.id)
            if cap <= 0:
                break
        else:
            rest.append(j)
            if j.alloc is None:
                idle.append(j)
    else:
        if not whole:
            return None
        filled = False
    end = len(chosen) + len(rest) + len(kept)
    assert view.free is not None
    current = view.current
    plan = Plan.extending(current)
    base = view.free
    free = base.copy()
    # the running jobs not selected are released; they stay in the plan until their turn comes,
    # when they are kept if what they hold is still free (as _try would: their request's key is
    # their allocation's) and otherwise taken out and placed anew
    released = current.keys() - kept
    free.release_all([current[jid] for jid in released])  # (releases add up: their order does not matter)
    take_if_fits = free.take_if_fits
    # keeps counted, not made (see the module notes): until the round places something a kept job
    # is only counted in free_gpus (always exact) and its parts wait in pend for the next try
    pend: list[tuple[Part, ...]] = []
    placed = False

    def try_(plan: Plan, req: Request, free: FreeState, view: View) -> bool:
        nonlocal placed
        if pend:
            if len(pend) > len(released):
                free.reset(base)
                free.release_all([current[jid] for jid in released])
            else:
                free.take_back(pend)
            pend.clear()
        if place._try(plan, req, free, view):
            placed = True
            return True
        return False

    def keep(j: Job) -> bool:
        jid = j.id
        if jid in released:
            released.remove(jid)
            a = j.alloc
            if not placed:
                pend.append(a.parts)
                free.free_gpus -= a.num_gpus
                return True
            if take_if_fits(a.parts):
                return True
            plan.remove(jid)
        return try_(plan, request(j), free, view)

    refused: set[tuple] = set()
    # the shapes of the waiting jobs refused so far: this walk runs under pure_choose and static
    # requests (Scheduler._tail_ok), so every waiting job of a shape asks the same and try_new would
    # refuse each later one unseen; known here without sizing the job (a long queue's blocked heads
    # are passed this way a dozen times a round)
    dead: set[Shape] = set()
    for j in chosen:  # phase 2b
        s = j.shape
        if s in dead or not try_new(place, plan, request(j), free, view, refused, try_):
            dead.add(s)
    # phase 3 goes over the prefix in order, the selected jobs refused in 2b in their places among
    # the rest; but each of those is a waiting job of a dead shape, which phase 3 passes without a
    # try (and no job passed changes free_gpus, which alone ends the loop), so only the rest is walked
    for j in rest:  # phase 3
        if free.free_gpus <= 0:
            break
        if j.spec.gpus <= free.free_gpus:
            if j.alloc is not None:
                keep(j)
            else:
                s = j.shape
                if s not in dead and not try_new(place, plan, request(j), free, view, refused, try_):
                    dead.add(s)
    walk = walk_of(end)
    walk.filled = filled
    walk.keep = keep
    walk.try_ = try_
    walk.backfill(place, plan, free, view, refused, idle=idle, tail=jobs)
    for jid in released:  # never kept: stopped
        plan.remove(jid)
    plan.free_gpus = free.free_gpus
    return plan, end, walk


class TailWalk:
    """The jobs ``ordered[start:]`` for placement's third phase (see the module notes).

    ``request(job)`` sizes one job; ``sort_key(job)`` is its place in the order (None: the running
    jobs left once no waiting job ahead can be placed are read from the tail itself, which is then
    the whole of the order past ``start``: a queue stage's admission);
    ``waiting`` counts the active jobs holding nothing by shape (:class:`Tally`);
    ``current`` is what runs now.  ``visited`` collects the jobs the walk met that could still
    get something (:meth:`requests` sizes them).  ``keep(job)``, when set, places a running job
    met instead of ``place._try`` (:func:`prefix_plan`'s, which keeps it without sizing it);
    ``try_(plan, request, free, view)``, when set, tries a waiting job instead of ``place._try``
    (:func:`prefix_plan`'s, which first takes back the keeps it deferred).
    """

    def __init__(
        self,
        ordered: Sequence[Job],
        start: int,
        request: Callable[[Job], Request],
        sort_key: Callable[[Job], Any] | None,
        waiting: Mapping[Shape, int],
        current: Mapping[str, Allocation],
    ) -> None:
        self.ordered = ordered
        self.keep: Callable[[Job], object] | None = None
        self.try_: Callable[[Plan, Request, FreeState, View], bool] | None = None
        self.start = start
        self.request = request
        self.sort_key = sort_key  # None: the running jobs left are read from the tail itself, in its order
        self.waiting = waiting
        self.current = current
        self.visited: list[Job] = []
        self.filled = True  # (prefix_plan: False when its prefix was all of ordered, the walk then empty)
        self.free: FreeState | None = None  # the free state it backfills, from when :meth:`backfill` starts

    def requests(self) -> list[Request]:
        """The requests of the jobs the walk met (:attr:`visited`)."""
        return [self.request(j) for j in self.visited]

    def backfill(self, place: PlacePolicy, plan: Plan, free: FreeState, view: View,
                 refused: Collection[tuple] = (), idle: Sequence[Job] | None = None,
                 tail: Iterator[Job] | None = None) -> None:
        """Phase 3 over the tail: ``place._try`` each job in order that can still get something.

        ``refused``: request shapes ``(gpus, cpus, mem_mb, members)`` placement already refused
        this round (on a larger free state).  ``idle``: the prefix's waiting jobs, when the caller
        knows them.  ``tail``: an iterator over ``ordered`` already at ``start``, when the caller
        has one (ordered is iterated, not indexed: getting there again costs a pass over the prefix)."""
        ordered, start = self.ordered, self.start
        self.free = free
        # waiting jobs of each shape not yet passed (kept up to date only while the shape may be placed:
        # a dead shape's count is read no more)
        left = dict(self.waiting)
        if idle is None:
            idle = [j for j in islice(ordered, start) if j.alloc is None]
        for j in idle:
            left[j.shape] -= 1
        dead: set[Shape] = {(g, c, m) for g, c, m, k in refused if k == 1}
        live = sum(k for s, k in left.items() if s not in dead)  # waiting jobs ahead whose shape may be placed
        visited = self.visited
        keep = self.keep
        try_ = self.try_ or place._try
        if keep is None:  # a running job met that may still fit: placed as any request
            def keep(j: Job) -> object:
                return place._try(plan, self.request(j), free, view)
        jobs = tail if tail is not None else islice(ordered, start, None)
        stopped_at: Job | None = None  # the job read when no waiting job ahead could be placed
        for j in jobs:
            if live <= 0:
                stopped_at = j
                break
            if free.free_gpus <= 0:
                return
            if j.alloc is not None:
                visited.append(j)
                if j.spec.gpus <= free.free_gpus:  # (its request's GPUs: fixed_gpus)
                    keep(j)
                continue
            s = j.shape
            if s in dead:
                continue
            left[s] -= 1
            live -= 1
            req = self.request(j)
            visited.append(j)
            if req.gpus > free.free_gpus or not try_(plan, req, free, view):
                dead.add(s)
                live -= left[s]
        # only running jobs of the tail are left that could be placed: in their order (rare: found
        # here rather than noted on the way)
        if self.sort_key is None:  # the order is the tail's own: the rest of it, running jobs only, read until
            # every running job was met (or the tail ends: a running job may not be in the order at all)
            unmet = len(self.current) - sum(1 for j in islice(ordered, start) if j.alloc is not None)
            unmet -= sum(1 for j in visited if j.alloc is not None)
            for j in chain((stopped_at,) if stopped_at is not None else (), jobs):
                if unmet <= 0 or free.free_gpus <= 0:
                    return
                if j.alloc is None:
                    continue
                unmet -= 1
                visited.append(j)
                if j.spec.gpus <= free.free_gpus:
                    keep(j)
            return
        # (the running jobs met: those of the prefix and those the loop above visited)
        seen = {j.id for j in islice(ordered, start) if j.alloc is not None}
        seen.update(j.id for j in visited if j.alloc is not None)
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in ordered}
        sort_key = self.sort_key
        rest = sorted([by_id[jid] for jid in self.current.keys() - seen], key=sort_key)
        for j in rest:
            if free.free_gpus <= 0:
                return
            visited.append(j)
            if j.spec.gpus <= free.free_gpus:
                keep(j)
