"""Job specs from every entry point: time limits by Slurm's rule (a bare number is minutes), in
exact seconds, from the API's JSON, spec files (YAML, JSON), ``submit --time`` and arrays; one typed
request for both faces (errors naming the field, equal requests from equivalent inputs, the stored form)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpuloom.cli import app as cli_app
from gpuloom.cli.specfile import parse_spec_text
from gpuloom.core.cluster import Cluster
from gpuloom.core.request import JobRequest, RequestError, parse_request
from gpuloom.runtime.api.app import JobSubmit, create_app, create_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.specs import parse_duration, parse_time_limit
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from gpuloom.sim.traces.own import read_jsonl
from service_util import Server, kill_jobs, own_cgroup_parent

NCPU = len(os.sched_getaffinity(0))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    parent = own_cgroup_parent()
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cluster = Cluster.homogeneous(2, 4)
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, next(parent)), Scheduler.from_names(),
                  ServiceConfig(tmp_path))
    with TestClient(create_app(svc)) as client:
        yield client, {"Authorization": f"Bearer {create_token(store, 'alice')}"}
    svc.terminate_all()
    svc.shutdown()
    store.close()
    next(parent, None)


def test_time_limit_bare_numbers_are_minutes_and_the_rest_as_documented() -> None:
    cases = {60: 3600.0, 1.5: 90.0, "60": 3600.0, " 5 ": 300.0, "10:00": 600.0, "1:30:00": 5400.0,
             "2-00:00:00": 172800.0, "1-2": 93600.0, "1-02:03:04": 93784.0, "90s": 90.0, "10m": 600.0,
             "2h": 7200.0, "1d": 86400.0, "1.5h": 5400.0}
    assert {k: parse_time_limit(k) for k in cases} == cases
    # the programmatic parser keeps numbers in seconds; what users write goes through parse_time_limit
    assert parse_duration(60, "x") == 60.0 and parse_duration("60", "x") == 3600.0


def test_token_lifetimes_read_bare_numbers_as_minutes_too(api: tuple[TestClient, dict[str, str]]) -> None:
    c, _ = api
    admin = c.app.state.service.store  # type: ignore[attr-defined]
    hd = {"Authorization": f"Bearer {create_token(admin, 'root', admin=True)}"}
    got = [c.post("/tokens", json={"user": "carol", "expires": e}, headers=hd).json()["expires_in"]
           for e in (60, "60", "30d", "90s")]
    assert got == [3600.0, 3600.0, 2592000.0, 90.0]


@pytest.mark.parametrize(("value", "message"), [
    (0, "time_limit: must be a finite time > 0, got '0'"),
    (-5, "time_limit: must be a finite time > 0, got '-5'"),
    (float("inf"), "time_limit: must be a finite time > 0, got 'inf'"),
    (10**400, "time_limit: must be a finite time > 0"),
    (True, "time_limit: expected a time like 1:30:00 or 2h, not a boolean"),
    ("soon", "time_limit: expected minutes or a time like 30:00, 1:30:00, 2-00:00:00, 90s or 2h, got 'soon'"),
    ("1:2:3:4", "time_limit: expected minutes"),
    (6_000_000, "time_limit: at most 3650 days, got '6000000'"),
])
def test_time_limit_errors_name_the_field(value: object, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_time_limit(value)
    assert str(e.value).startswith(message)


def test_api_reads_time_limits_as_slurm_does(api: tuple[TestClient, dict[str, str]]) -> None:
    c, hd = api
    got = {}
    for tl in (60, 1.5, "60", "10:00", "1:30:00", "2-00:00:00", "90s", "2h"):
        r = c.post("/jobs", json={"command": "true", "gpus": 1, "time_limit": tl}, headers=hd)
        assert r.status_code == 201, r.text
        got[tl] = r.json()["time_limit"]
    assert got == {60: 3600.0, 1.5: 90.0, "60": 3600.0, "10:00": 600.0, "1:30:00": 5400.0, "2-00:00:00": 172800.0,
                   "90s": 90.0, "2h": 7200.0}
    # every task of an array gets the same limit
    r = c.post("/jobs", json={"command": "true", "gpus": 1, "time_limit": 60, "array": "0-2"}, headers=hd)
    tasks = [j for j in c.get("/jobs", headers=hd).json() if j["array_id"] == r.json()["array_id"]]
    assert [(j["array_task"], j["time_limit"]) for j in tasks] == [(0, 3600.0), (1, 3600.0), (2, 3600.0)]
    r = c.post("/jobs", json={"command": "true", "gpus": 1, "time_limit": 0}, headers=hd)
    assert r.status_code == 422 and [d["loc"][-1] for d in r.json()["detail"]] == ["time_limit"]


def test_yaml_spec_files_keep_times_as_text() -> None:
    # YAML 1.1 would make 1:30:00 the integer 5400 (then 5400 minutes); the spec loader keeps it a time
    doc = parse_spec_text("time_limit: 1:30:00\nb: 10:00\nc: 60\nd: 1.5\ne: 0x10\nf: '2:00'\n", is_json=False)
    assert doc == {"time_limit": "1:30:00", "b": "10:00", "c": 60, "d": 1.5, "e": 16, "f": "2:00"}


def test_cli_flags_and_spec_files_give_the_same_seconds(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.5").start()
    sd = ("--state-dir", str(tmp_path))
    runner = CliRunner()

    def submitted(*args: str) -> dict:
        r = runner.invoke(cli_app, ["submit", "--json", *sd, *args])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    files = {"a.yaml": "command: sleep 0\ntime_limit: 60\n", "b.yaml": "command: sleep 0\ntime_limit: 1:30:00\n",
             "c.json": json.dumps({"command": "sleep 0", "time_limit": 60}),
             "d.json": json.dumps({"command": "sleep 0", "time_limit": "60"}),
             "e.yaml": "command: sleep 0\ntime_limit: 90s\narray: 0-1\n"}
    try:
        got = {}
        for name, text in files.items():
            (tmp_path / name).write_text(text)
            got[name] = submitted(str(tmp_path / name))["time_limit"]
        got["--time 60"] = submitted("--time", "60", "--", "sleep", "0")["time_limit"]
        got["-t 2-0"] = submitted("-t", "2-0", "--", "sleep", "0")["time_limit"]
        got["--time 60 over a file's 1:30:00"] = submitted("--time", "60", str(tmp_path / "b.yaml"))["time_limit"]
        arr = submitted("--time", "60", "--array", "0-1", "--", "sleep", "0")
        with s.client() as c:
            tasks = [j["time_limit"] for j in c.get("/jobs").json() if j["array_id"] == arr["array_id"]]
    finally:
        s.stop()
        kill_jobs(tmp_path)
    assert got == {"a.yaml": 3600.0, "b.yaml": 5400.0, "c.json": 3600.0, "d.json": 3600.0, "e.yaml": 90.0,
                   "--time 60": 3600.0, "-t 2-0": 172800.0, "--time 60 over a file's 1:30:00": 3600.0}
    assert tasks == [3600.0, 3600.0]


# -- one typed request for both faces ------------------------------------------------------------------
BAD_BODIES = [
    ({"command": "x", "gpu": 2}, "gpu", "gpu: not a job field; did you mean 'gpus'"),
    ({"gpus": 1}, "command", "command: missing"),
    ({"command": "x", "gpus": "two"}, "gpus", "gpus: expected a GPU count or TYPE:COUNT"),
    ({"command": "x", "gpus": 0}, "gpus", "gpus: must be >= 1, got 0"),
    ({"command": "x", "gpus": True}, "gpus", "gpus: expected a GPU count"),
    ({"command": "x", "gpus": "v100:2", "gpu_type": "k80"}, "gpu_type", "gpu_type: gpus v100:2 and gpu_type 'k80' disagree"),
    ({"command": "x", "gpu_type": "v100\nrm"}, "gpu_type", "gpu_type: a GPU type (v100, a100, ...)"),
    ({"command": "x", "cpus": 1.5}, "cpus", "cpus: expected a whole number, got 1.5"),
    ({"command": "x", "cpus": 0}, "cpus", "cpus: must be >= 1, got 0"),
    ({"command": "x", "priority": "high"}, "priority", "priority: expected a whole number, got 'high'"),
    ({"command": "x", "mem": "lots"}, "mem", "mem: expected a size like 8G"),
    ({"command": "x", "time_limit": "soon"}, "time_limit", "time_limit: expected minutes or a time like"),
    ({"command": "x", "env": {"A": 1}}, "env", "env: expected a mapping of NAME: text"),
    ({"command": "x", "resource_times": []}, "resource_times", "resource_times: expected a list of seconds"),
    ({"command": "x", "throughput": {"x": 1.0}}, "throughput", "throughput: keys are GPU counts"),
    ({"command": "x", "iteration_time": 0}, "iteration_time", "iteration_time: must be > 0"),
    ({"command": "x", "array": 5}, "array", "array: expected text, got 5"),
]


@pytest.mark.parametrize(("body", "field", "message"), BAD_BODIES)
def test_request_errors_name_the_field(body: dict, field: str, message: str) -> None:
    with pytest.raises(RequestError) as e:
        parse_request(body)
    assert e.value.field == field and str(e.value).startswith(message), str(e.value)


def test_the_api_refuses_the_same_bodies_naming_the_same_field(api: tuple[TestClient, dict[str, str]]) -> None:
    c, hd = api
    got = []
    for body, field, _ in BAD_BODIES:
        r = c.post("/jobs", json={"gpus": 1, **body} if "gpus" not in body and "command" in body else body, headers=hd)
        assert r.status_code == 422, (body, r.text)
        loc = r.json()["detail"][0]["loc"]
        got.append((field, loc[1] if len(loc) > 1 else loc[0]))
    # the API names every field parse_request names; the two GPU forms disagreeing is a check of the whole body
    assert got == [(f, "body" if f == "gpu_type" and "disagree" in m else f) for _, f, m in BAD_BODIES]


def test_both_faces_make_equal_requests_and_the_same_job_spec_as_a_trace(tmp_path: Path) -> None:
    # a spec file's fields (as the CLI reads them) and the API's JSON, written differently, mean one request
    from_file = parse_request(parse_spec_text(
        "command: python train.py\ngpus: v100:2\nmem: 8G\ntime_limit: 1:30:00\ncpus: 4\npriority: 3\n", False))
    from_api = JobSubmit.model_validate({"command": "python train.py", "gpus": 2, "gpu_type": "v100",
                                         "mem": 8000, "time_limit": 90, "cpus": 4, "priority": 3}).to_request()
    assert from_file == from_api == JobRequest("python train.py", gpus=2, gpu_type="v100", cpus=4, mem_mb=8000,
                                               time_limit=5400.0, priority=3)
    # and the scheduler sees what the simulator's own trace format makes of the same job
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "7", "arrival": 0, "gpus": 2, "duration": 5400, "cpus": 4, "mem_mb": 8000,
                                 "priority": 3, "gpu_type": "v100"}) + "\n")
    (from_trace,) = read_jsonl(trace).jobs
    assert from_api.to_job_spec("7", 0.0) == from_trace


def test_the_stored_form_is_unchanged_and_old_rows_load() -> None:
    # a row as the service stored it before the typed request: keys it adds itself ride along
    old = {"name": "arr", "command": "sleep 1", "gpus": 2, "mem_mb": 8000, "time_limit": 600.0, "profile": False,
           "array": "0-3%1", "array_limit": 1, "dependency": "afterok:3", "depends_on": [[3, "afterok"]],
           "env": {"A": "b"}, "throughput": {"1": 1.0, "2": 1.8}}
    req = JobRequest.from_stored(old)
    assert req.stored() == old and req.extra == {"array_limit": 1, "depends_on": [[3, "afterok"]]}
    assert (req.gpus, req.mem_mb, req.time_limit, req.profile) == (2, 8000, 600.0, False)
    body = {"command": "sleep 1", "gpus": "a100:1", "mem": "1Gi", "time_limit": "2h", "env": {"A": "b"}}
    assert JobSubmit.model_validate(body).to_spec() == {"name": "job", "command": "sleep 1", "gpus": 1,
                                                        "gpu_type": "a100", "mem_mb": 1074, "time_limit": 7200.0,
                                                        "env": {"A": "b"}}


def test_the_service_takes_a_typed_request(api: tuple[TestClient, dict[str, str]]) -> None:
    c, hd = api
    svc: Service = c.app.state.service  # type: ignore[attr-defined]
    jid = svc.submit(JobRequest("sleep 1", gpus=2, cpus=3, time_limit=60.0, name="typed"), "alice")
    assert svc.store.get_job(jid).spec == {"command": "sleep 1", "gpus": 2, "name": "typed",  # type: ignore[union-attr]
                                           "cpus": 3, "time_limit": 60.0}


def test_cli_refuses_a_bad_spec_file_naming_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("command: python train.py\ngpus: 2\ntime_limt: 60\n")
    # nothing listens on port 9: a request would fail differently; the field is refused before any is sent
    # (a wide terminal: the path, as long as the test's temporary directory, is not wrapped in the error's box)
    r = CliRunner().invoke(cli_app, ["submit", str(f), "--url", "http://127.0.0.1:9", "--token", "t"],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "time_limt: not a job field; did you mean 'time_limit'?" in r.output
    assert "job.yaml" in r.output
    r = CliRunner().invoke(cli_app, ["submit", "--gpus", "v100:x", "--url", "http://127.0.0.1:9", "--token", "t",
                                     "--", "true"])
    assert r.exit_code == 2 and "gpus: expected a GPU count or TYPE:COUNT" in r.output


def test_queue_rows_show_the_gpu_type_as_slurm_does() -> None:
    from gpuloom.cli.jobs import QUEUE_FIELDS, _queue_rows

    base = {"id": 1, "array": "", "name": "a", "user": "alice", "queue": "q", "st": "PD", "state": "waiting",
            "time_limit": 60.0, "held_s": 0.0, "gpus": 2, "gpu_type": "v100", "progress": None, "nodes": [],
            "pending_reason": "Resources", "reason": None}
    typed, plain = ([base[f] for f in QUEUE_FIELDS], [{**base, "gpu_type": None}[f] for f in QUEUE_FIELDS])
    rows = _queue_rows([typed, plain], list(QUEUE_FIELDS), False)
    assert [r[7] for r in rows] == ["v100:2", "2"]


# -- GPU types: placed only on nodes of the type asked for -----------------------------------------
def test_typed_jobs_are_placed_on_their_type_on_a_mixed_declared_cluster(tmp_path: Path) -> None:
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.runtime.service.errors import SubmitError

    parent = own_cgroup_parent()
    cluster = parse_cluster("k80:2x2,v100:1x2")  # k80-0, k80-1 (2 GPUs each), v100-0 (2 GPUs)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, next(parent)),
                  Scheduler.from_names("fifo"), ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0))
    try:
        ids = {name: svc.submit(parse_request({"command": "sleep 60", "name": name, **body}), "alice")
               for name, body in (("v100-pair", {"gpus": "v100:2"}), ("k80-three", {"gpus": 3, "gpu_type": "k80"}),
                                  ("either", {"gpus": 1, "gpu_type": "V100|k80"}), ("v100-wait", {"gpus": "v100:1"}))}
        with pytest.raises(SubmitError, match="needs GPU type a100, the cluster has k80, v100"):
            svc.submit(parse_request({"command": "true", "gpus": "a100:1"}), "alice")
        with pytest.raises(SubmitError, match="needs 3 GPUs, the cluster has 2 of type v100"):
            svc.submit(parse_request({"command": "true", "gpus": "v100:3"}), "alice")
        svc.round()
        nodes = {name: sorted({cluster.nodes[p.node].name for p in svc.current[str(i)].parts})
                 for name, i in ids.items() if str(i) in svc.current}
        gpus = {name: sorted((p.node, g) for p in svc.current[str(i)].parts for g in p.gpus)
                for name, i in ids.items() if str(i) in svc.current}
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
        next(parent, None)
    # FIFO, packed: the V100 pair fills v100-0; three K80 GPUs take k80-0 and one of k80-1; the job taking
    # either type gets the K80 GPU left; the second V100 job waits (both V100s are taken)
    assert nodes == {"v100-pair": ["v100-0"], "k80-three": ["k80-0", "k80-1"], "either": ["k80-1"]}
    # (node, GPU): GPUs are numbered across the cluster, k80-0 has 0-1, k80-1 2-3, v100-0 4-5
    assert gpus == {"v100-pair": [(2, 4), (2, 5)], "k80-three": [(0, 0), (0, 1), (1, 2)], "either": [(1, 3)]}
