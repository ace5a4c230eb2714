"""The operator's view, in process: pending reasons, arrays and dependencies, allocation records and
history, metrics read by a Prometheus parser, one structured log line per transition."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuloom.core.cluster import Cluster
from gpuloom.core.lifecycle import SHORT_STATE, JobState
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.deps import parse_array, parse_dependency
from gpuloom.runtime.service.logfmt import JsonFormatter
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.history import format_duration, format_mem, history
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

T0 = 1_700_000_000.0


@pytest.fixture
def make(tmp_path: Path, cgroup_parent: str):  # noqa: ANN201
    """``make(nodes, gpus, clock=None, **sched)`` -> a Service (loop not started) over a fresh store."""
    made: list[Service] = []

    def _make(nodes: int = 1, gpus: int = 2, clock: ManualClock | None = None, order: str = "fifo",
              **params: object) -> Service:
        store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        cl = Cluster.homogeneous(nodes, gpus)
        svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent),
                      Scheduler.from_names(order, params=dict(params)),
                      ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0,
                      clock=clock))
        made.append(svc)
        return svc

    yield _make
    for svc in made:
        svc.terminate_all()
        svc.shutdown()
        svc.store.close()


def rounds_until(svc: Service, cond, what: str, timeout: float = 20.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        svc.round()
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_every_lifecycle_state_has_a_slurm_code() -> None:
    assert set(SHORT_STATE) == set(JobState)
    assert {SHORT_STATE[s] for s in JobState} == {"PD", "R", "CG", "CD", "F", "CA"}
    assert (SHORT_STATE[JobState.STANDBY], SHORT_STATE[JobState.LAUNCHING], SHORT_STATE[JobState.CHECKPOINTING]) == \
        ("PD", "R", "CG")


def test_array_and_dependency_syntax() -> None:
    assert parse_array("0-9") == (list(range(10)), None)
    assert parse_array("1,3,5-7") == ([1, 3, 5, 6, 7], None)
    assert parse_array("0-15:4%2") == ([0, 4, 8, 12], 2)
    for bad, what in (("9-0", "empty"), ("a-b", "expected"), ("0-3%0", "limit"), ("0-20000", "at most")):
        with pytest.raises(ValueError, match=what):
            parse_array(bad)
    assert parse_dependency("afterok:5:6,afterany:7_2") == [("afterok", ["5", "6"]), ("afterany", ["7_2"])]
    for bad in ("afterfoo:1", "afterok:", "afterok:x"):
        with pytest.raises(ValueError, match="dependency"):
            parse_dependency(bad)


def test_display_helpers() -> None:
    assert [format_duration(s) for s in (None, 59, 3600, 90061)] == ["-", "0:59", "1:00:00", "1-01:01:01"]
    # G is 10^9 bytes: 1000 MB, for jobs and nodes alike
    assert [format_mem(m) for m in (None, 512, 8000, 64_000, 8589.934592, 2_000_000)] == \
        ["-", "512M", "8G", "64G", "8.59G", "2T"]


def test_pending_reasons_are_stored_and_cleared(make) -> None:  # noqa: ANN001
    svc = make(1, 2)
    a = svc.submit({"name": "a", "command": "sleep 60", "gpus": 2}, "alice")
    b = svc.submit({"name": "b", "command": "sleep 60", "gpus": 1, "queue": "research"}, "bob")
    svc.round()
    ra, rb = svc.store.get_job(a), svc.store.get_job(b)
    assert (ra.state, ra.pending_reason) == ("launching", None)
    assert (rb.state, rb.pending_reason) == ("waiting_for_initial_resource", "Resources")
    svc.cancel(a, "alice", False)
    rounds_until(svc, lambda: svc.store.get_job(b).state == "launching", "b to launch")
    assert svc.store.get_job(b).pending_reason is None


def test_dependencies_hold_jobs_out_of_the_driver_and_a_failure_cancels_the_chain(make) -> None:  # noqa: ANN001
    svc = make(1, 2)
    a = svc.submit({"name": "a", "command": "sleep 0.3; exit 3", "gpus": 1}, "alice")
    b = svc.submit({"name": "b", "command": "true", "gpus": 1, "dependency": f"afterok:{a}"}, "alice")
    c = svc.submit({"name": "c", "command": "true", "gpus": 1, "dependency": f"afterok:{b}"}, "alice")
    d = svc.submit({"name": "d", "command": "true", "gpus": 1, "dependency": f"afterany:{a}"}, "alice")
    svc.round()
    assert set(svc.driver.jobs) == {str(a)}  # the dependents never reach the driver while they wait
    assert [svc.store.get_job(j).pending_reason for j in (b, c, d)] == ["Dependency"] * 3
    assert [svc.store.get_job(j).state for j in (b, c, d)] == ["waiting_for_initial_contact"] * 3
    rounds_until(svc, lambda: svc.store.get_job(d).state in ("launching", "finished"), "d to run")
    rb, rc = svc.store.get_job(b), svc.store.get_job(c)
    assert (svc.store.get_job(a).state, svc.store.get_job(a).exit_code) == ("failed", 3)
    assert (rb.state, rb.reason) == ("cancelled", f"DependencyNeverSatisfied: job {a} failed")
    assert (rc.state, rc.reason) == ("cancelled", f"DependencyNeverSatisfied: job {b} cancelled")
    assert [e["kind"] for e in svc.store.events(c)] == ["submit", "cancelled"]


def test_an_array_limit_runs_tasks_in_order(make) -> None:  # noqa: ANN001
    svc = make(1, 4)
    first = svc.submit({"name": "arr", "command": "echo task $GPULOOM_ARRAY_TASK_ID of $GPULOOM_ARRAY_JOB_ID",
                        "gpus": 1, "array": "0-3%2"}, "alice")
    rows = svc.store.array_tasks(first)
    assert [(r.array_id, r.array_task) for r in rows] == [(first, i) for i in range(4)]
    assert [r.id for r in rows] == list(range(first, first + 4))
    svc.round()
    held = [r.id for r in svc.store.array_tasks(first) if r.pending_reason == "JobArrayTaskLimit"]
    assert held == [first + 2, first + 3]  # at most 2 active: four free GPUs notwithstanding
    rounds_until(svc, lambda: all(r.state == "finished" for r in svc.store.array_tasks(first)), "the array")
    assert svc.log_path(first + 3).read_text() == f"task 3 of {first}\n"


def test_unknown_dependency_is_refused_naming_the_field(make, tmp_path: Path) -> None:  # noqa: ANN001
    svc = make(1, 2)
    token = ensure_admin_token(svc.store, tmp_path)
    with TestClient(create_app(svc)) as c:
        h = {"Authorization": f"Bearer {token}"}
        for dep, msg in (("afterok:99", "no job 99"), ("afterwards:1", "unknown kind")):
            r = c.post("/jobs", json={"command": "true", "gpus": 1, "dependency": dep}, headers=h)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "dependency", r.text
            assert msg in r.json()["detail"][0]["msg"]
        r = c.post("/jobs", json={"command": "true", "gpus": 1, "array": "3-1"}, headers=h)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "array"
        assert svc.store.count_jobs() == 0  # nothing stored


def test_allocation_records_give_exact_history(make) -> None:  # noqa: ANN001
    clock = ManualClock(T0)
    svc = make(1, 4, clock=clock)
    a = svc.submit({"name": "a", "command": "sleep 60", "gpus": 2}, "alice")
    clock.advance(10)
    svc.round()  # a launches at T0 + 10
    clock.advance(3600)
    (rec,) = history(svc.store, clock.time(), user="alice")
    assert (rec["st"], rec["elapsed_s"], rec["held_s"], rec["gpu_hours"]) == ("R", 3600.0, 3600.0, 2.0)
    svc.cancel(a, "alice", False)
    svc.round()  # cancelled at T0 + 3610
    clock.advance(7200)
    (rec,) = history(svc.store, clock.time(), allocations=True)
    assert (rec["state"], rec["st"], rec["elapsed_s"], rec["gpu_hours"], rec["nodes"]) == \
        ("cancelled", "CA", 3600.0, 2.0, ["node-0"])
    assert (rec["submit"], rec["start"], rec["end"]) == \
        ("2023-11-14T22:13:20.000+00:00", "2023-11-14T22:13:30.000+00:00", "2023-11-14T23:13:30.000+00:00")
    (span,) = rec["allocations"]
    assert (span["gpus"], span["gpu_ids"], span["opened_by"], span["closed_by"]) == (2, [0, 1], "launch", "cancelled")
    assert history(svc.store, clock.time(), states=["finished"]) == []
    assert history(svc.store, clock.time(), since=T0 + 3611) == []  # ended before
    assert len(history(svc.store, clock.time(), until=T0)) == 1


def test_metrics_read_by_a_prometheus_parser(make, tmp_path: Path) -> None:  # noqa: ANN001
    svc = make(2, 2)
    admin = ensure_admin_token(svc.store, tmp_path)
    with TestClient(create_app(svc)) as c:
        h = {"Authorization": f"Bearer {admin}"}
        assert c.get("/metrics").status_code == 401
        for spec in ({"name": "big", "command": "sleep 60", "gpus": 2}, {"name": "bad", "command": "exit 1", "gpus": 1},
                     {"name": "wait", "command": "sleep 60", "gpus": 2}):
            assert c.post("/jobs", json=spec, headers=h).status_code == 201
        svc.submit({"name": "q", "command": "sleep 60", "gpus": 2, "queue": "research"}, "admin")
        rounds_until(svc, lambda: svc.store.get_job(2).state == "failed", "the bad job to fail")
        svc.round()
        text = c.get("/metrics", headers=h).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    def values(name: str, key: str = "") -> dict:
        return {tuple(s.labels[k] for k in key.split(",")) if key else (): s.value
                for s in fams[name].samples if s.name == name or s.name == name + "_total"}

    assert values("gpuloom_node_gpus", "node") == {("node-0",): 2.0, ("node-1",): 2.0}
    alloc = values("gpuloom_node_gpus_allocated", "node")
    assert sorted(alloc.values()) == [2.0, 2.0]  # big and wait hold a node each; bad has ended
    assert set(values("gpuloom_node_gpus_busy", "node").values()) <= {0.0, 2.0}
    jobs: dict[str, float] = {}
    for (_, st), v in values("gpuloom_jobs", "state,st").items():
        jobs[st] = jobs.get(st, 0.0) + v
    assert jobs == {"PD": 1.0, "R": 2.0, "CG": 0.0, "CD": 0.0, "F": 1.0, "CA": 0.0}
    q = values("gpuloom_queue_jobs", "queue,st")
    assert q[("research", "PD")] == 1.0 and q[("", "R")] == 2.0
    assert values("gpuloom_pending_jobs", "reason") == {("Resources",): 1.0}
    assert values("gpuloom_job_failures") == {(): 1.0}
    assert values("gpuloom_preemptions") == {(): 0.0}
    hist = {s.name: s.value for s in fams["gpuloom_round_duration_seconds"].samples if "_bucket" not in s.name}
    assert hist["gpuloom_round_duration_seconds_count"] == svc.rounds
    assert {s.name: s.value for s in fams["gpuloom_submit_latency_seconds"].samples}[
        "gpuloom_submit_latency_seconds_count"] == 3.0  # API submissions
    assert {s.name: s.value for s in fams["gpuloom_launch_latency_seconds"].samples}[
        "gpuloom_launch_latency_seconds_count"] == 3.0  # big, bad, wait launched once each
    # the sample Grafana dashboard queries only series the service exports
    import re

    dash = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    series = {s.name for f in fams.values() for s in f.samples}
    used = {m for e in exprs for m in re.findall(r"gpuloom_[a-z_]+", e)}
    assert used and used <= series, used - series


def test_one_json_log_line_per_transition(make) -> None:  # noqa: ANN001
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    jlog = logging.getLogger("gpuloom.jobs")
    jlog.addHandler(handler)
    old = jlog.level
    jlog.setLevel(logging.INFO)
    try:
        svc = make(2, 2)
        a = svc.submit({"name": "a", "command": "sleep 60", "gpus": 2}, "alice")
        b = svc.submit({"name": "b", "command": "exit 2", "gpus": 1}, "bob")
        rounds_until(svc, lambda: svc.store.get_job(b).state == "failed", "b to fail")
        svc.cancel(a, "alice", False)
        svc.round()
    finally:
        jlog.removeHandler(handler)
        jlog.setLevel(old)
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    got = [(d["job"], d["event"]) for d in lines]
    assert got.count((a, "launch")) == 1 and got.count((b, "fail")) == 1
    by = {(d["job"], d["event"]): d for d in lines}
    assert [e for j, e in got if j == a] == ["submit", "launch", "cancel"]
    assert [e for j, e in got if j == b] == ["submit", "launch", "fail"]
    la = by[a, "launch"]
    assert la["level"] == "info" and la["user"] == "alice" and la["nodes"] == ["node-0"]
    assert la["gpus"] == ["node-0:0", "node-0:1"] and la["msg"] == "job 1 launched on node-0 GPUs 0,1"
    fb = by[b, "fail"]
    assert fb["level"] == "warning" and fb["exit_code"] == 2 and fb["gpus"] == ["node-1:0"] and fb["user"] == "bob"
    assert by[a, "cancel"]["nodes"] == ["node-0"]  # the end line names what the job held
    assert by[a, "submit"]["user"] == "alice"


def test_stores_from_before_get_the_new_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    Store(url).close()
    con = sqlite3.connect(tmp_path / "old.sqlite")
    con.execute("DROP INDEX ix_jobs_array_state")
    for col in ("pending_reason", "array_id", "array_task"):
        con.execute(f"ALTER TABLE jobs DROP COLUMN {col}")
    con.execute("DROP TABLE allocations")
    con.commit()
    con.close()
    store = Store(url)
    jid = store.add_job({"command": "true", "gpus": 1}, "alice", "waiting_for_initial_contact")
    store.set_pending_reasons({jid: "Resources"})
    assert store.get_job(jid).pending_reason == "Resources" and store.allocations() == []
    store.close()
    con = sqlite3.connect(tmp_path / "old.sqlite")  # and the index the array queries read
    assert con.execute("SELECT sql FROM sqlite_master WHERE name = 'ix_jobs_array_state'").fetchone() == (
        "CREATE INDEX ix_jobs_array_state ON jobs (array_id, state, first_start)",)
    con.close()


def test_bearer_scheme_and_local_docs(make, tmp_path: Path) -> None:  # noqa: ANN001
    svc = make(1, 2)
    admin = ensure_admin_token(svc.store, tmp_path)
    alice = create_token(svc.store, "alice")
    with TestClient(create_app(svc)) as c:
        spec = c.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"]["HTTPBearer"] == {
            "type": "http", "scheme": "bearer", "description": spec["components"]["securitySchemes"]["HTTPBearer"]
            ["description"]}
        assert spec["paths"]["/jobs"]["post"]["security"] == [{"HTTPBearer": []}]
        page = c.get("/docs").text
        assert "/docs-assets/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
        assert c.get("/docs-assets/swagger-ui-bundle.js").status_code == 200
        assert "<title>gpuloom</title>" in c.get("/").text and c.get("/ui/app.js").status_code == 200
        assert c.get("/whoami", headers={"Authorization": f"Bearer {alice}"}).json() == {"user": "alice",
                                                                                         "admin": False}
        assert c.get("/whoami", headers={"Authorization": f"Bearer {admin}"}).json()["admin"] is True
