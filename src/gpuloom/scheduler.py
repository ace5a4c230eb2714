"""One scheduling round: order → queue → group → size → place, then plan hooks.

Which shortcuts a round may take is chosen from the stages' declarations by
:class:`~gpuloom.policies.fastpath.FastPaths`; ``-P`` routing is
:func:`~gpuloom.policies.check.route_params`.

The same :class:`Scheduler` object drives the simulator (:mod:`gpuloom.sim`)
and the real service (:mod:`gpuloom.runtime`), both through the driver
(:mod:`gpuloom.driver`): it builds a :class:`~gpuloom.policies.base.View`
and receives a :class:`Round`, the plan together with the requests it answers,
so :meth:`Scheduler.check` reads nothing left behind by an earlier call.

**Binding.**  :meth:`Scheduler.bind` checks the stages' declared needs
(``requires_factors``) against a throughput model before the first round:
missing factors are added (their declared default) or, with ``strict`` or when
there is no default (node topologies), refused naming the stage, the factor and
the option that gives it.  Both faces bind through the driver.

**Parameters.**  :meth:`Scheduler.from_names` takes ``-P`` style parameters:
``stage.name`` goes to that stage only; a bare ``name`` to the one chosen stage
that accepts it.  A bare name two chosen stages accept is ambiguous (an error
that lists the qualified forms) unless every one of them declares it shared
(``shared_params``: static slots); a name no chosen stage accepts is an error
that lists the accepted names.

Speed: when the sizer keeps every job at its requested GPU count
(``fixed_gpus``) and the group policy does not merge jobs (``merges``), only the prefix of the ordered
queue whose GPU demand can fill the cluster (counted as in phase 1 of
placement) is sized and placed.  If that plan leaves GPUs free while jobs past
the prefix wait, the round is redone on the whole queue, so the result is the
same as without the shortcut.

**Pending reasons.**  A round also says why each active job it leaves waiting
waits (``Round.reasons``, Slurm's REASON column): ``Resources`` when the GPUs
the plan leaves free are fewer than it asks for, ``Priority`` when enough are
free but jobs ahead of it hold it back (a strict queue, a non-preemptive
order), ``Placement`` when free GPUs exist but no placement of its gang does
(fragmentation, consolidation).  A stage may give its own reasons
(:meth:`~gpuloom.policies.base.Stage.pending_reasons`: a queue at its quota,
say), which take precedence.

**Queues.**  With a queue stage (:mod:`gpuloom.policies.queues`) the
pipeline runs on what it admits, guaranteed jobs first; lent GPUs are
reclaimed in the same round (:meth:`Scheduler._queued`: two passes, then
eviction for what a queue is still owed), the stage enforces its limits after
the hooks, and :meth:`Scheduler.check` runs its invariants.

*Plan hooks* (:meth:`~gpuloom.policies.base.Stage.plan_hooks`) run after
placement and may amend the plan against the current state (e.g. hysteresis:
keep protected jobs where they are); each is a callable ``hook(plan, view) ->
Plan``.  When a hook keeps a job on its current allocation, that job's request
is updated to match, so the gang check still holds against the final plan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .core.cluster import Cluster
from .core.job import Job, Shape
from .core.plan import Action, Allocation, Part, Plan, PlanError, changes, check_actions, check_plan, drop_job
from .perf.model import ThroughputModel
from .policies import base as pb
from .policies.backfill import Backfill
from .policies.check import route_params
from .policies.fastpath import FastPaths
from .policies.free import FreeState
from .policies.incremental import TailWalk, appended_plan, prefix_plan
from .policies.queue_base import Admission, Owed, QueuePolicy
from .policies.queue_book import Walk

PlanHook = pb.PlanHook


class RequirementError(pb.PolicyError):
    """A stage needs something the throughput model lacks; the message names both."""


#: pending reasons the scheduler gives on its own (stages may add theirs)
RESOURCES, PRIORITY, PLACEMENT = "Resources", "Priority", "Placement"


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


class Scheduler:
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

    def _hooked(self, rnd: Round, view: pb.View, hooks: Sequence[PlanHook] | None = None) -> Round:
        hooks = self.hooks if hooks is None else hooks
        if hooks:
            placed = plan = rnd.plan
            for hook in hooks:
                plan = hook(plan, view)
            if plan is not placed:
                rnd = Round(plan, _kept_requests(rnd.requests, plan, view))
        return rnd

    def _all_fit(self, view: pb.View) -> Round | None:
        """The round when every active job fits by GPU count (:meth:`~gpuloom.policies.fastpath.FastPaths.all_fit`)."""
        out = self.fast.all_fit(view)
        return None if out is None else Round(*out)

    # -- the queue stage (policies/queues.py) -------------------------------------------------
    def _queued(self, ordered: Sequence[Job], view: pb.View, lazy: bool = False) -> Round:
        """Admit across queues, plan the admitted jobs, reclaim lent GPUs, hooks, limits.

        Reclaim happens where a queue below its guarantee has a waiting job
        while borrowed (tier B) work holds GPUs.  First, if a guaranteed job was
        left out, the round is planned again in two passes (:meth:`_two_pass`).
        Then every job the queue stage still owes a place (a waiting job that
        fits its queue's unused guarantee, in the queue's order:
        :meth:`~gpuloom.policies.base.QueuePolicy.owed`) is placed by the place
        policy on what the non-borrowed jobs leave, evicting the borrowed work
        in its way (:meth:`_evict_for`).  So a guaranteed job that fits nowhere
        (the guaranteed jobs fragment the cluster) does not keep its queue's
        smaller jobs from the guarantee.  A plan hook may undo a reclaim (it
        keeps running jobs where they are) for one round; a queue still owed
        after the hooks in the next round too reclaims over the hook.
        """
        q = self.queue
        strict = not self.place.backfill
        adm = q.admit(ordered, view, strict, lazy=lazy)
        rnd = self._admitted_round(adm, view, lazy)
        one_pass = rnd
        whole = False  # planned again on the walk gone on whole
        if adm.paused is not None:
            # the lazy walk waits at its bound (Admission.paused), where it would be cut short: with GPUs left
            # free and jobs past it, it goes on as the whole walk (the same jobs up to here, then the rest) and
            # the round is planned again on it, as admitting again whole would; else it stops there
            if adm.paused and self.walk_whole and _free_gpus(rnd.plan, view) > 0 and q.read_whole(adm):
                rnd = one_pass = self._admitted_round(adm, view, lazy)
                whole = True
            else:
                adm.finish()
        # GPUs left free while the walk was cut short: plan again on everything.  (A lazy walk that placement
        # stopped reading before it stopped itself becomes the whole walk where it is: the plan is the whole
        # walk's, QueuePolicy.read_whole)
        if (not whole and _free_gpus(rnd.plan, view) > 0
                and (adm.truncated or (adm.walk is not None and adm.walk.more is not None))
                and not (self.walk_whole and q.read_whole(adm))):
            adm = q.admit(ordered, view, strict, full=True, lazy=lazy)
            rnd = one_pass = self._admitted_round(adm, view, lazy)
        # (the borrowing jobs placed are among those the walk read)
        if adm.over and any(j.id in rnd.plan.allocations for j in adm.over):
            if _left_out_while_lent(adm, rnd.plan):
                rnd = self._two_pass(adm, view, lazy)
                q.note_reclaim()
            owed = q.owed(rnd.plan, view)
            if owed:
                rnd = self._evict_for(owed, rnd, view)
        rnd = self._hooked(rnd, view)
        if self.hooks and adm.over:
            # a hook (elastic sizing's protection) may keep borrowed work where an owner's job should go:
            # for one round; a queue owed after the hooks two rounds running reclaims over the hook
            owed = q.owed(rnd.plan, view)
            again = q.owed_again(owed)
            if again:
                rnd = self._evict_for(again, rnd, view, {o.queue for o in owed})
                # a lender the reclaim left below its guarantee is owed from this round on
                q.owed_again(q.owed(rnd.plan, view))
        elif self.hooks:
            q.owed_again(())  # nothing borrowed: nothing owed this round (two rounds running means in a row)
        plan = q.enforce(rnd.plan, view)
        # one pass whose prefix filled the cluster (_walked), kept as it was: a round on its plan plans it again,
        # so the next may only backfill the jobs admitted meanwhile (_queued_appended)
        settled = rnd is one_pass and plan is rnd.plan and rnd.full
        q.settled(settled)
        rnd = rnd if plan is rnd.plan else Round(plan, rnd.requests)
        rnd.full = settled
        return rnd

    def _queued_appended(self, view: pb.View) -> Round | None:
        """The round when only ``view.appended`` jobs were admitted since a settled queue round
        (:meth:`_queued`) and the queue stage admits them after every other
        (:meth:`~gpuloom.policies.queue_base.QueuePolicy.appended`): the whole walk would redo the last
        round's steps on the plan it left and then backfill the new jobs, as without queues
        (:func:`~gpuloom.policies.incremental.appended_plan`).  That round would also reclaim for a queue
        owed GPUs, or in two passes for a guaranteed job left out while the new jobs borrow: None then
        (the whole round is planned)."""
        q, appended = self.queue, view.appended or ()
        if not q.appended(appended, view):
            return None
        size = self.size
        plan, requests = appended_plan(appended, lambda j: size.request(j, view), self.place, view)
        placed = [j for j in appended if j.id in plan.allocations]
        if q.owed(plan, view) or (placed and not q.all_guaranteed_placed(plan)):
            q.settled(False)
            return None
        q.note_appended(placed)
        return Round(plan, requests, full=True)

    def _admitted_round(self, adm: Admission, view: pb.View, lazy: bool) -> Round:
        """The plan of what the queue stage admitted: through :func:`~gpuloom.policies.incremental.prefix_plan`
        over the lazy walk (placement reads admission only as far as it needs: :meth:`_walked`) when
        ``lazy``, else by :meth:`_plan`."""
        walk = adm.walk
        if lazy and walk is not None and walk.more is not None:  # (a lazy walk not read yet)
            if not self.walk_whole:
                return self._walked(walk, view, None)
            tails: list[TailWalk] = []
            q = self.queue

            def go_on() -> bool:
                # the walk waits at its bound (Admission.paused) while placement backfills past its prefix:
                # what is free then is what the plan leaves free if the walk stops there (the backfill ends, the
                # jobs not kept were released before).  With GPUs free and jobs left past the bound the round
                # would admit again whole and plan again; the walk goes on whole instead and placement reads on:
                # up to here it read what it reads of the whole walk, in the same state
                free = tails[0].free if tails else None
                return bool(adm.paused) and free is not None and free.free_gpus > 0 and q.read_whole(adm)

            walk.go_on = go_on
            try:
                return self._walked(walk, view, None, tails)
            finally:
                walk.go_on = None
        return self._plan(adm.ordered, view)

    def _queue_walk_ok(self, view: pb.View) -> bool:
        """The queue stage's admission may be read lazily and placed through
        :func:`~gpuloom.policies.incremental.prefix_plan`: what :meth:`_prefix_round` asks of the stack, with
        FIFO (the stage then reads its jobs per queue as the driver admitted them) and borrowing allowed."""
        place, tally, order = self.place, view.tally, self.order
        return (self.walk_queues and self.preemptive and not self.hooks and not place.arranges
                and place.pure_choose and place.backfill and tally is not None and not tally.unkeyed
                and tally.index_order and order.keyed and order.follows_view
                and self.fast.ready(view, queues=True))

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
                            if a is not None and gpus.intersection(a.gpu_ids):
                                drop(b)
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

    def _two_pass(self, adm: Admission, view: pb.View, lazy: bool = False) -> Round:
        """Plan tier A alone on the whole cluster, then everything with tier A pinned where it landed.

        The second pass sees tier A's jobs as running on their first-pass
        allocations and borrowed work as running only where tier A left its GPUs
        free (the rest looks waiting: its ``alloc`` is hidden for the pass), so
        sticky placement keeps what the owners took and lent GPUs are reclaimed.
        Placement that is not sticky re-places everything, tier A first, as the
        first pass did.

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
    from .perf.assembly import FACTORS

    for d in FACTORS.values():
        if d.name == factor and d.options:
            return f"{d.options[0].cli} (or -P {d.options[0].name}=...)"
    return f"a {factor!r} factor"


def _left_out_while_lent(adm: Admission, plan: Plan) -> bool:
    """A guaranteed job is not in ``plan`` while borrowed work is."""
    allocs = plan.allocations
    return any(j.id not in allocs for j in adm.guaranteed) and any(j.id in allocs for j in adm.over)



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


def _free_gpus(plan: Plan, view: pb.View) -> int:
    free = plan.free_gpus
    if free is None:
        used = {g for a in plan.allocations.values() for g in a.gpu_ids}
        if view.blocked is not None and view.blocked.held:  # (and those work outside the plan holds)
            used.update(g for p in view.blocked.held for g in p.gpus)
        free = view.cluster.num_gpus - len(used)
    return free


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
