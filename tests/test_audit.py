"""The audit trail: every job change with its actor and subject, token and queue changes, admins only;
and the job log lines' fields (name, queue, actor; the logger under ``logger``)."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpuloom.cli import app as cli_app
from gpuloom.core.cluster import Cluster
from gpuloom.core.queues import parse_queues
from gpuloom.runtime.api.access import enable, open_log, safe_path
from gpuloom.runtime.api.access import log as access_log
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.logfmt import JsonFormatter, TextFormatter
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.audit import SCHEDULER, event_actor, record, trail
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import Server, kill_jobs

TREE = {"default": "prod", "queue": [{"name": "research", "guarantee": 1, "users": ["alice"]},
                                     {"name": "prod", "guarantee": 1, "open": True}]}


class Api:
    def __init__(self, tmp: Path, cgroup_parent: str, policy: str = "quota") -> None:
        self.tmp = tmp
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        cl = Cluster.homogeneous(1, 2)
        self.svc = Service(self.store, cl, local_executor(cl, tmp / "run", True, cgroup_parent),
                           Scheduler.from_names(queue=policy), ServiceConfig(tmp, round_s=1000.0, grace_s=1.0))
        self.admin = ensure_admin_token(self.store, tmp)
        self.alice = create_token(self.store, "alice")
        self.client = TestClient(create_app(self.svc))

    def h(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def rounds_until(self, cond: Any, what: str, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.svc.round()
            if cond():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        self.client.close()
        self.svc.terminate_all()
        self.svc.shutdown()
        self.store.close()


@pytest.fixture
def api(tmp_path: Path, cgroup_parent: str) -> Iterator[Api]:
    a = Api(tmp_path, cgroup_parent)
    yield a
    a.close()


class Captured:
    """JSON lines of the loggers ``names`` at INFO while in use."""

    def __init__(self, *names: str, fmt: logging.Formatter | None = None) -> None:
        self.buf = io.StringIO()
        self.handler = logging.StreamHandler(self.buf)
        self.handler.setFormatter(fmt or JsonFormatter())
        self.loggers = [logging.getLogger(n) for n in names]
        self.old = [lg.level for lg in self.loggers]

    def __enter__(self) -> Captured:
        for lg in self.loggers:
            lg.addHandler(self.handler)
            lg.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: Any) -> None:
        for lg, old in zip(self.loggers, self.old, strict=True):
            lg.removeHandler(self.handler)
            lg.setLevel(old)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.buf.getvalue().splitlines()]


def test_event_actor_rules() -> None:
    assert event_actor("submit", {"user": "alice"}) == "alice"
    assert event_actor("submit", {"user": "alice", "actor": "admin"}) == "admin"
    assert event_actor("cancel", {"by": "admin"}) == "admin"
    assert event_actor("cancel-request", {"by": "bob"}) == "bob"
    assert event_actor("launch", {"alloc": {}}) == SCHEDULER
    assert event_actor("failed", {"exit_code": 2}) == SCHEDULER


def test_an_admins_cancel_of_alices_jobs_is_logged_with_actor_and_subject(api: Api) -> None:
    api.svc.queues.configure(parse_queues(TREE))
    with Captured("gpuloom.jobs") as cap:
        run = api.client.post("/jobs", json={"name": "train", "command": "sleep 60", "gpus": 2, "queue": "research"},
                              headers=api.h(api.alice)).json()["id"]
        api.rounds_until(lambda: api.store.get_job(run).state in ("running", "running_protected", "launching")
                         and api.store.get_job(run).alloc is not None, "the job to launch")
        wait = api.client.post("/jobs", json={"name": "eval", "command": "true", "gpus": 1},
                               headers=api.h(api.alice)).json()["id"]
        assert api.client.delete(f"/jobs/{wait}", headers=api.h(api.admin)).json()["state"] == "cancelled"
        assert api.client.delete(f"/jobs/{run}", headers=api.h(api.admin)).status_code == 200
        api.rounds_until(lambda: api.store.get_job(run).state == "cancelled", "the running job to end")
    lines = cap.lines()
    by = {(d["job"], d["event"]): d for d in lines}
    sub = by[run, "submit"]
    assert {k: sub[k] for k in ("logger", "user", "actor", "name", "queue")} == {
        "logger": "gpuloom.jobs", "user": "alice", "actor": "alice", "name": "train", "queue": "research"}
    launch = by[run, "launch"]
    assert (launch["actor"], launch["name"], launch["queue"], launch["user"]) == (SCHEDULER, "train", "research",
                                                                                  "alice")
    # queued: cancelled by the API at once; running: ended by the loop at the admin's request
    for jid, name in ((wait, "eval"), (run, "train")):
        c = by[jid, "cancel"]
        assert (c["user"], c["actor"], c["name"]) == ("alice", "admin", name), c
    assert by[wait, "cancel"]["queue"] == "prod"  # the default queue, as assigned at submission


def test_text_lines_carry_the_same_fields_and_the_logger_once() -> None:
    rec = logging.LogRecord("gpuloom.jobs", logging.INFO, __file__, 1, "job %s cancelled", (7,), None)
    for k, v in {"event": "cancel", "job": 7, "user": "alice", "actor": "admin", "job_name": "train",
                 "queue": "research"}.items():
        setattr(rec, k, v)
    d = json.loads(JsonFormatter().format(rec))
    assert {k: v for k, v in d.items() if k != "time"} == {
        "level": "info", "logger": "gpuloom.jobs", "msg": "job 7 cancelled", "event": "cancel", "job": 7,
        "user": "alice", "actor": "admin", "name": "train", "queue": "research"}
    text = TextFormatter().format(rec)
    assert text.endswith("INFO gpuloom.jobs: job 7 cancelled [event=cancel job=7 user=alice actor=admin name=train "
                         "queue=research]")


def test_admin_submitting_for_alice_is_the_actor(api: Api) -> None:
    jid = api.client.post("/jobs", json={"command": "true", "gpus": 1, "user": "alice"},
                          headers=api.h(api.admin)).json()["id"]
    sub = [r for r in trail(api.store) if r["job"] == jid and r["kind"] == "submit"]
    assert [(r["actor"], r["subject"]) for r in sub] == [("admin", "alice")]
    own = api.client.post("/jobs", json={"command": "true", "gpus": 1}, headers=api.h(api.alice)).json()["id"]
    assert api.store.events(own)[0]["detail"] == {"user": "alice"}  # unchanged when one submits for oneself


def test_token_and_queue_changes_are_in_the_trail_for_admins_only(api: Api) -> None:
    admin, c = api.h(api.admin), api.client
    with Captured("gpuloom.audit", "gpuloom.jobs") as cap:
        made = c.post("/tokens", json={"user": "bob", "expires": "1d"}, headers=admin).json()
        tid = next(t["id"] for t in c.get("/tokens", headers=admin).json() if t["user"] == "bob")
        assert c.delete(f"/tokens/{tid}", headers=admin).status_code == 200
        assert c.put("/queues/research", json={"guarantee": 1, "users": ["alice"]}, headers=admin).status_code == 200
        assert c.put("/queues/prod", json={"guarantee": 1, "open": True}, headers=admin).status_code == 200
        assert c.put("/users/alice/queue", json={"queue": "research"}, headers=admin).status_code == 200
        assert c.put("/queue-default", json={"queue": "prod"}, headers=admin).status_code == 200
        assert c.put("/groups/ml", json={"users": ["alice", "bob"]}, headers=admin).status_code == 200
        assert c.put("/queues/lab", json={"per_user": True}, headers=admin).status_code == 200
        own = c.post("/jobs", json={"command": "true", "gpus": 1, "queue": "lab"}, headers=api.h(api.alice)).json()
        assert own["queue"] == "lab.alice"  # made on first submission: a change by alice
        assert c.delete("/queues/nope", headers=admin).status_code == 404  # no change: no record
        jid = c.post("/jobs", json={"command": "true", "gpus": 1}, headers=api.h(api.alice)).json()["id"]
        c.delete(f"/jobs/{jid}", headers=admin)
    want = [("admin", "token.create", "bob", tid), ("admin", "token.revoke", "bob", tid),
            ("admin", "queue.set", None, "research"), ("admin", "queue.set", None, "prod"),
            ("admin", "queue.user", "alice", "research"), ("admin", "queue.default", None, "prod"),
            ("admin", "queue.group", None, "ml"), ("admin", "queue.set", None, "lab"),
            ("alice", "queue.set", "alice", "lab.alice"), ("alice", "submit", "alice", None),
            ("alice", "submit", "alice", None), ("admin", "cancel", "alice", None)]
    r = c.get("/audit", headers=admin)
    assert r.status_code == 200
    got = r.json()
    assert [(x["actor"], x["kind"], x["subject"], x["target"]) for x in got] == want
    assert got[-1]["job"] == jid and got[0]["detail"] == {"admin": False, "expires_in": 86400.0}
    # filters: by actor, by kind family, by exact kind, from a time on
    assert [x["kind"] for x in c.get("/audit", params={"actor": "alice"}, headers=admin).json()] == [
        "queue.set", "submit", "submit"]
    assert [x["kind"] for x in c.get("/audit", params={"kind": "token"}, headers=admin).json()] == [
        "token.create", "token.revoke"]
    assert [x["job"] for x in c.get("/audit", params={"kind": "cancel"}, headers=admin).json()] == [jid]
    later = c.get("/audit", params={"since": got[-1]["t"]}, headers=admin).json()
    assert [x["kind"] for x in later] == ["cancel"]
    page = c.get("/audit", params={"limit": 2}, headers=admin)
    assert len(page.json()) == 2 and page.headers["X-Next-After"] == got[1]["cursor"]
    pages = page.json()
    while "X-Next-After" in page.headers:  # page by page: every record once, in order
        page = c.get("/audit", params={"limit": 2, "after": page.headers["X-Next-After"]}, headers=admin)
        pages += page.json()
    assert pages == got
    r = c.get("/audit", params={"after": "soon"}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "after"]
    # an ordinary user reads none of it, whatever the filter
    for params in ({}, {"actor": "alice"}, {"kind": "token"}):
        r = c.get("/audit", params=params, headers=api.h(api.alice))
        assert r.status_code == 403 and r.json() == {"detail": "only an admin may read the audit trail"}
    # no secret anywhere: neither the new token nor the admin's, in the trail or the log lines
    out = json.dumps(got) + cap.buf.getvalue()
    assert made["token"] not in out and api.admin not in out and api.alice not in out
    audit_lines = [d for d in cap.lines() if d["logger"] == "gpuloom.audit"]
    assert [(d["actor"], d["event"], d.get("subject"), d.get("target")) for d in audit_lines] == [
        w for w in want if w[1] not in ("submit", "cancel")]


def test_the_trail_survives_a_restart_and_old_stores_get_the_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store = Store(url)
    jid = store.add_job({"command": "true", "gpus": 1}, "alice", "waiting_for_initial_contact", now=100.0)
    store.update_job(jid, {"state": "cancelled"}, "cancel", {"by": "admin"}, now=101.0)
    record(store, "admin", "queue.delete", None, "old", now=102.0)
    store.close()
    con = sqlite3.connect(tmp_path / "db.sqlite")  # a store from before the audit table
    con.execute("DROP TABLE audit")
    con.commit()
    con.close()
    store = Store(url)
    assert [(r["actor"], r["kind"], r["subject"]) for r in trail(store)] == [
        ("alice", "submit", "alice"), ("admin", "cancel", "alice")]
    record(store, "admin", "queue.delete", None, "old", now=103.0)
    store.close()
    store = Store(url)  # and what was recorded is there after a restart
    assert [(r["time"], r["actor"], r["kind"], r["target"]) for r in trail(store, since=101.5)] == [
        (103.0, "admin", "queue.delete", "old")]
    assert [r["kind"] for r in trail(store, actor=SCHEDULER)] == []
    with pytest.raises(ValueError, match="limit: 1 to 10000 records, got 0"):
        trail(store, limit=0)
    store.close()


def test_access_log_one_line_per_request_without_secrets(api: Api, tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    lines: list[list[str]] = []
    for fmt in ("text", "json"):
        path.unlink(missing_ok=True)
        handler = open_log(str(path), fmt)
        app = create_app(api.svc)
        enable(app, handler)
        try:
            with TestClient(app) as c:
                r1 = c.get("/jobs", params={"state": "running", "token": "SECRETX"}, headers=api.h(api.alice))
                c.get("/health")
                c.get("/jobs", headers=api.h("nope-secret"))
                c.delete(f"/tokens/{api.alice}", headers=api.h(api.admin))
                made = c.post("/tokens", json={"user": "bob"}, headers=api.h(api.admin)).json()["token"]
        finally:
            access_log.removeHandler(handler)
            handler.close()
        text = path.read_text()
        for secret in (api.admin, api.alice, made, "SECRETX", "nope-secret"):
            assert secret not in text
        if fmt == "json":
            recs = [json.loads(x) for x in text.splitlines()]
            assert [(r["client"], r["user"], r["method"], r["path"], r["status"]) for r in recs] == [
                (x[1], x[2], x[3], x[4], int(x[5])) for x in lines]
            assert sorted(recs[0]) == ["bytes", "client", "duration_s", "method", "path", "status", "time", "user"]
            assert recs[0]["bytes"] == len(r1.content) and 0 <= recs[0]["duration_s"] < 10
        else:
            lines = [x.split(" ") for x in text.splitlines()]
            assert [x[1:6] for x in lines] == [
                ["testclient", "alice", "GET", "/jobs?state&token", "200"],
                ["testclient", "-", "GET", "/health", "200"],
                ["testclient", "-", "GET", "/jobs", "401"],
                ["testclient", "admin", "DELETE", "/tokens/<redacted>", "404"],
                ["testclient", "admin", "POST", "/tokens", "201"]]
            assert all(len(x) == 8 and x[0].endswith("Z") for x in lines)
            assert int(lines[0][7]) == len(r1.content) and float(lines[0][6]) >= 0


def test_safe_path() -> None:
    assert safe_path("/tokens/0123456789ab", b"") == "/tokens/0123456789ab"  # an id is no secret
    assert safe_path("/tokens/" + "x" * 43, b"") == "/tokens/<redacted>"
    assert safe_path("/jobs", b"state=running&state=pending&token=abc") == "/jobs?state&token"
    assert safe_path("/jobs", b"a%20b=1") == "/jobs?a?20b"


def test_serve_access_log_is_written_once_not_by_uvicorn_too(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    srv = Server(sd, "--cluster", "1x2", "--log-level", "info", "--access-log", "-").start()
    try:
        with srv.client() as c:
            assert c.get("/jobs", params={"state": "running"}).status_code == 200
    finally:
        srv.stop()
        kill_jobs(sd)
    out = (sd / "serve.out").read_text()
    mine = [x for x in out.splitlines() if "/jobs" in x]
    assert len(mine) == 1 and mine[0].split(" ")[1:6] == ["127.0.0.1", "admin", "GET", "/jobs?state", "200"], mine
    assert srv.token not in out
    # (a process of its own: serve configures the root logger)
    bad = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--state-dir", str(tmp_path / "s2"), "--cluster",
                          "1x2", "--access-log", str(tmp_path / "no" / "such" / "dir" / "a.log")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--access-log" in bad.stderr and "No such file or directory" in bad.stderr
    assert not (tmp_path / "s2").exists()  # refused before anything started


def test_gpuloom_audit_lists_the_trail_for_an_admin_and_refuses_a_user(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    srv = Server(sd, "--cluster", "1x2").start()
    env = {"GPULOOM_STATE_DIR": str(sd), "GPULOOM_URL": srv.url}
    runner = CliRunner()
    try:
        with srv.client() as c:
            alice = c.post("/tokens", json={"user": "alice"}).json()["token"]
            jid = c.post("/jobs", json={"command": "true", "gpus": 1, "user": "alice"}).json()["id"]
        r = runner.invoke(cli_app, ["audit", "--since", "1h", "--json"], env=env)
        assert r.exit_code == 0, r.output
        recs = json.loads(r.output)
        assert [(x["actor"], x["kind"], x["subject"]) for x in recs][:2] == [("admin", "token.create", "alice"),
                                                                             ("admin", "submit", "alice")]
        assert recs[1]["job"] == jid
        table = runner.invoke(cli_app, ["audit", "--kind", "token"], env=env).output.splitlines()
        assert table[0].split() == ["TIME", "ACTOR", "KIND", "SUBJECT", "TARGET", "DETAIL"]
        assert table[1].split()[1:4] == ["admin", "token.create", "alice"] and len(table) == 2
        denied = runner.invoke(cli_app, ["audit", "--token", alice], env=env)
        assert denied.exit_code == 1 and "error (403): only an admin may read the audit trail" in denied.output
        bad = runner.invoke(cli_app, ["audit", "--since", "soon"], env=env)
        assert bad.exit_code == 2 and "--since" in bad.output
    finally:
        srv.stop()
        kill_jobs(sd)


def test_pages_of_records_at_one_time_hold_each_once(tmp_path: Path) -> None:
    from gpuloom.runtime.state.audit import parse_cursor

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ids = store.add_jobs([{"command": "true", "gpus": 1}] * 5, "alice", "waiting_for_initial_contact", now=50.0,
                         array_tasks=range(5))  # one array: five submit events at the same time
    record(store, "admin", "queue.set", None, "a", now=50.0)
    record(store, "admin", "queue.set", None, "b", now=50.0)
    want = [("queue.set", None), ("queue.set", None), *(("submit", j) for j in ids)]
    assert [(r["kind"], r["job"]) for r in trail(store)] == want
    got: list[dict[str, Any]] = []
    after = None
    while True:
        page = trail(store, limit=2, after=after)
        got += page
        if len(page) < 2:
            break
        after = parse_cursor(page[-1]["cursor"])
    assert [(r["kind"], r["job"]) for r in got] == want
    with pytest.raises(ValueError, match="after: a record's cursor"):
        parse_cursor("50.0:2:1")
    store.close()
