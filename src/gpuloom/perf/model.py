"""The throughput model: the single source of truth about speed.

``ThroughputModel.speed(job, alloc)`` answers "how fast does ``job`` run on
``alloc``", relative to its reference speed (see :mod:`gpuloom.core.job`): 1.0
means its trace duration is its run time.  It is the product of independent
*factors*, each a small object with ``__call__(job, alloc) -> float``:

* :class:`LocalityFactor` – a multi-GPU job spread over several nodes is slowed
  down by a multiplicative penalty (PAL's evaluation uses 1.7), per model where
  known.
* :class:`~gpuloom.perf.interleave.InterleaveFactor` – a job sharing GPUs
  with a group (Muri) runs at its solo iteration time over the group's
  interleaved iteration time; 1.0 for a job alone (switched on by
  :func:`gpuloom.perf.assembly.build_model`).  Factors that must see other jobs
  (this one: the co-runners' stage profiles) have a ``bind(jobs)`` method;
  the simulator calls :meth:`ThroughputModel.bind` with its id → Job table.
* further factors plug in the same way: CPU/memory sensitivity (Synergy),
  per-GPU variability and topology cost (PAL, YARN-8821), scaling curves f(N)
  (F-scheduling).

Policies ask the model (to compare candidate allocations), the simulator uses
it to advance jobs, the runtime refines what it knows from measurements.  No
other module invents speeds.  A factor returning 0 means the job cannot run on
that allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.parse import normalise_model
from ..core.plan import Allocation

DEFAULT_LOCALITY_PENALTY = 1.7


class Factor(Protocol):
    name: str

    def __call__(self, job: Job, alloc: Allocation) -> float: ...


class LocalityFactor:
    """Slowdown ``1/penalty`` for a job whose GPUs span more than one node."""

    name = "locality"

    def __init__(self, penalty: float = DEFAULT_LOCALITY_PENALTY, per_model: Mapping[str, float] | None = None) -> None:
        if penalty < 1.0:
            raise ValueError(f"locality penalty must be >= 1, got {penalty}")
        self.penalty = penalty
        self.per_model = {normalise_model(k): v for k, v in (per_model or {}).items()}

    def penalty_for(self, model: str) -> float:
        return self.per_model.get(normalise_model(model), self.penalty) if self.per_model else self.penalty

    def __call__(self, job: Job, alloc: Allocation) -> float:
        if len(alloc.parts) <= 1:
            return 1.0
        return 1.0 / self.penalty_for(job.spec.model)


class ThroughputModel:
    """Product of factors.  Build with :meth:`default` or pass factors directly."""

    def __init__(self, cluster: Cluster, factors: Iterable[Factor] = ()) -> None:
        self.cluster = cluster
        self.factors: list[Factor] = list(factors)

    @classmethod
    def default(cls, cluster: Cluster, locality_penalty: float = DEFAULT_LOCALITY_PENALTY,
                per_model_penalty: Mapping[str, float] | None = None) -> ThroughputModel:
        return cls(cluster, [LocalityFactor(locality_penalty, per_model_penalty)])

    def bind(self, jobs: Mapping[str, Job]) -> None:
        """Give every factor that looks at other jobs (has ``bind``) the id → Job table."""
        for f in self.factors:
            b = getattr(f, "bind", None)
            if callable(b):
                b(jobs)

    def add(self, factor: Factor) -> ThroughputModel:
        self.factors.append(factor)
        return self

    def get(self, name: str) -> Factor | None:
        for f in self.factors:
            if f.name == name:
                return f
        return None

    def speed(self, job: Job, alloc: Allocation) -> float:
        s = 1.0
        for f in self.factors:
            s *= f(job, alloc)
            if s <= 0.0:
                return 0.0
        return s

    def iterations_per_second(self, job: Job, alloc: Allocation) -> float:
        """Speed in iterations/s where the job's iteration time is known, else work-s/s."""
        s = self.speed(job, alloc)
        it = job.spec.iter_time
        return s / it if it else s


SpeedFn = Callable[[Job, Allocation], float]
