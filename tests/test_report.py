"""Reports: files parse back with the exact values of small hand-checked runs."""

from __future__ import annotations

import csv
import io
import json
import math
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.job import JobSpec
from gpuloom.sim import RunResult, report, runcsv, simulate
from gpuloom.sim.metrics import DEPRECATED_KEYS, JobRecord, TimeSeries
from gpuloom.sim.plots import binned_series, cdf_points, modelled_panels, plot_compare, plot_run
from gpuloom.sim.report import (
    JOB_COLUMNS,
    METRICS,
    jsonable,
    summary_rows,
    summary_table,
    write_compare,
    write_report,
    write_run,
)

# FIFO on one GPU: a (100 s) and b (50 s) at 0, c (20 s) at 10 -> a 0-100, b 100-150, c 150-170
SPECS = [JobSpec("a", 0, 1, 100, model="resnet50"), JobSpec("b", 0, 1, 50), JobSpec("c", 10, 1, 20)]
PNG = b"\x89PNG\r\n\x1a\n"


def run(order: str = "fifo", cluster: Cluster | None = None, **kw: object) -> RunResult:
    return simulate(cluster or Cluster.homogeneous(1, 1), SPECS, order=order, round_len=10, restart_overhead=0, **kw)


def strict_json(path: Path) -> dict:
    def bad(x: str) -> None:
        raise AssertionError(f"{path}: non-standard JSON constant {x}")

    return json.loads(path.read_text(), parse_constant=bad)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_write_run_files_parse_back_exactly(tmp_path: Path) -> None:
    paths = write_run(run(), tmp_path / "out")
    assert set(paths) == {"jobs", "series", "summary"}
    rows = list(csv.DictReader(paths["jobs"].open()))
    # every job walks the lifecycle: its phases follow the fixed columns
    assert list(rows[0]) == [*JOB_COLUMNS, "phase_queued", "phase_launching", "phase_running"]
    got = {r["id"]: r for r in rows}
    expect = {  # first_start, finish, jct, queueing_delay, queued_time, slowdown
        "a": (0, 100, 100, 0, 0, 1),
        "b": (100, 150, 150, 100, 100, 3),
        "c": (150, 170, 160, 140, 140, 8),
    }
    for jid, (fs, fin, jct, qd, qt, slow) in expect.items():
        r = got[jid]
        assert [float(r[k]) for k in ("first_start", "finish", "jct", "queueing_delay", "queued_time", "slowdown")] \
            == [fs, fin, jct, qd, qt, slow]
    # Themis: active jobs 2 on [0,10), 3 on [10,100), 2 on [100,150), 1 on [150,170); G = g = 1.
    # a: N = (2*10 + 3*90) / 100 = 2.9, T_id = 100 * 2.9 = 290, rho = 100/290
    # b: N = (290 + 2*50) / 150 = 2.6, T_id = 50 * 2.6 = 130, rho = 150/130
    # c: N = (3*90 + 2*50 + 1*20) / 160 = 2.4375, T_id = 20 * 2.4375 = 48.75, rho = 160/48.75
    for jid, n, rho in (("a", 2.9, 100 / 290), ("b", 2.6, 150 / 130), ("c", 2.4375, 160 / 48.75)):
        assert float(got[jid]["contention"]) == pytest.approx(n, rel=1e-12)
        assert float(got[jid]["ftf_rho"]) == pytest.approx(rho, rel=1e-12)
        assert int(r["preemptions"]) == int(r["migrations"]) == int(r["resizes"]) == 0
        assert float(r["run_time"]) == float(r["duration"])
    assert got["a"]["model"] == "resnet50" and got["c"]["arrival"] == "10" and got["c"]["gpus"] == "1"

    series = [tuple(map(float, r)) for r in list(csv.reader(paths["series"].open()))[1:]]
    assert series == [(0, 1, 3, 64000, 1, 1), (10, 1, 3, 64000, 1, 2), (100, 1, 3, 64000, 1, 1),
                      (150, 1, 3, 64000, 1, 0), (170, 0, 0, 0, 0, 0)]

    doc = strict_json(paths["summary"])
    s = doc["summary"]
    assert s["mean_jct_s"] == pytest.approx(410 / 3, rel=1e-12)
    assert (s["median_jct_s"], s["makespan_s"], s["completed"], s["unfinished"]) == (150, 170, 3, 0)
    assert s["p95_jct_s"] == pytest.approx(159.0) and s["p99_jct_s"] == pytest.approx(159.8)
    assert s["geomean_jct_s"] == pytest.approx((100 * 150 * 160) ** (1 / 3))
    assert s["mean_queueing_delay_s"] == 80 and s["max_slowdown"] == 8 and s["mean_slowdown"] == 4
    # the names without a unit, deprecated, are still there with the same values
    assert DEPRECATED_KEYS == {"mean_jct": "mean_jct_s", "median_jct": "median_jct_s", "p95_jct": "p95_jct_s",
                               "p99_jct": "p99_jct_s", "geomean_jct": "geomean_jct_s", "makespan": "makespan_s",
                               "mean_queueing_delay": "mean_queueing_delay_s"}
    assert all(s[old] == s[new] for old, new in DEPRECATED_KEYS.items())
    assert s["max_ftf_rho"] == pytest.approx(160 / 48.75) and s["mean_ftf_rho"] == pytest.approx(
        (100 / 290 + 150 / 130 + 160 / 48.75) / 3)
    assert s["gpu_util"] == s["cpu_util"] == s["mem_util"] == 1.0
    assert doc["config"]["order"] == "fifo" and doc["config"]["max_time"] is None  # inf -> null
    assert doc["cluster"] == {"gpus": 1, "cpus": 3, "mem_mb": 64000}
    assert doc["end_time"] == 170


def test_unfinished_jobs_give_empty_cells_and_null_json(tmp_path: Path) -> None:
    res = run(max_time=60)  # nothing finishes by t=60; b and c never start
    paths = write_run(res, tmp_path)
    rows = {r["id"]: r for r in csv.DictReader(paths["jobs"].open())}
    assert rows["a"]["first_start"] == "0.0" and rows["a"]["finish"] == "" and rows["a"]["jct"] == ""
    assert all(rows["b"][k] == "" for k in ("first_start", "finish", "jct", "queueing_delay", "slowdown",
                                            "contention", "ftf_rho"))
    s = strict_json(paths["summary"])["summary"]
    assert (s["completed"], s["unfinished"]) == (0, 3)
    assert s["mean_jct"] is None and s["p99_jct"] is None and s["geomean_jct"] is None


def test_plot_run_pngs(tmp_path: Path) -> None:
    paths = plot_run(run(), tmp_path)
    assert [p.name for p in paths] == ["jct_cdf.png", "utilisation.png", "queue.png"]
    for p in paths:
        assert p.stat().st_size > 5000
        png_size(p)
    # cores and memory given out in proportion to GPUs would repeat the GPU panel: one panel
    one = png_size(tmp_path / "utilisation.png")[1]
    assert [t for _, _, t in modelled_panels(run())] == ["GPU"]
    gpu_only = Cluster((Node("n0", 1, 0, 0),))
    plot_run(run(cluster=gpu_only), tmp_path / "g")
    assert png_size(tmp_path / "g" / "utilisation.png")[1] == one
    # a asks 1 core (its share is 3), then also 1 GB (its share is 64): CPU, then memory, differ from GPU
    for k, own, titles in ((2, {"cpus": 1}, ["GPU", "CPU"]), (3, {"cpus": 1, "mem_mb": 1000}, ["GPU", "CPU", "memory"])):
        res = simulate(Cluster.homogeneous(1, 1), [replace(SPECS[0], **own), *SPECS[1:]], round_len=10,
                       restart_overhead=0)
        assert [t for _, _, t in modelled_panels(res)] == titles
        plot_run(res, tmp_path / str(k))
        assert png_size(tmp_path / str(k) / "utilisation.png")[1] == k * one


def test_plot_run_with_no_finished_job(tmp_path: Path) -> None:
    paths = plot_run(run(max_time=5), tmp_path)
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_write_report_links_existing_plots(tmp_path: Path) -> None:
    path = write_report(run(), tmp_path)
    md = path.read_text()
    assert "| mean JCT (s) | 136.7 |" in md and "| makespan (s) | 170.0 |" in md
    assert "| GPU utilisation (%) | 100.0 |" in md and "| order | fifo |" in md
    for name in ("jct_cdf.png", "utilisation.png", "queue.png"):
        assert f"]({name})" in md and (tmp_path / name).read_bytes()[:8] == PNG
    txt = (tmp_path / "report.txt").read_text()
    assert "mean JCT (s)" in txt and "136.7" in txt


def test_summary_table_side_by_side() -> None:
    results = {"fifo": run("fifo"), "srtf": run("srtf")}
    # SRTF: c preempts a at 10, b runs 30-80 -> a finishes at 170, b at 80, c at 30
    assert [j.jct for j in results["srtf"].jobs] == [170, 70, 20]
    table = summary_table(results)
    assert [c.header for c in table.columns] == ["metric", "fifo", "srtf"]
    assert table.row_count == len(METRICS)
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(table)
    text = buf.getvalue()
    mean_line = next(line for line in text.splitlines() if "mean JCT" in line)
    assert "136.7" in mean_line and "86.7" in mean_line
    rows = summary_rows(results)
    assert [r["label"] for r in rows] == ["fifo", "srtf"]
    assert rows[1]["mean_jct"] == pytest.approx(260 / 3) and rows[1]["preemptions"] == 1
    assert rows[0]["order"] == "fifo" and rows[1]["order"] == "srtf"


def test_time_rows_share_a_unit() -> None:
    long_specs = [JobSpec("x", 0, 1, 20_000), JobSpec("y", 0, 1, 50)]
    res = {"fifo": simulate(Cluster.homogeneous(1, 1), long_specs, round_len=50, restart_overhead=0),
           "sjf": simulate(Cluster.homogeneous(1, 1), long_specs, order="sjf", round_len=50,
                          restart_overhead=0)}
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(summary_table(res))
    # fifo: y waits for x -> max JCT 20,050 s = 334.2 min; sjf: 50 s and 20,050 s
    line = next(s for s in buf.getvalue().splitlines() if "makespan" in s)
    assert "(min)" in line and line.count("334.2") == 2


def test_write_compare(tmp_path: Path) -> None:
    results = {"fifo": run("fifo"), "srtf": run("srtf")}
    paths = write_compare(results, tmp_path)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["label"] for r in rows] == ["fifo", "srtf"]
    assert float(rows[0]["mean_jct"]) == pytest.approx(410 / 3, rel=1e-12)
    doc = strict_json(paths["json"])
    assert [r["label"] for r in doc["runs"]] == ["fifo", "srtf"]
    assert doc["runs"][1]["summary"]["median_jct"] == 70
    assert paths["plot"].read_bytes()[:8] == PNG
    assert "jct_cdf_compare.png" in paths["report"].read_text()
    assert plot_compare(results, tmp_path / "sub" / "c.png").stat().st_size > 5000


def test_binned_series_exact_against_brute_force() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(2.0, n - 1))])
    v = rng.integers(0, 20, n).astype(float)
    end = t[-1] + 7.0
    edges, mean, lo, hi = binned_series(t, v, end, bins=97)
    assert len(edges) == 98 and edges[0] == 0 and edges[-1] == end
    tt = np.append(t, end)
    for k in range(97):
        a, b = edges[k], edges[k + 1]
        overlap = np.clip(np.minimum(tt[1:], b) - np.maximum(tt[:-1], a), 0, None)
        held = overlap > 0
        assert mean[k] == pytest.approx((overlap * v).sum() / (b - a), rel=1e-9)
        assert (lo[k], hi[k]) == (v[held].min(), v[held].max())
    # the integral is kept: the bins' means average to the series' time-weighted mean
    assert np.mean(mean) == pytest.approx((v * np.diff(tt)).sum() / end, rel=1e-9)


def test_binned_series_short_series_unchanged() -> None:
    edges, mean, lo, hi = binned_series(np.array([0.0, 5.0]), np.array([2.0, 1.0]), 8.0)
    assert edges.tolist() == [0, 5, 8] and mean.tolist() == lo.tolist() == hi.tolist() == [2, 1]


def test_cdf_points() -> None:
    x, y = cdf_points(np.array([3.0, 1.0, 2.0]))
    assert x.tolist() == [1, 2, 3] and y.tolist() == pytest.approx([1 / 3, 2 / 3, 1])
    vals = np.random.default_rng(0).lognormal(5, 2, 100_000)
    x, y = cdf_points(vals, max_points=500)
    assert len(x) <= 500 and x[-1] == vals.max() and x[0] == vals.min() and y[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)


def test_jsonable() -> None:
    doc = jsonable({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": np.int64(3), "d": (1, Path("x"))})
    assert doc == {"a": None, "b": [None, None, 1.5], "c": 3, "d": [1, "x"]}
    json.dumps(doc, allow_nan=False)


def test_real_workload_reports_and_compare(tmp_path: Path, data_dir: Path) -> None:
    """PAL's Sia-Philly 160-job workload on 16x4: files agree with the summary; parallel = sequential."""
    traces = pytest.importorskip("gpuloom.sim.traces")
    from gpuloom.sim.runconfig import parse_run_config, run_many

    specs = traces.load_trace(data_dir / "pal" / "traces" / "philly" / "workload-1.csv")
    assert len(specs) == 160
    cluster = Cluster.homogeneous(16, 4)
    configs = [parse_run_config(f"order={o},round=360") for o in ("fifo", "srtf")]
    par = run_many(configs, cluster, specs, processes=2)
    seq = run_many(configs, cluster, specs, processes=1)
    for label in par:
        assert par[label].jobs == seq[label].jobs and par[label].series == seq[label].series
    res = par["fifo/round_len=360"]
    paths = write_run(res, tmp_path)
    rows = list(csv.DictReader(paths["jobs"].open()))
    assert len(rows) == 160 and all(r["jct"] for r in rows)
    s = strict_json(paths["summary"])["summary"]
    jcts = [float(r["jct"]) for r in rows]
    assert s["completed"] == 160 and s["mean_jct"] == pytest.approx(np.mean(jcts), rel=1e-12)
    assert s["p99_jct"] == pytest.approx(np.percentile(jcts, 99), rel=1e-12)
    assert 0 < s["gpu_util"] <= 1
    # time-weighted GPU utilisation recomputed from series.csv
    ser = np.array([[float(x) for x in r] for r in list(csv.reader(paths["series"].open()))[1:]])
    end = max(res.end_time, ser[-1, 0])
    busy = (ser[:, 1] * np.diff(np.append(ser[:, 0], end))).sum()
    assert s["gpu_util"] == pytest.approx(busy / (end - ser[0, 0]) / 64, rel=1e-9)
    assert par["srtf/round_len=360"].summary()["mean_jct"] <= s["mean_jct"]
    out = write_compare(par, tmp_path / "cmp")
    assert len(list(csv.DictReader(out["csv"].open()))) == 2


def test_lifecycle_phases_become_columns(tmp_path: Path) -> None:
    from gpuloom.sim.engine import LifecycleTimes

    res = run(lifecycle=LifecycleTimes(launch=20))
    rows = {r["id"]: r for r in csv.DictReader(write_run(res, tmp_path)["jobs"].open())}
    assert [float(rows[k]["jct"]) for k in "abc"] == [120, 190, 220]
    assert (rows["c"]["phase_queued"], rows["c"]["phase_launching"], rows["c"]["phase_running"]) == \
        ("180.0", "20.0", "20.0")


def test_report_links_plots_elsewhere_relatively(tmp_path: Path) -> None:
    res = run()
    plots = plot_run(res, tmp_path / "plots")
    md = write_report(res, tmp_path / "rep", plots=plots).read_text()
    assert "](../plots/jct_cdf.png)" in md and "](../plots/queue.png)" in md
    assert not (tmp_path / "rep" / "jct_cdf.png").exists()


# -- the files, written a column at a time: exactly what the csv module wrote row by row ------------------------
HEAD = ("id,model,gpus,arrival,duration,first_start,finish,jct,queueing_delay,preemptions,migrations,resizes,run_time,"
        "overhead_time,queued_time,slowdown,contention,ftf_rho,phase_queued,phase_launching,phase_running\r\n")


def test_jobs_and_series_csv_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the FIFO run above: the specs' integer times stay integers (0, 10), the simulator's are floats; floats in
    # their shortest exact form (contention 2.9 = 290/100, ρ = 100/290 ...: test_write_run_files_parse_back_exactly)
    jobs = HEAD + (
        "a,resnet50,1,0,100,0.0,100.0,100.0,0.0,0,0,0,100.0,0.0,0.0,1.0,2.9,0.3448275862068966,0.0,0.0,100.0\r\n"
        "b,,1,0,50,100.0,150.0,150.0,100.0,0,0,0,50.0,0.0,100.0,3.0,2.6,1.1538461538461537,100.0,0.0,50.0\r\n"
        "c,,1,10,20,150.0,170.0,160.0,140.0,0,0,0,20.0,0.0,140.0,8.0,2.4375,3.282051282051282,140.0,0.0,20.0\r\n")
    series = ("t,gpus,cpus,mem_mb,running,queued\r\n0,1,3,64000,1,1\r\n10,1,3,64000,1,2\r\n100.0,1,3,64000,1,1\r\n"
              "150.0,1,3,64000,1,0\r\n170.0,0,0,0,0,0\r\n")
    paths = write_run(run(), tmp_path / "one")
    assert paths["jobs"].read_bytes() == jobs.encode() and paths["series"].read_bytes() == series.encode()
    # in blocks of two rows: the same text
    monkeypatch.setattr(runcsv, "CSV_BLOCK", 2)  # where the writers read it
    paths = write_run(run(), tmp_path / "two")
    assert paths["jobs"].read_bytes() == jobs.encode() and paths["series"].read_bytes() == series.encode()
    # unfinished at t=60 (a runs 0-60; b and c wait): empty cells where there is no value
    paths = write_run(run(max_time=60), tmp_path / "cut")
    assert paths["jobs"].read_text() == HEAD.replace("\r\n", "\n") + (
        "a,resnet50,1,0,100,0.0,,,0.0,0,0,0,60.0,0.0,0.0,,,,0.0,0.0,60.0\n"
        "b,,1,0,50,,,,,0,0,0,0.0,0.0,60.0,,,,60.0,0.0,0.0\n"
        "c,,1,10,20,,,,,0,0,0,0.0,0.0,50.0,,,,50.0,0.0,0.0\n")


def test_jobs_csv_quotes_as_the_csv_module_does(tmp_path: Path) -> None:
    # ids and models with the csv module's special characters; a record without phases (never arrived); floats
    # beyond the finite ones.  The expected text is what csv.writer made of the same rows, one by one.
    ids = ["a,b", 'say "hi"', "two\nlines", "cr\rhere", " lead", "plain", "ü;x\t"]
    recs = [JobRecord(jid, jid[::-1], 1, float(k), 10.0, float(k), float(k) + 10.0, 0, 0, 0, 10.0, 0.0, 0.0,
                      (0.0, 0.0, 10.0)) for k, jid in enumerate(ids)]
    recs.append(JobRecord("late", "", 2, 50, 5, None, None, 0, 0, 0, math.inf, -0.0, math.nan, None))
    series = TimeSeries([0.0, 6.5], [1, 0], [0, 0], [0, 0], [1, 0], [0, 0])
    res = RunResult({"order": "fifo"}, recs, series, 8, 0, 0, 60.0)
    got = write_run(res, tmp_path)["jobs"].read_bytes()
    contention, rho = res.themis()
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(HEAD.rstrip().split(","))
    for i, j in enumerate(recs):
        fin = j.finish
        ph = j.phases or {}
        w.writerow([j.id, j.model, j.gpus, *(("" if v is None or v != v else repr(v)) for v in (
            j.arrival, j.duration, j.first_start, fin, None if fin is None else fin - j.arrival,
            None if j.first_start is None else j.first_start - j.arrival)),
            j.preemptions, j.migrations, j.resizes, *(("" if v is None or v != v else repr(v)) for v in (
                j.run_time, j.overhead_time, j.queued_time, None if fin is None else (fin - j.arrival) / j.duration,
                float(contention[i]), float(rho[i]), ph.get("queued"), ph.get("launching"), ph.get("running")))])
    assert got == buf.getvalue().encode()
    assert b'\r\n"a,b","b,a",1,0.0,' in got and b'\r\n"say ""hi""","""ih"" yas",1,' in got
    assert b'\r\n"two\nlines","senil\nowt",1,' in got and b'\r\n"cr\rhere","ereh\rrc",1' in got
    assert b"\r\n lead,dael ,1," in got and "\r\nü;x\t,\tx;ü,1,".encode() in got
    assert got.endswith(b"late,,2,50,5,,,,,0,0,0,inf,-0.0,,,,,,,\r\n")


def test_phase_columns_equal_to_others_in_value_only_keep_their_own_text(tmp_path: Path) -> None:
    # phase_queued and phase_launching are often queued_time and overhead_time again, and share their cells; only
    # where they are the same floats bit for bit: 0.0 == -0.0 and 5 == 5.0, but their text differs
    def rec(jid: str, queued: float, overhead: float, phases: tuple[float, float, float]) -> JobRecord:
        return JobRecord(jid, "", 1, 0.0, 10.0, 5.0, 15.0, 0, 0, 0, 10.0, overhead, queued, phases)

    series = TimeSeries([0.0, 15.0], [1, 0], [0, 0], [0, 0], [1, 0], [0, 0])
    same = RunResult({}, [rec("a", 5.0, 0.0, (5.0, 0.0, 10.0))], series, 1, 0, 0, 15.0)
    assert write_run(same, tmp_path / "same")["jobs"].read_text().splitlines()[1].endswith(
        ",10.0,0.0,5.0,1.5,1.0,1.5,5.0,0.0,10.0")
    signs = RunResult({}, [rec("a", 5, -0.0, (5.0, 0.0, 10.0)), rec("b", 5.0, 0.0, (5.0, -0.0, 10.0))], series, 1,
                      0, 0, 15.0)
    rows = write_run(signs, tmp_path / "signs")["jobs"].read_text().splitlines()[1:]
    assert [r.split(",")[13:15] + r.split(",")[18:20] for r in rows] == [["-0.0", "5", "5.0", "0.0"],
                                                                          ["0.0", "5.0", "5.0", "-0.0"]]


def _record_fields(res: RunResult, index: list[int]) -> list[list[Any]]:
    """:data:`report.HEAD_FIELDS` of ``res``'s jobs at places ``index``, one list per field."""
    return [[getattr(res.jobs[i], name) for i in index] for name in report.HEAD_FIELDS]


@pytest.mark.parametrize("block", [1 << 16, 2])
def test_rows_made_ahead_give_the_bytes_of_jobs_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    block: int) -> None:
    # jobs.csv from rows sent in parts, in any order, the rest given at the end: write_jobs_csv's bytes, with
    # phases, a measurement window, unfinished jobs (empty cells) and ids the csv module quotes
    from gpuloom.sim.engine import LifecycleTimes

    monkeypatch.setattr(runcsv, "CSV_BLOCK", block)
    specs = [JobSpec(f"j{k}" if k % 4 else f"j,{k}", k * 7.5, 1 + k % 2, 30 + 11 * k, model=("", "x")[k % 2])
             for k in range(12)]
    cases = {
        "plain": simulate(Cluster.homogeneous(1, 2), specs, order="srtf", round_len=10, restart_overhead=3),
        "phases": simulate(Cluster.homogeneous(1, 2), specs, round_len=10, lifecycle=LifecycleTimes(launch=4),
                           max_time=150),
    }
    cases["window"] = simulate(Cluster.homogeneous(1, 2), specs, round_len=10, max_time=200)
    cases["window"].measure((3, 9))
    for name, res in cases.items():
        want = report.write_jobs_csv(res, tmp_path / f"{name}-want.csv").read_bytes()
        assert any(j.finish is None for j in res.jobs) == (name != "plain")
        parts = [[7, 2], [0], [11, 5, 9]]  # (the rest: 1, 3, 4, 6, 8, 10)
        rows = report.JobRows()
        for index in parts:
            rows.add((index, _record_fields(res, index)))
        given = {i for p in parts for i in p}
        rest = report.jobs_rest(res, tmp_path / f"{name}.csv", given)
        assert rest.index == [1, 3, 4, 6, 8, 10]
        assert rows.write(rest).read_bytes() == want, name
        # every row in the rest, and every row ahead
        assert report.JobRows().write(report.jobs_rest(res, tmp_path / "none.csv", set())).read_bytes() == want
        every = report.JobRows()
        every.add((list(range(12)), _record_fields(res, list(range(12)))))
        assert every.write(report.jobs_rest(res, tmp_path / "all.csv", set(range(12)))).read_bytes() == want
    assert b"phase_queued" in (tmp_path / "phases.csv").read_bytes()
    assert b",measured\r\n" in (tmp_path / "window.csv").read_bytes()
    assert b'\r\n"j,0",,1,0.0,30,0.0,30.0,' in (tmp_path / "plain.csv").read_bytes()


def test_a_completed_job_holds_what_its_record_will(tmp_path: Path) -> None:
    # the fields read from the simulator's jobs as they complete (preempted, migrated, restarted ones too) are
    # those of their records at the end: rows made of them during the run are final
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator

    specs = [JobSpec(f"j{k}", k * 20.0, (1, 2, 4)[k % 3], 50 + 37 * (k % 5)) for k in range(40)]
    sim = Simulator(Cluster.homogeneous(2, 4), specs, Scheduler.from_names("srtf", "none", "proportional",
                                                                           "packed-non-sticky"),
                    config=SimConfig(round_len=30, restart_overhead=5, max_time=1500))
    seen: dict[int, list[Any]] = {}

    def tick(done: int, total: int) -> None:
        new = [j for j in sim.completed if j.index not in seen]
        for j, fields in zip(new, zip(*report.job_fields(new), strict=True), strict=True):
            seen[j.index] = list(fields)

    res = sim.run(tick)
    tick(0, 0)
    finished = [j.index for j in sim.jobs if j.finish is not None]
    assert 0 < len(finished) < len(specs)  # (max_time: some jobs never finish)
    assert sorted(seen) == sorted(j.index for j in sim.completed) == finished
    assert [j.finish for j in sim.completed] == sorted(j.finish for j in sim.completed)
    assert sum(r.preemptions + r.migrations for r in res.jobs) > 0
    for i, fields in seen.items():
        assert fields == [getattr(res.jobs[i], name) for name in report.HEAD_FIELDS], i


@pytest.mark.parametrize("block", [1 << 16, 2])
def test_series_rows_made_ahead_give_the_bytes_of_series_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             block: int) -> None:
    monkeypatch.setattr(runcsv, "CSV_BLOCK", block)
    s = TimeSeries([0, 2.5, 10.0, 1e-7, 12.25], [1, 2, 0, 3, 0], [3, 6, 0, 9, 0], [64000, 0, 1, 2, 3],
                   [1, 2, 0, 3, 0], [0, 1, 5, 0, 0])
    want = report.write_series_csv(s, tmp_path / "want.csv").read_bytes()
    assert want.startswith(b"t,gpus,cpus,mem_mb,running,queued\r\n0,1,3,64000,1,0\r\n2.5,") and want.endswith(
        b"\r\n1e-07,3,9,2,3,0\r\n12.25,0,0,3,0,0\r\n")
    for cuts in ([0, 0, 5], [0, 1, 3, 5], [0, 4, 5], [0, 5, 5]):
        rows = report.SeriesRows()
        for a, b in zip(cuts[:-2], cuts[1:-1], strict=True):
            rows.add(report.series_points(s, a, b))
        assert rows.write(report.series_points(s, cuts[-2], 5), tmp_path / "got.csv").read_bytes() == want, cuts
    empty = report.SeriesRows().write(report.series_points(TimeSeries(), 0, 0), tmp_path / "empty.csv")
    assert empty.read_bytes() == report.write_series_csv(TimeSeries(), tmp_path / "empty-want.csv").read_bytes()


def test_the_sender_sends_only_rows_the_run_will_not_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # simulate's child is sent finished jobs' rows and the series but for its last point, which the run may
    # still replace (another event at the same instant: here 32 jobs end at t=100, the 32nd at a progress
    # tick), and the files are the same bytes
    from gpuloom.cli import simfiles
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.background import Background
    from gpuloom.sim.engine import SimConfig, Simulator

    monkeypatch.setattr(simfiles, "ROWS_PART", 1)
    specs = [JobSpec(f"s{k}", 0.0, 1, 100) for k in range(40)]
    specs += [JobSpec(f"j{k}", 100 + k * 20.0, (1, 2, 4)[k % 3], 50 + 37 * (k % 5)) for k in range(30)]
    sim = Simulator(Cluster.homogeneous(4, 8), specs, Scheduler.from_names("srtf", "none", "proportional",
                                                                           "packed-non-sticky"),
                    config=SimConfig(round_len=30, restart_overhead=5))
    rows = simfiles._Made()
    child: Background[Any, None] = Background("writing", rows.write, fork=False, take=rows.add)
    sender = simfiles._Sender(child, child, [sim])
    lasts: list[tuple[int, list[Any]]] = []

    def tick(done: int, total: int) -> None:
        if sim.series.t:
            lasts.append((len(sim.series) - 1, [c[0] for c in report.series_points(sim.series, -1, None)]))
        sender()

    res = sim.run(tick)
    assert sender.jobs == 70 and len(rows.jobs.heads) == 70  # (the run's last tick sent them all)
    assert 0 < sender.points < len(res.series)
    final = {i: [c[0] for c in report.series_points(res.series, i, i + 1)] for i, _ in lasts}
    assert any(final[i] != last for i, last in lasts)  # a last point sent too early would be stale
    folder = tmp_path / "run"
    folder.mkdir()
    child.submit((sender.jobs_rest(res, folder), sender.last_points(res), folder))
    assert (folder / "jobs.csv").read_bytes() == report.write_jobs_csv(res, tmp_path / "jobs.csv").read_bytes()
    assert (folder / "series.csv").read_bytes() == report.write_series_csv(res, tmp_path / "series.csv").read_bytes()


def test_summary_is_computed_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # summary.json, report.md, report.txt, the plots and the printed table all read one summary
    calls = {"summary": 0, "summary_times": 0, "themis": 0}
    for name in calls:
        real = getattr(RunResult, f"_compute_{name}")

        def counted(self: RunResult, real: Any = real, name: str = name) -> Any:
            calls[name] += 1
            return real(self)

        monkeypatch.setattr(RunResult, f"_compute_{name}", counted)
    r = CliRunner().invoke(app, ["simulate", "--generate", "30", "--cluster", "2x4", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert calls == {"summary": 1, "summary_times": 1, "themis": 1}
    assert {"summary.json", "report.md", "report.txt", "jct_cdf.png", "jobs.csv"} <= {p.name for p in
                                                                                      (tmp_path / "o").iterdir()}


def test_summary_times_are_the_summary_but_themis_figures_and_give_the_reports_unit() -> None:
    # what the plots are drawn from, sent before Themis' figures are computed: the same figures, the same unit
    for res in (run(), run(max_time=5), run().measure((1, 3)), run(max_time=1)):
        s, times = res.summary(), res.summary_times()
        assert list(times) == list(s)  # (the keys in the same places)
        assert times["mean_ftf_rho"] is None and times["max_ftf_rho"] is None
        assert repr({**times, "mean_ftf_rho": 0, "max_ftf_rho": 0}) == repr(
            {**s, "mean_ftf_rho": 0, "max_ftf_rho": 0})  # (exactly: NaN where NaN)
        assert report.run_time_unit(res) == report.time_unit({res.label: res})
    assert run(max_time=1).summary()["completed"] == 0 and math.isnan(run(max_time=1).summary()["max_ftf_rho"])
    slow = replace(run(), jobs=[replace(j, arrival=j.arrival - 5000.0) for j in run().jobs])
    assert report.run_time_unit(slow) == report.time_unit({slow.label: slow}) == (60.0, "min")


def test_summary_follows_a_changed_result() -> None:
    res = run()
    s = res.summary()
    assert res.summary() == s and res.summary() is not res.summary()  # the same figures, a dict of its own
    res.wall_time = 12.5
    assert res.summary()["wall_time_s"] == 12.5
    res.jobs = res.jobs[:2]  # a result made of another's jobs
    assert (res.summary()["jobs"], res.summary()["mean_jct_s"]) == (2, 125.0)
    rho = res.themis()[1]
    with pytest.raises(ValueError, match="read-only"):
        rho[0] = 0.0


def test_simulate_runs_without_the_cycle_collector_and_restores_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    seen: list[bool] = []
    real = report.write_summary
    monkeypatch.setattr(report, "write_summary", lambda *a, **k: (seen.append(gc.isenabled()), real(*a, **k))[1])
    assert gc.isenabled()
    r = CliRunner().invoke(app, ["simulate", "--generate", "10", "--cluster", "2x4", "--no-plots", "--out",
                                 str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert seen == [False]  # off while the files were written
    assert gc.isenabled() and gc.get_freeze_count() == 0  # on again after, nothing left frozen
    # a host that froze objects of its own finds them frozen still
    gc.freeze()
    try:
        r = CliRunner().invoke(app, ["simulate", "--generate", "10", "--cluster", "2x4", "--no-plots", "--out",
                                     str(tmp_path / "o")])
        assert r.exit_code == 0, r.output
        assert gc.isenabled() and gc.get_freeze_count() > 0  # (unfrozen, none would be)
    finally:
        gc.unfreeze()


def test_the_command_line_loads_no_database_layer() -> None:
    # every gpuloom command imports every command's module; the store's SQLAlchemy (0.2-0.5 s) is for the
    # server's commands to import when they run
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, gpuloom.cli; print(sorted(m for m in sys.modules "
                          "if m.split('.')[0] == 'sqlalchemy' or m == 'gpuloom.runtime.state.store'))"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# -- gpuloom simulate writes its files from three processes: the bytes it writes alone ---------------------------
def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _files(folder: Path) -> dict[str, bytes]:
    """A run's files, byte for byte, but for the lines giving wall time (and when the run started)."""
    out = {}
    for p in sorted(folder.iterdir()):
        lines = p.read_bytes().splitlines(keepends=True)
        if p.suffix in (".json", ".md", ".txt"):
            lines = [x for x in lines if not any(w in x for w in (b"wall_time_s", b"wall time", b'"started"'))]
        out[p.name] = b"".join(lines)
    return out


def _forks(request: pytest.FixtureRequest) -> bool:
    """True when the test ran whole in a fresh interpreter instead (the caller returns).

    simulate forks only with no other thread running; an earlier test in this process may have left one, so
    the test then runs alone in a new pytest process, where nothing else has started a thread.
    """
    import os
    import subprocess
    import sys

    from gpuloom.sim.background import can_fork

    if not sys.platform.startswith("linux"):
        pytest.skip("simulate forks only on Linux")
    if can_fork():
        return False
    if os.environ.get("GPULOOM_TEST_ALONE") == "1":
        pytest.fail("a thread runs in a fresh pytest process: simulate would never fork")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", request.node.nodeid],
                       cwd=request.config.rootpath, env={**os.environ, "GPULOOM_TEST_ALONE": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout, r.stdout[-2000:]
    return True


SMALL = ["simulate", "--generate", "60", "--cluster", "4x4", "--order", "las", "--max-time", "20000", "--out"]


def test_simulate_writes_from_its_children_the_bytes_it_writes_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     request: pytest.FixtureRequest) -> None:
    import os

    from gpuloom.cli import ending, simfiles
    from gpuloom.sim import background, plots

    if _forks(request):
        return
    before = _children()
    pids = tmp_path / "pids"
    pids.mkdir()
    real_draw, real_cdf = plots.draw_series, plots.draw_jct_cdf
    real_jobs, real_add = report.JobRows.write, report.JobRows.add

    def draw(*a: Any) -> Any:
        (pids / f"plots {os.getpid()}").touch()
        return real_draw(*a)

    def cdf(*a: Any) -> Any:
        (pids / f"cdf {os.getpid()}").touch()
        return real_cdf(*a)

    def jobs(*a: Any) -> Any:
        (pids / f"jobs.csv {os.getpid()}").touch()
        return real_jobs(*a)

    def add(rows: report.JobRows, part: tuple[list[int], list[list[Any]]]) -> None:
        with (pids / f"rows {os.getpid()}").open("a") as f:  # (the rest's rows come through here too)
            f.write(f"{len(part[0])}\n")
        real_add(rows, part)

    monkeypatch.setattr(plots, "draw_series", draw)
    monkeypatch.setattr(plots, "draw_jct_cdf", cdf)
    monkeypatch.setattr(report.JobRows, "write", jobs)
    monkeypatch.setattr(report.JobRows, "add", add)
    monkeypatch.setattr(simfiles, "ROWS_PART", 1)  # the finished jobs' rows sent at every progress tick
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (tmp_path / "o").rename(tmp_path / "forked")  # (the command line, --out included, is in the files)
    made = sorted(p.name.split() for p in pids.iterdir())
    # each in a process of its own (the JCT CDF's a child of the plots'), jobs.csv's rows made where it is written
    assert [w for w, _ in made] == ["cdf", "jobs.csv", "plots", "rows"]
    assert made[1][1] == made[3][1] and len({int(pid) for _, pid in made} | {os.getpid()}) == 4
    # progress ticks at the 32nd job finished and at the run's end (38 of the 60 finish by --max-time): their
    # rows sent as the run goes, the 22 others' with the rest
    assert (pids / f"rows {made[3][1]}").read_text().split() == ["32", "6", "22"]
    assert _children() == before  # both waited for
    # the rows made during the run, and after: the bytes written all at once from the result
    assert (tmp_path / "forked" / "jobs.csv").read_bytes() == report.write_jobs_csv(
        ending._KEPT[0], tmp_path / "jobs.csv").read_bytes()
    assert (tmp_path / "forked" / "series.csv").read_bytes() == report.write_series_csv(
        ending._KEPT[0], tmp_path / "series.csv").read_bytes()
    monkeypatch.setattr(background, "can_fork", lambda: False)  # all in this process
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    forked, alone = _files(tmp_path / "forked"), _files(tmp_path / "o")
    assert set(forked) == {"jobs.csv", "series.csv", "summary.json", "report.md", "report.txt", "jct_cdf.png",
                           "utilisation.png", "queue.png", "gpuloom-run.json"}
    assert forked == alone
    assert b",,," in forked["jobs.csv"]  # (unfinished jobs: empty cells)


def test_simulate_without_plots_writes_series_csv_from_rows_made_during_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    from gpuloom.cli import ending, simfiles

    if _forks(request):
        return
    monkeypatch.setattr(simfiles, "ROWS_PART", 1)
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o"), "--no-plots"])
    assert r.exit_code == 0, r.output
    result = ending._KEPT[0]
    assert len(result.series) > 10  # (parts of it sent during the run)
    assert (tmp_path / "o" / "series.csv").read_bytes() == report.write_series_csv(
        result, tmp_path / "series.csv").read_bytes()
    assert (tmp_path / "o" / "jobs.csv").read_bytes() == report.write_jobs_csv(result, tmp_path / "jobs.csv").read_bytes()
    assert not list((tmp_path / "o").glob("*.png"))


def test_a_failing_child_fails_simulate_with_its_message_once_the_other_files_are_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:

    from gpuloom.sim import plots

    if _forks(request):
        return
    before = _children()

    def draw(*a: Any) -> Any:
        raise ValueError("no room for the legend")

    def cdf(*a: Any) -> Any:
        raise ValueError("no room for the axis")

    real_cdf = plots.draw_jct_cdf

    monkeypatch.setattr(plots, "draw_series", draw)
    monkeypatch.setattr(plots, "draw_jct_cdf", cdf)
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o")])
    assert r.exit_code == 1
    # (the plots' child draws the JCT CDF in a child of its own: its failure, and the traceback of both)
    assert ("error: drawing the plots failed: BackgroundError: drawing the JCT CDF failed: ValueError: no room "
            "for the axis") in r.output
    assert ", in draw\n" in r.output and ", in cdf\n" in r.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "gpuloom-run.json", "jobs.csv", "report.md", "report.txt", "series.csv", "summary.json"]
    assert "![" not in (tmp_path / "o" / "report.md").read_text()
    assert _children() == before
    # the series' plots failing alone: their error, the JCT CDF drawn all the same
    monkeypatch.setattr(plots, "draw_jct_cdf", real_cdf)
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o2")])
    assert r.exit_code == 1
    assert "error: drawing the plots failed: ValueError: no room for the legend" in r.output
    assert "JCT CDF" not in r.output and (tmp_path / "o2" / "jct_cdf.png").exists()
    assert _children() == before
    # jobs.csv's child failing: the command writes it itself, and fails all the same
    monkeypatch.undo()

    def jobs(*a: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.JobRows, "write", jobs)
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o")])
    assert r.exit_code == 1
    assert "error: writing jobs.csv failed: OSError: [Errno 28] No space left on device" in r.output
    (tmp_path / "o").rename(tmp_path / "failed")
    monkeypatch.undo()
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert _files(tmp_path / "failed") == _files(tmp_path / "o")  # the files whole, the plots too
    assert _children() == before


def test_simulate_leaves_no_child_behind_when_it_stops_early(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if _forks(request):
        return
    before = _children()
    # the plots' child is forked before the trace is read: a missing trace, a refused --out, end it
    r = CliRunner().invoke(app, ["simulate", "--trace", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no such file" in r.output
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine\n")
    r = CliRunner().invoke(app, [*SMALL, str(tmp_path / "taken")])
    assert r.exit_code == 2 and "holds files" in r.output
    assert _children() == before
