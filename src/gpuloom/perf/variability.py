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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.parse import normalise_model
from ..core.plan import Allocation
from .model import ThroughputModel
from .pm_bins import (  # noqa: F401  (binning and classes live there; re-exported)
    CLASS_INDEX,
    CLASSES,
    AppClassifier,
    Bins,
    VariabilityError,
    _best_kmeans_1d,
    _kmeans_1d,
    _silhouette_1d,
    bin_scores,
    fit_app_classes,
)

#: Known models -> class (keys normalised by :func:`~gpuloom.core.parse.normalise_model`, as lookups are).
MODEL_CLASSES: dict[str, str] = {normalise_model(m): c for m, c in {
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
}.items()}


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
    return MODEL_CLASSES.get(normalise_model(model), default)


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
    else ``../shared/data`` beside the checkout).
    """
    word, _, folder = spec.partition(":")
    if word in GENERATORS and (folder or spec == word):
        d: str | Path | None = folder or variability_dir
        if d is None:
            from .datadir import DataDirError, require_data_dir

            try:
                root = require_data_dir(hint=f"{word}:DIR")
            except DataDirError as e:
                raise VariabilityError(f"variability {word!r} needs the measured data folder: {e}") from None
            d = root / "pal" / "variability"
        per_gpu, draw = GENERATORS[word]
        scores = generate_for_cluster(cluster, d, seed, per_gpu=per_gpu, draw=draw)
    else:
        scores = load_variability_csv(spec)
    scores.check_cluster(cluster)
    return scores


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
            self.model_classes[normalise_model(m)] = CLASSES[parse_class(c, f"model {m!r}")]
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
            name = self.model_classes.get(normalise_model(m))
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
