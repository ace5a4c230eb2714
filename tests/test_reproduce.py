"""`gpuloom reproduce`: a fast smoke test on reduced inputs, and its error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.sim.reproduce import ReproduceError, run, table


def test_reproduce_all_on_reduced_input(data_dir: Path, tmp_path: Path) -> None:
    # limit=8: Gavel's window is jobs 6-7, done within 12 simulated hours on both seeds (a longer window's jobs
    # can keep the 108-GPU cluster's rounds going for days of simulated time)
    results = run("all", data_dir, "paper", seeds=2, out=tmp_path, limit=8)
    assert [r.name for r in results] == ["muri", "synergy", "pal", "fsched", "gavel"]
    text = table(results)
    assert "Muri Fig. 9" in text and "PAL Sec. V-B" in text and "Synergy abstract" in text
    for r in results:
        assert r.rows and all(row.values for row in r.rows)
        assert (tmp_path / f"reproduce_{r.name}_paper.png").stat().st_size > 1000
    pal = next(r for r in results if r.name == "pal")
    assert pal.seeds == 2 and all(len(row.values) == 2 and row.spread is not None for row in pal.rows)
    fs = next(r for r in results if r.name == "fsched")
    assert "reproduced: yes" in fs.notes[0]  # the thesis' direction
    data = json.loads((tmp_path / "reproduce.json").read_text())
    assert {d["name"] for d in data} == {"muri", "synergy", "pal", "fsched", "gavel"}
    gv = next(r for r in results if r.name == "gavel")
    assert gv.seeds == 2 and "Gavel's sim" in text and "Gavel Fig. 8" in text
    assert len(gv.rows) == 9 and all(len(row.values) == 2 for row in gv.rows)


def test_reproduce_cli_and_errors(data_dir: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["reproduce", "fsched", "--data", str(data_dir), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "F-scheduling" in r.output and "static n=6" in r.output
    r = CliRunner().invoke(app, ["reproduce", "nope", "--data", str(data_dir), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown experiment" in r.output
    with pytest.raises(ReproduceError, match="preset"):
        run("muri", data_dir, "blog")
    with pytest.raises(ReproduceError, match="missing input"):
        run("muri", tmp_path, "paper")


# -- a source's trace brings the model options its source simulated it under -----------------
def test_pal_traces_bring_their_source_model_options(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    import numpy as np

    from gpuloom.core.cluster import Cluster
    from gpuloom.perf.assembly import build_model, trace_options
    from gpuloom.perf.variability import generate_for_cluster
    from gpuloom.sim.traces import load_trace

    specs = load_trace(data_dir / "pal/traces/philly/workload-1.csv")
    assert trace_options(specs) == {"variability": "artifact", "locality_rule": "any", "place.backfill": False}
    assert trace_options([*specs, replace(specs[0], id="other", attrs={})]) == {}  # only what every job names
    cl = Cluster.homogeneous(16, 4)
    m = build_model(cl, specs=specs)
    drawn = generate_for_cluster(cl, data_dir / "pal/variability", 0, per_gpu="max", draw="gpu")
    assert np.array_equal(m.get("variability").scores, drawn.scores) and m.get("locality").rule == "any"
    m = build_model(cl, {"seed": 2}, specs)  # the run's seed draws the scores
    drawn2 = generate_for_cluster(cl, data_dir / "pal/variability", 2, per_gpu="max", draw="gpu")
    assert np.array_equal(m.get("variability").scores, drawn2.scores)
    m = build_model(cl, {"variability": "none", "locality_rule": "excess"}, specs)  # given options win
    assert m.get("variability") is None and m.get("locality").rule == "excess"
    assert build_model(cl, specs=load_trace(data_dir / "muri/sim_traces/trace3.csv")).get("variability") is None
    monkeypatch.setattr("gpuloom.perf.datadir.data_dir", lambda: None)
    with pytest.warns(UserWarning, match="needs the measured data folder"):
        m = build_model(cl, specs=specs)
    assert m.get("variability") is None and m.get("locality").rule == "any"


def test_simulate_with_default_flags_on_a_pal_trace(data_dir: Path, tmp_path: Path) -> None:
    trace = str(data_dir / "pal/traces/philly/workload-1.csv")
    base = ["simulate", "--trace", trace, "--cluster", "16x4", "--place", "pal", "--limit", "40", "--no-plots",
            "--json", "--out", str(tmp_path)]

    def mean_jct(*extra: str) -> tuple[float, str]:
        r = CliRunner().invoke(app, [*base, *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout[r.stdout.index("{"):])["mean_jct"], r.output

    default, out = mean_jct()
    assert "variability=artifact, locality_rule=any, place.backfill=False" in out  # the note says what applies
    assert mean_jct("--variability", "artifact", "-P", "locality_rule=any", "-P", "backfill=false")[0] == default
    assert mean_jct("-P", "backfill=true")[0] != default  # given options win, one by one
    assert mean_jct("--variability", "none")[0] != default
    assert mean_jct("-P", "locality_rule=excess")[0] != default


def test_trace_policy_params_only_where_taken_and_not_given() -> None:
    from gpuloom.core.job import JobSpec
    from gpuloom.driver.stack import Stack, trace_policy_params

    specs = [JobSpec("a", 0.0, 1, 10.0, attrs={"source_options": {"place.backfill": False, "locality_rule": "any"}})]
    names = Stack().names
    assert trace_policy_params(names, {}, specs) == {"place.backfill": False}
    assert trace_policy_params(names, {"backfill": True}, specs) == {}
    assert trace_policy_params(names, {"place.backfill": True}, specs) == {}
    assert trace_policy_params({**names, "place": "static"}, {}, specs) == {}
    assert trace_policy_params(names, {}, []) == {}
    assert Stack().scheduler(specs).place.backfill is False and Stack().scheduler().place.backfill is True


# -- measurement windows: Synergy's runner measures jobs 4,000-4,999; PAL's seeds ------------------------------
def test_synergy_window_run_stops_without_changing_the_windows_figures(data_dir: Path) -> None:
    from gpuloom.core.cluster import Cluster
    from gpuloom.perf.sensitivity import load_catalogue
    from gpuloom.sim.engine import simulate
    from gpuloom.sim.reproduce import synergy

    cat = load_catalogue(data_dir / "synergy/model_sensitivity_profiles.csv")
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    window = (40, 60)
    specs = synergy.window_workload(window, seed=1)
    assert len(specs) == 120 and {s.gpus for s in specs} == {1}
    for order, size in (("fifo", "tune"), ("srtf", "proportional")):
        stopped = synergy.run_window(cl, specs, order, size, cat, window, seed=1)
        full = simulate(cl, specs, order=order, size=size, model=synergy._model(cl, cat), round_len=300.0,
                        check=False, seed=1).measure(window)
        last = max(j.finish for j in full.jobs[40:60] if j.finish is not None)
        assert stopped.end_time == last < full.end_time  # the run ends at the window's last finish
        s, f = stopped.summary(), full.summary()
        assert s["completed"] == 20 and s["measure_jobs"] == "40:60"
        for key in ("mean_jct_s", "p99_jct_s", "mean_queueing_delay_s", "makespan_s", "mean_slowdown"):
            assert s[key] == f[key], key  # later jobs never change what the window's jobs did


def test_reproduce_measure_jobs(data_dir: Path, tmp_path: Path) -> None:
    res = run("synergy", data_dir, seeds=1, measure=(30, 40))[0]
    windowed = [r for r in res.rows if "jobs 30-39" in r.metric]
    assert len(windowed) == 9 and all(r.published is None for r in windowed)  # 3.4x is for jobs 4000-4999
    assert any("jobs 0-29" in r.metric for r in res.rows) and "window jobs 30-39 (--measure-jobs)" in res.notes[0]
    with pytest.raises(ReproduceError, match="--measure-jobs applies to gavel and synergy .* not to muri"):
        run("muri", data_dir, measure=(0, 10))
    r = CliRunner().invoke(app, ["reproduce", "pal", "--measure-jobs", "0:10", "--data", str(data_dir),
                                 "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "not to pal" in r.output and not (tmp_path / "x").exists()
    r = CliRunner().invoke(app, ["reproduce", "synergy", "--measure-jobs", "9:3", "--data", str(data_dir),
                                 "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--measure-jobs 9:3: needs 0 <= A < B" in r.output


def test_pal_reports_the_seeds_spread_and_what_each_seed_drew(data_dir: Path) -> None:
    res = run("pal", data_dir, seeds=3, limit=20)[0]
    rows = {(r.setting, r.metric.split()[0]): r for r in res.rows}
    for pol in ("pm-first", "pal"):
        geo, lo, hi = (rows[(f"{pol}, strict queue", k)] for k in ("geomean", "min", "max"))
        assert all(a <= g <= b for a, g, b in zip(lo.values, geo.values, hi.values, strict=True))
    note = next(n for n in res.notes if n.startswith("class-A GPUs drawn"))
    # the measured PM-scores: seed 2 draws none of the slow class-A GPUs, seeds 0 and 1 draw some
    assert "seed 0: 5 (class A max 2.75); seed 1: 2 (class A max 2.88); seed 2: 0 (class A max 1.27)" in note
    assert "(3.6 % of them)" in note and "probability 10 %" in note
    by_seed = next(n for n in res.notes if n.startswith("pm-first, strict queue, geomean by seed"))
    g = rows[("pm-first, strict queue", "geomean")].values
    assert f"range {min(g):.1f}-{max(g):.1f} %" in by_seed
