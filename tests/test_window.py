"""The measurement window (``--measure-jobs A:B``): the summary, jobs.csv and reports over jobs A..B-1."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import RunResult, report, simulate
from gpuloom.sim.metrics import TimeSeries
from gpuloom.sim.window import WindowError, check_window, mask, parse_window, stop_when_finished

# FIFO on one GPU, rounds on every arrival and completion: a 0-100, b 100-150, c 150-180, idle, d 200-210.
# Listed out of arrival order: arrival order is a, b, c, d.
SPECS = [JobSpec("c", 20, 1, 30), JobSpec("a", 0, 1, 100), JobSpec("d", 200, 1, 10), JobSpec("b", 10, 1, 50)]


def run(window: tuple[int, int] | None = None) -> RunResult:
    res = simulate(Cluster.homogeneous(1, 1), SPECS, round_len=math.inf, restart_overhead=0,
                   reschedule_on_arrival=True, reschedule_on_completion=True)
    return res.measure(window)


def test_summary_over_the_window_hand_checked() -> None:
    res = run()
    assert [(j.id, j.first_start, j.finish) for j in res.jobs] == [
        ("a", 0, 100), ("b", 100, 150), ("c", 150, 180), ("d", 200, 210)]
    full = res.summary()
    assert "measure_jobs" not in full and full["jobs"] == 4 and full["mean_jct_s"] == (100 + 140 + 160 + 10) / 4
    s = res.measure((1, 3)).summary()  # b and c
    assert (s["jobs"], s["completed"], s["unfinished"]) == (2, 2, 0)
    assert s["measure_jobs"] == "1:3"
    assert s["mean_jct_s"] == 150.0 and s["median_jct_s"] == 150.0
    assert s["makespan_s"] == 180 - 10  # the window's last finish minus its first arrival
    assert s["mean_queueing_delay_s"] == (90 + 130) / 2
    assert s["mean_slowdown"] == pytest.approx((140 / 50 + 160 / 30) / 2) and s["max_slowdown"] == 160 / 30
    assert s["gpu_util"] == 1.0  # the GPU is busy from b's arrival (10) to c's finish (180)
    rho = res.themis()[1]
    assert s["mean_ftf_rho"] == pytest.approx((rho[1] + rho[2]) / 2) and s["max_ftf_rho"] == max(rho[1], rho[2])
    assert s["rounds"] == full["rounds"]  # the whole run's
    s = res.measure((2, 4)).summary()  # c and d: busy 20-180 and 200-210 of 20-210
    assert s["mean_jct_s"] == 85.0 and s["makespan_s"] == 190 and s["gpu_util"] == pytest.approx(170 / 190)
    assert list(res.jcts()) == [160.0, 10.0]
    assert res.measure(None).summary() == full  # the window off: the summary as before


def test_window_counts_unfinished_jobs_and_the_run_end() -> None:
    res = simulate(Cluster.homogeneous(1, 1), SPECS, round_len=math.inf, restart_overhead=0,
                   reschedule_on_arrival=True, reschedule_on_completion=True, max_time=160)
    s = res.measure((1, 3)).summary()  # b finished at 150; c was running when the run stopped at 160
    assert (s["jobs"], s["completed"], s["unfinished"], s["mean_jct_s"]) == (2, 1, 1, 140.0)
    assert s["gpu_util"] == 1.0  # over 10 to the run's end, 160


def test_ranks_by_arrival_ties_in_workload_order() -> None:
    assert mask([5.0, 0.0, 5.0, 1.0], (1, 3)).tolist() == [True, False, False, True]
    assert mask([5.0, 0.0, 5.0, 1.0], (2, 4)).tolist() == [True, False, True, False]


def test_means_between() -> None:
    ts = TimeSeries()
    for t, g in ((10.0, 2), (20.0, 4), (40.0, 0)):
        ts.record(t, g, 0, 0, 0, 0)
    m = ts.means_between(("gpus",), 0.0, 50.0)["gpus"]
    assert m == (0 * 10 + 2 * 10 + 4 * 20 + 0 * 10) / 50
    assert ts.means_between(("gpus",), 15.0, 30.0)["gpus"] == (2 * 5 + 4 * 10) / 15
    assert ts.means_between(("gpus",), 25.0, 25.0)["gpus"] == 4.0


def test_bad_windows_name_the_option() -> None:
    assert parse_window("4000:5000") == (4000, 5000)
    for bad in ("5", "a:b", "1:2:3", "1.5:3", ""):
        with pytest.raises(WindowError, match=r"--measure-jobs must be A:B"):
            parse_window(bad)
    for bad in ("5:5", "7:3", "-1:3"):
        with pytest.raises(WindowError, match=r"--measure-jobs .*needs 0 <= A < B"):
            parse_window(bad)
    with pytest.raises(WindowError, match=r"--measure-jobs 2:5 reaches beyond the workload: it has 4 jobs"):
        check_window((2, 5), 4)
    with pytest.raises(WindowError, match="beyond the workload"):
        run((0, 5))
    assert check_window((0, 4), 4) == (0, 4)


def test_jobs_csv_marks_the_window_and_is_unchanged_without_one(tmp_path: Path) -> None:
    plain = report.write_run(run(), tmp_path / "plain")["jobs"].read_bytes()
    paths = report.write_run(run((1, 3)), tmp_path / "w")
    rows = list(csv.DictReader(paths["jobs"].open(newline="")))
    assert [(r["id"], r["measured"]) for r in rows] == [("a", "0"), ("b", "1"), ("c", "1"), ("d", "0")]
    # the window adds the last column and nothing else
    cut = b"\r\n".join(line.rsplit(b",", 1)[0] for line in paths["jobs"].read_bytes().split(b"\r\n")[:-1]) + b"\r\n"
    assert cut == plain and b"measured" not in plain
    data = json.loads(paths["summary"].read_text())
    assert data["measure_jobs"] == "1:3" and data["summary"]["measure_jobs"] == "1:3"
    md = report.write_report(run((1, 3)), tmp_path / "w", plots=[]).read_text()
    assert "- measured: `jobs 1-2 by arrival order (2 of 4; every job ran" in md


def test_cli_simulate_and_compare_honour_the_window(tmp_path: Path) -> None:
    base = ["--generate", "30", "--no-plots", "--json"]
    r = CliRunner().invoke(app, ["simulate", *base, "--measure-jobs", "10:20", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout[r.stdout.index("{"):])
    assert s["jobs"] == 10 and s["measure_jobs"] == "10:20"
    rows = list(csv.DictReader((tmp_path / "s" / "jobs.csv").open(newline="")))
    jct = [float(x["jct"]) for x in rows if x["measured"] == "1"]
    assert len(jct) == 10 and s["mean_jct_s"] == pytest.approx(float(np.mean(jct)), rel=1e-12)
    assert [x["measured"] for x in rows] == ["0"] * 10 + ["1"] * 10 + ["0"] * 10  # generated: ids in arrival order
    r = CliRunner().invoke(app, ["compare", *base, "-c", "fifo", "-c", "srtf", "--seeds", "2", "-j", "1",
                                 "--measure-jobs", "10:20", "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout[r.stdout.index("["):])
    assert len(got) == 4 and all(x["jobs"] == 10 and x["measure_jobs"] == "10:20" for x in got)
    assert "- measure_jobs: `10:20`" in (tmp_path / "c" / "compare.md").read_text()
    for args, msg in ((["--measure-jobs", "10:31"], "--measure-jobs 10:31 reaches beyond the workload: it has 30 jobs"),
                      (["--measure-jobs", "3"], "--measure-jobs must be A:B"),
                      (["--measure-jobs", "4:2"], "--measure-jobs 4:2: needs 0 <= A < B")):
        for cmd in ("simulate", "compare"):
            r = CliRunner().invoke(app, [cmd, *base, *args, "--out", str(tmp_path / "bad")])
            assert r.exit_code == 2 and msg in r.output, r.output
            assert not (tmp_path / "bad").exists()  # refused before any run or folder


def test_stop_when_finished_ends_the_run_at_the_windows_last_finish() -> None:
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator

    cl = Cluster.homogeneous(1, 1)
    sim = Simulator(cl, SPECS, Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"), None,
                    SimConfig(round_len=math.inf, restart_overhead=0, reschedule_on_arrival=True,
                              reschedule_on_completion=True), observers=[stop_when_finished({"b"})])
    res = sim.run()
    assert res.end_time == 150 and [j.finish for j in res.jobs] == [100, 150, None, None]
