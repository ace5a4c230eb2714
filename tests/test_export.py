"""The service's history as a trace (runtime/state/export.py): exact numbers from a hand-written store and logs,
the trace read back by the simulator, and replayed at the measured speeds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.driver import Stack
from gpuloom.perf.profile_record import profile_from_record, record_from_function, record_from_points
from gpuloom.perf.sensitivity import SensitivityError, SensitivityProfile
from gpuloom.runtime.exec.progress import Point
from gpuloom.runtime.state.export import export_trace, span_rate
from gpuloom.runtime.state.store import Store
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.traces import TraceError
from gpuloom.sim.traces.own import read_jsonl, save_trace

T0 = 1_700_000_000.0
CLUSTER = Cluster.homogeneous(1, 4, 12, 8000)  # proportional share: 3 cores and 2000 MB per GPU


def alloc(gpus: int, cpus: int, mem: int, group: tuple[str, ...] = ()) -> dict:
    return {"parts": [{"node": "node-0", "gpus": list(range(gpus)), "local_gpus": list(range(gpus)), "cpus": cpus,
                       "mem_mb": mem, "cores": []}], "group": list(group)}


class History:
    """A store and a log folder written by hand, as the service would have written them."""

    def __init__(self, tmp: Path) -> None:
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        self.logs = tmp / "logs"
        self.logs.mkdir()

    def submit(self, at: float, **spec: object) -> int:
        spec = {"name": "j", "command": "true", **spec}
        return self.store.add_jobs([spec], "alice", "waiting_for_initial_contact", now=T0 + at)[0]

    def launch(self, jid: int, at: float, a: dict, kind: str = "launch") -> None:
        row = self.store.get_job(jid)
        assert row is not None
        first = row.first_start if row.first_start is not None else T0 + at
        self.store.update_job(jid, {"state": "launching", "alloc": a, "first_start": first}, kind, {}, now=T0 + at)

    def stop(self, jid: int, at: float, done: float) -> None:
        self.store.update_job(jid, {"state": "checkpointing"}, "checkpointing", {}, now=T0 + at)
        row = self.store.get_job(jid)
        assert row is not None
        self.store.update_job(jid, {"state": "standby", "alloc": None, "preemptions": row.preemptions + 1},
                              "preempt", {}, now=T0 + done)

    def finish(self, jid: int, at: float, iters: int, state: str = "finished") -> None:
        self.store.update_job(jid, {"state": state, "alloc": None, "end_time": T0 + at, "progress": iters,
                                    "held_time": 10.0}, state, {}, now=T0 + at)

    def progress(self, jid: int, *points: tuple[float, int]) -> None:
        with open(self.logs / f"{jid}.log", "a") as f:
            for t, it in points:
                f.write(f"noise line\nGPULOOM_PROGRESS iter={it} t={T0 + t}\n")


@pytest.fixture
def hist(tmp_path: Path):  # noqa: ANN201
    h = History(tmp_path)
    yield h
    h.store.close()


def test_span_rate_measures_the_last_segment_inside_the_span() -> None:
    pts = [Point(0.0, 0, None), Point(1.0, 5, None), Point(2.0, 2, None), Point(4.0, 8, None), Point(9.0, 50, None)]
    assert span_rate(pts, 0.0, 5.0) == (3.0, 6, 2.0, 0.0)  # iter fell at t=2: 2 -> 8 over 2 s
    assert span_rate(pts, 8.0, 10.0) == (None, 0, 0.0, 9.0)  # one point: no rate
    assert span_rate(pts, 20.0, 30.0) == (None, 0, 0.0, None)


def test_export_measures_speeds_profile_curve_and_lifecycle_times(hist: History) -> None:
    # job 1: 1 GPU; alone at the proportional 3 cores (2 it/s), preempted, then alone at 6 cores (3 it/s)
    j1 = hist.submit(0.0, gpus=1, model="resnet50")
    hist.launch(j1, 1.0, alloc(1, 3, 2000))
    hist.progress(j1, (1.5, 0), (4.0, 5), (6.5, 10))
    hist.stop(j1, 6.6, 7.0)
    hist.launch(j1, 10.0, alloc(1, 6, 2000))
    hist.progress(j1, (10.25, 10), (15.25, 25))
    hist.finish(j1, 15.5, 25)
    # job 2: 2 GPUs alone (4 it/s), resized to 1 GPU alone (2.5 it/s), both at proportional cores
    j2 = hist.submit(2.0, gpus=2)
    hist.launch(j2, 2.0, alloc(2, 6, 4000))
    hist.progress(j2, (3.0, 0), (8.0, 20))
    hist.stop(j2, 8.0, 8.5)
    hist.launch(j2, 8.5, alloc(1, 3, 2000), "resize")
    hist.progress(j2, (9.0, 20), (13.0, 30))
    hist.finish(j2, 13.5, 30)
    # job 3: only ever shared its GPU: 5 iterations over the 5 s it ran
    j3 = hist.submit(3.0, gpus=1, resource_times=[0.1, 0.2, 0.0], iteration_time=0.3)
    hist.launch(j3, 4.0, alloc(1, 1, 1000, ("9",)))
    hist.progress(j3, (5.0, 0), (10.0, 5))
    hist.finish(j3, 10.0, 5)
    j4 = hist.submit(4.0, gpus=1)  # printed no progress line
    hist.launch(j4, 4.0, alloc(1, 3, 2000))
    hist.finish(j4, 6.0, 0)
    j5 = hist.submit(5.0, gpus=1)  # cancelled: not exported
    hist.progress(j5, (5.5, 0), (6.0, 3))
    hist.finish(j5, 6.0, 3, "cancelled")

    rows = export_trace(hist.store, hist.logs, CLUSTER)
    assert [r["id"] for r in rows] == [str(j1), str(j2), str(j3)]
    r1, r2, r3 = rows
    assert (r1["arrival"], r1["gpus"], r1["iterations"], r1["model"], r1["user"]) == (0.0, 1, 25, "resnet50", "alice")
    assert r1["iter_time"] == pytest.approx(0.5)  # 2 it/s at the reference allocation
    a = r1["attrs"]
    assert (a["jct_s"], a["wait_s"], a["preemptions"], a["exit_s"]) == (15.5, 1.0, 1, 0.25)
    assert [(x["start"], x["end"], x["cpus"], x["iters"], x["it_s"], x["launch_s"], x["opened_by"])
            for x in a["allocations"]] == [(1.0, 7.0, 3, 10, 2.0, 0.5, "launch"), (10.0, 15.5, 6, 15, 3.0, 0.25, "launch")]
    assert (a["launch_time"], a["checkpoint_time"], a["stop_time"]) == (0.375, 0.4, 0.0)
    # measured alone at 3 and 6 cores: a profile record the simulator reads
    assert a["profile"] == {"status": "ok", "gpus": 1, "cpu_points": [3, 6], "mem_points": [2000],
                            "matrix": [[2.0], [3.0]], "source": "measured", "cpus": 3, "mem_mb": 2000}
    assert "throughput" not in a  # one GPU count only
    assert r2["iter_time"] == pytest.approx(0.25)  # 4 it/s on its 2 GPUs
    assert r2["attrs"]["throughput"] == {"1": 2.5, "2": 4.0}
    assert r2["attrs"]["allocations"][1]["opened_by"] == "resize"
    # job 3 shared its GPU only: iterations over seconds ran; never stopped: the export's mean stop time
    assert r3["iter_time"] == pytest.approx(1.0)
    assert r3["attrs"]["allocations"][0]["group"] == ["9"]
    assert (r3["attrs"]["resource_times"], r3["attrs"]["iteration_time"]) == ([0.1, 0.2, 0.0], 0.3)
    assert (r3["attrs"]["checkpoint_time"], r3["attrs"]["launch_time"]) == (0.45, 1.0)  # means of jobs 1 and 2; own
    assert [r["attrs"]["reference"] for r in rows] == ["measured", "measured", "running"]


def test_jobs_that_only_shared_a_gpu_get_their_reference_through_the_model(hist: History) -> None:
    # two GPU-bound twins (0.2 s of GPU per iteration) shared one GPU: 2.5 it/s each, half their speed alone
    ids = [hist.submit(0.0, gpus=1, resource_times=[0.0, 0.2, 0.0], iteration_time=0.2) for _ in range(2)]
    for me, other in (ids, ids[::-1]):
        hist.launch(me, 0.0, alloc(1, 1, 1000, (str(other),)))
        hist.progress(me, (0.0, 0), (4.0, 10))
        hist.finish(me, 4.0, 10)
    rows = export_trace(hist.store, hist.logs, CLUSTER)
    assert [(r["attrs"]["reference"], r["iter_time"]) for r in rows] == [("model", pytest.approx(0.2))] * 2


def test_exported_trace_replays_the_measured_speeds(hist: History, tmp_path: Path) -> None:
    j1 = hist.submit(0.0, gpus=1)
    hist.launch(j1, 0.0, alloc(1, 3, 2000))
    hist.progress(j1, (0.0, 0), (5.0, 10))
    hist.stop(j1, 5.0, 5.0)
    hist.launch(j1, 5.0, alloc(1, 6, 2000))
    hist.progress(j1, (5.0, 10), (10.0, 25))
    hist.finish(j1, 10.0, 25)
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in export_trace(hist.store, hist.logs, CLUSTER)))
    (spec,) = read_jsonl(f).jobs
    assert isinstance(spec.profile, SensitivityProfile)
    assert spec.duration == pytest.approx(12.5)  # 25 iterations at 0.5 s, the reference speed

    def finish(s: JobSpec) -> float | None:
        sched, model = Stack().build(CLUSTER, specs=[s])  # the trace's profiles give the sensitivity factor
        res = Simulator(CLUSTER, [s], sched, model, SimConfig(round_len=1.0, launch_overhead=0.0)).run()
        return res.jobs[0].finish

    assert finish(spec) == pytest.approx(12.5)  # proportional cores: 2 it/s, as measured there
    assert finish(dataclasses.replace(spec, cpus=6)) == pytest.approx(25 / 3)  # 6 cores: 3 it/s, as measured
    save_trace([spec], tmp_path / "back.jsonl")
    (again,) = read_jsonl(tmp_path / "back.jsonl").jobs
    assert isinstance(again.profile, SensitivityProfile) and again.attrs["profile"] == spec.attrs["profile"]


def test_profile_records() -> None:
    rec = record_from_points(2, [(4, 1000, 2.0), (8, 1000, 3.0), (4, 1000, 4.0), (0, 1000, 9.0), (8, 2000, 0.0)])
    assert rec == {"status": "ok", "gpus": 2, "cpu_points": [4, 8], "mem_points": [1000], "matrix": [[3.0], [3.0]],
                   "source": "measured"}
    p = profile_from_record("m", rec)
    assert p is not None and p.cpu_axis == (2.0, 4.0) and p.mem_axis == (500.0,)
    assert record_from_points(1, [(1, 1, 0.0)]) is None
    f = record_from_function(1, [2, 1], [5], lambda c, m: c * 10.0 + m)
    assert (f["cpu_points"], f["matrix"]) == ([1, 2], [[15.0], [25.0]])
    assert profile_from_record("x", {"status": "unprofilable", "gpus": 1}) is None
    with pytest.raises(SensitivityError, match="profile 'x'.*cpu_points"):
        profile_from_record("x", {"gpus": 1, "matrix": [[1.0]], "mem_points": [1]})
    with pytest.raises(SensitivityError, match="profile 'x': .*matrix is 1x1"):
        profile_from_record("x", {"gpus": 1, "matrix": [[1.0]], "cpu_points": [1, 2], "mem_points": [1]})


def test_a_bad_profile_in_a_trace_names_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "a", "arrival": 0, "gpus": 1, "duration": 5}\n'
                 '{"id": "b", "arrival": 0, "gpus": 1, "duration": 5, "attrs": {"profile": {"gpus": 1, '
                 '"cpu_points": [1], "mem_points": [1], "matrix": [[-1]]}}}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: field 'profile': .*negative"):
        read_jsonl(f)


def test_a_job_spec_brings_its_work_estimate_and_profile() -> None:
    from pydantic import ValidationError

    from gpuloom.runtime.api.app import JobSubmit
    from gpuloom.runtime.service.profiles import wants_profile
    from gpuloom.runtime.state.specs import job_spec
    from gpuloom.runtime.state.store import JobRow

    rec = record_from_function(1, [1, 2, 4], [1000], lambda c, m: float(c))
    spec = {"command": "x", "gpus": 1, "model": "m", "iterations": 200, "iteration_time": 0.25, "time_limit": 600,
            "profile": rec}
    js = job_spec(JobRow(3, "j", "u", spec, "standby", T0 + 5.0), T0)
    assert (js.id, js.arrival, js.duration, js.iterations, js.iter_time) == ("3", 5.0, 50.0, 200, 0.25)
    assert isinstance(js.profile, SensitivityProfile) and js.profile.throughput_at(4, 1000, 1) == 4.0
    # without iterations: the time limit is the estimate
    js = job_spec(JobRow(4, "j", "u", {"command": "x", "gpus": 1, "time_limit": 600, "profile": True}, "standby", T0), T0)
    assert (js.duration, js.profile) == (600.0, None)
    assert not wants_profile(spec) and wants_profile({"model": "m"})  # it brought its own
    assert JobSubmit(command="x", gpus=1, iterations=10, iteration_time=0.5, profile=rec).to_spec()["iterations"] == 10
    with pytest.raises(ValidationError, match=r"profile[\s\S]*matrix is 1x1"):
        JobSubmit(command="x", gpus=1, profile={"gpus": 1, "cpu_points": [1, 2], "mem_points": [1], "matrix": [[1]]})
    with pytest.raises(ValidationError, match="iterations"):
        JobSubmit(command="x", gpus=1, iterations=0)
