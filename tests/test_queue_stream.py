"""``GET /jobs/stream`` and ``gpuloom queue`` through it.  Behaviour only (the speed is in
``benchmarks/bench_scale.py``):

* ``queue`` (table, ``--long``, ``--all``, ``--user``, ``--json``) prints the same bytes through the stream
  as through the pages of ``GET /jobs`` (what it reads from a server without the stream), on the same jobs
  at the same (manual) time; the table's lines are checked by hand;
* each job's values in the stream are those of ``GET /jobs``, redacted alike for another user;
* blocks read while jobs change list no job twice and miss none that matched throughout;
* a stream without its end line is an error, not a short listing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.cli import jobs as jobs_cli
from gpuloom.cli.service import Client
from gpuloom.core.cluster import Cluster
from gpuloom.runtime.api.app import JOB_FIELDS, create_app, create_token, ensure_admin_token
from gpuloom.runtime.api.listing import job_lines
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import ACTIVE_STATES, Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler


@pytest.fixture
def served(tmp_path: Path, cgroup_parent: str) -> Iterator[tuple[Service, TestClient, str]]:
    """A service on a 1x2 cluster, its clock by hand, with: job 1 running (alice), job 2 finished (alice),
    an array of three two-GPU tasks 3-5 waiting (bob), job 6 cancelled while waiting (bob).  Yields the
    service, an admin's test client and bob's token."""
    clock = ManualClock(1_700_000_000.0)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 2)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0, launch_timeout_s=1.0, clock=clock))
    try:
        svc.submit({"name": "run", "command": "sleep 60", "gpus": 1, "time_limit": 3600}, "alice")
        done = svc.submit({"name": "done", "command": "true", "gpus": 1}, "alice")
        svc.round()
        for _ in range(400):  # job 2 exits on its own (the clock stands still meanwhile)
            time.sleep(0.05)
            svc.round()
            if store.get_job(done).state == "finished":  # type: ignore[union-attr]
                break
        svc.submit({"name": "wide", "command": "sleep 60", "gpus": 2, "array": "0-2"}, "bob")
        gone = svc.submit({"name": "gone", "command": "sleep 60", "gpus": 1}, "bob")
        svc.cancel(gone, "bob", False)
        svc.round()
        clock.advance(2.0)  # past the launch timeout: running_protected
        svc.round()
        clock.advance(123.0)  # past the protection: running
        svc.round()
        assert [store.get_job(j).state for j in range(1, 7)] == [  # type: ignore[union-attr]
            "running", "finished", "waiting_for_initial_resource", "waiting_for_initial_resource",
            "waiting_for_initial_resource", "cancelled"]
        ensure_admin_token(store, tmp_path)
        bob = create_token(store, "bob")
        admin = (tmp_path / "admin.token").read_text().strip()
        with TestClient(create_app(svc), headers={"Authorization": f"Bearer {admin}"}) as client:
            yield svc, client, bob
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def _queue(monkeypatch: pytest.MonkeyPatch, client: TestClient, *flags: str, stream: bool = True) -> str:
    """``gpuloom queue FLAGS``'s output, talking to ``client``; without ``stream`` the command meets a
    server without ``/jobs/stream`` (which reads the path as a job id) and reads pages."""
    c = object.__new__(Client)
    c.http, c.url, c.check, c.last = client, "http://testserver", None, None
    monkeypatch.setattr(jobs_cli, "Client", lambda *a: c)
    monkeypatch.setattr(jobs_cli, "STREAM", "/jobs/stream" if stream else "/jobs/0")
    monkeypatch.setattr(jobs_cli, "LIST_PAGE", 2)  # (pages of two jobs)
    res = CliRunner().invoke(app, ["queue", *flags])
    assert res.exit_code == 0, res.output
    return res.output


def test_queue_prints_the_same_bytes_through_the_stream_as_through_pages(
        served: tuple[Service, TestClient, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client, _ = served
    out = _queue(monkeypatch, client, "--array")
    assert out.splitlines() == [
        " JOBID  ARRAY  NAME  USER   QUEUE  ST  TIME  GPUS  ITER  NODELIST(REASON) ",
        " 1             run   alice  -      R   2:05  1     -     node-0           ",
        " 3      3_0    wide  bob    -      PD  0:00  2     -     (Resources)      ",
        " 4      3_1    wide  bob    -      PD  0:00  2     -     (Resources)      ",
        " 5      3_2    wide  bob    -      PD  0:00  2     -     (Resources)      ",
    ]
    assert out == _queue(monkeypatch, client, "--array", stream=False)
    out = _queue(monkeypatch, client)  # the array's pending tasks as one line
    assert out.splitlines() == [
        " JOBID  ARRAY    NAME  USER   QUEUE  ST  TIME  GPUS  ITER  NODELIST(REASON)    ",
        " 1               run   alice  -      R   2:05  1     -     node-0              ",
        " 3      3_[0-2]  wide  bob    -      PD  0:00  2     -     (Resources) 3 tasks ",
    ]
    assert out == _queue(monkeypatch, client, stream=False)
    for flags in (["--all"], ["--all", "--long"], ["--user", "bob", "--all"], ["--state", "CA"], ["--json"],
                  ["--json", "--all"]):
        assert _queue(monkeypatch, client, *flags) == _queue(monkeypatch, client, *flags, stream=False), flags
    jobs = json.loads(_queue(monkeypatch, client, "--json", "--all"))
    assert [(j["id"], j["st"], j["held_s"]) for j in jobs] == [(1, "R", 125.0), (2, "CD", 0.0), (3, "PD", 0.0),
                                                               (4, "PD", 0.0), (5, "PD", 0.0), (6, "CA", 0.0)]
    assert list(jobs[0]) == list(JOB_FIELDS)


def _stream(client: TestClient, **kw: Any) -> tuple[list[dict[str, Any]], int]:
    """The jobs of a ``/jobs/stream`` answer as dicts, and its end count."""
    r = client.get("/jobs/stream", **kw)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(x) for x in r.text.splitlines()]
    fields = lines[0]["fields"]
    assert list(lines[-1]) == ["end"]
    return [dict(zip(fields, v, strict=True)) for block in lines[1:-1] for v in block], lines[-1]["end"]


def test_the_streams_values_are_those_of_the_pages_redacted_alike(served: tuple[Service, TestClient, str]) -> None:
    _, client, bob = served
    for headers in ({}, {"Authorization": f"Bearer {bob}"}):
        jobs, end = _stream(client, headers=headers)
        assert jobs == client.get("/jobs", params={"limit": 100}, headers=headers).json() and end == 6
        fields = {"fields": "st,command,alloc,user,id"}
        assert _stream(client, params=fields, headers=headers)[0] == client.get(
            "/jobs", params={**fields, "limit": 100}, headers=headers).json()
    jobs, _ = _stream(client, headers={"Authorization": f"Bearer {bob}"})
    # bob sees alice's jobs without command, paths and processes, and where they run without core ids
    assert [(j["id"], j["command"], j["procs"]) for j in jobs if j["user"] == "alice"] == [(1, None, None),
                                                                                          (2, None, None)]
    assert jobs[0]["alloc"] is not None and "cores" not in jobs[0]["alloc"]["parts"][0]
    assert jobs[2]["command"] == "sleep 60"  # his own
    jobs, end = _stream(client, params={"state": ["cancelled", "finished"], "user": "bob", "fields": "id,st"})
    assert (jobs, end) == ([{"id": 6, "st": "CA"}], 1)
    assert client.get("/jobs/stream", params={"fields": "id,secret"}).status_code == 422
    assert client.get("/jobs/stream", headers={"Authorization": "Bearer not-a-token"}).status_code == 401


def test_blocks_read_while_jobs_change_list_each_job_once(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        for st in ["standby"] * 5 + ["finished"] * 2:  # jobs 1-7
            store.add_job({"command": "x", "gpus": 1}, "u", st, now=1.0)
        lines = job_lines(store, ["id", "state"], ("u", False), lambda: 2.0, lambda j, s: None, ACTIVE_STATES,
                          block=2)
        got = [json.loads(x) for x in next(lines).splitlines()]  # the header and jobs 1-2
        store.set_states([1], "running", ["standby"])  # listed already: not again
        store.set_states([3], "finished", ["standby"])  # not listed yet, no longer active: left out
        store.set_states([4], "running", ["standby"])  # still active: listed as it is now
        store.set_states([6], "standby", ["finished"])  # active now: listed
        store.add_job({"command": "x", "gpus": 1}, "u", "standby", now=3.0)  # job 8: listed
        got += [json.loads(x) for chunk in lines for x in chunk.splitlines()]
    finally:
        store.close()
    assert got[0] == {"fields": ["id", "state"]} and got[-1] == {"end": 6}
    assert [v for block in got[1:-1] for v in block] == [[1, "standby"], [2, "standby"], [4, "running"],
                                                        [5, "standby"], [6, "standby"], [8, "standby"]]


def test_a_stream_without_its_end_line_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    lines = iter(['{"fields": ["id"]}', "[[1], [2]]"])  # (the connection closed here)
    blocks = jobs_cli._blocks(lines, "http://x")
    assert next(blocks) == (["id"], [[1], [2]])
    with pytest.raises(typer.Exit) as e:
        next(blocks)
    assert e.value.exit_code == 1
    assert "the listing from http://x was cut short" in capsys.readouterr().err


def test_rows_added_at_once_show_their_text_as_rows_added_one_by_one() -> None:
    """(``queue`` adds a block's rows at once: a name's terminal escapes are shown as ``?`` all the same.)"""
    from gpuloom.cli.common import PlainTable

    rows = [["1", "a\x1b[2Jb", "x"], ["2", "ok", "\x9bc"], ["3", "日本", "-"]]
    one, block = PlainTable("ID", "NAME", "R"), PlainTable("ID", "NAME", "R")
    for r in rows:
        one.add_row(*r)
    block.add_rows([list(r) for r in rows])
    assert block.rows == one.rows == [["1", "a?[2Jb", "x"], ["2", "ok", "?c"], ["3", "日本", "-"]]
    clean = PlainTable("ID")
    clean.add_rows([["7"], ["8"]])
    assert clean.lines() == [" ID ", " 7  ", " 8  "]
