"""The :class:`Scheduler`: its stages and their checks, binding, ``-P`` routing, the round without a
queue stage and its shortcuts, pending reasons, and the plan checks (the notes: :mod:`gpuloom.scheduler`).

The pipeline it runs is :mod:`.rounds`'; with a queue stage, rounds are :mod:`.queued`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.plan import Action, Part, PlanError, check_actions, check_plan
from ..perf.model import ThroughputModel
from ..policies import base as pb
from ..policies.backfill import Backfill
from ..policies.check import route_params
from ..policies.fastpath import FastPaths
from ..policies.queue_base import QueuePolicy
from .queued import QueueRounds
from .rounds import PlanHook, Round, _free_gpus


class RequirementError(pb.PolicyError):
    """A stage needs something the throughput model lacks; the message names both."""


#: pending reasons the scheduler gives on its own (stages may add theirs)
RESOURCES, PRIORITY, PLACEMENT = "Resources", "Priority", "Placement"


class Scheduler(QueueRounds):
    def __init__(
        self,
        order: pb.OrderPolicy,
        group: pb.GroupPolicy,
        size: pb.SizePolicy,
        place: pb.PlacePolicy,
        preemptive: bool = True,
        hooks: Sequence[PlanHook] = (),
        queue: QueuePolicy | None = None,
    ) -> None:
        self.order = order
        self.group = group
        self.size = size
        self.place = place
        self.preemptive = preemptive
        self.hooks = list(hooks)
        #: hooks that also have the last word over a queue stage's reclaims (nodes out of service); each is
        #: in ``hooks`` too
        self.final_hooks: list[PlanHook] = []
        #: nodes out of service this round, given to the view before planning (operator control)
        self.blocked: Callable[[pb.View], pb.Blocked | None] | None = None
        #: what work outside the plan holds (jobs submitted to Slurm directly), given to the view's blocked too
        self.outside: list[Callable[[Cluster], Sequence[Part]]] = []
        self.queue = queue if queue is not None else pb.make("queue", "none")
        chosen = {st.stage: st for st in self.stages}
        for st in self.stages:  # a stage that cannot run beside the others says so now, not mid-run
            why = st.refuse(chosen)
            if why:
                raise pb.PolicyError(why)
        if group.name != "none" and not size.sizes_groups:
            raise pb.PolicyError(f"size policy {size.name!r} sizes one job per GPU set, not the groups of group "
                                 f"policy {group.name!r} (jobs sharing GPUs): use group 'none' or another size policy")
        if size.one_node and place.spreads:
            raise pb.PolicyError(f"size policy {size.name!r} keeps a job that one node could hold on one node, and "
                                 f"place policy {place.name!r} draws GPUs from the whole cluster: a multi-GPU job "
                                 f"would almost never start; use a packed placement, pm-first or pal")
        #: the round's shortcuts, chosen from the stages' declarations (stages are fixed from here on)
        self.fast = FastPaths(order, group, size, place, self.queue, preemptive)
        self._whole = False  # the last round's prefix left GPUs free: it was planned on the whole queue
        self.guess_whole = True  # False: always plan the prefix first (tests compare the two ways)
        self.walk_queues = True  # False: a queue stage's admission is always read whole (tests compare the two ways)
        self.append_queues = True  # False: a queue round never only backfills its new jobs (tests compare)
        self.walk_whole = True  # False: a lazy walk that left GPUs free is always admitted again whole (tests compare)
        # False: reclaim's free state is built from every allocation, an owed queue's jobs are all read, reclaim's
        # plans are compared with the current allocations allocation by allocation, and an eviction asks placement
        # even for more GPUs than are free (tests compare)
        self.reclaim_changes = True
        # False: a two-pass round always plans its second pass, even when its view would be the round's own
        # (tests compare)
        self.reclaim_again = True

    @classmethod
    def from_names(
        cls,
        order: str = pb.STAGE_DEFAULTS["order"],
        group: str = pb.STAGE_DEFAULTS["group"],
        size: str = pb.STAGE_DEFAULTS["size"],
        place: str = pb.STAGE_DEFAULTS["place"],
        preemptive: bool = True,
        params: Mapping[str, Any] | None = None,
        queue: str = pb.STAGE_DEFAULTS["queue"],
    ) -> Scheduler:
        """Build from registry names; ``params`` (bare or ``stage.name``) go to the stage that takes them."""
        chosen = {"order": order, "group": group, "size": size, "place": place}
        if queue != "none":  # (no queue stage: error messages do not list one)
            chosen["queue"] = queue
        per_stage = route_params(chosen, params or {})
        stages = {s: pb.make(s, n, per_stage[s]) for s, n in chosen.items()}
        stages.setdefault("queue", pb.make("queue", "none"))
        # a stage may bring plan hooks of its own (e.g. elastic sizing's hysteresis)
        hooks = [h for st in stages.values() for h in st.plan_hooks()]
        return cls(stages["order"], stages["group"], stages["size"], stages["place"], preemptive, hooks,
                   stages["queue"])

    def reserve(self, depth: int) -> Backfill:
        """Keep reservations for the first ``depth`` waiting jobs (:mod:`.policies.backfill`): a plan hook,
        run after the stages' own."""
        bf = Backfill(self.order, self.size, self.place, depth, self.stages)
        self.hooks.append(bf)
        return bf

    @property
    def backfill(self) -> Backfill | None:
        """The backfill hook :meth:`reserve` added, if any."""
        return next((h for h in self.hooks if isinstance(h, Backfill)), None)

    @property
    def stages(self) -> tuple[pb.Stage, ...]:
        return (self.order, self.group, self.size, self.place, self.queue)

    @property
    def names(self) -> dict[str, str]:
        """The stages' names; ``queue`` only when there is a queue stage."""
        out = {"order": self.order.name, "group": self.group.name, "size": self.size.name, "place": self.place.name}
        if self.queue.enabled:
            out["queue"] = self.queue.name
        return out

    @property
    def label(self) -> str:
        """``order/group/size/place`` (the full stack, for titles)."""
        return "/".join(self.names.values())

    @property
    def dynamic(self) -> bool:
        """True if a round can change the plan although no job arrived or finished."""
        return any(st.dynamic for st in self.stages) or bool(self.hooks)

    def next_change(self, view: pb.View) -> float:
        """The earliest time a round could plan differently from the one that just left
        ``view``'s state unchanged, if no job arrives or ends: the soonest of the stages'
        :meth:`~gpuloom.policies.base.Stage.next_change` (``view.now`` with a plan hook no
        stage brought: it may read anything)."""
        own = [h for st in self.stages for h in st.plan_hooks()]
        if any(h not in own for h in self.hooks):
            return view.now
        return min(st.next_change(view) for st in self.stages)

    def never_runs(self, job: Job, model: ThroughputModel) -> str | None:
        """Why this stack can never run ``job`` (None: it may): its sizer gives it no request it runs on, or
        its place policy could not place the fewest GPUs the sizer asks for it even on an empty cluster.
        What no stack could place is :func:`~gpuloom.core.fit.never_fits`'."""
        why = self.size.never_sizes(job, model)
        if why is None:
            gpus = self.size.least_gpus(job, model)
            if gpus is not None:
                why = self.place.never_places(gpus, model.cluster)
        return why

    @property
    def checks_jobs(self) -> bool:
        """Whether :meth:`never_runs` can refuse a job (a stage of this stack says so)."""
        return (type(self.size).never_sizes is not pb.SizePolicy.never_sizes
                or type(self.place).never_places is not pb.PlacePolicy.never_places)

    @property
    def needs_profiles(self) -> bool:
        return any(st.needs_profiles for st in self.stages)

    def bind(self, model: ThroughputModel, strict: bool = False) -> None:
        """Enforce the stages' ``requires_factors`` on ``model`` (see the module notes)."""
        for st in self.stages:
            for fname, make in st.requires_factors.items():
                if model.get(fname) is not None:
                    continue
                if strict or make is None:
                    raise RequirementError(
                        f"{st.stage} policy {st.name!r} needs the {fname!r} factor in the throughput model; "
                        + (f"give {_option_for(fname)}" if make is None else "add it")
                    )
                model.add(make(model.cluster))

    def stats(self) -> dict[str, Any]:
        """Every stage's counters of the last round, keyed ``stage.counter``."""
        return {f"{st.stage}.{k}": v for st in self.stages for k, v in st.stats().items()}


    def schedule(self, view: pb.View, reasons: bool = True) -> Round:
        """The round for ``view``; ``reasons=False`` leaves ``Round.reasons`` empty (the simulator
        has no use for them, and they cost a pass over every waiting job)."""
        if view.blocked is None and (self.blocked is not None or self.outside):
            view.blocked = self._blocked(view)
        ordered: Sequence[Job] | None = None
        every_asked = False  # every job past the requests would be asked for its spec's GPUs
        if self.queue.enabled:
            lazy = not reasons and self._queue_walk_ok(view)
            if lazy and view.appended is not None and self.append_queues:
                fast = self._queued_appended(view)
                if fast is not None:
                    return fast
            ordered = self.order.order(view.jobs, view)
            rnd = self._queued(ordered, view, lazy)
            if self.final_hooks:
                rnd = self._hooked(rnd, view, self.final_hooks)
        else:
            if view.appended is not None:
                fast = self._appended_round(view)
                if fast is not None:
                    return self._appended_reasons(fast, view) if reasons else fast
            rnd_fit = self._all_fit(view)
            if rnd_fit is not None:
                rnd, every_asked = rnd_fit, True
            elif self.fast.prefix:
                ordered = self.order.order(view.jobs, view)
                fast = self._prefix_round(ordered, view)
                if fast is not None:
                    return self._with_reasons(fast, view, ordered, reasons)
                prefix = self._prefix(ordered, view.cluster.num_gpus)
                walk = self.fast.tail(ordered, len(prefix), view) if len(prefix) < len(ordered) else None
                if walk is not None:
                    requests = self.size.size([(j,) for j in prefix], view)
                    rnd = Round(self.place.place(requests, view, self.preemptive, tail=walk),
                                requests + walk.requests(), full=True)
                    every_asked = True
                elif self._whole and self.guess_whole and len(prefix) < len(ordered):
                    # the last round's prefix left GPUs free (fragmented nodes keep doing so): plan the
                    # whole queue at once.  When the prefix would have filled the cluster the whole
                    # queue gives the same plan (nothing past the prefix gets a GPU), so only time
                    # depends on this guess
                    rnd = self._run(ordered, view)
                    allocs = rnd.plan.allocations
                    # would the prefix alone have left GPUs free? (what it holds of this plan, a guess)
                    self._whole = sum(allocs[j.id].num_gpus for j in prefix if j.id in allocs) < view.cluster.num_gpus
                else:
                    rnd = self._run(prefix, view)
                    self._whole = False
                    if len(prefix) < len(ordered) and _free_gpus(rnd.plan, view) > 0:
                        rnd = self._run(ordered, view)
                        self._whole = True
            else:
                ordered = self.order.order(view.jobs, view)
                rnd = self._run(ordered, view)
            rnd = self._hooked(rnd, view)
        return self._with_reasons(rnd, view, ordered, reasons, every_asked)

    def _blocked(self, view: pb.View) -> pb.Blocked | None:
        """The nodes held this round (:attr:`blocked`) with what work outside the plan holds (:attr:`outside`)."""
        b = self.blocked(view) if self.blocked is not None else None
        held = tuple(p for f in self.outside for p in f(view.cluster))
        if not held:
            return b
        return pb.Blocked({}, _no_limit, held=held) if b is None else replace(b, held=held)

    def _with_reasons(self, rnd: Round, view: pb.View, ordered: Sequence[Job] | None, reasons: bool,
                      every_asked: bool = True) -> Round:
        if reasons:
            if ordered is None:
                ordered = self.order.order(view.jobs, view)
            rnd.reasons = self.reasons(rnd, view, ordered, every_asked)
        return rnd

    def _prefix_round(self, ordered: Sequence[Job], view: pb.View) -> Round | None:
        """The round through :meth:`~gpuloom.policies.fastpath.FastPaths.prefix_round`, or None."""
        out = self.fast.prefix_round(ordered, view, bool(self.hooks))
        return None if out is None else Round(out[0], lazy=out[1], full=True)

    def _appended_round(self, view: pb.View) -> Round | None:
        """The round through :meth:`~gpuloom.policies.fastpath.FastPaths.appended_round`, or None."""
        out = self.fast.appended_round(view, bool(self.hooks))
        return None if out is None else Round(out[0], out[1], full=True)

    def _appended_reasons(self, rnd: Round, view: pb.View) -> Round:
        """The reasons of an appended round (:meth:`_appended_round`).  When it placed none of the jobs
        appended, the GPUs it leaves free are those the last round left, so every other waiting job
        waits for the reason it had: only the appended jobs get theirs (``Round.reasons_of``), and a
        round of a long queue in which nothing changed costs O(its new jobs), not O(its jobs).  The
        last round was a prefix round (it filled the cluster): every job past the requests counts as
        asked, as there."""
        appended = view.appended or ()
        if len(rnd.plan.allocations) == len(view.current):
            rnd.reasons = self.reasons(rnd, view, appended, every_asked=True)
            rnd.reasons_of = appended
            return rnd
        return self._with_reasons(rnd, view, None, True, every_asked=True)

    def _all_fit(self, view: pb.View) -> Round | None:
        """The round when every active job fits by GPU count (:meth:`~gpuloom.policies.fastpath.FastPaths.all_fit`)."""
        out = self.fast.all_fit(view)
        return None if out is None else Round(*out)

    def reasons(self, rnd: Round, view: pb.View, ordered: Sequence[Job], every_asked: bool = False) -> dict[str, str]:
        """Why each active job the plan leaves out waits (see the module notes); ``every_asked``: the
        jobs without a request in ``rnd`` would have asked for their spec's GPUs."""
        plan = rnd.plan.allocations
        waiting = [j for j in ordered if j.id not in plan]
        if not waiting:
            return {}
        free = rnd.plan.free_gpus
        if free is None:
            free = view.cluster.num_gpus - len({g for a in plan.values() for g in a.gpu_ids})
        asked = {j.id: r.gpus for r in rnd.requests for j in r.jobs}
        out: dict[str, str] = {}
        for j in waiting:
            need = asked.get(j.id, j.spec.gpus)
            if need > free:
                out[j.id] = RESOURCES
            elif (every_asked or j.id in asked) and self.place.backfill and self.preemptive:
                out[j.id] = PLACEMENT
            else:
                out[j.id] = PRIORITY
        for st in self.stages:
            out.update({k: v for k, v in st.pending_reasons(rnd.plan, view).items() if k in out})
        return out

    def check(self, rnd: Round, view: pb.View) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` unless ``rnd.plan`` is sound for ``view``.

        :func:`~gpuloom.core.plan.check_plan` (no GPU given twice outside a group,
        no node over its cores or memory), every job holding exactly the GPUs its
        request asked for (gang), and only active jobs planned.  The simulator and
        the service run it on every round's plan.
        """
        plan = rnd.plan
        check_plan(plan, view.cluster)
        requested: set[str] = set()
        for req in rnd.requests:
            for j in req.jobs:
                requested.add(j.id)
                a = plan.allocations.get(j.id)
                if a is not None and a.num_gpus != req.gpus:
                    raise PlanError(f"job {j.id}: gang broken, holds {a.num_gpus} of {req.gpus} GPUs")
        active: set[str] | None = None  # built only if a hook planned a job outside the requests
        for jid in plan.allocations:
            if jid in requested:
                continue
            if active is None:
                active = {x.id for x in view.jobs}
            if jid not in active:
                raise PlanError(f"job {jid} planned but not active")
        if self.queue.enabled:
            self.queue.check(plan, view, self.place)

    def check_changes(
        self,
        rnd: Round,
        view: pb.View,
        actions: Sequence[Action],
        holders: Mapping[int, Collection[str]],
        active: Mapping[str, Job],
    ) -> None:
        """:meth:`check` for what ``rnd`` changes, in O(actions), given that ``view.current`` passed it.

        ``actions`` are ``diff(view.current, rnd.plan)``; ``holders`` maps each GPU to the
        jobs holding it in ``view.current`` and ``active`` the active jobs by id (the driver
        keeps both).  :func:`~gpuloom.core.plan.check_actions` checks every changed
        allocation against the unchanged ones; a changed job must be active and hold what
        its request asks (its spec's GPUs when the sizer keeps them, ``fixed_gpus``).
        """
        free = view.free if view.free is not None else pb.FreeState.of(view.cluster, view.current)
        check_actions(actions, rnd.plan, view.cluster, free.cpu_counts, free.mem_counts, holders)
        asked: dict[str, int] | None = None
        if not self.size.fixed_gpus or self.hooks:
            asked = {j.id: r.gpus for r in rnd.requests for j in r.jobs}
        for act in actions:
            a = act.new
            if a is None:
                continue
            job = active.get(act.job_id)
            if job is None:
                raise PlanError(f"job {act.job_id} planned but not active")
            want = job.spec.gpus if asked is None else asked.get(act.job_id)
            if want is not None and a.num_gpus != want:
                raise PlanError(f"job {act.job_id}: gang broken, holds {a.num_gpus} of {want} GPUs")
        if self.queue.enabled:
            self.queue.check(rnd.plan, view, self.place)


def _no_limit(job: str) -> float | None:
    return None


def _option_for(factor: str) -> str:
    """The command-line option that configures ``factor`` (from its declaration)."""
    from ..perf.assembly import FACTORS

    for d in FACTORS.values():
        if d.name == factor and d.options:
            return f"{d.options[0].cli} (or -P {d.options[0].name}=...)"
    return f"a {factor!r} factor"


