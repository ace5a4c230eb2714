"""Workload generator: deterministic per seed, Poisson rate, weights respected, trace sampling."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpuloom.core import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import simulate
from gpuloom.sim.generator import (
    BUILTIN_MODELS,
    PHILLY_DURATIONS,
    LogNormalByGpus,
    builtin_workload,
    generate,
)
from gpuloom.sim.traces import load_trace


def test_deterministic_for_a_seed() -> None:
    a = generate(300, 25.0, seed=7)
    assert a == generate(300, 25.0, seed=7)
    assert a != generate(300, 25.0, seed=8)
    assert [j.id for j in a[:3]] == ["job-000", "job-001", "job-002"]


def test_poisson_rate_and_start() -> None:
    jobs = generate(5000, 30.0, seed=1, start=1000.0)
    arr = np.array([j.arrival for j in jobs])
    assert (np.diff(arr) >= 0).all() and arr[0] > 1000.0
    gaps = np.diff(np.concatenate([[1000.0], arr]))
    # mean gap 120 s; over 5000 gaps the standard error is 120/sqrt(5000) = 1.7 s
    assert gaps.mean() == pytest.approx(120.0, rel=0.05)
    # exponential gaps: the coefficient of variation is 1
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    rate = len(jobs) / ((arr[-1] - 1000.0) / 3600.0)
    assert rate == pytest.approx(30.0, rel=0.05)


def test_model_and_gpu_weights_respected() -> None:
    jobs = generate(10_000, 20.0, seed=2, models={"a": 3, "b": 1}, gpu_dist={1: 0.5, 4: 0.25, 8: 0.25})
    m = Counter(j.model for j in jobs)
    assert set(m) == {"a", "b"} and m["a"] / len(jobs) == pytest.approx(0.75, abs=0.02)
    g = Counter(j.gpus for j in jobs)
    assert set(g) == {1, 4, 8}
    assert g[1] / len(jobs) == pytest.approx(0.5, abs=0.02) and g[8] / len(jobs) == pytest.approx(0.25, abs=0.02)


def test_builtin_distributions() -> None:
    jobs = generate(20_000, 20.0, seed=3)
    g = Counter(j.gpus for j in jobs)
    assert g[1] / len(jobs) == pytest.approx(0.7, abs=0.015)
    assert set(Counter(j.model for j in jobs)) == set(BUILTIN_MODELS)
    for gpus, (mu, sigma) in PHILLY_DURATIONS.params.items():
        if gpus == 16:
            continue
        logs = np.log([j.duration for j in jobs if j.gpus == gpus])
        # quartiles are unaffected by the clipping at [60 s, 14 d]: median mu, upper quartile mu + 0.674 sigma
        assert np.median(logs) == pytest.approx(mu, abs=0.1)
        assert np.quantile(logs, 0.75) == pytest.approx(mu + 0.6745 * sigma, abs=0.15)
        # the share clipped to 60 s is the normal tail below ln 60
        clipped = float(np.mean(logs <= math.log(60.0) + 1e-9))
        assert clipped == pytest.approx(0.5 * (1 + math.erf((math.log(60.0) - mu) / (sigma * math.sqrt(2)))),
                                        abs=0.03)
    assert min(j.duration for j in jobs) == 60.0 and max(j.duration for j in jobs) <= 14 * 86400


def test_lognormal_buckets_and_clip() -> None:
    d = LogNormalByGpus({1: (math.log(100.0), 0.0), 4: (math.log(1000.0), 0.0)}, low=50.0, high=500.0)
    out = d.sample(np.random.default_rng(0), np.array([1, 2, 3, 4, 8]))
    assert out.tolist() == pytest.approx([100.0, 100.0, 100.0, 500.0, 500.0])  # 2,3 -> bucket 1; 4,8 clipped
    with pytest.raises(ValueError):
        LogNormalByGpus({})
    with pytest.raises(ValueError):
        LogNormalByGpus({1: (0.0, 1.0)}, low=10.0, high=5.0)


def test_sampling_from_a_trace_keeps_pairs() -> None:
    pool = [JobSpec("a", 0, 1, 100.0, model="m1"), JobSpec("b", 5, 4, 3600.0, model="m2"),
            JobSpec("c", 9, 8, 50.0, model="m3")]
    jobs = generate(2000, 60.0, seed=4, sample_from=pool)
    pairs = {(p.gpus, p.duration, p.model) for p in pool}
    assert {(j.gpus, j.duration, j.model) for j in jobs} == pairs
    n = Counter(j.gpus for j in jobs)
    assert all(abs(c / 2000 - 1 / 3) < 0.04 for c in n.values())
    relabelled = generate(50, 60.0, seed=4, sample_from=pool, models={"x": 1})
    assert {j.model for j in relabelled} == {"x"}
    assert {(j.gpus, j.duration) for j in relabelled} <= {(p.gpus, p.duration) for p in pool}


def test_sampling_from_real_trace(data_dir: Path) -> None:
    pool = load_trace(data_dir / "pal/traces/philly/workload-1.csv")
    jobs = generate(500, 20.0, seed=5, sample_from=pool)
    assert {(j.gpus, j.duration) for j in jobs} <= {(p.gpus, p.duration) for p in pool}


def test_philly_fit_matches_the_data(data_dir: Path) -> None:
    """The built-in log-normal parameters are the per-GPU-count fit on the Philly list."""
    jobs = load_trace(data_dir / "sia/philly_jobs.csv", "philly")
    gpus = np.array([j.gpus for j in jobs])
    logd = np.log([j.duration for j in jobs])
    keys = np.array(sorted(PHILLY_DURATIONS.params))
    bucket = keys[np.searchsorted(keys, gpus, side="right") - 1]  # 12 -> 8, 24 -> 16, as sampling does
    for g, (mu, sigma) in PHILLY_DURATIONS.params.items():
        sel = logd[bucket == g]
        assert (round(float(sel.mean()), 3), round(float(sel.std()), 3)) == (mu, sigma)
    assert sorted(set(bucket.tolist())) == [1, 2, 4, 8, 16]


def test_bad_arguments() -> None:
    pool = [JobSpec("a", 0, 1, 100.0)]
    for kw in ({"jobs_per_hour": 0.0}, {"jobs_per_hour": math.inf}, {"num_jobs": -1}, {"start": -5.0},
               {"models": {"a": -1.0}}, {"models": {}}, {"gpu_dist": {0: 1.0}}, {"gpu_dist": {1: 0.0}},
               {"sample_from": []}, {"sample_from": pool, "gpu_dist": {1: 1.0}}):
        with pytest.raises(ValueError):
            generate(**{"num_jobs": 10, **kw})  # type: ignore[arg-type]
    assert generate(0) == []


def test_builtin_workload_runs_on_16x4() -> None:
    jobs = builtin_workload()
    assert jobs == builtin_workload(0) and jobs != builtin_workload(1)
    assert len(jobs) == 200 and max(j.gpus for j in jobs) == 8
    assert all(60.0 <= j.duration <= 2.5 * 3600 for j in jobs)
    res = simulate(Cluster.homogeneous(16, 4), jobs)
    s = res.summary()
    assert (s["completed"], s["unfinished"]) == (200, 0)
    # 200 jobs in about 10 h of arrivals: the run ends within a day, with the cluster well used
    assert s["makespan"] < 86400 and 0.3 < s["gpu_util"] < 1.0
