"""The ``gpuloom`` command: the built-in scenario, errors, and compare."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app

REPO = Path(__file__).resolve().parents[1]

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


# -- the researcher's first hour: clear errors, warnings, self-describing results ------------------
def main_output(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the real entry point (``gpuloom ...``): exit code, stdout, stderr."""
    import sys

    from gpuloom.cli import main

    monkeypatch.setattr(sys, "argv", ["gpuloom", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_version(monkeypatch, capsys) -> None:
    from gpuloom import __version__

    code, out, _ = main_output(monkeypatch, capsys, "--version")
    assert code == 0 and out == f"gpuloom {__version__}\n"


@pytest.mark.parametrize(("args", "expect"), [
    (["simulate", "--round", "0"], "error: --round must be a number > 0, got 0\n"),
    (["simulate", "--restart-overhead", "-1"], "error: --restart-overhead must be a number >= 0, got -1\n"),
    (["simulate", "--locality-penalty", "0.5"], "error: --locality-penalty must be a number >= 1, got 0.5\n"),
    (["simulate", "--ordr", "fifo"],
     "error: no such option: --ordr; did you mean --order or --round? (see 'gpuloom simulate --help')\n"),
    (["simulate", "--order", "srtff"], "error: unknown order policy 'srtff'; did you mean 'srtf' or 'srsf'? "
                                       "(choose from: 2d-las, fifo, ftf, las, las-gpu, las-gpu-events, sjf, srsf, srsf-events, srtf, themis, tiresias; "
                                       "or module:Class)\n"),
    (["simulate", "--reschedule-on", "arival"],
     "error: --reschedule-on must be one of none, arrival, completion, both, got 'arival'; did you mean 'arrival'?\n"),
    (["simulate", "--generate", "0"], "error: --generate must be a number of jobs >= 1, got 0\n"),
    (["compare", "--seeds", "0"], "error: --seeds must be a count >= 1, got 0\n"),
    (["compare", "-c", "order=fifo", "-c", "order=lass"],
     "error: config 'order=lass': unknown order policy 'lass'; did you mean 'las' or '2d-las'? (choose from: 2d-las, fifo, "
     "ftf, las, las-gpu, las-gpu-events, sjf, srsf, srsf-events, srtf, themis, tiresias; or module:Class)\n"),
])
def test_bad_options_are_one_line(monkeypatch, capsys, args: list[str], expect: str) -> None:
    code, out, err = main_output(monkeypatch, capsys, *args)
    assert (code, out, err) == (2, "", expect)


def test_unknown_p_name_lists_the_accepted_names(monkeypatch, capsys) -> None:
    code, _, err = main_output(monkeypatch, capsys, "simulate", "--size", "static", "--place", "static",
                               "-P", "slott=2")
    assert code == 2 and err.count("\n") == 1  # one line, however long, not wrapped at 80 columns
    assert err.startswith("error: parameter 'slott' is not taken by order=fifo, group=none, size=static, "
                          "place=static (they take slot); did you mean 'slot'?")
    code, _, err = main_output(monkeypatch, capsys, "simulate", "-P", "thresholds=1,2")
    assert "thresholds is a parameter of order 2d-las" in err


def test_warnings_for_ignored_and_conflicting_options(tmp_path, monkeypatch, capsys) -> None:
    code, _, err = main_output(monkeypatch, capsys, "simulate", "--rate", "5", "--format", "csv", "--cluster",
                               "2x4", "--generate", "20", "--place", "static", "-P", "slot=2",
                               "--no-plots", "-o", str(tmp_path))
    lines = err.splitlines()
    assert "warning: --format is ignored without --trace" in lines
    assert any(x.startswith("warning: --place static places only whole slots") for x in lines)
    # and so it goes: a 1-GPU job never starts on slots of 2: refused before the run, in one line
    assert code == 2 and lines[-1].startswith("error: job job-00: asks 1 GPUs; place policy 'static' places whole "
                                              "slots of 2 GPUs on one node")
    # --rate with --generate is used, not ignored
    assert not any("--rate is ignored" in x for x in lines)
    # jobs that wait for ever (under strict quotas, one larger than its queue's guarantee): the stall guard ends
    # the run and names them
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival,gpus,duration,queue\nsmall,0,1,100,shared\nbig,0,3,100,shared\n")
    code, _, err = main_output(monkeypatch, capsys, "simulate", "--trace", str(trace), "--cluster", "2x4", "--queues",
                               str(REPO / "examples" / "queues.toml"), "-P", "borrow=false", "--no-plots", "-o",
                               str(tmp_path / "stall"))
    stall = next(x for x in err.splitlines() if "stalled" in x)
    assert code == 0 and stall.startswith("warning: fifo/none/proportional/packed-sticky/quota: the run stalled at t=")
    assert json.loads((tmp_path / "stall" / "summary.json").read_text())["stalled"] == ["big"]
    code, _, err = main_output(monkeypatch, capsys, "simulate", "--rate", "5", "--no-plots", "-o", str(tmp_path))
    assert "warning: --rate is ignored without --generate" in err


def test_generate_with_trace_draws_from_the_trace(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival,gpus,duration,model\na,0,2,100,bert\nb,5,4,300,vgg\n")
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--generate", "30", "--rate", "60", "--cluster", "2x4",
                            "--out", str(tmp_path / "o"), "--no-plots", "--seed", "4"])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((tmp_path / "o" / "jobs.csv").open()))
    assert len(rows) == 30 and {(x["gpus"], x["duration"], x["model"]) for x in rows} <= {
        ("2", "100.0", "bert"), ("4", "300.0", "vgg")}
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["trace"] == str(trace) and doc["workload"] == f"30 jobs at 60/h drawn from {trace} (seed 4)"


def test_impossible_jobs_error_or_drop(tmp_path, monkeypatch, capsys) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival,gpus,duration,cpus\nbig,0,1,100,100\nok,0,1,100,2\n")
    args = ["simulate", "--trace", str(trace), "--cluster", "1x8", "--no-plots", "-o", str(tmp_path / "o")]
    code, _, err = main_output(monkeypatch, capsys, *args)
    assert (code, err) == (2, "error: job big: needs 100 CPU cores, the cluster has 24 (use --drop-impossible to "
                              "count such jobs as unfinished)\n")
    code, _, err = main_output(monkeypatch, capsys, *args, "--drop-impossible", "--json")
    assert code == 0 and err == ("warning: 1 of 2 jobs can never run on this cluster and count as unfinished "
                                 "(first: big: needs 100 CPU cores, the cluster has 24)\n")
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["impossible"] == {"big": "needs 100 CPU cores, the cluster has 24"}
    assert (doc["summary"]["completed"], doc["summary"]["unfinished"], doc["summary"]["impossible"]) == (1, 1, 1)


def test_impossible_jobs_asked_once(tmp_path, monkeypatch, capsys) -> None:
    # the command's check hands its answer to the simulator, which does not ask again
    import gpuloom.core.fit as fit
    import gpuloom.sim.engine as engine

    asked: list[int] = []
    real = fit.impossible_jobs

    def counted(specs, cluster):  # noqa: ANN001, ANN202
        asked.append(len(specs))
        return real(specs, cluster)

    monkeypatch.setattr(fit, "impossible_jobs", counted)
    monkeypatch.setattr(engine, "impossible_jobs", counted)
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival,gpus,duration,cpus\nbig,0,1,100,100\nok,0,1,100,2\n")
    code, _, _ = main_output(monkeypatch, capsys, "simulate", "--trace", str(trace), "--cluster", "1x8", "--no-plots",
                             "-o", str(tmp_path / "o"), "--drop-impossible", "--json")
    assert code == 0 and asked == [2]
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["impossible"] == {"big": "needs 100 CPU cores, the cluster has 24"}


def test_results_say_what_they_were_made_from(tmp_path) -> None:
    from gpuloom import __version__

    r = runner.invoke(app, ["simulate", "--out", str(tmp_path), "--generate", "30", "--cluster", "2x4", "--order",
                            "2d-las", "--group", "muri", "-P", "thresholds=100,200", "--seed", "7"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["label"] == doc["stages"] == "2d-las/muri/proportional/packed-sticky"
    assert doc["gpuloom_version"] == __version__ and doc["seed"] == 7 and doc["trace"] is None
    assert doc["workload"] == "30 generated jobs at 20/h (seed 7)"
    assert doc["params"] == {"thresholds": [100, 200]} and doc["config"]["params"] == {"thresholds": [100, 200]}
    assert doc["cluster"]["spec"] == "2x4" and doc["command"].startswith("gpuloom ")
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# gpuloom run: 2d-las/muri/proportional/packed-sticky\n")
    for text in ("- seed: `7`", f"- gpuloom version: `{__version__}`", "- parameters: `thresholds=[100, 200]`",
                 "- workload: `30 generated jobs at 20/h (seed 7)`"):
        assert text in md
    # one time unit for the whole table
    units = {line.split("(")[-1].split(")")[0] for line in md.splitlines()
             if line.startswith("| ") and any(k in line for k in ("JCT (", "makespan (", "delay ("))}
    assert len(units) == 1


def test_compare_with_seeds_writes_runs_ci_and_plots(tmp_path) -> None:
    r = runner.invoke(app, ["compare", "--generate", "30", "--cluster", "2x4", "-c", "order=fifo", "-c",
                            "order=srtf", "--seeds", "3", "--seed", "10", "-j", "2", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert [(x["label"], x["seed"]) for x in doc["runs"]] == [
        ("fifo", 10), ("fifo", 11), ("fifo", 12), ("srtf", 10), ("srtf", 11), ("srtf", 12)]
    assert doc["meta"]["seeds"] == [10, 11, 12] and doc["meta"]["workload"] == "30 generated jobs at 20/h (one per seed)"
    fifo = [x["summary"]["mean_jct"] for x in doc["runs"] if x["label"] == "fifo"]
    assert len(set(fifo)) == 3  # each seed its own workload
    agg = doc["aggregate"]["fifo"]["mean_jct"]
    assert agg["mean"] == pytest.approx(sum(fifo) / 3) and agg["n"] == 3
    import numpy as np
    from scipy.stats import t

    assert agg["ci95"] == pytest.approx(t.ppf(0.975, 2) * np.std(fifo, ddof=1) / 3 ** 0.5)
    for label in ("fifo", "srtf"):
        for s in (10, 11, 12):
            rows = list(csv.DictReader((tmp_path / "runs" / label / f"seed-{s}" / "jobs.csv").open()))
            assert len(rows) == 30 and "ftf_rho" in rows[0] and "slowdown" in rows[0]
    for name in ("jct_cdf_compare.png", "bars_compare.png", "slowdown_cdf_compare.png", "ftf_cdf_compare.png",
                 "utilisation_compare.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in (tmp_path / "compare.md").read_text()
    assert "±" in r.output and len(list(csv.DictReader((tmp_path / "compare.csv").open()))) == 6


def test_compare_writes_per_run_jobs_csv(tmp_path) -> None:
    r = runner.invoke(app, ["compare", "--generate", "20", "--cluster", "2x4", "-c", "order=fifo",
                            "-c", "order=srtf,place=random-sticky", "-j", "1", "--out", str(tmp_path), "--no-plots"])
    assert r.exit_code == 0, r.output
    assert len(list(csv.DictReader((tmp_path / "runs" / "fifo" / "jobs.csv").open()))) == 20
    doc = json.loads((tmp_path / "runs" / "srtf_random-sticky" / "summary.json").read_text())
    assert doc["label"] == "srtf/random-sticky" and doc["stages"] == "srtf/none/proportional/random-sticky"


@pytest.mark.parametrize("args", [["simulate", "--help"], ["queues", "--help"], ["simulate", "--ordr", "fifo"],
                                  ["simulat"], ["--help"]])
def test_the_command_named_alone_answers_as_the_whole_app(monkeypatch, capsys, args: list[str]) -> None:
    # main() builds only the command the first word names (gpuloom.cli.command_for): its help and its usage
    # errors are those of the whole app's; a word that names no command (a misspelling: "did you mean") or
    # none at all gets the whole app
    import typer

    from gpuloom.cli import app, command_for

    argv = ["gpuloom", *args]
    one = command_for(argv)
    assert (sorted(getattr(one, "commands", {})) == [args[0]] if args[0] in ("simulate", "queues")
            else len(getattr(one, "commands", {})) > 10)
    answers = []
    for cmd in (one, typer.main.get_command(app)):
        monkeypatch.setattr("gpuloom.cli.command_for", lambda _argv, cmd=cmd: cmd)
        answers.append(main_output(monkeypatch, capsys, *args))
    assert answers[0] == answers[1]
    assert answers[0][0] in (0, 2) and (answers[0][1] or answers[0][2])


def test_process_age_counts_from_the_process_start() -> None:
    code = ("import time; time.sleep(0.3)\n"
            "import psutil; from gpuloom.cli.output import process_age\n"
            "print(process_age(), time.time() - psutil.Process().create_time())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    age, by_psutil = map(float, out.stdout.split())
    assert 0.3 <= age < 30
    # psutil's boot time is whole seconds: its age reads up to a second long, never short
    assert age - 0.02 <= by_psutil <= age + 1.02
