"""One scheduling round: order → group → size → place, then plan hooks.

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
(``fixed_gpus``) and there is no grouping, only the prefix of the ordered
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

*Plan hooks* (:meth:`~gpuloom.policies.base.Stage.plan_hooks`) run after
placement and may amend the plan against the current state (e.g. hysteresis:
keep protected jobs where they are); each is a callable ``hook(plan, view) ->
Plan``.  When a hook keeps a job on its current allocation, that job's request
is updated to match, so the gang check still holds against the final plan.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .core.job import Job
from .core.plan import Plan, PlanError, check_plan
from .perf.model import ThroughputModel
from .policies import base as pb

PlanHook = pb.PlanHook


class RequirementError(pb.PolicyError):
    """A stage needs something the throughput model lacks; the message names both."""


#: pending reasons the scheduler gives on its own (stages may add theirs)
RESOURCES, PRIORITY, PLACEMENT = "Resources", "Priority", "Placement"


@dataclass(slots=True)
class Round:
    """A round's decision: the plan, the requests (one per unit) it answers, and why jobs wait."""

    plan: Plan
    requests: list[pb.Request] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


class Scheduler:
    def __init__(
        self,
        order: pb.OrderPolicy,
        group: pb.GroupPolicy,
        size: pb.SizePolicy,
        place: pb.PlacePolicy,
        preemptive: bool = True,
        hooks: Sequence[PlanHook] = (),
    ) -> None:
        self.order = order
        self.group = group
        self.size = size
        self.place = place
        self.preemptive = preemptive
        self.hooks = list(hooks)

    @classmethod
    def from_names(
        cls,
        order: str = "fifo",
        group: str = "none",
        size: str = "proportional",
        place: str = "packed-sticky",
        preemptive: bool = True,
        params: Mapping[str, Any] | None = None,
    ) -> Scheduler:
        """Build from registry names; ``params`` (bare or ``stage.name``) go to the stage that takes them."""
        chosen = {"order": order, "group": group, "size": size, "place": place}
        per_stage = route_params(chosen, params or {})
        stages = {s: pb.make(s, n, per_stage[s]) for s, n in chosen.items()}
        # a stage may bring plan hooks of its own (e.g. elastic sizing's hysteresis)
        hooks = [h for st in stages.values() for h in st.plan_hooks()]
        return cls(stages["order"], stages["group"], stages["size"], stages["place"], preemptive, hooks)

    @property
    def stages(self) -> tuple[pb.Stage, ...]:
        return (self.order, self.group, self.size, self.place)

    @property
    def names(self) -> dict[str, str]:
        return {"order": self.order.name, "group": self.group.name, "size": self.size.name, "place": self.place.name}

    @property
    def label(self) -> str:
        """``order/group/size/place`` (the full stack, for titles)."""
        return "/".join(self.names.values())

    @property
    def dynamic(self) -> bool:
        """True if a round can change the plan although no job arrived or finished."""
        return any(st.dynamic for st in self.stages) or bool(self.hooks)

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
    def _prefix(self, ordered: list[Job], capacity: int) -> list[Job]:
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

    def _run(self, ordered: list[Job], view: pb.View) -> Round:
        units = self.group.group(ordered, view)
        requests = self.size.size(units, view)
        return Round(self.size.allocate(requests, view, self.place, self.preemptive), requests)

    def schedule(self, view: pb.View) -> Round:
        ordered = self.order.order(view.jobs, view)
        if self.size.fixed_gpus and self.group.name == "none":
            prefix = self._prefix(ordered, view.cluster.num_gpus)
            rnd = self._run(prefix, view)
            if len(prefix) < len(ordered):
                free = rnd.plan.free_gpus
                if free is None:
                    free = view.cluster.num_gpus - len({g for a in rnd.plan.allocations.values() for g in a.gpu_ids})
                if free > 0:
                    rnd = self._run(ordered, view)
        else:
            rnd = self._run(ordered, view)
        if self.hooks:
            placed = plan = rnd.plan
            for hook in self.hooks:
                plan = hook(plan, view)
            if plan is not placed:
                rnd = Round(plan, _kept_requests(rnd.requests, plan, view))
        rnd.reasons = self.reasons(rnd, view, ordered)
        return rnd

    def reasons(self, rnd: Round, view: pb.View, ordered: Sequence[Job]) -> dict[str, str]:
        """Why each active job the plan leaves out waits (see the module notes)."""
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
            elif j.id in asked and self.place.backfill and self.preemptive:
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


def route_params(chosen: Mapping[str, str], params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split ``-P`` parameters by stage (see the module notes); errors name the parameter."""
    accepted = {s: pb.accepted_params(s, n) for s, n in chosen.items()}
    out: dict[str, dict[str, Any]] = {s: {} for s in chosen}
    problems: list[str] = []
    for key, value in params.items():
        stage, dot, name = key.partition(".")
        if dot:
            if stage not in chosen:
                problems.append(f"{key!r}: unknown stage {stage!r} (stages: {', '.join(chosen)})")
            elif name not in accepted[stage]:
                problems.append(f"{key!r}: {stage} policy {chosen[stage]!r} takes {_listing(accepted[stage])}"
                                + _did_you_mean(name, accepted[stage]))
            else:
                out[stage][name] = value
            continue
        takers = [s for s in chosen if key in accepted[s]]
        if len(takers) == 1 or (takers and all(key in pb.lookup(s, chosen[s]).shared_params for s in takers)):
            for s in takers:
                out[s][key] = value
        elif takers:
            problems.append(f"{key!r} is taken by several stages: give {' or '.join(f'{s}.{key}' for s in takers)}")
        else:
            from .policies.check import _takers

            every = set().union(*accepted.values())
            others = _takers(key)
            problems.append(f"{key!r} is not taken by " + ", ".join(f"{s}={n}" for s, n in chosen.items())
                            + f" (they take {_listing(every)})" + _did_you_mean(key, every)
                            + (f"; {key} is a parameter of {', '.join(others)}" if others else ""))
    if problems:
        raise pb.PolicyError("parameter " + "; ".join(problems))
    return out


def _option_for(factor: str) -> str:
    """The command-line option that configures ``factor`` (from its declaration)."""
    from .perf.assembly import FACTORS

    for d in FACTORS:
        if d.name == factor and d.options:
            return f"{d.options[0].cli} (or -P {d.options[0].name}=...)"
    return f"a {factor!r} factor"


def _listing(names: set[str]) -> str:
    return ", ".join(sorted(names)) if names else "no parameters"


def _did_you_mean(name: str, names: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _kept_requests(requests: list[pb.Request], plan: Plan, view: pb.View) -> list[pb.Request]:
    """A hook that keeps a job on its current allocation changes that job's request to match
    (so the gang check compares with what the final plan asks for)."""
    out = []
    for r in requests:
        a = plan.allocations.get(r.job.id)
        if a is not None and a.num_gpus != r.gpus and view.current.get(r.job.id) == a:
            r = pb.Request(r.jobs, a.num_gpus, r.cpus, r.mem_mb)
        out.append(r)
    return out
