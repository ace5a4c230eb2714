"""Synergy's runner workload: the job list its default run (the artifact README's command) generates."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest

from gpuloom.sim.synergy_workload import RUNNER_MODELS, WorkloadError, runner_workload

# iter_time of each model's 1-GPU profile (synergy/model_sensitivity_profiles.csv, Synergy's models/*_1.py)
ITER = {"alexnet": 0.6, "res18": 0.64, "res50": 0.78, "mobilenet": 0.71, "shufflenet": 0.615,
        "gnmt": 0.12, "transformer": 0.67, "lstm": 0.011, "m5": 0.6, "deepspeech": 0.757}


def test_first_jobs_match_synergys_runner() -> None:
    # (arrival s, model, iterations) of jobs 0-11 as Synergy's runner records them (--rec_trace) for its
    # default run: runner.py --cluster_job_log ..., seed 42, FIFO, 9 jobs/h, split (20, 70, 10)
    want = [(409, "alexnet", 3447), (951, "gnmt", 34181), (1053, "transformer", 29317), (1505, "m5", 122162),
            (1542, "lstm", 191185), (1555, "gnmt", 90573), (1654, "res18", 5891), (2023, "transformer", 18598),
            (2112, "lstm", 1320252), (2330, "gnmt", 507538), (2686, "res50", 383880),
            (3255, "transformer", 4845)]
    specs = runner_workload(12, ITER)
    assert [(s.arrival, s.model, s.iterations) for s in specs] == want
    assert [s.id for s in specs] == [f"j{i}" for i in range(12)] and {s.gpus for s in specs} == {1}
    assert all(s.duration == s.iterations * ITER[s.model] for s in specs if s.iterations is not None)


def test_first_job_by_hand() -> None:
    # Random(42): 0.6394... (< 0.8: the short range), then 0.0250...: 60 * 10**(1.5 + 1.5 * 0.0250) s at
    # 0.6 s an iteration; the fresh stream's 0.6394... gives the gap ceil(-ln(1 - 0.6394) / 9 h) = 409 s
    r = random.Random(42)
    u1, u2 = r.random(), r.random()
    assert u1 < 0.8
    dur = 60 * 10 ** (1.5 + 1.5 * u2)
    j = runner_workload(1, ITER)[0]
    assert j.iterations == int(dur / 0.6) == 3447
    assert j.arrival == math.ceil(-math.log(1 - u1) / 9 * 3600) == 409


def test_split_is_kept_exactly_and_models_take_turns() -> None:
    specs = runner_workload(100, ITER, jobs_per_hour=4.0, split=(50, 0, 50), seed=3)
    fams = Counter(s.attrs["family"] for s in specs)
    assert fams == {"image": 50, "speech": 50}
    image = [s.model for s in specs if s.attrs["family"] == "image"]
    assert image[:7] == list(RUNNER_MODELS["image"]) + ["alexnet", "res18"]
    assert runner_workload(100, ITER, jobs_per_hour=4.0, split=(50, 0, 50), seed=3) == specs
    assert runner_workload(100, ITER, jobs_per_hour=4.0, split=(50, 0, 50), seed=4) != specs


def test_bad_arguments() -> None:
    with pytest.raises(WorkloadError, match="jobs_per_hour"):
        runner_workload(3, ITER, jobs_per_hour=0)
    with pytest.raises(WorkloadError, match="num_jobs"):
        runner_workload(-1, ITER)
    with pytest.raises(WorkloadError, match="split"):
        runner_workload(3, ITER, split=(1, 2))
    with pytest.raises(WorkloadError, match="lstm"):
        runner_workload(3, {k: v for k, v in ITER.items() if k != "lstm"})


def test_reproduce_artifact_preset_runs_the_runners_job_list(data_dir: Path) -> None:
    from gpuloom.sim.reproduce import run, synergy

    iters = synergy.runner_iter_times(data_dir / "synergy/model_sensitivity_profiles.csv")
    assert {m: iters[m] for m in ITER} == ITER
    specs = synergy.window_workload((30, 40), 0, iter_times=iters)
    assert specs == runner_workload(80, ITER)  # runner seed 42: the README's run
    assert synergy.window_workload((30, 40), 1, iter_times=iters) == runner_workload(80, ITER, seed=43)
    art = run("synergy", data_dir, preset="artifact", seeds=1, measure=(30, 40))[0]
    paper = run("synergy", data_dir, preset="paper", seeds=1, measure=(30, 40))[0]
    assert any(n.startswith("jobs: the job list Synergy's runner generates") for n in art.notes)
    assert any("--preset artifact runs the runner's own job list" in n for n in paper.notes)
    jct = {(r.setting, r.metric): r.values for r in art.rows}
    assert jct != {(r.setting, r.metric): r.values for r in paper.rows}


def test_artifact_preset_replaces_every_job_every_round_at_no_cost(data_dir: Path) -> None:
    # Synergy's simulator ends every lease with its round and allocates each round afresh, charging nothing
    from gpuloom.core.cluster import Cluster
    from gpuloom.perf.sensitivity import load_catalogue
    from gpuloom.sim.reproduce import synergy

    profiles = data_dir / "synergy/model_sensitivity_profiles.csv"
    cat = load_catalogue(profiles)
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    specs = synergy.window_workload((40, 60), 0, iter_times=synergy.runner_iter_times(profiles))
    art = synergy.run_window(cl, specs, "fifo", "tune", cat, (40, 60), 0, "artifact")
    paper = synergy.run_window(cl, specs, "fifo", "tune", cat, (40, 60), 0)
    assert (art.config["place"], paper.config["place"]) == ("packed-non-sticky", "packed-sticky")
    assert sum(j.migrations for j in art.jobs) > 0 and all(j.overhead_time == 0 for j in art.jobs)
    assert sum(j.migrations for j in paper.jobs) == 0
