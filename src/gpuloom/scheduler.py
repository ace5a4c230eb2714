"""One scheduling round: order → group → size → place, then plan hooks.

The same :class:`Scheduler` object drives the simulator (:mod:`gpuloom.sim`)
and the real service (:mod:`gpuloom.runtime`): both build a
:class:`~gpuloom.policies.base.View` and receive a :class:`~gpuloom.core.plan.Plan`.

Speed: when the sizer keeps every job at its requested GPU count
(``fixed_gpus``) and there is no grouping, only the prefix of the ordered
queue whose GPU demand can fill the cluster (counted as in phase 1 of
placement) is sized and placed.  If that plan leaves GPUs free while jobs past
the prefix wait, the round is redone on the whole queue, so the result is the
same as without the shortcut.

*Plan hooks* run after placement and may amend the plan against the current
state (e.g. hysteresis: keep protected jobs where they are); each is a
callable ``hook(plan, view) -> Plan``.  :meth:`Scheduler.from_names` adds
the hooks a stage offers through an optional ``plan_hooks()`` method.  When a
hook keeps a job on its current allocation, that job's request is updated to
match, so the simulator's gang check still holds against the final plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core.job import Job, JobStatus
from .core.plan import Plan, PlanError, check_plan
from .policies import base as pb

PlanHook = Callable[[Plan, pb.View], Plan]


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
        self.last_requests: list[pb.Request] = []

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
        """Build from registry names; ``params`` go to whichever stage accepts them.

        A parameter that no stage accepts is an error naming it.
        """
        params = dict(params or {})
        chosen = {"order": order, "group": group, "size": size, "place": place}
        accepted: set[str] = set()
        for stage, name in chosen.items():
            accepted |= pb.accepted_params(stage, name)
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise pb.PolicyError(
                f"parameter(s) {', '.join(unknown)} not accepted by "
                + ", ".join(f"{s}={n}" for s, n in chosen.items())
            )
        stages = {s: pb.make(s, n, params) for s, n in chosen.items()}
        # a stage may bring plan hooks of its own (e.g. elastic sizing's hysteresis)
        hooks = [h for st in stages.values() for h in (st.plan_hooks() if hasattr(st, "plan_hooks") else ())]
        return cls(stages["order"], stages["group"], stages["size"], stages["place"], preemptive, hooks)

    @property
    def names(self) -> dict[str, str]:
        return {"order": self.order.name, "group": self.group.name, "size": self.size.name, "place": self.place.name}

    @property
    def dynamic(self) -> bool:
        """True if a round can change the plan although no job arrived or finished."""
        return bool(
            self.order.dynamic or self.group.dynamic or self.size.dynamic or self.place.dynamic or self.hooks
        )

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

    def _run(self, ordered: list[Job], view: pb.View) -> Plan:
        units = self.group.group(ordered, view)
        requests = self.size.size(units, view)
        self.last_requests = requests
        return self.size.allocate(requests, view, self.place, self.preemptive)

    def check(self, plan: Plan, view: pb.View) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` unless ``plan`` is sound for ``view``.

        :func:`~gpuloom.core.plan.check_plan` (no GPU given twice outside a group,
        no node over its cores or memory), every job holding exactly the GPUs its
        request asked for (gang), and only active jobs planned.  The simulator and
        the service run it on every round's plan.
        """
        check_plan(plan, view.cluster)
        requested: dict[str, Job] = {}
        for req in self.last_requests:
            for j in req.jobs:
                requested[j.id] = j
                a = plan.allocations.get(j.id)
                if a is not None and a.num_gpus != req.gpus:
                    raise PlanError(f"job {j.id}: gang broken, holds {a.num_gpus} of {req.gpus} GPUs")
        active: set[str] | None = None  # built only if a hook planned a job outside the requests
        for jid in plan.allocations:
            j = requested.get(jid)
            if j is not None and j.status in (JobStatus.WAITING, JobStatus.RUNNING):
                continue
            if active is None:
                active = {x.id for x in view.jobs}
            if jid not in active:
                raise PlanError(f"job {jid} planned but not active")

    def schedule(self, view: pb.View) -> Plan:
        ordered = self.order.order(view.jobs, view)
        shortcut = getattr(self.size, "fixed_gpus", False) and self.group.name == "none"
        if shortcut:
            prefix = self._prefix(ordered, view.cluster.num_gpus)
            plan = self._run(prefix, view)
            if len(prefix) < len(ordered):
                free = plan.free_gpus
                if free is None:
                    free = view.cluster.num_gpus - len({g for a in plan.allocations.values() for g in a.gpu_ids})
                if free > 0:
                    plan = self._run(ordered, view)
        else:
            plan = self._run(ordered, view)
        if self.hooks:
            placed = plan
            for hook in self.hooks:
                plan = hook(plan, view)
            if plan is not placed:
                self.last_requests = _kept_requests(self.last_requests, plan, view)
        return plan


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
