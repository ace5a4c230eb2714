"""The throughput model: the single source of truth about speed.

``ThroughputModel.speed(job, alloc)`` answers "how fast does ``job`` run on
``alloc``", relative to its reference speed (see :mod:`gpuloom.core.job`): 1.0
means its trace duration is its run time.  It is the product of independent
*factors*, each a small object with ``__call__(job, alloc) -> float``:

* :class:`LocalityFactor` – a multi-GPU job spread over more nodes than it
  must use is slowed down by a multiplicative penalty (PAL's evaluation uses
  1.7), per model where known.  A job larger than a node already needs several
  nodes, and its measured iteration time includes that all-reduce (Muri's and
  Tiresias' traces); it pays only for spanning *more* nodes than the fewest
  that can hold it (``rule="excess"``, the default).  ``rule="any"`` charges
  every job that spans nodes (PAL's artifact).
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

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.parse import normalise_model
from ..core.plan import Allocation

DEFAULT_LOCALITY_PENALTY = 1.7


class Factor(Protocol):
    name: str

    def __call__(self, job: Job, alloc: Allocation) -> float: ...


LOCALITY_RULES = ("excess", "any")


def min_nodes(node_sizes: Sequence[int], gpus: int) -> int:
    """The fewest nodes (``node_sizes`` sorted largest first) whose GPUs add up to ``gpus``."""
    total = 0
    for i, n in enumerate(node_sizes):
        total += n
        if total >= gpus:
            return i + 1
    return max(1, len(node_sizes))


class LocalityFactor:
    """Slowdown ``1/penalty`` for a job spread over more nodes than it needs.

    ``rule="excess"`` (default): a job pays when its parts outnumber the fewest
    nodes of the cluster that could hold its GPUs (``min_nodes``; 1 for a job
    that fits on a node).  Without a cluster every multi-node job needs one
    node more than it has, i.e. the rule is ``"any"``.  ``rule="any"``: every
    job that spans nodes pays (PAL's artifact; the old behaviour).
    """

    name = "locality"

    def __init__(self, penalty: float = DEFAULT_LOCALITY_PENALTY, per_model: Mapping[str, float] | None = None,
                 cluster: Cluster | None = None, rule: str = "excess") -> None:
        if penalty < 1.0:
            raise ValueError(f"locality penalty must be >= 1, got {penalty}")
        if rule not in LOCALITY_RULES:
            raise ValueError(f"locality rule must be one of {', '.join(LOCALITY_RULES)}, got {rule!r}")
        self.penalty = penalty
        self.per_model = {normalise_model(k): v for k, v in (per_model or {}).items()}
        self.rule = rule
        self.node_sizes: tuple[int, ...] = (
            tuple(sorted((n.gpus for n in cluster.nodes), reverse=True)) if cluster is not None else ()
        )
        self._need: dict[int, int] = {}

    def penalty_for(self, model: str) -> float:
        return self.per_model.get(normalise_model(model), self.penalty) if self.per_model else self.penalty

    def needed_nodes(self, gpus: int) -> int:
        """Nodes a job of ``gpus`` GPUs must span at least (1 without a cluster or under ``rule="any"``)."""
        if self.rule == "any" or not self.node_sizes:
            return 1
        n = self._need.get(gpus)
        if n is None:
            n = self._need[gpus] = min_nodes(self.node_sizes, gpus)
        return n

    def __call__(self, job: Job, alloc: Allocation) -> float:
        k = len(alloc.parts)
        if k <= 1 or k <= self.needed_nodes(alloc.num_gpus):
            return 1.0
        return 1.0 / self.penalty_for(job.spec.model)


class ThroughputModel:
    """Product of factors.  Build with :meth:`default` or pass factors directly."""

    def __init__(self, cluster: Cluster, factors: Iterable[Factor] = ()) -> None:
        self.cluster = cluster
        self.factors: list[Factor] = list(factors)
        self._named: tuple[list[Factor], int, dict[str, Factor]] | None = None  # get()'s index, per list

    @classmethod
    def default(cls, cluster: Cluster, locality_penalty: float = DEFAULT_LOCALITY_PENALTY,
                per_model_penalty: Mapping[str, float] | None = None, locality_rule: str = "excess") -> ThroughputModel:
        return cls(cluster, [LocalityFactor(locality_penalty, per_model_penalty, cluster, locality_rule)])

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
        """The first factor named ``name`` (None if none): indexed once per factor list (placement asks
        for ``gpu_type`` on every try), again when the list is replaced or grows."""
        fs = self.factors
        c = self._named
        if c is None or c[0] is not fs or c[1] != len(fs):
            c = self._named = (fs, len(fs), {f.name: f for f in reversed(fs)})
        return c[2].get(name)

    def speed(self, job: Job, alloc: Allocation) -> float:
        s = 1.0
        for f in self.factors:
            # f.__call__ rather than f(): calling an instance goes through its type's call slot,
            # which packs the arguments into a tuple; the bound method is called like a function
            s *= f.__call__(job, alloc)
            if s <= 0.0:
                return 0.0
        return s

    def iterations_per_second(self, job: Job, alloc: Allocation) -> float:
        """Speed in iterations/s where the job's iteration time is known, else work-s/s."""
        s = self.speed(job, alloc)
        it = job.spec.iter_time
        return s / it if it else s


SpeedFn = Callable[[Job, Allocation], float]
