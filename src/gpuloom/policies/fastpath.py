"""Which shortcuts a round may take, chosen once from what the stages declare.

:class:`FastPaths` reads the declarations of :class:`~gpuloom.policies.base.Stage` and its
subclasses (``fixed_gpus``, ``static_requests``, ``negotiates``, ``merges``, ``sticky``,
``three_phase``, ``arranges``, ``pure_choose``, ``backfill``, ``keyed``, ``follows_view``)
when the scheduler is built, and gives the scheduler the shortcuts of
:mod:`gpuloom.policies.incremental` that they allow; what also depends on the round (the
driver's tally and free state, plan hooks) is checked per round.  Each shortcut gives exactly
the plan the whole walk gives (see :mod:`gpuloom.policies.incremental`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.job import Job
from ..core.plan import Plan
from .base import GroupPolicy, OrderPolicy, PlacePolicy, Request, SizePolicy, View
from .incremental import TailWalk, all_fit_plan, appended_plan, prefix_plan
from .queue_base import QueuePolicy


class FastPaths:
    """The shortcuts a stack's declarations allow (see the module notes)."""

    def __init__(self, order: OrderPolicy, group: GroupPolicy, size: SizePolicy, place: PlacePolicy,
                 queue: QueuePolicy, preemptive: bool) -> None:
        self.order, self.size, self.place = order, size, place
        self.preemptive = preemptive
        #: a prefix of the ordered queue whose GPUs fill the cluster can be planned alone (every
        #: request asks for its job's GPUs, every job is a unit)
        self.prefix = size.fixed_gpus and not group.merges
        #: what every incremental shortcut rests on, but the round's tally and free state
        core = (self.prefix and size.static_requests and not size.negotiates and place.sticky
                and place.three_phase and order.keyed)
        self.incremental = core and not queue.enabled
        #: the same with a queue stage, whose own path asks for what else it uses (Scheduler._queue_walk_ok)
        self.incremental_queues = core
        #: the tail walk (TailWalk): also a pure ``choose`` and backfilling
        self.tail_walk = self.incremental and place.pure_choose and place.backfill
        #: the prefix plan: also the order's own order placed as given
        self.prefix_plan = self.tail_walk and preemptive and not place.arranges
        #: the appended round: also a static order that is View.jobs' own
        self.appended = (self.tail_walk and preemptive and order.follows_view
                         and not any(st.dynamic for st in (order, group, size, place, queue)))

    def ready(self, view: View, queues: bool = False) -> bool:
        """The incremental shortcuts apply to ``view`` (the driver keeps a tally and the free state); with
        ``queues``, on a queue stage's path."""
        tally = view.tally
        return ((self.incremental_queues if queues else self.incremental) and tally is not None and view.free is not None
                and (tally.index_order or not self.order.follows_view)
                # (they keep running jobs where they run: not while a node evicts its jobs)
                and (view.blocked is None or not view.blocked.evicts))

    def tail(self, ordered: Sequence[Job], start: int, view: View) -> TailWalk | None:
        """Backfill past ``ordered[:start]`` without walking the rest, or None (place the whole queue)."""
        if not (self.tail_walk and self.ready(view)):
            return None
        order, size, tally = self.order, self.size, view.tally
        assert tally is not None
        return TailWalk(ordered, start, lambda j: size.request(j, view), lambda j: order.sort_key(j, view),
                        tally.waiting, view.current)

    def all_fit(self, view: View) -> tuple[Plan, list[Request]] | None:
        """The round when every active job fits by GPU count (:func:`~.incremental.all_fit_plan`)."""
        tally = view.tally
        if tally is None or tally.demand > view.cluster.num_gpus or tally.unkeyed or not self.ready(view):
            return None
        order, size = self.order, self.size
        waiting = sorted(tally.idle.values(), key=lambda j: order.sort_key(j, view))
        return all_fit_plan(waiting, lambda j: size.request(j, view), self.place, view)

    def prefix_round(self, ordered: Sequence[Job], view: View,
                     hooked: bool) -> tuple[Plan, Callable[[], list[Request]]] | None:
        """The plan through :func:`~.incremental.prefix_plan` and a function listing its requests, when
        the stack allows it and only the stack made the allocations (``Tally.unkeyed == 0``), with no
        plan hook (``hooked``); None otherwise, or when the prefix is the whole queue."""
        tally = view.tally
        if not (self.prefix_plan and not hooked and tally is not None and not tally.unkeyed and self.ready(view)):
            return None
        size = self.size

        def request(j: Job) -> Request:
            return size.request(j, view)

        def walk_of(start: int) -> TailWalk:
            walk = self.tail(ordered, start, view)
            assert walk is not None  # (ready above)
            return walk

        out = prefix_plan(ordered, request, walk_of, self.place, view)
        if out is None:
            return None
        plan, end, walk = out
        return plan, lambda: [request(j) for j in ordered[:end]] + walk.requests()

    def appended_round(self, view: View, hooked: bool) -> tuple[Plan, list[Request]] | None:
        """The round when only jobs were admitted since a round that filled the cluster with its prefix
        and planned no action or had its actions carried out (``view.appended``), under a static stack
        whose order puts them last (FIFO, jobs admitted in index order), with no plan hook; None
        otherwise.  The whole walk would redo the last round's steps on the state it left and then
        backfill the new jobs in order: that last part is the round (:func:`~.incremental.appended_plan`)."""
        tally = view.tally
        if not (self.appended and not hooked and tally is not None and tally.index_order and self.ready(view)):
            return None
        size = self.size
        return appended_plan(view.appended or (), lambda j: size.request(j, view), self.place, view)
