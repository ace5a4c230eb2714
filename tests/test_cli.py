"""The ``gpuloom`` command: the built-in scenario, errors, and compare."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpuloom.cli import app

runner = CliRunner()


def test_simulate_builtin_scenario_writes_results(tmp_path) -> None:
    r = runner.invoke(app, ["simulate", "--out", str(tmp_path), "--json", "--no-plots"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    flat = json.dumps(summary)
    assert '"completed": 200' in flat and '"unfinished": 0' in flat
    assert (tmp_path / "jobs.csv").read_text().count("\n") == 201


def test_simulate_plots_and_report(tmp_path) -> None:
    r = runner.invoke(app, ["simulate", "--out", str(tmp_path), "--generate", "30", "--cluster", "2x4",
                            "--order", "srtf", "--place", "random-sticky", "-P", "thresholds=100,200"])
    # thresholds belongs to 2d-las only: a clear error, nothing run
    assert r.exit_code == 2 and "thresholds" in r.output
    r = runner.invoke(app, ["simulate", "--out", str(tmp_path), "--generate", "30", "--cluster", "2x4",
                            "--order", "2d-las", "-P", "thresholds=100,200"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "report.md").exists() and (tmp_path / "jct_cdf.png").stat().st_size > 1000


def test_simulate_errors_are_one_clear_line(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,arrival,gpus,duration\nj1,0,2,100\nj2,5,x,100\n")
    r = runner.invoke(app, ["simulate", "--trace", str(bad), "--format", "csv", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert "bad.csv:3" in r.output and "gpus" in r.output
    r = runner.invoke(app, ["simulate", "--order", "nope", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown order policy 'nope'" in r.output
    r = runner.invoke(app, ["simulate", "--cluster", "4y4", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "4y4" in r.output
    big = tmp_path / "big.csv"
    big.write_text("id,arrival,gpus,duration\nj1,0,64,100\n")
    r = runner.invoke(app, ["simulate", "--trace", str(big), "--cluster", "2x4", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "j1: needs 64 GPUs, the cluster has 8" in r.output


def test_compare_runs_configs_side_by_side(tmp_path) -> None:
    r = runner.invoke(app, ["compare", "--generate", "40", "--cluster", "2x4", "-c", "order=fifo", "-c", "order=srtf",
                            "-j", "1", "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "compare.json").read_text())
    assert [r["label"] for r in rows["runs"]] == ["fifo", "srtf"]
    assert (tmp_path / "compare.csv").exists() and (tmp_path / "jct_cdf_compare.png").exists()
