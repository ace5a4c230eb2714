"""PM-scores, application classes, binning and the variability factor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.variability import (
    PMScores,
    VariabilityError,
    VariabilityFactor,
    _kmeans_1d,
    _silhouette_1d,
    add_variability,
    bin_scores,
    fit_app_classes,
    generate_pm_scores,
    load_aggregate,
    load_class_profiles,
    load_variability_csv,
    model_class,
    variability_from_spec,
)


def _job(model: str = "resnet50", gpus: int = 1, **attrs: object) -> Job:
    return Job(JobSpec("j", 0.0, gpus, 100.0, model=model, attrs=attrs))


def _alloc(cl: Cluster, gpus: list[int]) -> Allocation:
    by: dict[int, list[int]] = {}
    for g in gpus:
        by.setdefault(int(cl.gpu_node[g]), []).append(g)
    return Allocation("j", tuple(Part(n, tuple(v), 0, 0) for n, v in sorted(by.items())))


def test_load_32gpu_table(data_dir):
    s = load_variability_csv(data_dir / "pal/variability/32gpu-variability.csv")
    assert s.scores.shape == (32, 4)
    assert s.scores[0, 0] == pytest.approx(1.014469743078943, abs=0)
    # B and C come from the same profile in PAL's table
    assert np.array_equal(s.for_class("B"), s.for_class("classC"))
    # node 7 (GPUs 28-31) is the slow node for compute-bound class A
    assert s.scores[28:32, 0].min() > 1.10 and s.scores[:28, 0].max() < 1.06


def test_variability_factor_slowest_gpu(data_dir):
    s = load_variability_csv(data_dir / "pal/variability/32gpu-variability.csv")
    cl = Cluster.homogeneous(8, 4)
    f = VariabilityFactor(s)
    # class A job on GPU 0 (1.0145) and GPU 28 (1.1098): pace of GPU 28
    assert f(_job("resnet50", 2), _alloc(cl, [0, 28])) == 1.0 / 1.1098080838626039
    # class D job on the same GPUs: PageRank barely varies
    assert f(_job("pagerank", 2), _alloc(cl, [0, 28])) == 1.0 / 1.0006066217454985
    m = add_variability(ThroughputModel.default(cl, 1.7), s)
    # spans nodes 0 and 7: locality 1/1.7 times variability
    assert m.speed(_job("vgg19", 2), _alloc(cl, [0, 28])) == pytest.approx(1 / 1.7 / 1.1098080838626039)
    with pytest.raises(VariabilityError, match="32 GPUs, the cluster has 64"):
        add_variability(ThroughputModel.default(Cluster.homogeneous(16, 4)), s)


@pytest.mark.parametrize(
    "model,cls",
    [("ResNet-50", "A"), ("resnet50", "A"), ("vgg19", "A"), ("DCGAN", "A"), ("BERT", "B"), ("GPT2", "B"),
     ("PointNet", "C"), ("PageRank", "D"), ("ncf", "D"), ("imagenet", "A"), ("deepspeech2", "B")],
)
def test_model_classes(model, cls):
    assert model_class(model) == cls


def test_job_class_sources():
    f = VariabilityFactor(PMScores(np.ones((4, 4))), model_classes={"mystery-net": "C"})
    assert f.job_class(_job("BERT")) == 1
    assert f.job_class(_job("unknown-model")) == 0  # default: assume the worst (A)
    assert f.job_class(_job("mystery_net")) == 2
    assert f.job_class(_job("BERT", pal_class="classD")) == 3
    with pytest.raises(VariabilityError, match="job j: unknown application class 'E'"):
        f.job_class(_job("BERT", pal_class="E"))


def test_bin_scores_hand_checked():
    b = bin_scores(np.array([1.0, 2.0, 1.0, 2.0, 1.0, 2.0]))
    assert b.levels.tolist() == [1.0 / 1.5, 2.0 / 1.5]
    assert b.index.tolist() == [0, 1, 0, 1, 0, 1]
    # flat class: one bin; memory-bound flag: one bin
    assert bin_scores(np.array([1.0, 1.001, 0.999, 1.0])).levels.tolist() == [1.0]
    assert bin_scores(np.array([1.0, 2.0, 1.0, 2.0]), single=True).index.tolist() == [0, 0, 0, 0]
    # three clear groups
    x = np.array([0.9, 0.91, 0.9, 1.0, 1.01, 1.0, 1.2, 1.21, 1.2])
    b = bin_scores(x, outlier_sigma=10)
    assert len(b.levels) == 3 and b.index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert b.levels[1] == 1.0


def test_silhouette_matches_brute_force():
    rng = np.random.default_rng(3)
    xs = np.sort(np.concatenate([rng.normal(1, 0.01, 30), rng.normal(1.1, 0.02, 20), rng.normal(1.3, 0.01, 5)]))
    lab = _kmeans_1d(xs, 3)
    d = np.abs(xs[:, None] - xs[None])
    s = []
    for i in range(xs.size):
        own = lab == lab[i]
        a = d[i, own].sum() / (own.sum() - 1)
        b = min(d[i, lab == c].mean() for c in set(lab.tolist()) if c != lab[i])
        s.append((b - a) / max(a, b))
    assert _silhouette_1d(xs, lab) == pytest.approx(float(np.mean(s)), rel=1e-12)


def test_bins_on_measured_table(data_dir):
    s = load_variability_csv(data_dir / "pal/variability/32gpu-variability.csv")
    f = VariabilityFactor(s)
    a = f.bins(0)
    # the slow node lands in the worst bin; the class-D table is one bin
    assert set(a.index[28:32].tolist()) == {len(a.levels) - 1}
    assert f.bins(3).levels.tolist() == [1.0]
    assert np.all(np.diff(a.levels) > 0)


def test_aggregates_and_generator(data_dir):
    d = data_dir / "pal/variability"
    res = load_aggregate(d / "sim/resnet-longhorn-agg.csv")
    assert len(res.keys) == 336 and np.median(res.scores) == 1.0
    prof = load_class_profiles(d)
    assert prof["B"] is prof["C"]  # class_profiles.json maps both to BERT
    g1 = generate_pm_scores([4] * 16, prof, seed=7)
    g2 = generate_pm_scores([4] * 16, prof, seed=7)
    g3 = generate_pm_scores([4] * 16, prof, seed=8)
    assert np.array_equal(g1.scores, g2.scores) and not np.array_equal(g1.scores, g3.scores)
    assert g1.scores.shape == (64, 4)
    assert np.allclose(np.median(g1.scores, axis=0), 1.0)
    # every generated node is a measured node (scaled by one factor per class)
    nodes = [tuple(np.round(v, 9)) for v in res.by_node()]
    for n in range(16):
        col = g1.scores[4 * n:4 * n + 4, 0]
        scale = col[0] / next(v[0] for v in res.by_node() if np.allclose(v / v[0], col / col[0]))
        assert tuple(np.round(col / scale, 9)) in nodes
    # any size, uneven nodes
    big = generate_pm_scores([8] * 3 + [3], prof, seed=1)
    assert big.scores.shape == (27, 4)
    cl = Cluster.homogeneous(16, 4)
    assert variability_from_spec(f"generate:{d}", cl, seed=7).scores.tolist() == g1.scores.tolist()
    with pytest.raises(VariabilityError, match="scores for 32 GPUs"):
        variability_from_spec(str(d / "32gpu-variability.csv"), cl)


def test_bad_files(tmp_path):
    p = tmp_path / "v.csv"
    p.write_text("GPU_ID,PerfVar_classA\n0,1.0\n")
    with pytest.raises(VariabilityError, match="missing column"):
        load_variability_csv(p)
    p.write_text("PerfVar_classA,PerfVar_classB,PerfVar_classC,PerfVar_classD\n1,1,1,1\n1,x,1,1\n")
    with pytest.raises(VariabilityError, match=r"v.csv:3: non-numeric"):
        load_variability_csv(p)
    p.write_text("PerfVar_classA,PerfVar_classB,PerfVar_classC,PerfVar_classD\n1,1,1,0\n")
    with pytest.raises(VariabilityError, match=r"v.csv:2: PM-scores must be > 0"):
        load_variability_csv(p)


def test_app_class_kmeans():
    pts = {
        "conv1": (10.0, 90.0), "conv2": (12.0, 88.0),
        "lm1": (35.0, 60.0), "lm2": (33.0, 62.0),
        "pc1": (55.0, 40.0), "pc2": (57.0, 42.0),
        "mem1": (90.0, 10.0), "mem2": (88.0, 12.0),
    }
    clf, got = fit_app_classes(pts, k=4, seed=0)
    assert got == {"conv1": "A", "conv2": "A", "lm1": "B", "lm2": "B", "pc1": "C", "pc2": "C",
                   "mem1": "D", "mem2": "D"}
    assert clf.classify(80.0, 5.0) == "D" and clf.classify(15.0, 95.0) == "A"
    assert clf.centroids[0].tolist() == [11.0, 89.0]
    with pytest.raises(VariabilityError, match="at least k points"):
        fit_app_classes({"a": (1.0, 1.0)}, k=2)



def test_build_model_options(data_dir):
    from gpuloom.perf.assembly import build_model

    cl = Cluster.homogeneous(2, 8)
    m = build_model(cl, {"variability": f"generate:{data_dir / 'pal/variability'}", "variability_seed": 3,
                                  "topology": str(data_dir / "topology/v100_dgx1class_8gpu_oneflow_dlperf.txt")})
    names = [f.name for f in m.factors]
    assert names[0] == "locality" and names[-2:] == ["variability", "topology"]
    assert m.get("variability").scores.shape == (16, 4)
    assert build_model(cl).get("variability") is None


def test_per_gpu_statistic_hand_checked(tmp_path):
    # GPU c1-1-0 ran 10, 20, 60; c1-1-1 ran 30; c1-2-0 ran 40, 40  (perf = iteration time)
    p = tmp_path / "agg.csv"
    p.write_text("cabinet,node,device,perf\n"
                 "c1,1,0,10\nc1,1,0,20\nc1,1,0,60\nc1,1,1,30\nc1,2,0,40\nc1,2,0,40\nc1,2,1,nan\n")
    med = load_aggregate(p)
    assert med.keys == ("c1-1-0", "c1-1-1", "c1-2-0") and med.nodes == ("c1-1", "c1-1", "c1-2")
    # medians 20, 30, 40 -> over their median 30
    assert med.scores.tolist() == pytest.approx([20 / 30, 1.0, 40 / 30])
    mx = load_aggregate(p, per_gpu="max")
    # slowest runs 60, 30, 40 -> over their median 40
    assert mx.scores.tolist() == pytest.approx([60 / 40, 30 / 40, 1.0])
    with pytest.raises(VariabilityError, match="per_gpu must be one of median, max"):
        load_aggregate(p, per_gpu="mean")


def test_per_gpu_max_widens_measured_spread(data_dir):
    # the artifact's per-GPU statistic (slowest run) vs ours (median run) on the class-A source
    d = data_dir / "pal/variability"
    med = load_aggregate(d / "sim/resnet-longhorn-agg.csv").scores
    mx = load_aggregate(d / "sim/resnet-longhorn-agg.csv", per_gpu="max").scores
    assert med.size == mx.size == 336
    assert round(float(med.max()), 2) == 1.12 and round(float(mx.max()), 2) == 3.41
    assert round(float(np.percentile(med, 95)), 2) == 1.06 and round(float(np.percentile(mx, 95)), 2) == 1.21
    # PAL's measured 32-GPU table agrees with the median statistic, not with the slowest run
    table = load_variability_csv(d / "32gpu-variability.csv").scores[:, 0]
    assert round(float(table.max()), 3) == 1.117


def test_generator_gpu_draw(data_dir):
    d = data_dir / "pal/variability"
    prof = load_class_profiles(d, per_gpu="max")
    g = generate_pm_scores([4] * 16, prof, seed=3, draw="gpu")
    assert g.scores.shape == (64, 4) and np.allclose(np.median(g.scores, axis=0), 1.0)
    assert np.array_equal(g.scores, generate_pm_scores([4] * 16, prof, seed=3, draw="gpu").scores)
    # every GPU is one measured GPU drawn independently (one stream, class by class), renormalised
    rng = np.random.default_rng(3)
    for ci, c in enumerate("ABCD"):
        v = prof[c].scores[rng.integers(prof[c].scores.size, size=64)]
        assert g.scores[:, ci].tolist() == (v / np.median(v)).tolist()
    # no within-node correlation is imposed: class-A nodes are not copies of measured nodes
    assert np.any(g.scores[:, 0] > 1.2)  # the slowest-run tail is present
    with pytest.raises(VariabilityError, match="draw must be one of node, gpu"):
        generate_pm_scores([4], prof, draw="rack")


def test_artifact_model_classes():
    from gpuloom.perf.variability import ARTIFACT_MODEL_CLASSES

    f = VariabilityFactor(PMScores(np.ones((4, 4))), model_classes=ARTIFACT_MODEL_CLASSES)
    got = {m: "ABCD"[f.job_class(_job(m))] for m in ("resnet50", "vgg19", "DCGAN", "BERT", "GPT2", "PointNet")}
    assert got == {"resnet50": "A", "vgg19": "C", "DCGAN": "B", "BERT": "B", "GPT2": "B", "PointNet": "D"}
    # default: the paper's classes
    f0 = VariabilityFactor(PMScores(np.ones((4, 4))))
    assert ["ABCD"[f0.job_class(_job(m))] for m in ("vgg19", "DCGAN", "PointNet")] == ["A", "A", "C"]


def test_spec_artifact_generator(data_dir, monkeypatch, tmp_path):
    d = data_dir / "pal/variability"
    cl = Cluster.homogeneous(16, 4)
    got = variability_from_spec(f"artifact:{d}", cl, seed=5)
    want = generate_pm_scores([4] * 16, load_class_profiles(d, per_gpu="max"), seed=5, draw="gpu")
    assert got.scores.tolist() == want.scores.tolist()
    monkeypatch.setenv("GPULOOM_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(VariabilityError, match="'artifact' needs the measured data folder"):
        variability_from_spec("artifact", cl)
    monkeypatch.setenv("GPULOOM_DATA", str(data_dir))
    assert variability_from_spec("artifact", cl, seed=5).scores.tolist() == want.scores.tolist()
    # without $GPULOOM_DATA: ../shared/data beside the current directory, else beside the checkout
    monkeypatch.delenv("GPULOOM_DATA")
    monkeypatch.chdir(tmp_path)
    if data_dir.resolve() == (Path(__file__).resolve().parents[2] / "shared" / "data").resolve():
        assert variability_from_spec("artifact", cl, seed=5).scores.tolist() == want.scores.tolist()
    (tmp_path / "clone").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_dir.resolve())
    monkeypatch.chdir(tmp_path / "clone")
    assert variability_from_spec("artifact", cl, seed=5).scores.tolist() == want.scores.tolist()
