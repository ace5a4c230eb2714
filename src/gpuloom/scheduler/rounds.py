"""The pipeline every round runs: group → size → place over an ordered list of jobs, then the plan hooks.

:class:`Round` is a round's decision.  :class:`Pipeline` plans an ordered list whole
(:meth:`Pipeline._plan`: only the prefix that fills the cluster when that is exact) or read lazily, as
far as placement needs (:meth:`Pipeline._walked`), and runs the plan hooks on the result; the plain
round (:mod:`.core`) and the queue rounds (:mod:`.queued`, :mod:`.reclaim`) are built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..core.job import Job, Shape
from ..core.plan import Plan
from ..policies import base as pb
from ..policies.fastpath import FastPaths
from ..policies.incremental import TailWalk, prefix_plan
from ..policies.queue_book import Walk

PlanHook = pb.PlanHook


class Round:
    """A round's decision: the plan, the requests (one per unit) it answers, and why jobs wait.

    ``requests`` may be given as a function that lists them (``lazy``): a round that placed only
    what changed need not size every job it kept unless a check or a reason asks.  ``full``: phase
    1's count of the ordered queue reached the cluster's GPUs before its end, so a job appended to
    the queue is never selected, only backfilled (what :attr:`~gpuloom.policies.base.View.appended`
    rests on).  ``reasons_of``: the jobs ``reasons`` covers when not every active job (a round that
    only looked at the jobs appended since the last, and placed none of them: the others wait for
    the reasons they had); None: every active job.
    """

    __slots__ = ("plan", "_requests", "_lazy", "reasons", "full", "reasons_of")

    def __init__(self, plan: Plan, requests: list[pb.Request] | None = None, reasons: dict[str, str] | None = None,
                 lazy: Callable[[], list[pb.Request]] | None = None, full: bool = False) -> None:
        self.plan = plan
        self._requests = requests
        self._lazy = lazy
        self.reasons: dict[str, str] = reasons if reasons is not None else {}
        self.full = full
        self.reasons_of: Sequence[Job] | None = None

    @property
    def requests(self) -> list[pb.Request]:
        if self._requests is None:
            self._requests = self._lazy() if self._lazy is not None else []
            self._lazy = None
        return self._requests


class Pipeline:
    """group → size → place over an ordered list, and the plan hooks (the stages and switches are the
    :class:`~gpuloom.scheduler.core.Scheduler`'s, set by its constructor)."""

    group: pb.GroupPolicy
    size: pb.SizePolicy
    place: pb.PlacePolicy
    preemptive: bool
    hooks: list[PlanHook]
    fast: FastPaths

    # -- one round ----------------------------------------------------------------------
    def _prefix(self, ordered: Sequence[Job], capacity: int) -> Sequence[Job]:
        if not self.preemptive:
            return ordered
        cap = capacity
        for i, j in enumerate(ordered):
            g = j.spec.gpus
            if g <= cap:
                cap -= g
                if cap <= 0:
                    return ordered[: i + 1]
        return ordered

    def _run(self, ordered: Sequence[Job], view: pb.View) -> Round:
        units = self.group.group(ordered, view)
        requests = self.size.size(units, view)
        return Round(self.size.allocate(requests, view, self.place, self.preemptive), requests)

    def _plan(self, ordered: Sequence[Job], view: pb.View) -> Round:
        """group → size → place over ``ordered`` (only the prefix that fills the cluster when that is exact)."""
        if self.fast.prefix:
            prefix = self._prefix(ordered, view.cluster.num_gpus)
            rnd = self._run(prefix, view)
            if len(prefix) < len(ordered) and _free_gpus(rnd.plan, view) > 0:
                rnd = self._run(ordered, view)
            return rnd
        return self._run(ordered, view)
    def _hooked(self, rnd: Round, view: pb.View, hooks: Sequence[PlanHook] | None = None) -> Round:
        hooks = self.hooks if hooks is None else hooks
        if hooks:
            placed = plan = rnd.plan
            for hook in hooks:
                plan = hook(plan, view)
            if plan is not placed:
                rnd = Round(plan, _kept_requests(rnd.requests, plan, view))
        return rnd

    def _walked(self, ordered: Sequence[Job], view: pb.View, waiting: Mapping[Shape, int] | None,
                tails: list[TailWalk] | None = None) -> Round:
        """:func:`~gpuloom.policies.incremental.prefix_plan` over ``ordered`` (a list or a lazy walk: read only
        as far as placement needs) with the running jobs of its tail read from it in its order (``waiting``:
        counts of the jobs that may look waiting in it, by shape; the driver's by default); :meth:`_plan` when
        the prefix is all of it.  ``tails`` gets the tail walk placement made, if any."""
        size = self.size
        counts = waiting if waiting is not None else view.tally.waiting if view.tally is not None else None
        assert counts is not None

        def request(j: Job) -> pb.Request:
            return size.request(j, view)

        def walk_of(start: int) -> TailWalk:
            tail = TailWalk(ordered, start, request, None, counts, view.current)
            if tails is not None:
                tails.append(tail)
            return tail

        out = prefix_plan(ordered, request, walk_of, self.place, view, whole=True)
        if out is None:
            return self._plan(list(ordered), view)
        plan, end, tail = out
        # the prefix's jobs as they are now (reclaim may move jobs of the walk's lists before the requests are read)
        head = _head(ordered, end)
        return Round(plan, lazy=lambda: [request(j) for j in (ordered[:end] if head is None else head)]
                     + tail.requests(), full=tail.filled)

def _head(ordered: Sequence[Job], end: int) -> list[Job] | None:
    """``ordered[:end]`` as it is now, when that reads no further (a list, or an admission's walk that has
    read those jobs: only they are copied, where its own slice joins every job it read first); else None."""
    if isinstance(ordered, Walk):
        g, over = ordered.guaranteed, ordered.over
        if end <= len(g):
            return g[:end]
        if end - len(g) <= len(over):
            return g + over[:end - len(g)]
        return None
    return ordered[:end] if isinstance(ordered, list) else None


def _free_gpus(plan: Plan, view: pb.View) -> int:
    free = plan.free_gpus
    if free is None:
        used = {g for a in plan.allocations.values() for g in a.gpu_ids}
        if view.blocked is not None and view.blocked.held:  # (and those work outside the plan holds)
            used.update(g for p in view.blocked.held for g in p.gpus)
        free = view.cluster.num_gpus - len(used)
    return free


def _kept_requests(requests: list[pb.Request], plan: Plan, view: pb.View) -> list[pb.Request]:
    """A hook that keeps a job on its current allocation changes that job's request to match
    (so the gang check compares with what the final plan asks for).  A member of a group request
    kept on what it holds now (alone, or in another group) gets a request of its own."""
    out = []
    allocs, current = plan.allocations, view.current
    for r in requests:
        if len(r.jobs) == 1:
            a = allocs.get(r.job.id)
            if a is not None and a.num_gpus != r.gpus and current.get(r.job.id) == a:
                r = pb.Request(r.jobs, a.num_gpus, r.cpus, r.mem_mb)
            out.append(r)
            continue
        kept = []
        for j in r.jobs:
            a = allocs.get(j.id)
            if a is not None and a.num_gpus != r.gpus and current.get(j.id) == a:
                kept.append(j)
        if not kept:
            out.append(r)
            continue
        rest = tuple(j for j in r.jobs if j not in kept)
        if rest:
            out.append(pb.Request(rest, r.gpus, r.cpus, r.mem_mb))
        out.extend(pb.Request((j,), allocs[j.id].num_gpus, r.cpus, r.mem_mb) for j in kept)
    return out
