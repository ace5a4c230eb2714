"""GPU performance variability (PAL, SC'24): PM-scores, application classes, binning.

Identical GPUs do not run at the same speed, and the spread depends on the
application: compute-bound training (ResNet-50) varies by up to ~12 % on
Longhorn's V100s, memory-bound kernels (PageRank) by well under 1 %.  PAL
captures this with three pieces, all here:

**PM-scores.**  A GPU's PM-score for an application class is its iteration
time divided by the cluster median for that class, so 1.0 is a median GPU and
1.1 a GPU 10 % slower.  :class:`PMScores` holds a ``(G, 4)`` array (GPU x class
A-D).  Sources:

* :func:`load_variability_csv` - PAL's measured table of 32 GPUs
  (``PerfVar_classA..D`` columns, ``Node_ID``);
* :func:`load_aggregate` - a per-run measurement file (``*-agg.csv``: TACC
  Longhorn V100, Frontera RTX5000, Lonestar6 A100).  Every such file has a
  time-like ``perf`` column (median iteration or kernel time of one run); a GPU
  is keyed ``cabinet-node-device``, its time is the median over its runs and
  its PM-score that time over the median of all GPUs in the file;
* :func:`generate_pm_scores` - draws scores for a cluster of any size from the
  measured distributions: for every class (source per class from
  ``class_profiles.json``: A = ResNet, B and C = BERT, D = PageRank on
  Longhorn) each cluster node receives the GPUs of one measured node drawn
  uniformly with replacement (more nodes are concatenated when the cluster's
  nodes hold more GPUs than the measured ones).  Drawing whole nodes keeps the
  measured within-node correlation (PAL's node 7 is slow on all four GPUs).
  Classes are drawn independently: the sources were measured on mostly
  different GPUs (20 GPUs are common to all three Longhorn files).  The drawn
  scores are renormalised to the generated cluster's median, so the
  definition "time / cluster median" holds exactly.  Seeded, deterministic.
  Two choices are parameters because they decide how wide the spread is:
  ``per_gpu`` - a GPU's measured time is the median of its runs (default) or
  its slowest run (``"max"``); ``draw`` - whole measured nodes (default) or
  every GPU independently (``"gpu"``).  PAL's artifact simulates with
  ``per_gpu="max", draw="gpu"``: the slowest run of a GPU includes one-off
  slow runs, so class A (ResNet on Longhorn) then spans 0.95-1.21 between
  the 5th and 95th percentile with a tail to 3.41, against 0.97-1.06 and a
  maximum of 1.12 for the per-GPU median (and 1.117 in PAL's own measured
  32-GPU table).  See ``docs/pal.md`` for what this does to the evaluation.

**Application classes.**  :func:`fit_app_classes` runs 2-D k-means on
(DRAM throughput, SM throughput) profiles and orders the clusters from
compute-bound to memory-bound by the centroid's share of DRAM,
``dram / (dram + sm)``: class A is the most compute-bound.  A new
application falls into the nearest centroid (:meth:`AppClassifier.classify`).
Known models map directly (:data:`MODEL_CLASSES`): ResNet-50, VGG19, DCGAN ->
A; BERT, GPT2 -> B; PointNet -> C; memory-bound (PageRank) -> D.  Extended for
the models in the Sia, PAL, Gavel and Muri traces by architecture:
convolutional image models (ResNet-18, ImageNet, CIFAR-10, YOLOv3, CycleGAN,
Inception, SGEMM) -> A; transformer and recurrent language/speech models
(Transformer, LM, DeepSpeech2) -> B; point-cloud models -> C; embedding-heavy
recommendation (NCF, DLRM, "recommendation") -> D.  (PAL's artifact, when it
reads the Sia-Philly traces for its simulations, maps differently:
ResNet-50 -> A, BERT, GPT2 and DCGAN -> B, VGG19 -> C, PointNet -> D; that
mapping is :data:`ARTIFACT_MODEL_CLASSES`, usable as ``model_classes=`` of
:class:`VariabilityFactor`.  We follow the paper's classes by default.)  A job may name its class in ``JobSpec.attrs["pal_class"]``
("A".."D" or "classA"..); an unknown model gets ``default_class`` ("A", as in
the artifact: assume the worst variability).

**Binning.**  Per class, :func:`bin_scores` clusters the GPUs' scores with
1-D k-means: outliers (above mean + 3 sigma) are binned separately, the
number of bins among the rest is chosen by the best silhouette score over
k = 2..10 (computed exactly in O(n) per k with prefix sums, clusters in 1-D
being contiguous runs of the sorted scores); a bin's level is its centroid
divided by the median centroid (PAL).  A class whose scores are flat (5-95 %
spread under ``flat_tol`` = 0.5 %) and the memory-bound class D are one bin.

**Throughput.**  :class:`VariabilityFactor` (factor name ``"variability"``):
a data-parallel job synchronises every iteration, so it runs at the pace of
its slowest GPU: ``speed = 1 / max(PM-score of its GPUs for its class)``.
The measured (unbinned) scores drive speed; placement policies read the
binned levels from the same factor (:mod:`gpuloom.policies.pal`), so one set
of scores drives both.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.plan import Allocation
from .model import ThroughputModel

CLASSES = ("A", "B", "C", "D")
CLASS_INDEX = {c: i for i, c in enumerate(CLASSES)}


class VariabilityError(ValueError):
    """Unusable variability data; the message names the file, line or value."""


def _norm_model(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


#: Known models -> class (keys normalised: lower case, letters and digits only).
MODEL_CLASSES: dict[str, str] = {
    # A: compute-bound convolutional models (and dense GEMM)
    **dict.fromkeys(
        ["resnet50", "resnet", "resnet18", "resnet101", "vgg19", "vgg16", "vgg", "dcgan", "imagenet",
         "cifar10", "yolov3", "yolo", "cyclegan", "inception", "inceptionv3", "sgemm"], "A"),
    # B: transformer / recurrent language and speech models
    **dict.fromkeys(
        ["bert", "bertbase", "bertlarge", "gpt2", "gpt2medium", "gpt2xl", "gpt", "transformer", "lm",
         "deepspeech2", "deepspeech"], "B"),
    # C: point-cloud models
    **dict.fromkeys(["pointnet", "pointnet2"], "C"),
    # D: memory-bound
    **dict.fromkeys(["pagerank", "ncf", "dlrm", "recommendation"], "D"),
}


#: The classes PAL's artifact gives the Sia-Philly models when it simulates
#: (its trace reader), which differ from the paper's for VGG19, DCGAN and PointNet.
ARTIFACT_MODEL_CLASSES: dict[str, str] = {
    "resnet50": "A", "bert": "B", "gpt2": "B", "dcgan": "B", "vgg19": "C", "pointnet": "D",
}


def parse_class(value: object, where: str = "class") -> int:
    """``"A"``, ``"classA"`` or ``0..3`` -> class index; anything else is an error naming it."""
    if isinstance(value, (int, np.integer)) and 0 <= int(value) < len(CLASSES):
        return int(value)
    s = str(value).strip()
    if s.lower().startswith("class"):
        s = s[5:]
    s = s.upper()
    if s in CLASS_INDEX:
        return CLASS_INDEX[s]
    raise VariabilityError(f"{where}: unknown application class {value!r} (use A, B, C or D)")


def model_class(model: str, default: str = "A") -> str:
    return MODEL_CLASSES.get(_norm_model(model), default)


# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PMScores:
    """PM-scores of ``G`` GPUs for the four classes: ``scores[g, c]`` (1.0 = median GPU)."""

    scores: np.ndarray  # (G, 4) float64
    source: str = ""

    def __post_init__(self) -> None:
        s = np.asarray(self.scores, dtype=np.float64)
        if s.ndim != 2 or s.shape[1] != len(CLASSES) or s.shape[0] == 0:
            raise VariabilityError(f"{self.source or 'PM-scores'}: expected a (GPUs, 4) array, got {s.shape}")
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise VariabilityError(f"{self.source or 'PM-scores'}: scores must be finite and > 0")
        object.__setattr__(self, "scores", s)

    @property
    def num_gpus(self) -> int:
        return int(self.scores.shape[0])

    def for_class(self, cls: str | int) -> np.ndarray:
        return self.scores[:, parse_class(cls)]

    def check_cluster(self, cluster: Cluster) -> None:
        if self.num_gpus != cluster.num_gpus:
            raise VariabilityError(
                f"{self.source or 'PM-scores'}: scores for {self.num_gpus} GPUs, the cluster has "
                f"{cluster.num_gpus} (generate scores for this cluster instead)"
            )


def load_variability_csv(path: str | Path) -> PMScores:
    """PAL's per-GPU table: one row per GPU with ``PerfVar_classA..D`` (rows in GPU order)."""
    path = Path(path)
    cols = [f"PerfVar_class{c}" for c in CLASSES]
    rows: list[list[float]] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in cols if c not in (reader.fieldnames or [])]
        if missing:
            raise VariabilityError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, r in enumerate(reader, start=2):
            try:
                vals = [float(r[c]) for c in cols]
            except (TypeError, ValueError):
                raise VariabilityError(f"{path}:{line}: non-numeric PM-score in {[r.get(c) for c in cols]}") from None
            if not all(math.isfinite(v) and v > 0 for v in vals):
                raise VariabilityError(f"{path}:{line}: PM-scores must be > 0, got {vals}")
            rows.append(vals)
    if not rows:
        raise VariabilityError(f"{path}: no GPU rows")
    return PMScores(np.array(rows), str(path))


@dataclass(frozen=True)
class MeasuredGPUs:
    """Per-GPU PM-scores of one application measured on one cluster (from an ``*-agg.csv``)."""

    keys: tuple[str, ...]  # cabinet-node-device
    nodes: tuple[str, ...]  # cabinet-node
    scores: np.ndarray  # (n,), median-normalised
    source: str = ""

    def by_node(self) -> list[np.ndarray]:
        groups: dict[str, list[float]] = defaultdict(list)
        for n, _k, s in sorted(zip(self.nodes, self.keys, self.scores.tolist(), strict=True)):
            groups[n].append(s)
        return [np.array(v) for _, v in sorted(groups.items())]


PER_GPU_STATS = ("median", "max")


def load_aggregate(path: str | Path, perf_column: str = "perf", per_gpu: str = "median") -> MeasuredGPUs:
    """Per-GPU PM-scores from a per-run file: ``per_gpu`` of ``perf`` per GPU over the median GPU.

    ``per_gpu="median"`` (default) is the GPU's typical run; ``"max"`` its
    slowest run, which is what PAL's artifact keeps when it reduces a file to
    one row per GPU (``idxmax`` of ``perf`` per ``uuid``) for its simulations.
    """
    if per_gpu not in PER_GPU_STATS:
        raise VariabilityError(f"{path}: per_gpu must be one of {', '.join(PER_GPU_STATS)}, got {per_gpu!r}")
    path = Path(path)
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        need = {"cabinet", "node", "device", perf_column}
        missing = sorted(need - set(reader.fieldnames or []))
        if missing:
            raise VariabilityError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, r in enumerate(reader, start=2):
            try:
                node = f"{r['cabinet'].strip()}-{int(float(r['node']))}"
                dev = int(float(r["device"]))
                perf = float(r[perf_column])
            except (TypeError, ValueError):
                raise VariabilityError(f"{path}:{line}: bad cabinet/node/device/{perf_column} value") from None
            if not math.isfinite(perf) or perf <= 0:
                continue  # failed run
            runs[(node, f"{node}-{dev}")].append(perf)
    if not runs:
        raise VariabilityError(f"{path}: no usable runs")
    items = sorted(runs.items())
    reduce = np.median if per_gpu == "median" else np.max
    med = np.array([float(reduce(v)) for _, v in items])
    return MeasuredGPUs(
        tuple(k for (_, k), _ in items), tuple(n for (n, _), _ in items), med / float(np.median(med)), str(path)
    )


def load_class_profiles(variability_dir: str | Path, per_gpu: str = "median") -> dict[str, MeasuredGPUs]:
    """Class -> measured source, following ``class_profiles.json`` in ``variability_dir``."""
    d = Path(variability_dir)
    pj = d / "class_profiles.json"
    try:
        spec = json.loads(pj.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise VariabilityError(f"{pj}: {e}") from None
    out: dict[str, MeasuredGPUs] = {}
    cache: dict[Path, MeasuredGPUs] = {}
    for c in CLASSES:
        ref = spec.get(f"class{c}")
        if ref is None:
            raise VariabilityError(f"{pj}: no entry for class{c}")
        # the artifact writes paths as aggregated_data/<cluster>/<file>; keep the last two parts
        p = d.joinpath(*Path(ref).parts[-2:])
        if p not in cache:
            if not p.exists():
                raise VariabilityError(f"{pj}: class{c} refers to {ref}, not found as {p}")
            cache[p] = load_aggregate(p, per_gpu=per_gpu)
        out[c] = cache[p]
    return out


DRAWS = ("node", "gpu")


def generate_pm_scores(
    gpus_per_node: Sequence[int], profiles: Mapping[str, MeasuredGPUs], seed: int = 0, draw: str = "node"
) -> PMScores:
    """Scores for a cluster whose node ``i`` has ``gpus_per_node[i]`` GPUs.

    ``draw="node"`` (default) gives every node the GPUs of one measured node;
    ``draw="gpu"`` draws every GPU independently from all measured GPUs of the
    class (PAL's artifact), which loses the within-node correlation.
    """
    if draw not in DRAWS:
        raise VariabilityError(f"generate: draw must be one of {', '.join(DRAWS)}, got {draw!r}")
    rng = np.random.default_rng(seed)
    total = int(sum(gpus_per_node))
    if total <= 0 or any(g < 0 for g in gpus_per_node):
        raise VariabilityError(f"generate: bad node sizes {list(gpus_per_node)}")
    out = np.empty((total, len(CLASSES)))
    for ci, c in enumerate(CLASSES):
        if c not in profiles:
            raise VariabilityError(f"generate: no measured source for class {c}")
        if draw == "gpu":
            measured = profiles[c].scores
            v = measured[rng.integers(measured.size, size=total)]
        else:
            nodes = profiles[c].by_node()
            col: list[np.ndarray] = []
            for g in gpus_per_node:
                got: list[float] = []
                while len(got) < g:
                    got.extend(nodes[int(rng.integers(len(nodes)))].tolist())
                col.append(np.array(got[:g]))
            v = np.concatenate(col)
        out[:, ci] = v / float(np.median(v))
    return PMScores(out, f"generated(seed={seed}, draw={draw})")


def generate_for_cluster(cluster: Cluster, variability_dir: str | Path, seed: int = 0, per_gpu: str = "median",
                         draw: str = "node") -> PMScores:
    """:func:`generate_pm_scores` for ``cluster`` from the measured files in ``variability_dir``.

    ``per_gpu="max", draw="gpu"`` reproduces how PAL's artifact builds the
    scores of its simulated clusters (each GPU's slowest run, GPUs drawn
    independently); the defaults use each GPU's median run and whole nodes.
    """
    return generate_pm_scores([n.gpus for n in cluster.nodes], load_class_profiles(variability_dir, per_gpu), seed,
                              draw)


#: spec word -> (per_gpu, draw) for :func:`variability_from_spec`
GENERATORS = {"generate": ("median", "node"), "artifact": ("max", "gpu")}


def variability_from_spec(spec: str, cluster: Cluster, variability_dir: str | Path | None = None,
                          seed: int = 0) -> PMScores:
    """``FILE`` (a PerfVar table), ``generate[:DIR]`` or ``artifact[:DIR]`` -> scores checked against ``cluster``.

    ``generate`` draws our way (median run per GPU, whole nodes), ``artifact``
    the way PAL's artifact does for its simulations (slowest run per GPU,
    GPUs drawn independently).  Without a folder they read ``pal/variability``
    in the data folder (:func:`gpuloom.perf.datadir.data_dir`: ``$GPULOOM_DATA``,
    else ``../shared/data``).
    """
    word, _, folder = spec.partition(":")
    if word in GENERATORS and (folder or spec == word):
        d: str | Path | None = folder or variability_dir
        if d is None:
            from .datadir import data_dir, describe_search

            root = data_dir()
            if root is None:
                raise VariabilityError(
                    f"variability {word!r} needs the measured data folder: {word}:DIR, {describe_search()}"
                )
            d = root / "pal" / "variability"
        per_gpu, draw = GENERATORS[word]
        scores = generate_for_cluster(cluster, d, seed, per_gpu=per_gpu, draw=draw)
    else:
        scores = load_variability_csv(spec)
    scores.check_cluster(cluster)
    return scores


# ---------------------------------------------------------------------------
# 1-D binning


@dataclass(frozen=True)
class Bins:
    """Binned scores of one class: ``levels[index[g]]`` is GPU ``g``'s level (ascending levels)."""

    index: np.ndarray  # (G,) int
    levels: np.ndarray  # (B,) ascending, normalised to the median centroid

    @property
    def values(self) -> np.ndarray:
        return self.levels[self.index]


def _kmeans_1d(xs: np.ndarray, k: int, iters: int = 100) -> np.ndarray:
    """Lloyd's k-means on sorted ``xs``; returns the sorted labels (contiguous runs)."""
    c = np.quantile(xs, (np.arange(k) + 0.5) / k)
    c = np.unique(c)
    labels = np.zeros(xs.size, dtype=np.int64)
    for _ in range(iters):
        cuts = (c[1:] + c[:-1]) / 2
        new = np.searchsorted(cuts, xs, side="right")
        used = np.unique(new)
        new = np.searchsorted(used, new)  # drop empty clusters
        cnew = np.bincount(new, weights=xs) / np.bincount(new)
        if new.size == labels.size and np.array_equal(new, labels) and cnew.size == c.size:
            break
        labels, c = new, cnew
    return labels


def _silhouette_1d(xs: np.ndarray, labels: np.ndarray) -> float:
    """Exact mean silhouette for sorted ``xs`` with contiguous ``labels`` (O(n))."""
    n = xs.size
    k = int(labels[-1]) + 1
    if k < 2:
        return -1.0
    P = np.concatenate([[0.0], np.cumsum(xs)])
    starts = np.searchsorted(labels, np.arange(k), side="left")
    ends = np.searchsorted(labels, np.arange(k), side="right")
    s = np.zeros(n)
    for c in range(k):
        lo, hi = starts[c], ends[c]
        m = hi - lo
        if m <= 1:
            continue  # singleton: silhouette 0
        i = np.arange(lo, hi)
        x = xs[lo:hi]
        within = x * (i - lo) - (P[i] - P[lo]) + (P[hi] - P[i + 1]) - x * (hi - i - 1)
        a = within / (m - 1)
        b = np.full(m, np.inf)
        if c > 0:
            l2, h2 = starts[c - 1], ends[c - 1]
            b = np.minimum(b, (x * (h2 - l2) - (P[h2] - P[l2])) / (h2 - l2))
        if c < k - 1:
            l2, h2 = starts[c + 1], ends[c + 1]
            b = np.minimum(b, ((P[h2] - P[l2]) - x * (h2 - l2)) / (h2 - l2))
        den = np.maximum(a, b)
        s[lo:hi] = np.where(den > 0, (b - a) / np.where(den > 0, den, 1.0), 0.0)
    return float(s.mean())


def _best_kmeans_1d(xs: np.ndarray, max_k: int) -> np.ndarray:
    if xs.size < 3 or xs[-1] - xs[0] <= 0:
        return np.zeros(xs.size, dtype=np.int64)
    best, best_s = None, -2.0
    for k in range(2, min(max_k, xs.size - 1) + 1):
        lab = _kmeans_1d(xs, k)
        s = _silhouette_1d(xs, lab)
        if s > best_s + 1e-12:
            best, best_s = lab, s
    return best if best is not None else np.zeros(xs.size, dtype=np.int64)


def bin_scores(scores: np.ndarray, max_k: int = 10, single: bool = False, flat_tol: float = 0.005,
               outlier_sigma: float = 3.0) -> Bins:
    """Bin one class's PM-scores (see the module docstring)."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise VariabilityError("bin_scores: need a non-empty 1-D array")
    med = float(np.median(x))
    p5, p95 = np.percentile(x, [5, 95])
    if single or (p95 - p5) / med < flat_tol:
        return Bins(np.zeros(x.size, dtype=np.int64), np.array([1.0]))
    order = np.argsort(x, kind="stable")
    xs = x[order]
    cut = x.mean() + outlier_sigma * x.std()
    n_in = int(np.searchsorted(xs, cut, side="right"))
    lab_in = _best_kmeans_1d(xs[:n_in], max_k)
    labels = lab_in
    if n_in < xs.size:
        lab_out = _best_kmeans_1d(xs[n_in:], max_k) if xs.size - n_in >= 3 else np.arange(xs.size - n_in)
        labels = np.concatenate([lab_in, lab_out + (int(lab_in[-1]) + 1 if n_in else 0)])
    cent = np.bincount(labels, weights=xs) / np.bincount(labels)
    levels = cent / float(np.median(cent))
    index = np.empty(x.size, dtype=np.int64)
    index[order] = labels
    return Bins(index, levels)


# ---------------------------------------------------------------------------
# application classes from (DRAM, SM) throughput


@dataclass(frozen=True)
class AppClassifier:
    """Centroids of the k-means application classes, compute-bound (A) first."""

    centroids: np.ndarray  # (k, 2): (dram, sm)
    labels: tuple[str, ...]

    def classify(self, dram: float, sm: float) -> str:
        d = np.hypot(self.centroids[:, 0] - dram, self.centroids[:, 1] - sm)
        return self.labels[int(np.argmin(d))]


def fit_app_classes(points: Mapping[str, tuple[float, float]] | np.ndarray, k: int = 4, seed: int = 0,
                    n_init: int = 10) -> tuple[AppClassifier, dict[str, str] | list[str]]:
    """2-D k-means on (DRAM throughput, SM throughput), classes ordered by DRAM share.

    Returns the classifier and the class of every input point (a dict when
    ``points`` is a mapping name -> (dram, sm)).
    """
    names = list(points) if isinstance(points, Mapping) else None
    X = np.asarray([points[n] for n in names] if names is not None else points, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2:
        raise VariabilityError(f"fit_app_classes: expected (n, 2) points, got shape {X.shape}")
    if not 1 <= k <= len(CLASSES) or X.shape[0] < k:
        raise VariabilityError(f"fit_app_classes: need 1 <= k <= 4 and at least k points (k={k}, n={X.shape[0]})")
    rng = np.random.default_rng(seed)
    best_c, best_inertia = None, math.inf
    for _ in range(n_init):
        # k-means++ seeding
        c = [X[int(rng.integers(len(X)))]]
        for _ in range(1, k):
            d2 = np.min(((X[:, None, :] - np.array(c)[None]) ** 2).sum(-1), axis=1)
            tot = d2.sum()
            c.append(X[int(rng.choice(len(X), p=d2 / tot))] if tot > 0 else X[int(rng.integers(len(X)))])
        cen = np.array(c)
        for _ in range(100):
            lab = np.argmin(((X[:, None, :] - cen[None]) ** 2).sum(-1), axis=1)
            new = np.array([X[lab == j].mean(0) if np.any(lab == j) else cen[j] for j in range(k)])
            if np.allclose(new, cen):
                break
            cen = new
        inertia = float(((X - cen[lab]) ** 2).sum())
        if inertia < best_inertia - 1e-12:
            best_c, best_inertia = cen, inertia
    assert best_c is not None
    share = best_c[:, 0] / np.maximum(best_c[:, 0] + best_c[:, 1], 1e-12)
    best_c = best_c[np.argsort(share, kind="stable")]
    clf = AppClassifier(best_c, CLASSES[:k])
    assigned = [clf.classify(float(d), float(s)) for d, s in X]
    return clf, (dict(zip(names, assigned, strict=True)) if names is not None else assigned)


# ---------------------------------------------------------------------------
class VariabilityFactor:
    """Throughput factor: a job runs at the pace of its slowest GPU for its class.

    ``speed = 1 / max(scores[g, class] for g in the job's GPUs)``.  Also the
    policies' source of each job's class and of the per-class bins.
    """

    name = "variability"

    def __init__(self, scores: PMScores, model_classes: Mapping[str, str] | None = None,
                 default_class: str = "A", max_bins: int = 10, single_bin_classes: Sequence[str] = ("D",)) -> None:
        self.pm = scores
        self.scores = scores.scores
        self.model_classes = dict(MODEL_CLASSES)
        for m, c in (model_classes or {}).items():
            self.model_classes[_norm_model(m)] = CLASSES[parse_class(c, f"model {m!r}")]
        self.default_class = parse_class(default_class, "default_class")
        self.max_bins = max_bins
        self.single = {parse_class(c) for c in single_bin_classes}
        self._bins: dict[int, Bins] = {}
        self._by_model: dict[str, int] = {}

    def job_class(self, job: Job) -> int:
        attrs = job.spec.attrs
        if attrs:
            v = attrs.get("pal_class", attrs.get("app_class"))
            if v is not None:
                return parse_class(v, f"job {job.id}")
        m = job.spec.model
        c = self._by_model.get(m)
        if c is None:
            name = self.model_classes.get(_norm_model(m))
            c = CLASS_INDEX[name] if name is not None else self.default_class
            self._by_model[m] = c
        return c

    def bins(self, cls: int) -> Bins:
        b = self._bins.get(cls)
        if b is None:
            b = bin_scores(self.scores[:, cls], self.max_bins, single=cls in self.single)
            self._bins[cls] = b
        return b

    def slowest(self, job: Job, gpu_ids: Sequence[int]) -> float:
        return float(self.scores[list(gpu_ids), self.job_class(job)].max())

    def __call__(self, job: Job, alloc: Allocation) -> float:
        return 1.0 / self.slowest(job, alloc.gpu_ids)


def add_variability(model: ThroughputModel, scores: PMScores, **kw: Any) -> ThroughputModel:
    """Add (or replace) the ``variability`` factor of a :class:`~gpuloom.perf.model.ThroughputModel`."""
    scores.check_cluster(model.cluster)
    model.factors = [f for f in model.factors if f.name != "variability"]
    model.add(VariabilityFactor(scores, **kw))
    return model
