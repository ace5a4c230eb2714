"""Synthetic workloads: Poisson arrivals, sampled GPU demands and durations, a model mix.

``generate(num_jobs, jobs_per_hour, seed, ...)`` draws

* **arrivals** from a Poisson process of ``jobs_per_hour``: exponential gaps of
  mean ``3600 / jobs_per_hour`` seconds, the first job one gap after ``start``;
* **(GPUs, duration) jointly per job**: either a uniformly drawn job of
  ``sample_from`` (a loaded trace: its pair, and its model unless ``models`` is
  given), or GPUs from ``gpu_dist`` and then a duration from ``duration_dist``
  *given those GPUs* (durations and GPU counts are correlated in real traces:
  in Philly the geometric-mean duration of 8-15-GPU jobs is 19 times that of 1-GPU jobs);
* **models** from ``models`` (name -> weight, normalised).

Everything comes from one ``numpy.random.Generator(PCG64(seed))`` drawn in a
fixed order, so a seed gives the same jobs on every machine.

Built-in distribution (used when neither ``sample_from`` nor the argument is given):

* GPU demand :data:`PHILLY_LIKE_GPUS` = ``{1: .7, 2: .1, 4: .1, 8: .1}``, the
  Philly-like mix Gavel and Blox generate with.  (The real Philly list is more
  single-GPU: 93.2 % 1, 2.2 % 2, 2.3 % 4, 2.0 % 8, 0.35 % more.)
* Durations :data:`PHILLY_DURATIONS`: log-normal per GPU count, ``ln d ~
  N(mu, sigma)`` fitted (maximum likelihood: mean and standard deviation of
  ``ln duration``) on the 82,247 jobs of ``sia/philly_jobs.csv``, each job in
  the bucket of the largest key at or below its GPU count (as sampling does):

  ======  =====  =====  ======  ==================
  GPUs    mu     sigma  jobs    fit median e^mu
  ======  =====  =====  ======  ==================
  1       6.719  1.972  76,627  828 s
  2       4.522  3.268  1,818   92 s
  4       9.106  2.781  1,870   2.5 h
  8-15    9.642  2.792  1,650   4.3 h
  >= 16   8.996  3.221  282     2.2 h
  ======  =====  =====  ======  ==================

  A GPU count between buckets uses the bucket at or below it.  Samples are
  clipped to ``[60 s, 14 days]`` by default (``LogNormalByGpus.low/high``).

``builtin_workload(seed)`` is the scenario ``gpuloom simulate`` runs with no
trace: 200 jobs at 20 jobs/h (about 10 hours of arrivals) on the built-in mix
with durations clipped to ``[60 s, 2.5 h]``: about 2.5 GPU-hours per job, so an
offered load of about 80 % of a 16 x 4 cluster (measured over 20,000 jobs; the
same fit clipped at 8 h would offer 1.8x the cluster), with queues in bursts; and
:data:`BUILTIN_MODELS` as the model mix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..core.job import JobSpec

__all__ = [
    "BUILTIN_MODELS",
    "PHILLY_DURATIONS",
    "PHILLY_LIKE_GPUS",
    "DurationDist",
    "LogNormalByGpus",
    "builtin_workload",
    "generate",
]

PHILLY_LIKE_GPUS: dict[int, float] = {1: 0.7, 2: 0.1, 4: 0.1, 8: 0.1}

BUILTIN_MODELS: dict[str, float] = {
    "resnet50": 0.3, "vgg19": 0.2, "bert": 0.2, "gpt2": 0.1, "dcgan": 0.1, "pointnet": 0.1,
}


class DurationDist(Protocol):
    """Durations in seconds for jobs with the given GPU counts (one per entry of ``gpus``)."""

    def sample(self, rng: np.random.Generator, gpus: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class LogNormalByGpus:
    """``ln d ~ N(mu, sigma)`` with (mu, sigma) chosen by GPU count (bucket at or below), clipped."""

    params: Mapping[int, tuple[float, float]]
    low: float = 60.0
    high: float = 14 * 86400.0
    _keys: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.params:
            raise ValueError("LogNormalByGpus needs at least one (mu, sigma)")
        for g, (_mu, sigma) in self.params.items():
            if g < 1 or not sigma >= 0:
                raise ValueError(f"bad log-normal bucket {g}: sigma must be >= 0 and GPUs >= 1")
        if not 0 < self.low <= self.high:
            raise ValueError(f"need 0 < low <= high, got {self.low}, {self.high}")
        object.__setattr__(self, "_keys", np.array(sorted(self.params), dtype=np.int64))

    def sample(self, rng: np.random.Generator, gpus: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self._keys, gpus, side="right") - 1
        idx[idx < 0] = 0
        table = np.array([self.params[int(k)] for k in self._keys], dtype=float)
        z = rng.standard_normal(len(gpus))
        d = np.exp(table[idx, 0] + table[idx, 1] * z)
        return np.clip(d, self.low, self.high)

    def clipped(self, low: float, high: float) -> LogNormalByGpus:
        return LogNormalByGpus(self.params, low, high)


PHILLY_DURATIONS = LogNormalByGpus({
    1: (6.719, 1.972),
    2: (4.522, 3.268),
    4: (9.106, 2.781),
    8: (9.642, 2.792),
    16: (8.996, 3.221),
})


def _weights(dist: Mapping, what: str) -> tuple[list, np.ndarray]:
    keys = list(dist)
    w = np.array([float(dist[k]) for k in keys], dtype=float)
    if not keys or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"{what} weights must be finite, >= 0 and not all 0: {dict(dist)}")
    return keys, w / w.sum()


def generate(
    num_jobs: int = 100,
    jobs_per_hour: float = 20.0,
    seed: int = 0,
    sample_from: Sequence[JobSpec] | None = None,
    models: Mapping[str, float] | None = None,
    gpu_dist: Mapping[int, float] | None = None,
    duration_dist: DurationDist | None = None,
    start: float = 0.0,
    prefix: str = "job",
) -> list[JobSpec]:
    """``num_jobs`` jobs with Poisson arrivals at ``jobs_per_hour``; see the module docstring."""
    if num_jobs < 0:
        raise ValueError(f"num_jobs must be >= 0, got {num_jobs}")
    if not (math.isfinite(jobs_per_hour) and jobs_per_hour > 0):
        raise ValueError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"start must be a time >= 0, got {start}")
    if sample_from is not None and (gpu_dist is not None or duration_dist is not None):
        raise ValueError("sample_from gives (GPUs, duration) pairs: do not also pass gpu_dist or duration_dist")
    rng = np.random.Generator(np.random.PCG64(seed))
    n = num_jobs
    arrivals = start + np.cumsum(rng.exponential(3600.0 / jobs_per_hour, n))
    sampled_models: list[str] | None = None
    if sample_from is not None:
        pool = list(sample_from)
        if not pool:
            raise ValueError("sample_from is empty")
        pick = rng.integers(0, len(pool), n)
        gpus = np.array([pool[i].gpus for i in pick], dtype=np.int64)
        durs = np.array([pool[i].duration for i in pick], dtype=float)
        sampled_models = [pool[i].model for i in pick]
    else:
        keys, w = _weights(PHILLY_LIKE_GPUS if gpu_dist is None else gpu_dist, "gpu_dist")
        if any(not isinstance(k, int | np.integer) or k < 1 for k in keys):
            raise ValueError(f"gpu_dist keys must be GPU counts >= 1: {keys}")
        gpus = np.array(keys, dtype=np.int64)[rng.choice(len(keys), n, p=w)]
        durs = np.asarray((PHILLY_DURATIONS if duration_dist is None else duration_dist).sample(rng, gpus), dtype=float)
        if durs.shape != (n,) or not (durs > 0).all():
            raise ValueError("duration_dist must give one duration > 0 per job")
    if models is not None or sampled_models is None:
        names, mw = _weights(BUILTIN_MODELS if models is None else models, "models")
        chosen = rng.choice(len(names), n, p=mw)
        named = [str(x) for x in names]  # one string per model, shared by its jobs
        model_of = [named[i] for i in chosen.tolist()]
    else:
        model_of = sampled_models
    width = len(str(max(n - 1, 0)))
    at, gs, ds = np.asarray(arrivals, dtype=float).tolist(), np.asarray(gpus).tolist(), durs.tolist()
    return [
        JobSpec(f"{prefix}-{i:0{width}d}", at[i], int(gs[i]), ds[i], model=model_of[i])
        for i in range(n)
    ]


def builtin_workload(seed: int = 0) -> list[JobSpec]:
    """The default scenario of ``gpuloom simulate``: 200 jobs, 20 jobs/h, sized for a 16 x 4 cluster."""
    return generate(200, 20.0, seed, duration_dist=PHILLY_DURATIONS.clipped(60.0, 2.5 * 3600.0))
