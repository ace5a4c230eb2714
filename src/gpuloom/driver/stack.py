"""A policy stack: the one route from options to a scheduler and a throughput model.

``gpuloom simulate``, ``compare`` (and its worker processes) and ``serve`` all
describe what to run as a :class:`Stack`: the stage names, preemption,
``-P`` parameters and model options.  :meth:`Stack.scheduler` builds the
scheduler (parameters routed to stages by :func:`~gpuloom.policies.check.route_params`),
:meth:`Stack.model` the throughput model (:func:`~gpuloom.perf.assembly.build_model`);
``-P`` names that are model options (:data:`~gpuloom.perf.assembly.MODEL_OPTIONS`)
configure the model, every other one a stage.  The driver then binds the two
(:meth:`~gpuloom.scheduler.Scheduler.bind`), adding factors a stage requires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..core.reservations import Reservation
from ..perf.assembly import build_model, split_params
from ..perf.model import ThroughputModel
from ..policies.base import STAGE_DEFAULTS
from ..scheduler import Scheduler


def trace_policy_params(names: Mapping[str, str], given: Mapping[str, Any],
                        specs: Sequence[JobSpec]) -> dict[str, Any]:
    """The ``stage.name`` parameters a trace's source ran it with (:func:`~gpuloom.perf.assembly.trace_options`)
    that the chosen policy of that stage takes and that ``given`` does not set (bare or qualified)."""
    if not specs:
        return {}
    from ..perf.assembly import MODEL_OPTIONS, trace_options
    from ..policies.base import accepted_params

    out: dict[str, Any] = {}
    for key, value in trace_options(specs).items():
        stage, dot, name = key.partition(".")
        if key in MODEL_OPTIONS or not dot or stage not in names or name in given or key in given:
            continue
        if name in accepted_params(stage, names[stage]):
            out[key] = value
    return out


@dataclass(slots=True)
class Stack:
    order: str = STAGE_DEFAULTS["order"]
    group: str = STAGE_DEFAULTS["group"]
    size: str = STAGE_DEFAULTS["size"]
    place: str = STAGE_DEFAULTS["place"]
    preemptive: bool = True
    #: ``-P`` items: policy parameters (bare or ``stage.name``) and model options, mixed
    params: dict[str, Any] = field(default_factory=dict)
    #: model options given as flags (``--profiles``, ``--locality-penalty``, ...); ``-P`` wins
    model_options: dict[str, Any] = field(default_factory=dict)
    #: the queue stage (:mod:`gpuloom.policies.queues`): ``none``, ``quota``, ``drf``, ``fairshare``
    queue: str = STAGE_DEFAULTS["queue"]
    #: reservations for this many waiting jobs (:mod:`gpuloom.policies.backfill`); 0: none
    reserve_depth: int = 0
    #: advance reservations (:mod:`gpuloom.core.reservations`) the backfill hook keeps
    reservations: list[Reservation] = field(default_factory=list)

    @property
    def names(self) -> dict[str, str]:
        out = {"order": self.order, "group": self.group, "size": self.size, "place": self.place}
        if self.queue != "none":
            out["queue"] = self.queue
        return out

    @property
    def label(self) -> str:
        return "/".join(self.names.values())

    def split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(policy parameters, model options)."""
        policy, model = split_params(self.params)
        return policy, {**{k: v for k, v in self.model_options.items() if v is not None}, **model}

    def scheduler(self, specs: Sequence[JobSpec] = ()) -> Scheduler:
        """The scheduler; ``specs``' own policy parameters (:func:`trace_policy_params`) where none is given."""
        policy, _ = self.split()
        policy = {**trace_policy_params(self.names, policy, specs), **policy}
        sched = Scheduler.from_names(self.order, self.group, self.size, self.place, self.preemptive, policy,
                                     self.queue)
        if self.reserve_depth or self.reservations:
            sched.reserve(self.reserve_depth).reservations = list(self.reservations)
        return sched

    def model(self, cluster: Cluster, seed: int | None = None, specs: Sequence[JobSpec] = ()) -> ThroughputModel:
        _, opts = self.split()
        if seed is not None:
            opts.setdefault("seed", seed)
        return build_model(cluster, opts, specs)

    def build(self, cluster: Cluster, seed: int | None = None,
              specs: Sequence[JobSpec] = ()) -> tuple[Scheduler, ThroughputModel]:
        """Scheduler and model, bound (the stages' required factors added)."""
        sched = self.scheduler(specs)
        model = self.model(cluster, seed, specs)
        sched.bind(model)
        return sched, model
