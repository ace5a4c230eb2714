"""Job specs from every entry point: time limits by Slurm's rule (a bare number is minutes), in
exact seconds, from the API's JSON, spec files (YAML, JSON), ``submit --time`` and arrays."""

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
from gpuloom.runtime.api.app import create_app, create_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.specs import parse_duration, parse_time_limit
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
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
    store.close()
    next(parent, None)


def test_time_limit_bare_numbers_are_minutes_and_the_rest_as_documented() -> None:
    cases = {60: 3600.0, 1.5: 90.0, "60": 3600.0, " 5 ": 300.0, "10:00": 600.0, "1:30:00": 5400.0,
             "2-00:00:00": 172800.0, "1-2": 93600.0, "1-02:03:04": 93784.0, "90s": 90.0, "10m": 600.0,
             "2h": 7200.0, "1d": 86400.0, "1.5h": 5400.0}
    assert {k: parse_time_limit(k) for k in cases} == cases
    # other durations (token lifetimes, --keep-finished) keep their numbers in seconds
    assert parse_duration(60, "expires") == 60.0 and parse_duration("60", "expires") == 3600.0


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
