"""CPU and memory sensitivity of training jobs (Synergy, OSDI'22).

A job's *sensitivity profile* is its throughput as a function of the CPU cores
and memory it gets next to its GPUs.  This module holds

* :class:`SensitivityProfile` – a measured matrix over a (CPU, memory) grid;
* :class:`DataPipelineModel` – an analytic profile for jobs without a matrix:
  a CPU pre-processing curve combined with a dataset-cache memory model;
* :class:`Catalogue` / :func:`load_catalogue` – Synergy's measured profiles
  (``synergy/model_sensitivity_profiles.csv``) by model name and GPU count;
* :class:`SensitivityFactor` – the throughput-model factor that turns a
  profile into a speed, and :func:`add_sensitivity` to plug it in;
* :func:`demand_vector` – the best-case demand: GPUs plus the smallest CPU and
  memory that saturate throughput within a threshold.

The profile file
----------------
Each row is ``model_gpus`` (``alexnet_1``, ``res18_4``; ``shufflenet_12`` is a
12-GPU job) with ``cpus``, ``mem`` (GB), ``speedup``, ``iter_time`` and
``tput_rows``: the matrix rows separated by ``|``.  Cells may be arithmetic
expressions (``62.5*2``, ``int(62.5/3)``); they are evaluated by
:func:`gpuloom.core.parse.safe_arith` (numbers, ``+ - * / // %``, unary minus
and ``int``/``float``/``round`` – never ``eval``).  The file is parsed by
:func:`gpuloom.perf.synergy_profiles.read_profile_rows`; a malformed file raises
its :class:`~gpuloom.perf.synergy_profiles.ProfileFileError` (a
:class:`SensitivityError`) naming file, line and column.  Model names are
compared through :func:`gpuloom.core.parse.normalise_model` (``res50`` is
``ResNet-50``).

Grid axes (from Synergy's simulator, ``jobs/job.py``: ``cpu_val`` /
``mem_val``): rows are CPU cores **per GPU** ``1, 2, 3, 4, 5, 6, 9, 12, 24``;
the five columns of 1-GPU matrices are memory **per GPU**
``20.83, 62.5, 125, 187.5, 250`` GB.  Multi-GPU matrices have four columns,
the same axis without 20.83 GB (checked against the file: ``m5_2`` reaches its
``speedup`` 2.5 at ``cpus`` 6, ``mem`` 187.5 = row 5, column 2 of 4).  A zero
cell means *not measured* (mostly rows whose total CPU exceeds a 24-core
server: ``alexnet_4`` stops at 6 cores/GPU = 24 cores).

Note: the data README calls ``cpus``/``mem`` "the GPU-proportional point"; in
the file they are the *best-case demand* (the point where ``speedup`` is
reached: ``alexnet_1`` 12 cores, 125 GB → 2.94).  The GPU-proportional point
of Synergy's servers (8 GPUs, 24 cores, 500 GB) is 3 cores and 62.5 GB per
GPU, where every 1-GPU matrix reads 1.0.

Reading a matrix
----------------
* Monotone envelope: cell (i, j) holds the best measured value at or below
  (i, j) in both dimensions (a job can leave extra cores or memory unused);
  unmeasured cells therefore inherit their lower neighbours.
* Between grid points the lookup *floors* to the grid (a measured profile says
  nothing about 7 cores; 6 cores is what is known to be reached), which also
  makes the demand found by the profiler give exactly its measured value.
  Below the first CPU point throughput falls linearly to 0 at 0 cores; below
  the first memory point the first column is used.
* Speeds are relative: ``speed = tput(alloc) / tput(GPU-proportional share of
  the nodes the allocation uses)``, so 1.0 is the trace duration (see
  :mod:`gpuloom.core.job`).

GPU counts without their own matrix use the largest profiled count below
(Synergy's simulator uses the 1-GPU matrix for every count).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.parse import normalise_model
from ..core.parse import safe_arith as safe_number  # noqa: F401  (the one arithmetic evaluator, old name)
from ..core.plan import Allocation
from .model import ThroughputModel
from .synergy_profiles import ProfileFileError, SensitivityError, read_profile_rows  # noqa: F401  (re-exported)

_Point = TypeVar("_Point", int, float)

#: Synergy's CPU axis: cores per GPU of the matrix rows.
CPU_AXIS: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 9, 12, 24)
#: Memory axis (MB per GPU) of 5-column (1-GPU) matrices.
MEM_AXIS_5: tuple[float, ...] = (20_830, 62_500, 125_000, 187_500, 250_000)
#: Memory axis (MB per GPU) of 4-column (multi-GPU) matrices.
MEM_AXIS_4: tuple[float, ...] = MEM_AXIS_5[1:]
#: GPU-proportional share of a Synergy server (24 cores, 500 GB, 8 GPUs).
SYNERGY_PROPORTIONAL: tuple[float, float] = (3.0, 62_500.0)

#: Synergy's model families.
IMAGE_MODELS = ("alexnet", "res18", "res50", "mobilenet", "shufflenet")
LANGUAGE_MODELS = ("gnmt", "transformer", "lstm")
SPEECH_MODELS = ("m5", "deepspeech")
FAMILIES: dict[str, tuple[str, ...]] = {
    "image": IMAGE_MODELS,
    "language": LANGUAGE_MODELS,
    "speech": SPEECH_MODELS,
}

DEFAULT_THRESHOLD = 0.10
_EPS = 1e-9


# ---------------------------------------------------------------------------
@runtime_checkable
class CpuMemProfile(Protocol):
    """Anything that gives a job's throughput for total cores and memory (MB) on ``gpus`` GPUs."""

    def throughput_at(self, cpus: float, mem_mb: float, gpus: int) -> float: ...


def _floor_index(axis: Sequence[float], x: float) -> int:
    return bisect.bisect_right(axis, x + _EPS) - 1


@dataclass(frozen=True, eq=False)
class SensitivityProfile:
    """Throughput over a grid of cores and memory **per GPU** (see the module notes).

    ``raw`` is the matrix as measured (0 = not measured); ``tput`` its monotone
    envelope, used for every lookup.
    """

    model: str
    gpus: int
    cpu_axis: tuple[float, ...]
    mem_axis: tuple[float, ...]
    raw: np.ndarray
    best_cpus: float | None = None  # per GPU, as the file states it
    best_mem_mb: float | None = None  # per GPU
    speedup: float | None = None
    iter_time: float | None = None
    tput: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        raw = np.asarray(self.raw, dtype=float)
        name = f"profile {self.model}_{self.gpus}"
        if raw.shape != (len(self.cpu_axis), len(self.mem_axis)):
            raise SensitivityError(
                f"{name}: matrix is {raw.shape[0]}x{raw.shape[1] if raw.ndim > 1 else 0}, "
                f"axes are {len(self.cpu_axis)} CPU x {len(self.mem_axis)} memory points"
            )
        if list(self.cpu_axis) != sorted(set(self.cpu_axis)) or list(self.mem_axis) != sorted(set(self.mem_axis)):
            raise SensitivityError(f"{name}: axes must be strictly increasing")
        if self.cpu_axis[0] <= 0 or self.mem_axis[0] < 0:
            raise SensitivityError(f"{name}: axes must be positive")
        if (raw < 0).any() or not np.isfinite(raw).all():
            raise SensitivityError(f"{name}: negative or non-finite throughput")
        if not (raw > 0).any():
            raise SensitivityError(f"{name}: no measured cell")
        env = np.maximum.accumulate(np.maximum.accumulate(raw, axis=0), axis=1)
        # cells with nothing measured at or below them take the smallest measured value
        env = np.where(env > 0, env, raw[raw > 0].min())
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "tput", env)

    # -- lookups --------------------------------------------------------------
    def per_gpu(self, cpus_per_gpu: float, mem_mb_per_gpu: float) -> float:
        """Throughput at a per-GPU point (floored to the grid)."""
        j = max(0, _floor_index(self.mem_axis, mem_mb_per_gpu))
        i = _floor_index(self.cpu_axis, cpus_per_gpu)
        if i < 0:
            if cpus_per_gpu <= 0:
                return 0.0
            return float(self.tput[0, j]) * cpus_per_gpu / self.cpu_axis[0]
        return float(self.tput[i, j])

    def throughput_at(self, cpus: float, mem_mb: float, gpus: int) -> float:
        if gpus <= 0:
            return 0.0
        return self.per_gpu(cpus / gpus, mem_mb / gpus)

    def grid(self, gpus: int) -> tuple[list[int], list[int]]:
        """The grid as job totals for ``gpus`` GPUs (cores, MB)."""
        return (
            [int(round(c * gpus)) for c in self.cpu_axis],
            [int(round(m * gpus)) for m in self.mem_axis],
        )


@dataclass(frozen=True)
class DataPipelineModel:
    """Analytic profile for jobs without a measured matrix.

    Training is a pipeline fetch → pre-process (CPU) → compute (GPU); the
    slowest stage sets the pace (samples/s):

    * GPU: ``gpu_rate`` samples/s per GPU;
    * CPU curve: ``cpu_rate`` samples/s per core, linear in cores (data loaders
      scale out) up to the GPU rate;
    * memory: a MinIO-style dataset cache (CoorDL, VLDB'21, which Synergy
      builds on): items once cached are never evicted, so the hit rate is
      exactly ``min(1, mem / dataset)``; each miss fetches ``sample_mb`` from
      storage at ``storage_mb_s``, so the fetch stage delivers
      ``storage_mb_s / (miss_rate * sample_mb)`` samples/s.

    ``mem_mb`` counts the cache (the memory the job was given), per job.
    """

    gpu_rate: float
    cpu_rate: float
    dataset_mb: float
    sample_mb: float
    storage_mb_s: float

    def __post_init__(self) -> None:
        for k in ("gpu_rate", "cpu_rate", "dataset_mb", "sample_mb", "storage_mb_s"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise SensitivityError(f"data pipeline model: {k} must be > 0, got {v!r}")

    def cache_hit(self, mem_mb: float) -> float:
        return min(1.0, max(0.0, mem_mb) / self.dataset_mb)

    def io_rate(self, mem_mb: float) -> float:
        miss = 1.0 - self.cache_hit(mem_mb)
        return math.inf if miss <= 0 else self.storage_mb_s / (miss * self.sample_mb)

    def throughput_at(self, cpus: float, mem_mb: float, gpus: int) -> float:
        if gpus <= 0 or cpus <= 0:
            return 0.0
        return min(self.gpu_rate * gpus, self.cpu_rate * cpus, self.io_rate(mem_mb))

    def memory_for(self, rate: float, mem_points: Iterable[_Point]) -> _Point | None:
        """Smallest memory point at which the fetch stage delivers ``rate``."""
        for m in sorted(mem_points):
            if self.io_rate(m) >= rate * (1 - 1e-12):
                return m
        return None


# ---------------------------------------------------------------------------
class Catalogue:
    """Profiles by (model, GPU count); lookups fall back to the largest profiled count below.

    Model names are compared through :func:`~gpuloom.core.parse.normalise_model`:
    ``get("ResNet-50", 2)`` finds Synergy's ``res50_2``.
    """

    def __init__(self, profiles: Iterable[SensitivityProfile] = ()) -> None:
        self._by: dict[tuple[str, int], SensitivityProfile] = {}
        self._counts: dict[str, list[int]] = {}
        self._names: dict[str, str] = {}
        self._cache: dict[tuple[str, int], SensitivityProfile | None] = {}
        for p in profiles:
            self.add(p)

    def add(self, p: SensitivityProfile) -> None:
        key = (normalise_model(p.model), p.gpus)
        if key in self._by:
            raise SensitivityError(f"catalogue: {p.model}_{p.gpus} given twice")
        self._by[key] = p
        self._names.setdefault(key[0], p.model)
        self._counts.setdefault(key[0], []).append(p.gpus)
        self._counts[key[0]].sort()
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._by)

    def __iter__(self):  # noqa: ANN204
        return iter(self._by.values())

    @property
    def models(self) -> list[str]:
        """The models, as the profiles name them."""
        return sorted(self._names.values())

    def get(self, model: str, gpus: int) -> SensitivityProfile | None:
        """The profile for ``model`` on ``gpus`` GPUs, or ``None`` if the model is unknown."""
        ck = (model, gpus)
        if ck in self._cache:
            return self._cache[ck]
        norm = normalise_model(model)
        p = self._by.get((norm, gpus))
        if p is None:
            counts = self._counts.get(norm)
            if counts:
                below = [c for c in counts if c <= gpus]
                p = self._by[(norm, below[-1] if below else counts[0])]
        self._cache[ck] = p
        return p


def load_catalogue(path: str | Path) -> Catalogue:
    """Read Synergy's ``model_sensitivity_profiles.csv`` (see the module notes).

    Every row needs its ``tput_rows`` matrix: 9 CPU rows (:data:`CPU_AXIS`) of 5
    (1-GPU, :data:`MEM_AXIS_5`) or 4 (:data:`MEM_AXIS_4`) memory columns.  Any
    problem raises :class:`~gpuloom.perf.synergy_profiles.ProfileFileError`
    naming file, line and column.
    """
    cat = Catalogue()
    for r in read_profile_rows(path):

        def err(message: str, field: str | None = "tput_rows", r: Any = r) -> ProfileFileError:
            return ProfileFileError(message, path, r.line, field)

        if r.tput is None:
            raise err("missing: a catalogue profile needs its throughput matrix")
        if len(r.tput) != len(CPU_AXIS):
            raise err(f"{r.name} has {len(r.tput)} CPU rows, expected {len(CPU_AXIS)}")
        ncol = len(r.tput[0])
        if ncol not in (4, 5):
            raise err(f"{r.name} has {ncol} memory columns, expected 4 or 5")
        try:
            prof = SensitivityProfile(
                model=r.model,
                gpus=r.gpus,
                cpu_axis=CPU_AXIS,
                mem_axis=MEM_AXIS_5 if ncol == 5 else MEM_AXIS_4,
                raw=np.array(r.tput, dtype=float),
                best_cpus=r.cpus,
                best_mem_mb=r.mem_gb * 1000.0,
                speedup=r.speedup,
                iter_time=r.iter_time,
            )
        except SensitivityError as e:
            raise err(str(e)) from None
        try:
            cat.add(prof)  # two spellings of one model and count, e.g. res50_1 and resnet50_1
        except SensitivityError as e:
            raise err(str(e), "model_file") from None
    return cat


_FAMILY_OF: dict[str, str] = {normalise_model(m): fam for fam, names in FAMILIES.items() for m in names}


def family_of(model: str) -> str | None:
    """``"image"``, ``"language"`` or ``"speech"`` for a Synergy model (any spelling), else ``None``."""
    return _FAMILY_OF.get(normalise_model(model))


# ---------------------------------------------------------------------------
def proportional_point(cluster: Cluster | None, alloc: Allocation) -> tuple[float, float]:
    """The GPU-proportional (cores, MB) of the nodes and GPU counts of ``alloc``."""
    if cluster is None:
        g = alloc.num_gpus
        return SYNERGY_PROPORTIONAL[0] * g, SYNERGY_PROPORTIONAL[1] * g
    c = m = 0
    for p in alloc.parts:
        pc, pm = cluster.proportional(p.node, len(p.gpus))
        c += pc
        m += pm
    return float(c), float(m)


class SensitivityFactor:
    """Throughput-model factor: speed from the job's CPU/memory profile.

    The profile is ``job.spec.profile`` when that is a :class:`CpuMemProfile`,
    else the catalogue entry for the job's model and GPU count; jobs with
    neither run at 1.0 whatever CPU and memory they hold.
    """

    name = "sensitivity"

    def __init__(self, catalogue: Catalogue | None = None, cluster: Cluster | None = None) -> None:
        self.catalogue = catalogue or Catalogue()
        self.cluster = cluster

    def profile_for(self, job: Job) -> CpuMemProfile | None:
        p = job.spec.profile
        if p is not None and isinstance(p, CpuMemProfile):
            return p
        if job.spec.model:
            return self.catalogue.get(job.spec.model, job.spec.gpus)
        return None

    def relative(self, p: CpuMemProfile, cpus: float, mem_mb: float, gpus: int, ref: tuple[float, float]) -> float:
        base = p.throughput_at(ref[0], ref[1], gpus)
        if base <= 0:
            return 1.0
        return p.throughput_at(cpus, mem_mb, gpus) / base

    def __call__(self, job: Job, alloc: Allocation) -> float:
        p = self.profile_for(job)
        if p is None:
            return 1.0
        g = alloc.num_gpus
        return self.relative(p, alloc.cpus, alloc.mem_mb, g, proportional_point(self.cluster, alloc))


def add_sensitivity(model: ThroughputModel, catalogue: Catalogue | None = None) -> ThroughputModel:
    """Add (or replace) the sensitivity factor of ``model``; returns ``model``."""
    model.factors = [f for f in model.factors if f.name != "sensitivity"]
    return model.add(SensitivityFactor(catalogue, model.cluster))


# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Demand:
    """A job's best-case demand vector: GPUs, cores and MB (job totals)."""

    gpus: int
    cpus: int
    mem_mb: int


def demand_vector(
    profile: CpuMemProfile,
    gpus: int,
    cpu_points: Sequence[int],
    mem_points: Sequence[int],
    threshold: float = DEFAULT_THRESHOLD,
    floor: tuple[float, float] | None = None,
) -> Demand:
    """GPUs plus the smallest CPU, then memory, that reach the best throughput within ``threshold``.

    Searches the given grid exhaustively (the profile is known).  With
    ``floor`` (the GPU-proportional point), the demand never gives less
    throughput than that point: target = max(best / (1 + threshold), tput(floor)).
    """
    if threshold < 0:
        raise SensitivityError(f"threshold must be >= 0, got {threshold}")
    cps = sorted(set(int(c) for c in cpu_points))
    mps = sorted(set(int(m) for m in mem_points))
    if not cps or not mps:
        raise SensitivityError("demand_vector: empty CPU or memory grid")
    mmax = mps[-1]
    best = max(profile.throughput_at(c, m, gpus) for c in cps for m in mps)
    target = best / (1.0 + threshold)
    if floor is not None:
        target = max(target, profile.throughput_at(floor[0], floor[1], gpus))
    target *= 1 - 1e-12
    cpu = next((c for c in cps if profile.throughput_at(c, mmax, gpus) >= target), cps[-1])
    mem = next((m for m in mps if profile.throughput_at(cpu, m, gpus) >= target), mmax)
    return Demand(gpus, cpu, mem)


def default_grid(profile: CpuMemProfile, gpus: int, cpu_cap: int, mem_cap: int) -> tuple[list[int], list[int]]:
    """Grid to search a profile on, capped at one node: its own grid, else every core and 16 memory steps."""
    if isinstance(profile, SensitivityProfile):
        cps, mps = profile.grid(gpus)
    else:
        cps = list(range(1, cpu_cap + 1))
        mps = [int(mem_cap * k / 16) for k in range(1, 17)]
    cps = [c for c in cps if c <= cpu_cap] or [cpu_cap]
    mps = [m for m in mps if m <= mem_cap] or [mem_cap]
    return cps, mps
