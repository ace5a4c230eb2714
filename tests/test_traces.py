"""Trace readers: every real file in shared/data loads with its documented job count; exact
values on a few rows per format; malformed files raise TraceError naming file, line and field."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from gpuloom.core import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import simulate
from gpuloom.sim.traces import (
    FORMATS,
    SIA_DURATIONS,
    TraceError,
    _power_law,
    detect_format,
    load_trace,
    read_trace,
    safe_arith,
    save_trace,
)

# --------------------------------------------------------------------------- real data: job counts

# The data README says the Philly list has 82,248 rows: that is the file's line count
# (82,249) minus the header.  The last of those lines is blank (the file ends in "\n\n"),
# so the list holds 82,247 jobs.
PHILLY_JOBS = 82_247

COUNTS: list[tuple[str, str, int]] = [
    ("sia/philly_jobs.csv", "philly", PHILLY_JOBS),
    *[(f"sia/workloads/philly/workload-{n}.csv", "sia", 160) for n in range(1, 9)],
    *[(f"sia/workloads/saturn/workload-{n}.csv", "sia", 160) for n in range(1, 11)],
    *[(f"sia/workloads/newtrace/workload-{n}.csv", "sia", 960) for n in (1, 10)],
    *[(f"pal/traces/philly/workload-{n}.csv", "pal", 160) for n in range(1, 9)],
    ("pal/traces/philly/workload-1-noheader.csv", "pal", 16_000),
    ("pal/blox/sia-160job-trace.csv", "pal", 160),
    ("pal/blox/sia-160job-reduced.csv", "pal", 160),
    ("muri/sim_traces/trace1.csv", "muri", 1_494),
    ("muri/sim_traces/trace2.csv", "muri", 5_755),
    ("muri/sim_traces/trace3.csv", "muri", 992),
    ("muri/sim_traces/trace4.csv", "muri", 2_638),
    ("muri/sim_traces/trace1_pr.csv", "muri", 1_494),
    ("muri/testbed_trace/cluster_trace.csv", "muri", 400),
    # Gavel's msr traces: one job per line (every file ends in a newline); "e.g. 2,000" in the README.
    ("gavel/msr/seed0/11cb48.trace", "gavel", 2_000),
    ("gavel/msr/seed0/0e4a51.trace", "gavel", 1_181),
    ("gavel/msr/seed0/795a4c.trace", "gavel", 3),
    ("gavel/physical_cluster/minimize_makespan.trace", "gavel", 100),
    ("gavel/physical_cluster/small_test.trace", "gavel", 20),
    ("synergy/traces/static_100job.csv", "synergy", 100),
    ("synergy/traces/dynamic_100job.csv", "synergy", 100),
    ("synergy/traces/test_trace.txt", "synergy", 8),
    ("tiresias/60_job.csv", "tiresias", 60),
]


@pytest.mark.parametrize(("rel", "fmt", "count"), COUNTS, ids=[c[0] for c in COUNTS])
def test_real_trace_counts_and_autodetect(data_dir: Path, rel: str, fmt: str, count: int) -> None:
    path = data_dir / rel
    assert detect_format(path) == fmt
    tr = read_trace(path)
    assert tr.format == fmt
    assert len(tr.jobs) == count == tr.rows
    assert tr.skipped == {}
    assert len({j.id for j in tr.jobs}) == count
    arrivals = [j.arrival for j in tr.jobs]
    assert arrivals == sorted(arrivals)
    assert all(j.gpus >= 1 and j.duration > 0 for j in tr.jobs)


# --------------------------------------------------------------------------- philly

def test_philly_values(data_dir: Path) -> None:
    tr = read_trace(data_dir / "sia/philly_jobs.csv", "philly")
    assert tr.meta["origin"] == "2017-09-04 10:30:41"
    by_id = {j.id: j for j in tr.jobs}
    first_row = by_id["philly-0"]  # line 2: 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    assert first_row.arrival == 34 * 86400 + 20 * 3600 + 31 * 60 + 14  # 2017-10-09 07:01:55 - origin
    assert (first_row.gpus, first_row.duration, first_row.attrs["cluster"]) == (1, 66.0, "11cb48")
    earliest = tr.jobs[0]
    assert (earliest.id, earliest.arrival, earliest.gpus, earliest.duration) == ("philly-31566", 0.0, 8, 2240194.0)
    assert len({j.attrs["cluster"] for j in tr.jobs}) == 15
    assert sum(j.gpus == 1 for j in tr.jobs) == 76_627


def test_philly_read_in_bulk_is_the_row_by_row_reading(data_dir: Path, tmp_path: Path) -> None:
    # the columns converted at once give exactly the jobs of the checked reading, row by row
    from gpuloom.sim.traces import philly
    from gpuloom.sim.traces.fields import Header, Where, first_row, read_rows

    path = data_dir / "sia/philly_jobs.csv"
    bulk = read_trace(path, "philly")
    w = Where(path)
    rows = read_rows(path, w)
    h = Header(first_row(rows, path), (), w)
    stamps, durs, gpus, clusters = philly._checked(read_rows(path, w), h, w)
    origin = min(stamps)
    checked = sorted((JobSpec(f"philly-{k}", (stamps[k] - origin).total_seconds(), gpus[k], durs[k],
                              attrs={"cluster": clusters[k], "queue": clusters[k]}) for k in range(len(stamps))),
                     key=lambda j: j.arrival)
    assert bulk.jobs == checked and bulk.rows == len(checked) == PHILLY_JOBS
    # a cell only the checked reading takes ("4.0" GPUs: an integer written as a number) gives the same job
    head = "timestamp,duration,num_gpus,gpu_time,cluster\n"
    rows_text = "2017-10-09 07:01:55,66.0,{},264.0,a\n2017-10-09 07:00:00,10,1,10,b\n"
    (tmp_path / "int.csv").write_text(head + rows_text.format("4"))
    (tmp_path / "float.csv").write_text(head + rows_text.format("4.0"))
    assert read_trace(tmp_path / "float.csv", "philly").jobs == read_trace(tmp_path / "int.csv", "philly").jobs
    assert [(j.id, j.arrival, j.gpus) for j in load_trace(tmp_path / "float.csv", "philly")] == \
        [("philly-1", 0.0, 1), ("philly-0", 115.0, 4)]


def test_philly_names_the_first_bad_line_whatever_follows(tmp_path: Path) -> None:
    # a bad field on line 3, malformed CSV on line 5 (a cell past the csv module's limit): the reading in bulk
    # meets the CSV error first (it reads the whole file), the row by row reading that follows names line 3,
    # as reading row by row always did
    f = tmp_path / "p.csv"
    head = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n"
    f.write_text(head + "2017-10-09 07:01:56,66.0,x,66.0,a\n2017-10-09 07:01:57,66.0,1,66.0,a\n2017," + "x" * 200_000)
    with pytest.raises(TraceError, match="expected a positive integer, got 'x'") as e:
        load_trace(f, "philly")
    assert (e.value.line, e.value.field) == (3, "num_gpus")
    f.write_text(head + "2017-10-09 07:01:57,66.0,1,66.0,a\n2017," + "x" * 200_000)
    with pytest.raises(TraceError, match="malformed CSV: field larger than field limit") as e:
        load_trace(f, "philly")
    assert e.value.line == 4
    f.write_text(head + "2017-10-09 07:01:56,nan,1,66.0,a\n")
    with pytest.raises(TraceError, match="expected a number > 0, got 'nan'") as e:
        load_trace(f, "philly")
    assert (e.value.line, e.value.field) == (3, "duration")


# --------------------------------------------------------------------------- sia

def test_sia_values_and_power_law(data_dir: Path) -> None:
    jobs = {j.id: j for j in load_trace(data_dir / "sia/workloads/philly/workload-1.csv")}
    j = jobs["cifar10-0"]
    assert (j.arrival, j.gpus, j.duration, j.model, j.attrs["batch_size"]) == (107.0, 6, 854.0, "cifar10", 2048)
    assert jobs["deepspeech2-1"].duration == 4153.0
    # imagenet at 10 GPUs: PAL only has 24/32/48, so the per-application power law extrapolates
    fit = _power_law(SIA_DURATIONS["imagenet"])
    assert jobs["imagenet-11"].duration == round(fit(10), 1) == 60649.5
    # two points: the power law goes exactly through them and halves per doubling here
    f = _power_law({2: 100.0, 4: 50.0})
    assert f(2) == pytest.approx(100.0) and f(8) == pytest.approx(25.0)


def test_sia_durations_agree_with_pal_conversion(data_dir: Path) -> None:
    """Where PAL's noheader workload kept the Sia job's GPU count and counterpart model, the
    built-in table gives PAL's duration; and the noheader file's first 160 submit times are Sia's."""
    counterpart = {"cifar10": "res18", "bert": "transformer", "deepspeech2": "deepspeech",
                   "yolov3": "res50", "imagenet": "alexnet"}
    checked = 0
    for n in range(1, 8):
        sia = load_trace(data_dir / f"sia/workloads/philly/workload-{n}.csv", "sia")
        sia_by_file = sorted(sia, key=lambda j: int(j.id.rsplit("-", 1)[1]))
        with open(data_dir / f"pal/traces/philly/workload-{n}-noheader.csv", newline="") as f:
            pal = [r for _, r in zip(range(160), csv.reader(f), strict=False)]
        for s, (_id, model, submit, dur, gpus) in zip(sia_by_file, pal, strict=True):
            assert s.arrival == float(submit)
            if model == counterpart[s.model] and int(gpus) == s.gpus:
                assert s.duration == float(dur)
                checked += 1
    assert checked > 500


def test_sia_custom_durations_and_missing(tmp_path: Path) -> None:
    p = tmp_path / "w.csv"
    p.write_text("name,time,application,num_replicas,batch_size\na-0,5,ncf,2,64\nb-1,7.5,bert,8,384\n")
    jobs = load_trace(p, durations={"ncf": 100.0, "bert": {8: 2000.0}})
    assert [(j.id, j.arrival, j.duration) for j in jobs] == [("a-0", 5.0, 100.0), ("b-1", 7.5, 2000.0)]
    with pytest.raises(TraceError, match=r"w\.csv:2: field 'application': no duration known for 'ncf'"):
        load_trace(p)


# --------------------------------------------------------------------------- pal / blox

def test_pal_values(data_dir: Path) -> None:
    j = load_trace(data_dir / "pal/traces/philly/workload-1.csv")[0]
    assert (j.id, j.gpus, j.arrival, j.duration, j.model) == ("0", 1, 98.0, 1481.0, "vgg19")
    nh = {j.id: j for j in load_trace(data_dir / "pal/traces/philly/workload-1-noheader.csv")}
    # the headerless order is id, model, submit, duration, gpus
    assert (nh["0"].model, nh["0"].arrival, nh["0"].duration, nh["0"].gpus) == ("res18", 107.0, 854.0, 6)
    assert (nh["15999"].model, nh["15999"].arrival, nh["15999"].gpus) == ("gnmt", 2769500000.0, 1)
    b = load_trace(data_dir / "pal/blox/sia-160job-trace.csv", "blox")[0]
    assert (b.id, b.gpus, b.arrival, b.duration, b.model, b.attrs["batch_size"]) == ("0", 6, 53.0, 2868.0,
                                                                                     "PointNet", 2048)


# --------------------------------------------------------------------------- muri

def test_muri_first_job_in_seconds(data_dir: Path) -> None:
    jobs = load_trace(data_dir / "muri/sim_traces/trace1.csv")
    j = jobs[0]  # 0,1,0,5853661,dqn,128,2868294000,46122000,490,446,8,0,1
    assert (j.id, j.arrival, j.gpus, j.model, j.iterations) == ("0", 0.0, 1, "dqn", 5853661)
    assert j.iter_time == pytest.approx(0.490)
    assert j.duration == pytest.approx(5853661 * 0.490)
    a = j.attrs
    assert a["resource_times"] == pytest.approx((0.446, 0.008, 0.0))
    assert (a["iteration_time"], a["batch_size"], a["priority"]) == (pytest.approx(0.49), 128, 1)
    assert a["interval"] == pytest.approx(46122.0) and a["trace_duration"] == pytest.approx(2868294.0)
    assert jobs[1].arrival == pytest.approx(201694.0) and jobs[1].gpus == 8


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_muri_sim_duration_is_iterations_times_iteration_time(data_dir: Path, n: int) -> None:
    jobs = load_trace(data_dir / f"muri/sim_traces/trace{n}.csv", "muri")
    # the trace's duration is the product rounded up to a whole second; a few (6 in trace2) are one
    # more second above it, as if computed from the iteration time before its rounding to whole ms
    assert all(-0.001 <= j.attrs["trace_duration"] - j.duration < 2.0 for j in jobs)
    # resource_time_2 is the network stage: zero for every 1-GPU job
    assert all(j.attrs["resource_times"][2] == 0 for j in jobs if j.gpus == 1)
    assert any(j.attrs["resource_times"][2] > 0 for j in jobs if j.gpus > 1)


def test_muri_testbed_duration_differs(data_dir: Path) -> None:
    jobs = load_trace(data_dir / "muri/testbed_trace/cluster_trace.csv")
    off = [j for j in jobs if abs(j.attrs["trace_duration"] - j.duration) >= 1.0]
    assert len(off) == 378  # measured runs: only 22 of 400 match iterations * iteration_time
    j = jobs[0]  # 0,8,0,10956,gpt2,4,5095000,91000,437,0.6,419,49,0
    assert (j.duration, j.attrs["trace_duration"]) == (pytest.approx(10956 * 0.437), pytest.approx(5095.0))
    assert j.attrs["resource_times"] == pytest.approx((0.0006, 0.419, 0.049))


# --------------------------------------------------------------------------- gavel

def test_gavel_values_and_throughput_option(data_dir: Path) -> None:
    j = load_trace(data_dir / "gavel/msr/seed0/11cb48.trace")[0]
    assert (j.id, j.model, j.gpus, j.arrival, j.iterations) == ("11cb48-0", "Transformer", 1, 0.0, 13407515)
    # Gavel's measured V100 throughput of ('Transformer (batch size 128)', 1) in simulation_throughputs.json
    assert j.attrs["batch_size"] == 128 and j.attrs["steps_per_second"] == 5.44610521981264
    assert j.duration == pytest.approx(13407515 / 5.44610521981264)
    assert Path(j.attrs["gpu_speeds_file"]).name == "simulation_throughputs.json"
    # the assumed table where the file is not wanted
    a = load_trace(data_dir / "gavel/msr/seed0/11cb48.trace", throughputs="none")[0]
    assert a.attrs["steps_per_second"] == 2000.0 / 128 and "gpu_speeds_file" not in a.attrs
    assert a.duration == pytest.approx(13407515 / 15.625)
    small = data_dir / "gavel/physical_cluster/small_test.trace"
    k = load_trace(small)[0]  # Transformer (batch size 128) ... -step 1 346 2 1 -1.000000 0
    assert (k.gpus, k.iterations, k.arrival, k.attrs["priority"]) == (2, 346, 0.0, 1.0)
    # physical_cluster traces take Gavel's physical-cluster measurements, at their scale factor (2 GPUs)
    assert k.attrs["steps_per_second"] == 10.069238394742342
    assert Path(k.attrs["gpu_speeds_file"]).name == "physical_cluster_throughputs.json"
    mine = load_trace(small, steps_per_second={"Transformer (batch size 128)": 10.0, "Transformer": 20.0})
    assert mine[0].duration == pytest.approx(34.6)  # the exact job type wins over the model
    assert {j.attrs["steps_per_second"] for j in mine if j.model == "Transformer"} >= {10.0, 20.0}


def test_gavel_scale_factor_is_last_msr_field(data_dir: Path) -> None:
    jobs = load_trace(data_dir / "gavel/msr/seed0/23dbec.trace")
    # line 3: Transformer (batch size 256) ... -step 1 19178 182095.000000 8
    j = next(j for j in jobs if j.id == "23dbec-2")
    assert (j.gpus, j.iterations, j.arrival) == (8, 19178, 182095.0)
    assert j.attrs["steps_per_second"] == 9.71702368412533  # measured at 8 GPUs
    # 11cb48.trace line 149: ResNet-18 (batch size 128), 55335 steps, 64 GPUs: Gavel measured up to 8
    big = next(j for j in load_trace(data_dir / "gavel/msr/seed0/11cb48.trace") if j.id == "11cb48-148")
    assert (big.gpus, big.iterations) == (64, 55335)
    assert big.attrs["steps_per_second"] == 162.09160717942794  # the file's 8-GPU V100 throughput


# --------------------------------------------------------------------------- synergy

def test_safe_arith() -> None:
    assert safe_arith("62.5*2") == 125.0
    assert safe_arith("int(62.5/3)") == 20.0
    assert safe_arith(" -3 + 4 ") == 1.0
    assert safe_arith("(1+2)//2") == 1.0
    for bad in ("__import__('os')", "a", "2**10", "open('x')", "1/0", "", "int(1, 2)", "True"):
        with pytest.raises(ValueError):
            safe_arith(bad)


def test_synergy_values(data_dir: Path) -> None:
    static = load_trace(data_dir / "synergy/traces/static_100job.csv")
    j = static[0]  # 0,alexnet,0.0,3349,1  with alexnet_1 iter_time 0.6
    assert (j.id, j.model, j.arrival, j.iterations, j.gpus, j.iter_time) == ("0", "alexnet", 0.0, 3349, 1, 0.6)
    assert j.duration == pytest.approx(2009.4)
    s = j.attrs["sensitivity"]
    assert (s["cpus"], s["mem_gb"], s["speedup"]) == (12.0, 125.0, 2.94)  # mem cell is "62.5*2"
    assert len(s["tput"]) == 9 and s["tput"][8] == (0.1, 2.0, 2.94, 2.94, 2.94)
    test = {j.id: j for j in load_trace(data_dir / "synergy/traces/test_trace.txt", "synergy")}
    assert test["2"].iter_time == 0.67 and test["7"].iter_time == 0.99  # transformer_2 vs transformer_4
    assert test["0"].arrival == 0.123
    dyn = load_trace(data_dir / "synergy/traces/dynamic_100job.csv")
    assert dyn[0].arrival == 8.0 and dyn[-1].arrival < 4 * 3600


def test_synergy_without_profiles(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("0,res50,0,100,1\n1,vae,3,10,2\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: field 'model': no iteration time for 'res50'"):
        load_trace(p, "synergy")
    jobs = load_trace(p, "synergy", iter_times={"res50": 0.5, "vae": 0.01})
    assert [j.duration for j in jobs] == [50.0, pytest.approx(0.1)]
    # a 2-GPU job falls back to the model's 1-GPU row
    (tmp_path / "model_sensitivity_profiles.csv").write_text(
        "model_file,cpus,mem,speed,batch,placement_penalty,speedup,iter_time\n"
        "res50_1,4,62.5,62.5,512,1,1.15,0.78\nvae_1,1,int(62.5/3),int(62.5/3),20,1,1,0.011\n")
    jobs = load_trace(p, "synergy")
    assert jobs[1].iter_time == 0.011 and jobs[1].attrs["sensitivity"]["mem_gb"] == 20.0


# --------------------------------------------------------------------------- tiresias

def test_tiresias_values(data_dir: Path) -> None:
    j = load_trace(data_dir / "tiresias/60_job.csv")[0]  # 0,1,0,606,vgg19,164,30  (CRLF file)
    assert (j.id, j.gpus, j.arrival, j.iterations, j.model, j.duration) == ("0", 1, 0.0, 606, "vgg19", 164.0)
    assert j.iter_time == pytest.approx(164 / 606) and j.attrs["interval"] == 30.0


# --------------------------------------------------------------------------- alibaba

def test_alibaba_counts_and_values(data_dir: Path) -> None:
    path = data_dir / "alibaba/gpu-v2023/openb_pod_list_default.csv"
    tr = read_trace(path)
    assert tr.format == "alibaba"
    # 8,152 pods = 6,203 GPU pods that ran + 1,088 CPU-only + 861 GPU pods never scheduled
    assert tr.rows == 8_152
    assert tr.skipped == {"cpu-only": 1_088, "never-scheduled": 861}
    assert len(tr.jobs) == 6_203
    by = {j.id: j for j in tr.jobs}
    p0 = by["openb-pod-0000"]  # 12000,16384,1,1000,,LS,Running,0,12537496,0
    assert (p0.arrival, p0.duration, p0.cpus, p0.mem_mb, p0.gpus) == (0.0, 12537496.0, 12, 16384, 1)
    assert p0.attrs["censored"] is True and p0.attrs["qos"] == "LS"
    p33 = by["openb-pod-0033"]  # 3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463
    assert (p33.arrival, p33.duration, p33.cpus, p33.attrs["phase"]) == (9965463.0, 182.0, 4, "Failed")
    assert by["openb-pod-0001"].attrs["gpu_milli"] == 460
    with pytest.raises(TraceError, match=r"openb_pod_list_default\.csv:63: field 'scheduled_time'"):
        load_trace(path, pending="error")


# --------------------------------------------------------------------------- gpuloom csv / jsonl

def test_own_format_roundtrip(tmp_path: Path) -> None:
    jobs = [
        JobSpec("a", 0.0, 2, 100.0, model="resnet50", user="ann", cpus=8, mem_mb=32000, attrs={"batch_size": 64}),
        JobSpec.from_iterations("b", 5.5, 1, 1000, 0.25, model="bert", attrs={"priority": 1, "tag": "x"}),
    ]
    for name in ("t.csv", "t.jsonl"):
        save_trace(jobs, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back == jobs
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == \
        "id,arrival,gpus,duration,model,user,cpus,mem_mb,batch_size,iterations,iter_time,priority,tag"


def test_own_csv_and_jsonl_by_hand(tmp_path: Path) -> None:
    c = tmp_path / "mine.csv"
    c.write_text("id,arrival,gpus,iterations,iter_time,model,queue\nx,10,4,100,2.5,gpt2,prod\ny,0,1,,,,\n")
    with pytest.raises(TraceError, match=r"mine\.csv:3: field 'duration': missing"):
        load_trace(c)
    c.write_text("id,arrival,gpus,iterations,iter_time,duration,queue\nx,10,4,100,2.5,,prod\ny,0,1,,,60,\n")
    y, x = load_trace(c, "csv")  # sorted by arrival
    assert (x.duration, x.iterations, x.attrs) == (250.0, 100, {"queue": "prod"})
    assert (y.arrival, y.duration, y.attrs) == (0.0, 60.0, {})
    j = tmp_path / "mine.jsonl"
    j.write_text('{"id": "p", "arrival": 1, "gpus": 2, "duration": 30, "team": "nlp", "attrs": {"k": [1, 2]}}\n\n')
    (p,) = load_trace(j)
    assert (p.duration, dict(p.attrs)) == (30.0, {"team": "nlp", "k": [1, 2]})


# --------------------------------------------------------------------------- malformed input

BAD: list[tuple[str, str, str, str, int, str]] = [
    # (format, file name, content, field, line, words in the message)
    ("philly", "p.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n"
     "2017-10-09 07:01:56,66.0,x,66.0,a\n", "num_gpus", 3, "expected a positive integer, got 'x'"),
    ("philly", "p.csv", "timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,66.0,1,66.0,a\n",
     "timestamp", 2, "expected a date-time"),
    ("philly", "p.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,0,1,66.0,a\n",
     "duration", 2, "expected a number > 0, got '0'"),
    ("sia", "s.csv", "name,time,application,num_replicas,batch_size\na,1,bert,8,x\n", "batch_size", 2,
     "expected a positive integer"),
    ("sia", "s.csv", "name,time,application,num_replicas,batch_size\na,-1,bert,8,384\n", "time", 2,
     "expected a number >= 0, got '-1'"),
    ("pal", "b.csv", "job_id,num_gpus,submit_time,duration,model\n0,1,0,10,m\n\n1,2,5,-5,m\n", "duration", 4,
     "expected a number > 0"),
    ("pal", "b.csv", "0,res18,10,nan,1\n", "duration", 1, "got 'nan'"),
    ("muri", "m.csv", ",".join(["job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size",
                                "duration", "interval", "iteration_time", "resource_time_0", "resource_time_1",
                                "resource_time_2", "priority"]) + "\n0,1,0,10,dqn,128,4900,0,abc,446,8,0,1\n",
     "iteration_time", 2, "got 'abc'"),
    ("gavel", "g.trace", "ResNet-18 (batch size 128)\tcmd\t--num_steps\t1\t100\t0.0\ttwo\n", "scale_factor", 1,
     "got 'two'"),
    ("gavel", "g.trace", "Mystery (batch size 8)\tcmd\t--n\t1\t100\t0.0\t1\n", "job_type", 1,
     "no throughput known"),
    ("tiresias", "t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
     "0,1,0,606,vgg19,164,30\n1,0,3,10,vgg19,5,1\n", "num_gpu", 3, "got '0'"),
    ("alibaba", "a.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
     "deletion_time,scheduled_time\np0,1000,1024,1,1000,,LS,Running,0,50,100\n", "deletion_time", 2,
     "ends (50) before it runs (100)"),
    ("csv", "o.csv", "id,arrival,gpus,duration\na,0,,10\n", "gpus", 2, "missing"),
    ("csv", "o.csv", "id,arrival,gpus,duration,iterations,iter_time\na,0,1,10,5,3\n", "duration", 2,
     "disagrees with iterations * iter_time = 15"),
    ("jsonl", "o.jsonl", '{"id": "a", "arrival": 0, "gpus": 1, "duration": 5}\n{"id": "b", "arrival": true,'
     ' "gpus": 1, "duration": 5}\n', "arrival", 2, "expected a number"),
]


@pytest.mark.parametrize(("fmt", "name", "content", "field", "line", "words"), BAD,
                         ids=[f"{b[0]}-{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_malformed_row_names_file_line_field(tmp_path: Path, fmt: str, name: str, content: str, field: str,
                                             line: int, words: str) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(TraceError) as ei:
        load_trace(p, fmt)
    e = ei.value
    assert (Path(e.path or "").name, e.line, e.field) == (name, line, field)
    assert str(e).startswith(f"{name}:{line}: field '{field}': ")
    assert words in str(e)


def test_error_message_format() -> None:
    e = TraceError("expected a positive integer, got 'x'", "/some/dir/trace.csv", 17, "num_gpus")
    assert str(e) == "trace.csv:17: field 'num_gpus': expected a positive integer, got 'x'"
    assert isinstance(e, ValueError)


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - {"blox"}))
def test_empty_file_is_an_error(tmp_path: Path, fmt: str) -> None:
    p = tmp_path / ("e.jsonl" if fmt == "jsonl" else "e.trace" if fmt == "gavel" else "e.csv")
    p.write_text("\n\n" if fmt != "synergy" else "")
    with pytest.raises(TraceError, match=r"^e\.\w+: empty"):
        load_trace(p, fmt, **({"iter_times": {}} if fmt == "synergy" else {}))


def test_header_only_and_auto_empty(tmp_path: Path) -> None:
    p = tmp_path / "h.csv"
    p.write_text("job_id,num_gpus,submit_time,duration,model\n")
    with pytest.raises(TraceError, match="empty trace: no data rows"):
        load_trace(p)
    q = tmp_path / "z.csv"
    q.write_text("")
    with pytest.raises(TraceError, match=r"^z\.csv: empty file"):
        load_trace(q)


def test_all_pods_skipped_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                 "deletion_time,scheduled_time\np0,1000,1024,0,0,,LS,Running,0,50,0\n")
    with pytest.raises(TraceError, match=r"empty trace: no jobs \(1 cpu-only skipped\)"):
        load_trace(p)


def test_duplicate_ids(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("job_id,num_gpus,submit_time,duration,model\n7,1,0,10,m\n8,1,0,10,m\n7,2,5,10,m\n")
    with pytest.raises(TraceError, match=r"d\.csv:4: field 'id': duplicate job id '7' \(first on line 2\)"):
        load_trace(p)


def test_wrong_width_and_missing_columns(tmp_path: Path) -> None:
    p = tmp_path / "w.csv"
    p.write_text("job_id,num_gpus,submit_time,duration,model\n0,1,0,10\n")
    with pytest.raises(TraceError, match=r"w\.csv:2: expected 5 fields, got 4"):
        load_trace(p)
    p.write_text("job_id,num_gpus,submit_time,model\n0,1,0,m\n")
    with pytest.raises(TraceError, match=r"w\.csv:1: header lacks column\(s\) duration"):
        load_trace(p, "pal")


def test_detection_errors_and_unknown_format(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("foo,bar\n1,2\n")
    with pytest.raises(TraceError, match="give one of: alibaba, blox, csv, gavel, jsonl, muri, pal, philly, sia, synergy, tiresias"):
        load_trace(p)
    with pytest.raises(TraceError, match="unknown trace format 'nope'"):
        load_trace(p, "nope")
    q = tmp_path / "five.csv"
    q.write_text("0,res18,10,20,1\n")
    with pytest.raises(TraceError, match="either 'pal' .* or 'synergy'"):
        load_trace(q)
    with pytest.raises(TraceError, match="does not take option"):
        load_trace(q, "pal", steps_per_second={})
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.csv")


def test_jsonl_errors(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    p.write_text(json.dumps({"id": "a", "arrival": 0, "gpus": 1, "duration": 1}) + "\n{oops\n")
    with pytest.raises(TraceError, match=r"j\.jsonl:2: invalid JSON"):
        load_trace(p)
    p.write_text("[1, 2]\n")
    with pytest.raises(TraceError, match=r"j\.jsonl:1: expected a JSON object"):
        load_trace(p)


# --------------------------------------------------------------------------- simulate what was loaded

@pytest.mark.parametrize("rel", ["sia/workloads/philly/workload-1.csv", "tiresias/60_job.csv",
                                 "synergy/traces/dynamic_100job.csv"])
def test_loaded_traces_simulate(data_dir: Path, rel: str) -> None:
    jobs = load_trace(data_dir / rel)
    res = simulate(Cluster.homogeneous(16, 4), jobs, round_len=360.0)
    s = res.summary()
    assert s["completed"] == len(jobs) and s["unfinished"] == 0
    assert math.isfinite(s["mean_jct"]) and s["mean_jct"] >= min(j.duration for j in jobs)
