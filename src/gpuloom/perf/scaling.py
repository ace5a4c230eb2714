"""Scaling curves f(R): how fast a job runs on R GPUs (F-scheduling), and slowdown fairness.

A :class:`ScalingCurve` maps a GPU count ``n`` on one node (and, where known,
``(n, nodes)``) to a throughput in the job's *iterations per second*.  Between
known counts it interpolates linearly; above the largest known count it stays
flat (no speed-up is assumed that was not measured); below the smallest count
with a positive value, and at counts listed as 0, it is 0: the job cannot run
there (too little GPU memory, a model that needs 2 GPUs, ...).  ``(n, k)``
entries with ``k > 1`` nodes are used as given; where a count is only known on
one node, ``f(n, k) = f(n, 1)`` and the model's locality factor charges the
spread (do not combine measured multi-node entries with
:class:`~gpuloom.perf.model.LocalityFactor`, or the penalty is counted twice).

Where curves come from, first match wins:

1. the job spec: ``JobSpec.attrs["throughput"]``, a mapping ``{gpus: it/s}``
   (keys may also be ``"gpus"``, ``"gpusxnodes"`` strings or ``(gpus, nodes)``
   tuples) or a list ``[f(1), f(2), ...]``;
2. the built-in catalogue, by model name (``resnet50``, ``ResNet-50`` and
   ``res50`` are the same model); see :data:`BUILTIN`.

Built-in curves (iterations/s, "an iteration" = one per-GPU mini-batch, so an
``n``-GPU data-parallel step counts ``n`` iterations), derived from the
profiles in ``../shared/data`` by the ``*_curves`` functions below (the tests
re-derive them from the files and compare):

* ``tiresias``: Tiresias' 60-job trace (``tiresias/60_job.csv``) gives, per
  model and GPU count, ``iterations / duration`` (whole-job steps/s); times the
  GPU count this is f(n) at 1, 2, 4, 8 GPUs for ten CNNs (ResNet-50/101/152,
  InceptionV3/V4, VGG11/16/19, AlexNet, GoogLeNet).  These are parameter-server
  measurements: the 1 → 2 GPU step gains little (VGG and AlexNet even lose),
  4 and 8 GPUs scale again.  The primary source: it is the one catalogue with
  both ResNet-50 and InceptionV3, measured on one testbed.
* ``pal``: PAL/Blox's measured single-job speeds (``pal/blox/raw_single.csv``,
  data-parallel rows): ResNet-50, VGG19, DCGAN, PointNet at 1, 2, 4, 8 GPUs
  (used for DCGAN and PointNet, absent from Tiresias).
* ``synergy``: Synergy's profiles (``synergy/model_sensitivity_profiles.csv``)
  give seconds per iteration at the GPU-proportional CPU/memory point for 1, 2,
  4 (and 12) GPUs; f(n) = n / iter_time(n) (weak scaling, one mini-batch per
  GPU).  Nearly linear; used for the models no other catalogue has.

Slowdown and unfairness (F-scheduling): ``S_j = f_j(R_j) / f_j(U)`` where U is
the whole cluster (:func:`slowdown`); f(U) is read as the best the job can do
with the whole cluster at its disposal, max over n <= |U| of f(n), which is
f(|U|) for non-decreasing curves and stays meaningful for rigid jobs and
curves that fall (VGG, AlexNet in the Tiresias data).  Unfairness is the
variance of the running jobs' slowdowns (:func:`unfairness`).

:class:`ScalingFactor` (name ``"scaling"``) is the throughput-model factor:
``speed = f(alloc GPUs, alloc nodes) / f(requested GPUs)`` so that a job's
work stays in reference seconds (its duration at its requested GPU count).
Jobs without a curve are *rigid* by default: speed 1 at their requested
count, 0 (cannot run) elsewhere; ``fallback="linear"`` assumes f(n) ∝ n instead.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job, JobError, JobSpec
from ..core.parse import normalise_model
from ..core.plan import Allocation
from .synergy_profiles import read_profile_rows


class ScalingError(ValueError):
    """A malformed throughput table; the message names the job or file and the entry."""


class ScalingCurve:
    """Throughput in iterations/s as a function of GPUs (and nodes, where known)."""

    __slots__ = ("source", "_n", "_v", "_multi", "_cache")

    def __init__(
        self,
        points: Mapping[int, float],
        multi_node: Mapping[tuple[int, int], float] | None = None,
        source: str = "",
    ) -> None:
        where = source or "throughput table"
        if not points:
            raise ScalingError(f"{where}: needs at least one single-node (gpus -> it/s) point")
        for n, v in list(points.items()) + [(k[0], v) for k, v in (multi_node or {}).items()]:
            if not isinstance(n, (int, np.integer)) or n < 1:
                raise ScalingError(f"{where}: GPU count {n!r} must be an integer >= 1")
            if not isinstance(v, (int, float, np.number)) or not math.isfinite(v) or v < 0:
                raise ScalingError(f"{where}: throughput at {n} GPUs must be a finite number >= 0, got {v!r}")
        for (n, k) in (multi_node or {}):
            if not isinstance(k, (int, np.integer)) or k < 1 or k > n:
                raise ScalingError(f"{where}: {n} GPUs on {k!r} nodes is impossible")
        ns = sorted(int(n) for n in points)
        self._n = np.array(ns, dtype=np.int64)
        self._v = np.array([float(points[n]) for n in ns], dtype=float)
        self._multi = {(int(n), int(k)): float(v) for (n, k), v in (multi_node or {}).items() if k > 1}
        self.source = source
        self._cache: dict[tuple[int, int], float] = {}

    # -- construction from user input ----------------------------------------
    @classmethod
    def parse(cls, table: Any, where: str = "throughput") -> ScalingCurve:
        """Read a user table: ``{gpus: tput}`` (keys int, ``"4"``, ``"4x2"``, ``(4, 2)``) or ``[f(1), f(2), ...]``."""
        single: dict[int, float] = {}
        multi: dict[tuple[int, int], float] = {}
        if isinstance(table, ScalingCurve):
            return table
        if isinstance(table, (list, tuple)):
            items: Iterable[tuple[Any, Any]] = ((i + 1, v) for i, v in enumerate(table))
        elif isinstance(table, Mapping):
            items = table.items()
        else:
            raise ScalingError(f"{where}: expected a mapping {{gpus: it/s}} or a list, got {type(table).__name__}")
        for key, val in items:
            try:
                if isinstance(key, tuple):
                    n, k = int(key[0]), int(key[1])
                elif isinstance(key, str) and "x" in key.lower():
                    a, b = key.lower().split("x", 1)
                    n, k = int(a), int(b)
                else:
                    n, k = int(key), 1
                v = float(val)
            except (TypeError, ValueError, IndexError):
                raise ScalingError(f"{where}: bad entry {key!r}: {val!r}") from None
            if k == 1:
                single[n] = v
            else:
                multi[(n, k)] = v
        return cls(single, multi, where)

    @classmethod
    def linear(cls, per_gpu: float = 1.0, max_gpus: int = 1) -> ScalingCurve:
        return cls({1: per_gpu, max(1, max_gpus): per_gpu * max(1, max_gpus)}, source="linear")

    # -- evaluation ------------------------------------------------------------
    @property
    def points(self) -> dict[int, float]:
        return {int(n): float(v) for n, v in zip(self._n, self._v, strict=True)}

    @property
    def min_gpus(self) -> int:
        """Smallest GPU count with a positive throughput (0 if none)."""
        pos = np.flatnonzero(self._v > 0)
        return int(self._n[pos[0]]) if pos.size else 0

    @property
    def max_known(self) -> int:
        return int(self._n[-1])

    def best(self, upto: int) -> float:
        """max f(n) over 1 <= n <= ``upto`` (single-node values; the curve is piecewise linear,
        so the maximum is at a known point or at ``upto``)."""
        known = self._v[self._n <= upto]
        return max(float(known.max()) if known.size else 0.0, self._single(upto))

    def __call__(self, gpus: int, nodes: int = 1) -> float:
        key = (gpus, nodes)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if nodes > 1 and key in self._multi:
            val = self._multi[key]
        else:
            val = self._single(gpus)
        self._cache[key] = val
        return val

    def _single(self, n: int) -> float:
        if n < 1:
            return 0.0
        ns, vs = self._n, self._v
        i = int(np.searchsorted(ns, n))
        if i < len(ns) and ns[i] == n:
            return float(vs[i])
        pos = vs > 0
        if not pos.any() or n < ns[pos][0]:
            return 0.0
        pn, pv = ns[pos], vs[pos]
        if n >= pn[-1]:
            return float(pv[-1])
        return float(np.interp(n, pn, pv))

    def __repr__(self) -> str:
        return f"ScalingCurve({self.points}, source={self.source!r})"


# ---------------------------------------------------------------------------
# built-in catalogue (derived from ../shared/data; see the module docstring)

#: tiresias/60_job.csv: f(n) = n * mean(iterations / duration) per (model, n)
TIRESIAS: dict[str, dict[int, float]] = {
    "alexnet": {1: 18.354, 2: 7.429, 4: 10.937, 8: 17.983},
    "googlenet": {1: 7.138, 2: 14.271, 4: 28.562, 8: 57.128},
    "inception3": {1: 4.305, 2: 4.529, 4: 8.468, 8: 16.696},
    "inception4": {1: 2.093, 2: 2.472, 4: 4.721, 8: 9.333},
    "resnet101": {1: 3.844, 2: 4.264, 4: 7.683, 8: 15.168},
    "resnet152": {1: 2.696, 2: 3.097, 4: 5.691, 8: 11.107},
    "resnet50": {1: 6.524, 2: 6.667, 4: 12.062, 8: 23.714},
    "vgg11": {1: 6.405, 2: 3.164, 4: 4.727, 8: 7.238},
    "vgg16": {1: 4.241, 2: 3.032, 4: 4.562, 8: 7.467},
    "vgg19": {1: 3.695, 2: 3.023, 4: 4.661, 8: 7.207},
}
#: pal/blox/raw_single.csv, data-parallel rows: measured speed per (model, n)
PAL: dict[str, dict[int, float]] = {
    "resnet50": {1: 14.41, 2: 30.39, 4: 55.18, 8: 111.92},
    "vgg19": {1: 13.27, 2: 26.5, 4: 52.05, 8: 102.98},
    "dcgan": {1: 56.65, 2: 104.82, 4: 200.85, 8: 372.51},
    "pointnet": {1: 1.33, 2: 3.01, 4: 11.85, 8: 22.98},
}
#: synergy/model_sensitivity_profiles.csv: f(n) = n / iter_time(n), 4 decimals
SYNERGY: dict[str, dict[int, float]] = {
    "alexnet": {1: 1.6667, 2: 3.3333, 4: 6.6667},
    "bert": {1: 90.9091},
    "deepspeech": {1: 1.321, 2: 2.642, 4: 5.284},
    "gnmt": {1: 8.3333, 2: 16.6667, 4: 33.3333},
    "lstm": {1: 90.9091, 2: 181.8182, 4: 363.6364},
    "m5": {1: 1.6667, 2: 3.3333, 4: 6.6667},
    "mobilenet": {1: 1.4085, 2: 2.8169, 4: 5.6338},
    "resnet18": {1: 1.5625, 2: 3.125, 4: 6.25},
    "resnet50": {1: 1.2821, 2: 2.5641, 4: 5.1282},
    "shufflenet": {1: 1.626, 2: 3.252, 4: 6.5041, 12: 19.5122},
    "transformer": {1: 1.4925, 2: 2.9851, 4: 4.0404},
    "vae": {1: 90.9091},
}
CATALOGUES: dict[str, dict[str, dict[int, float]]] = {"tiresias": TIRESIAS, "pal": PAL, "synergy": SYNERGY}
#: catalogues searched, in order, for a model without a user table
DEFAULT_ORDER = ("tiresias", "pal", "synergy")

#: ``"ResNet-50 (batch size 64)"`` → ``"resnet50"``; ``"InceptionV3"`` → ``"inception3"``: the
#: project's one model-name normalisation (:func:`gpuloom.core.parse.normalise_model`).
canonical_model = normalise_model


_BUILTIN_CACHE: dict[tuple[str, str], ScalingCurve | None] = {}


def builtin_curve(model: str, sources: Sequence[str] = DEFAULT_ORDER) -> ScalingCurve | None:
    """The first built-in curve for ``model`` in ``sources`` order, or None."""
    key = (normalise_model(model), ",".join(sources))
    if key in _BUILTIN_CACHE:
        return _BUILTIN_CACHE[key]
    out = None
    for src in sources:
        if src not in CATALOGUES:
            raise ScalingError(f"unknown curve catalogue {src!r}; choose from {', '.join(CATALOGUES)}")
        pts = CATALOGUES[src].get(key[0])
        if pts:
            out = ScalingCurve(pts, source=f"{src}:{key[0]}")
            break
    _BUILTIN_CACHE[key] = out
    return out


def spec_curve(spec: JobSpec, sources: Sequence[str] = DEFAULT_ORDER) -> ScalingCurve | None:
    """The job's own table (``attrs["throughput"]``) if any, else a built-in curve by model name."""
    table = spec.attrs.get("throughput") if spec.attrs else None
    if table is not None:
        return ScalingCurve.parse(table, f"job {spec.id}: attrs['throughput']")
    if spec.model:
        return builtin_curve(spec.model, sources)
    return None


def curve_for(job: Job, sources: Sequence[str] = DEFAULT_ORDER) -> ScalingCurve | None:
    """Like :func:`spec_curve`, cached on the job (``job.extra["scaling_curve"]``)."""
    ex = job.extra
    if "scaling_curve" in ex:
        return ex["scaling_curve"]
    c = spec_curve(job.spec, sources)
    ex["scaling_curve"] = c
    return c


# ---------------------------------------------------------------------------
# slowdown fairness

def cluster_throughput(curve: ScalingCurve, cluster: Cluster) -> float:
    """f(U): the job's best throughput given the whole cluster, max f(n) for n <= all its GPUs.

    For a non-decreasing curve this is f(all GPUs); for a job that slows down
    past some size (or runs at one size only) it is its best size, which it
    could pick if it had the cluster to itself.
    """
    return curve.best(cluster.num_gpus)


def slowdown(curve: ScalingCurve, gpus: int, cluster: Cluster, nodes: int = 1) -> float:
    """S = f(R) / f(U); 0 where the job cannot run on R or on U."""
    fu = cluster_throughput(curve, cluster)
    return curve(gpus, nodes) / fu if fu > 0 else 0.0


def unfairness(slowdowns: Sequence[float] | np.ndarray) -> float:
    """Variance (population) of the running jobs' slowdowns; 0 for fewer than two jobs."""
    a = np.asarray(slowdowns, dtype=float)
    return float(a.var()) if a.size > 1 else 0.0


# ---------------------------------------------------------------------------
class ScalingFactor:
    """Throughput-model factor ``f(alloc) / f(requested)`` (see the module docstring)."""

    name = "scaling"

    def __init__(self, sources: Sequence[str] = DEFAULT_ORDER, fallback: str = "rigid") -> None:
        if fallback not in ("rigid", "linear"):
            raise ValueError(f"scaling fallback must be 'rigid' or 'linear', got {fallback!r}")
        for s in sources:
            if s not in CATALOGUES:
                raise ScalingError(f"unknown curve catalogue {s!r}; choose from {', '.join(CATALOGUES)}")
        self.sources = tuple(sources)
        self.fallback = fallback
        self._ratios: dict[tuple[ScalingCurve, int, int, int], float] = {}  # (see __call__)

    def curve(self, job: Job) -> ScalingCurve | None:
        return curve_for(job, self.sources)

    def reference(self, job: Job) -> float:
        """f(requested GPUs): what speed 1.0 stands for."""
        c = self.curve(job)
        if c is None:
            return 1.0
        ref = c(job.spec.gpus)
        if ref <= 0:
            raise JobError(
                f"job {job.id}: its throughput curve ({c.source}) is 0 at its requested {job.spec.gpus} GPUs"
            )
        return ref

    def throughput(self, job: Job, gpus: int, nodes: int = 1) -> float:
        """Iterations/s of ``job`` on ``gpus`` GPUs over ``nodes`` nodes (its curve, or the fallback)."""
        c = self.curve(job)
        if c is not None:
            return c(gpus, nodes)
        return self._fallback_speed(job, gpus) * self._fallback_rate(job)

    def _fallback_rate(self, job: Job) -> float:
        it = job.spec.iter_time
        return 1.0 / it if it else 1.0

    def _fallback_speed(self, job: Job, gpus: int) -> float:
        req = job.spec.gpus
        if self.fallback == "linear":
            return gpus / req
        return 1.0 if gpus == req else 0.0

    def cluster_throughput(self, job: Job, cluster: Cluster) -> float:
        """f(U) for ``job`` (see :func:`cluster_throughput`), with the fallback for jobs without a curve."""
        c = self.curve(job)
        if c is not None:
            return cluster_throughput(c, cluster)
        g = cluster.num_gpus
        best = g if self.fallback == "linear" else (job.spec.gpus if job.spec.gpus <= g else 0)
        return self._fallback_speed(job, best) * self._fallback_rate(job) if best else 0.0

    def speed_at(self, job: Job, gpus: int, nodes: int = 1) -> float:
        c = self.curve(job)
        if c is None:
            return self._fallback_speed(job, gpus)
        return c(gpus, nodes) / self.reference(job)

    def __call__(self, job: Job, alloc: Allocation) -> float:
        # speed_at, its ratio kept by curve, GPUs, nodes and requested GPUs (the driver rates every job
        # it starts, moves or regroups: few distinct answers, read again and again)
        gpus = alloc.num_gpus
        c = self.curve(job)
        if c is None:
            return self._fallback_speed(job, gpus)
        key = (c, gpus, len(alloc.parts), job.spec.gpus)
        v = self._ratios.get(key)
        if v is None:
            v = c(gpus, key[2]) / self.reference(job)
            if len(self._ratios) > 100_000:
                self._ratios.clear()
            self._ratios[key] = v
        return v


# ---------------------------------------------------------------------------
# deriving the catalogues from the data files (tests compare them with the tables above)

def tiresias_curves(path: str | Path) -> dict[str, dict[int, float]]:
    """f(n) = n * mean(iterations / duration) per (model, n) from a Tiresias job CSV."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(list)
    path = Path(path)
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            try:
                n = int(row["num_gpu"])
                acc[(row["model_name"], n)].append(int(row["iterations"]) / float(row["duration"]))
            except (KeyError, ValueError, ZeroDivisionError) as e:
                raise ScalingError(f"{path}:{i}: {e}") from None
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (m, n), v in sorted(acc.items()):
        out[normalise_model(m)][n] = round(n * sum(v) / len(v), 3)
    return dict(out)


def pal_curves(path: str | Path) -> dict[str, dict[int, float]]:
    """Measured speed per (model, n) from PAL/Blox's ``raw_single.csv`` (rows without a pipeline strategy)."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    path = Path(path)
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            if row.get("pipeline_strategy", "NA") != "NA":
                continue
            try:
                out[normalise_model(row["model"])][int(row["gpu_num"])] = float(row["speed"])
            except (KeyError, ValueError) as e:
                raise ScalingError(f"{path}:{i}: {e}") from None
    return dict(out)


def synergy_curves(path: str | Path) -> dict[str, dict[int, float]]:
    """f(n) = n / iter_time(n) from Synergy's ``model_sensitivity_profiles.csv`` (``model_n`` rows).

    The file is read by :func:`gpuloom.perf.synergy_profiles.read_profile_rows` (its
    :class:`~gpuloom.perf.synergy_profiles.ProfileFileError` names file, line and column);
    rows without an ``iter_time`` give no point.
    """
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for r in read_profile_rows(path):
        if r.iter_time is not None:
            out[normalise_model(r.model)][r.gpus] = round(r.gpus / r.iter_time, 4)
    return dict(out)


#: samples in one global step of the F-scheduling thesis' jobs, split over the job's GPUs
THESIS_SAMPLES_PER_STEP = 90
#: per-GPU mini-batch of the weak-scaling measurements (Tiresias' CNN benchmarks); an assumption:
#: the 60-job trace does not record batch sizes
WEAK_SCALING_BATCH = 32


def strong_scaling_curve(
    weak: ScalingCurve, samples_per_step: float = THESIS_SAMPLES_PER_STEP, batch: float = WEAK_SCALING_BATCH,
    max_gpus: int = 8,
) -> dict[int, float]:
    """Global steps/s on n GPUs when each step's ``samples_per_step`` are split over the GPUs.

    ``weak`` is a weak-scaling curve (per-GPU mini-batches of ``batch`` samples,
    f(n) = n / step time).  Its step time T(n) = n / f(n) is compute on one
    mini-batch, T(1), plus synchronisation, T(n) - T(1).  A strong-scaling step
    computes ``samples_per_step / n`` samples per GPU, at the same per-sample
    cost, and synchronises the same gradients:
    ``g(n) = 1 / ((samples_per_step / (n batch)) T(1) + T(n) - T(1))``.
    """
    if not samples_per_step > 0 or not batch > 0:
        raise ScalingError("samples per step and batch must be > 0")
    if weak(1) <= 0:
        raise ScalingError(f"{weak.source}: no throughput on 1 GPU")
    t1 = 1.0 / weak(1)
    out = {}
    for n in range(1, max_gpus + 1):
        f = weak(n)
        if f <= 0:
            out[n] = 0.0
            continue
        out[n] = 1.0 / (samples_per_step / (n * batch) * t1 + max(0.0, n / f - t1))
    return out
