"""Every random draw of a run comes from the run's seed: per stage that draws (generated workloads, random
placement, generated PM-scores), seeds 0 and 1 differ and a seed repeats exactly; ``compare --seeds N`` gives N
different runs wherever randomness matters, and says why a configuration shows ± 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim.generator import builtin_workload, generate
from gpuloom.sim.report import aggregate, seed_notes
from gpuloom.sim.runconfig import parse_run_config, run_config, run_seeds
from gpuloom.sim.synergy_workload import synergy_workload

# 2-GPU jobs on 4-GPU nodes: a random draw lands on one node or spans two (and pays the locality penalty)
PAIRS = [JobSpec(f"j{i}", 60.0 * i, 2, 1800.0 + 300 * (i % 3)) for i in range(12)]


def test_generated_workloads_follow_the_seed() -> None:
    trace = PAIRS[:3]
    for make in (lambda s: generate(20, 30.0, seed=s), builtin_workload,
                 lambda s: generate(20, 30.0, seed=s, sample_from=trace), lambda s: synergy_workload(20, seed=s)):
        a, b, again = make(0), make(1), make(0)
        assert a == again and a != b


@pytest.mark.parametrize("place", ["random-sticky", "random-non-sticky"])
def test_random_placement_follows_the_seed(place: str) -> None:
    cl = Cluster.homogeneous(4, 4)
    runs = [run_config(parse_run_config(f"order=fifo,place={place},seed={s}"), cl, PAIRS) for s in (0, 1, 0)]
    assert runs[0].jobs == runs[2].jobs and runs[0].jobs != runs[1].jobs
    # packed placement draws nothing: every seed the same run
    packed = [run_config(parse_run_config(f"order=fifo,seed={s}"), cl, PAIRS) for s in (0, 1)]
    assert packed[0].jobs == packed[1].jobs


def test_generated_pm_scores_follow_the_seed(data_dir: Path) -> None:
    cl = Cluster.homogeneous(4, 4)

    def scores(text: str) -> np.ndarray:
        return parse_run_config(text).model(cl).get("variability").scores

    s0, s1 = scores("order=fifo,P.variability=generate,seed=0"), scores("order=fifo,P.variability=generate,seed=1")
    assert np.array_equal(s0, scores("order=fifo,P.variability=generate,seed=0")) and not np.array_equal(s0, s1)
    # --variability-seed fixes the scores whatever the run's seed
    fixed = "order=fifo,P.variability=generate,P.variability_seed=1"
    assert np.array_equal(scores(fixed + ",seed=0"), s1) and np.array_equal(scores(fixed + ",seed=7"), s1)


def test_seeds_give_different_runs_where_draws_matter_and_say_why_not_elsewhere() -> None:
    configs = [parse_run_config("order=fifo"), parse_run_config("order=fifo,place=random-sticky")]
    res = run_seeds(configs, Cluster.homogeneous(4, 4), [0, 1, 2], PAIRS, processes=1)
    rand = res["fifo/random-sticky"]
    assert len({tuple((j.id, j.finish) for j in r.jobs) for r in rand}) == 3
    agg = aggregate(res)
    assert agg["fifo"]["mean_jct_s"]["ci95"] == 0 and agg["fifo/random-sticky"]["mean_jct_s"]["ci95"] > 0
    assert seed_notes(res) == ["fifo: every seed gave the same run (nothing in it depends on the seed: a trace's "
                               "jobs, no random stage), hence ± 0"]
    # 3-GPU jobs on 2x2: every draw (which GPU is left out) spans the 2 nodes the job needs anyway
    trios = [JobSpec(f"t{i}", 100.0 * i, 3, 500.0) for i in range(4)]
    res = run_seeds(configs[1:], Cluster.homogeneous(2, 2), [0, 1], trios, processes=1)
    assert seed_notes(res) == [
        "fifo/random-sticky: every seed gave the same run although each drew other GPUs at random: no job ran "
        "faster or slower for the GPUs it drew (a job pays the same locality penalty however many nodes beyond the "
        "fewest it spans, and no PM-scores tell GPUs apart), hence ± 0; the seed matters with --variability "
        "generate (GPUs of unequal speed), or with smaller jobs on larger nodes"]


def test_compare_seeds_on_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "pairs.csv"
    trace.write_text("id,arrival,gpus,duration\n" + "".join(f"{j.id},{j.arrival},2,{j.duration}\n" for j in PAIRS))
    r = CliRunner().invoke(app, ["compare", "--trace", str(trace), "--cluster", "4x4", "-c", "order=fifo", "-c",
                                 "order=las,place=random-sticky", "--seeds", "3", "-j", "1", "--no-plots",
                                 "-o", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    jct = {(x["label"], x["seed"]): x["summary"]["mean_jct_s"] for x in doc["runs"]}
    assert len({jct["las/random-sticky", s] for s in (0, 1, 2)}) == 3 and len({jct["fifo", s] for s in (0, 1, 2)}) == 1
    assert doc["aggregate"]["las/random-sticky"]["mean_jct_s"]["ci95"] > 0
    assert "note: fifo: every seed gave the same run" in r.output
