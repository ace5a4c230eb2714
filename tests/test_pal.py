"""PM-First and PAL placement: LV order, hand-checked choices, brute-force optimality, simulation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.variability import PMScores, add_variability, generate_for_cluster
from gpuloom.policies import PolicyError, make
from gpuloom.policies.base import FreeState, Request, View
from gpuloom.policies.pal import PAL, lv_order
from gpuloom.sim import simulate
from gpuloom.sim.traces import load_trace


def test_lv_product_example():
    # PAL's example: four variability bins, L_within = 1, L_across = 1.5
    got = lv_order([0.89, 0.94, 1.06, 2.55], l_within=1.0, l_across=1.5)
    assert [(v, w) for v, w, _ in got] == [
        (0.89, True), (0.94, True), (1.06, True), (0.89, False), (0.94, False), (1.06, False),
        (2.55, True), (2.55, False),
    ]
    assert [round(p, 4) for _, _, p in got] == [0.89, 0.94, 1.06, 1.335, 1.41, 1.59, 2.55, 3.825]


def _setup(class_a: list[float], nodes: int, per_node: int, penalty: float = 1.5, sizes: list[int] | None = None):
    cl = Cluster.homogeneous(nodes, per_node) if sizes is None else Cluster.from_groups([{"gpus": g} for g in sizes])
    s = np.ones((cl.num_gpus, 4))
    s[:, 0] = class_a
    model = ThroughputModel.default(cl, penalty)
    add_variability(model, PMScores(s), max_bins=10)
    view = View(0.0, cl, [], {}, model, np.random.default_rng(0))
    return cl, model, view


def _req(gpus: int, model: str = "resnet50", jid: str = "j") -> Request:
    return Request((Job(JobSpec(jid, 0.0, gpus, 10.0, model=model)),), gpus)


def test_pm_first_takes_best_gpus():
    # node 0: 1.0 1.2 1.0 1.2 | node 1: 0.8 1.2 1.2 1.0
    cl, _, view = _setup([1.0, 1.2, 1.0, 1.2, 0.8, 1.2, 1.2, 1.0], 2, 4)
    # the paper's PM-First: raw scores, ties by GPU id, no locality tie-break
    pol = make("place", "pm-first")
    parts = pol.choose(_req(2), FreeState(cl), view)
    assert sorted(g for p in parts for g in p.gpus) == [0, 4]  # 0.8, then the first 1.0 (GPU 0, node 0)
    parts = pol.choose(_req(3), FreeState(cl), view)
    assert sorted(g for p in parts for g in p.gpus) == [0, 2, 4]
    # the artifact's PM-First: binned levels with the best-match locality tie-break
    pol = make("place", "pm-first", {"pm_sort": "binned"})
    parts = pol.choose(_req(2), FreeState(cl), view)
    assert sorted(g for p in parts for g in p.gpus) == [4, 7]  # 0.8 then the 1.0 on the same node
    parts = pol.choose(_req(3), FreeState(cl), view)
    # 0.8 (GPU 4), then two of the 1.0s; node 0 has two 1.0s (exact match for the two still needed)
    assert sorted(g for p in parts for g in p.gpus) == [0, 2, 4]


def test_pal_within_vs_across_decision():
    # bins: 0.9 (GPUs 0, 4) and 1.1 (the rest). A 2-GPU job: within-node best is 1.1,
    # across-node best is {0, 4} at 0.9 * L.
    lv = [0.9, 1.1, 1.1, 1.1, 0.9, 1.1, 1.1, 1.1]
    cl, _, view = _setup(lv, 2, 4, penalty=1.5)
    f = view.model.get("variability")
    levels = f.bins(0).levels
    assert levels.tolist() == pytest.approx([0.9, 1.1])
    pol = make("place", "pal")
    parts = pol.choose(_req(2), FreeState(cl), view)
    assert len(parts) == 1  # 1.1 * 1 <= 0.9 * 1.5
    assert parts[0].gpus == (0, 1)  # best fit: node 0, its 0.9 GPU first
    pol2 = make("place", "pal", {"locality_penalty": 1.1})
    parts = pol2.choose(_req(2), FreeState(cl), view)
    assert sorted(g for p in parts for g in p.gpus) == [0, 4]  # 0.99 < 1.1: spread


def _brute(vals: np.ndarray, node: np.ndarray, free: np.ndarray, k: int, pen: float) -> float:
    best = np.inf
    for combo in itertools.combinations(np.flatnonzero(free).tolist(), k):
        lv = vals[list(combo)].max() * (1.0 if len(set(node[list(combo)].tolist())) == 1 else pen)
        best = min(best, lv)
    return best


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("sizes", [[4, 4, 4], [2, 4, 3, 1]])
def test_pal_choice_has_minimal_lv_product(seed, sizes):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    raw = rng.choice([0.9, 1.0, 1.05, 1.3], size=n)
    cl, _, view = _setup(raw.tolist(), 0, 0, penalty=float(rng.choice([1.0, 1.2, 1.5, 1.7, 3.0])), sizes=sizes)
    pen = view.model.get("locality").penalty
    vals = view.model.get("variability").bins(0).values
    free = FreeState(cl)
    busy = rng.random(n) < 0.35
    free.gpu_free[busy] = False
    for i in range(cl.num_nodes):
        free.node_gpus[i] = int(free.gpu_free[list(cl.node_gpus(i))].sum())
    for k in (2, 3, 4):
        if free.gpu_free.sum() < k:
            continue
        parts = PAL().choose(_req(k), free, view)
        got = [g for p in parts for g in p.gpus]
        assert len(got) == k and free.gpu_free[got].all()
        assert all(cl.gpu_node[g] == p.node for p in parts for g in p.gpus)
        lv = vals[got].max() * (1.0 if len(parts) == 1 else pen)
        assert lv == pytest.approx(_brute(vals, cl.gpu_node, free.gpu_free, k, pen))


def test_placement_priority_by_class():
    # one fast GPU (0.8) on node 1; a BERT job (class B) comes first in the queue,
    # a ResNet job (class A) second: class A is placed first and gets the fast GPU.
    cl = Cluster.homogeneous(2, 2)
    s = np.ones((4, 4))
    s[2, :] = 0.8
    model = add_variability(ThroughputModel.default(cl), PMScores(s))
    view = View(0.0, cl, [], {}, model, np.random.default_rng(0))
    reqs = [_req(1, "bert", "b"), _req(1, "resnet50", "a")]
    plan = make("place", "pal").place(reqs, view)
    assert plan.allocations["a"].gpu_ids == (2,)
    plan = make("place", "pal", {"priority": "queue"}).place(reqs, view)
    assert plan.allocations["b"].gpu_ids == (2,)
    # class-size: inside a class, larger jobs first
    reqs = [_req(1, "vgg19", "small"), _req(2, "resnet50", "big")]
    pol = make("place", "pm-first", {"priority": "class-size"})
    assert [r.job.id for r in pol.priority_order(reqs, view)] == ["big", "small"]
    assert [r.job.id for r in make("place", "pm-first").priority_order(reqs, view)] == ["small", "big"]


def test_without_variability_factor():
    cl = Cluster.homogeneous(1, 2)
    view = View(0.0, cl, [], {}, ThroughputModel.default(cl), np.random.default_rng(0))
    with pytest.raises(PolicyError, match="needs PM-scores"):
        make("place", "pm-first", {"require_scores": True}).choose(_req(1), FreeState(cl), view)
    # without scores: uniform scores, a warning, and PAL only weighs locality
    pol = make("place", "pal")
    with pytest.warns(UserWarning, match="no PM-scores"):
        parts = pol.choose(_req(2), FreeState(cl), view)
    assert parts[0].gpus == (0, 1)
    with pytest.raises(PolicyError, match="priority"):
        make("place", "pal", {"priority": "size"})


@pytest.mark.parametrize("policy", ["pm-first", "pal"])
def test_sia_philly_workload_runs(data_dir, policy):
    cl = Cluster.homogeneous(16, 4)
    scores = generate_for_cluster(cl, data_dir / "pal/variability", seed=0)
    specs = load_trace(data_dir / "pal/traces/philly/workload-1.csv", "pal")
    runs = []
    for _ in range(2):
        model = add_variability(ThroughputModel.default(cl, 1.7), scores)
        runs.append(simulate(cl, specs, place=policy, model=model, round_len=360.0))  # checks every plan
    a, b = (r.summary() for r in runs)
    assert a["completed"] == 160 and a["mean_jct"] == b["mean_jct"]  # deterministic
    # no job runs faster than its fastest possible GPUs allow
    best = scores.scores.min()
    for j in runs[0].finished:
        assert j.run_time - j.overhead_time >= j.duration * best - 1e-6


@pytest.mark.parametrize("seed", range(20))
def test_pm_first_matches_reference(seed):
    # reference: sort free GPUs by (level, |free GPUs of that level on the node - still needed|, node, id)
    rng = np.random.default_rng(seed)
    cl, _, view = _setup(rng.choice([0.9, 1.0, 1.2], size=24).tolist(), 6, 4)
    vals = view.model.get("variability").bins(0).values
    free = FreeState(cl)
    free.gpu_free[rng.random(24) < 0.4] = False
    cv = make("place", "pm-first").scores(view).cls(0)
    for k in range(1, int(free.gpu_free.sum()) + 1):
        got = make("place", "pm-first").pm_first(cv, free, k)
        ids = np.flatnonzero(free.gpu_free)
        kth = np.sort(vals[ids])[k - 1]
        below = ids[vals[ids] < kth]
        tie = ids[vals[ids] == kth]
        need = k - below.size
        cnt = np.array([np.sum(cl.gpu_node[tie] == cl.gpu_node[g]) for g in tie])
        ref = tie[np.lexsort((tie, cl.gpu_node[tie], np.abs(cnt - need)))][:need]
        assert sorted(got.tolist()) == sorted(below.tolist() + ref.tolist())


@pytest.mark.parametrize("place", ["packed-sticky", "packed-non-sticky", "random-sticky", "pm-first", "pal"])
def test_strict_queue_without_backfill(place):
    # one node of 4 GPUs, FIFO, all at t=0: a (2 GPUs, 100 s), b (4 GPUs, 100 s), c (1 GPU, 50 s)
    cl = Cluster.homogeneous(1, 4)
    specs = [JobSpec("a", 0.0, 2, 100.0, model="resnet50"), JobSpec("b", 0.0, 4, 100.0, model="resnet50"),
             JobSpec("c", 0.0, 1, 50.0, model="resnet50")]
    model = add_variability(ThroughputModel.default(cl, 1.7), PMScores(np.ones((4, 4))))

    def finish(**params: object) -> dict[str, float]:
        res = simulate(cl, specs, place=place, model=model, round_len=360.0, params=params)
        return {r.id: r.finish for r in res.jobs}

    # backfill: c starts beside a at 0; b starts at the 360 s round
    assert finish() == {"a": 100.0, "b": 460.0, "c": 50.0}
    # strict queue (Blox / PAL's artifact): c waits behind b, starts at the 720 s round
    assert finish(backfill=False) == {"a": 100.0, "b": 460.0, "c": 770.0}
    assert finish(backfill="false") == finish(backfill=False)
    with pytest.raises(PolicyError, match="backfill must be true or false"):
        make("place", place, {"backfill": "sometimes"})
