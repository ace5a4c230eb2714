"""`gpuloom reproduce`: a fast smoke test on reduced inputs, and its error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.sim.reproduce import ReproduceError, run, table


def test_reproduce_all_on_reduced_input(data_dir: Path, tmp_path: Path) -> None:
    results = run("all", data_dir, "paper", seeds=2, out=tmp_path, limit=40)
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
