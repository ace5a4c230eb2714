"""The service with a long queue: what a round touches, the store's lock under submissions, and
``gpuloom queue`` over ten thousand jobs.  Behaviour only: the speeds are in ``benchmarks/bench_scale.py``.

* a round in which nothing changed reads one statement and touches no waiting job, however many
  wait; a round after a submission gives the new job its reason and leaves the others' as they were;
* the store's lock lets the scheduling loop's thread go before threads that waited longer, and a due
  round reads the store before eight waiting submissions; the loop sleeps no later than a round is due;
* ``GET /jobs?fields=`` and ``X-Total-Count``; ``gpuloom queue`` lays 10,000 jobs out as plain lines
  (exactly as Rich would lay the table out, minus the cost), and ``--json`` writes them all.
"""

from __future__ import annotations

import io
import json
import random
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import event

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.api.app import JOB_FIELDS, job_json
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import ACTIVE_STATES, Service
from gpuloom.runtime.state.store import JobRow, Store
from gpuloom.runtime.state.storelock import StoreLock
from gpuloom.scheduler import Scheduler
from service_util import Server, kill_jobs, wait_for


def _poll(cond, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


# -- rounds ----------------------------------------------------------------------------------------
def _series_write(sql: str) -> bool:
    """A statement of the time series' flush: its insert or prune, or the switch to a write not synced at once."""
    return "series" in sql.split() or sql.startswith("PRAGMA synchronous")


@pytest.mark.parametrize("waiting", [5, 60])
def test_a_round_in_which_nothing_changed_touches_no_waiting_job(tmp_path: Path, cgroup_parent: str,
                                                                 waiting: int) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 2)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0, launch_timeout_s=1.0, clock=clock))
    try:
        run = [svc.submit({"name": "r", "command": "sleep 60", "gpus": 1}, "alice") for _ in range(2)]
        svc.round()
        clock.advance(2.0)  # past the launch timeout: running_protected
        svc.round()
        clock.advance(100.0)  # past the protection: running
        svc.round()
        assert [store.get_job(j).state for j in run] == ["running", "running"]  # type: ignore[union-attr]
        first = svc.submit({"name": "p", "command": "sleep 60", "gpus": 1, "array": f"0-{waiting - 1}"}, "alice")
        pending = [str(first + k) for k in range(waiting)]
        svc.round()  # they make contact; the cluster is full
        assert {store.get_job(int(j)).pending_reason for j in pending} == {"Resources"}  # type: ignore[union-attr]
        seen = {j: svc.jobs[j].last_update for j in pending}
        svc.mark_time()  # the service time's mark (one write per MARK_S whatever waits) falls outside
        statements: list[str] = []
        # (the dashboard's time series is flushed every few samples, and pruned, whatever waits: left out)
        event.listen(store.engine, "before_cursor_execute",
                     lambda _c, _cur, sql, *_: None if _series_write(sql) else statements.append(sql.split()[0]))
        for _ in range(3):
            clock.advance(3.0)
            svc.round()
            # one statement (any new submission?), however many jobs wait; no job's reason is redone
            assert statements == ["SELECT"] and list(svc.driver.reasoned) == []
            statements.clear()
        assert {j: svc.jobs[j].last_update for j in pending} == seen  # no waiting job was advanced
        assert {svc.jobs[j].last_update for j in map(str, run)} == {svc.now()}  # the running ones were
        late = svc.submit({"name": "late", "command": "sleep 60", "gpus": 1}, "alice")
        svc.round()  # the new job alone gets its reason
        assert [j.id for j in svc.driver.reasoned] == [str(late)]
        assert store.get_job(late).pending_reason == "Resources"  # type: ignore[union-attr]
        # a running job ends: the first in the queue starts, every job's reason is given again
        svc.cancel(run[0], "alice", False)
        end = time.monotonic() + 20
        while store.get_job(first).state != "launching" and time.monotonic() < end:  # type: ignore[union-attr]
            clock.advance(1.0)
            svc.round()
            time.sleep(0.05)
        assert store.get_job(first).state == "launching"  # type: ignore[union-attr]
        assert len(svc.driver.reasoned) == waiting + 2
        assert {store.get_job(int(j)).pending_reason for j in pending[1:] + [str(late)]} == {"Resources"}  # type: ignore[union-attr]
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


# -- the store's lock ------------------------------------------------------------------------------
def test_the_store_lock_is_reentrant_and_only_its_holder_releases_it() -> None:
    lock = StoreLock()
    with lock, lock:
        assert lock.waiting() == (0, 0)
        errors: list[Exception] = []

        def other() -> None:
            try:
                lock.release()
            except RuntimeError as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1 and "does not hold" in str(errors[0])
    taken: list[int] = []
    t = threading.Thread(target=lambda: (lock.acquire(), taken.append(1), lock.release()))
    t.start()
    t.join(5)
    assert taken == [1]  # released by both exits above


def test_the_store_lock_excludes_and_every_thread_gets_it() -> None:
    lock = StoreLock()
    inside, most, done = [0], [0], []

    def work(first: bool) -> None:
        if first:
            lock.first()
        for _ in range(300):
            with lock, lock:  # (reentrant)
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(0)
                inside[0] -= 1
        done.append(first)

    threads = [threading.Thread(target=work, args=(k == 0,)) for k in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == [False] * 8 + [True] and most == [1] and lock.waiting() == (0, 0)


def test_the_loop_thread_goes_before_api_threads_that_waited_longer(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        counts: list[int] = []
        writers = [threading.Thread(target=store.add_job, args=({"command": "x", "gpus": 1}, "u", "standby"))
                   for _ in range(3)]

        def loop() -> None:
            store.lock.first()
            counts.append(store.count_jobs())

        reader = threading.Thread(target=loop)
        with store.lock:  # a commit in progress
            for t in writers:
                t.start()
            _poll(lambda: store.lock.waiting() == (0, 3), "three writers to wait")
            reader.start()
            _poll(lambda: store.lock.waiting() == (1, 3), "the loop's thread to wait")
        for t in [reader, *writers]:
            t.join(10)
        assert counts == [0]  # it read before any of the three writes that waited longer
        assert store.count_jobs() == 3
    finally:
        store.close()


def test_the_scheduling_loop_waits_for_the_store_as_the_first(tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=0.05))
    try:
        svc.start()
        with store.lock:  # the loop's next round waits for the store, counted as the first
            _poll(lambda: store.lock.waiting() == (1, 0), "the loop to wait")
    finally:
        svc.shutdown()
        store.close()


def test_a_due_round_reads_the_store_before_eight_waiting_submissions(tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=0.05))
    order: list[str] = []
    try:
        svc.start()
        subs = [threading.Thread(target=svc.submit, args=({"name": "s", "command": "sleep 60", "gpus": 1}, "u"))
                for _ in range(8)]
        with store.lock:  # a commit in progress: eight submissions and the loop queue behind it
            for t in subs:
                t.start()
            _poll(lambda: store.lock.waiting() == (1, 8), "eight submissions and the loop's round to wait")
            event.listen(store.engine, "before_cursor_execute",
                         lambda *_: order.append(threading.current_thread().name))
        for t in subs:
            t.join(30)
        _poll(lambda: store.count_jobs() == 8, "the eight jobs")
    finally:
        svc.shutdown()
        store.close()
    # the round's statement first, then the eight inserts (a round waits for one commit, not eight)
    assert order[0] == "gpuloom-scheduler" and len([n for n in order if n != "gpuloom-scheduler"]) >= 8


class _Waits(threading.Event):
    """The loop's wake-up event, recording how long each wait may last."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


def test_the_loop_sleeps_no_later_than_the_next_round_is_due(tmp_path: Path, cgroup_parent: str) -> None:
    """With a round every 0.25 s and a tick of 0.1 s, the loop that has 0.05 s left to the next round
    waits 0.05 s, not a whole tick (the round then came up to a tick late: 0.3-0.35 s apart)."""
    clock = ManualClock(1_700_000_000.0)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=0.25, clock=clock))
    waits = svc._wake = _Waits()
    try:
        svc.start()
        _poll(lambda: svc.rounds == 1 and len(waits.timeouts) > 2, "the first round")
        assert waits.timeouts[-1] == 0.1  # (the clock stands still: a tick at a time)
        clock.advance(0.2)
        _poll(lambda: waits.timeouts[-1] != 0.1, "a shorter wait")
        assert waits.timeouts[-1] == pytest.approx(0.05) and svc.rounds == 1
        clock.advance(0.05)
        _poll(lambda: svc.rounds == 2, "the round then due")
    finally:
        svc.shutdown()
        store.close()


# -- the queue command -------------------------------------------------------------------------------
def test_job_fields_name_every_field_of_a_job() -> None:
    from gpuloom.cli.jobs import ACTIVE

    assert tuple(job_json(JobRow(1, "n", "u", {}, "standby", 0.0))) == JOB_FIELDS
    assert ACTIVE == ACTIVE_STATES  # what `queue` lists, without loading the service


def test_plain_tables_are_laid_out_as_rich_lays_them_out() -> None:
    """The plain path writes what Rich wrote into a pipe (box=None), cell for cell: scripts that read
    ``gpuloom queue | ...`` see the same text."""
    from gpuloom.cli.common import PlainTable

    rng = random.Random(7)
    bits = ["a", "Z9", " ", "(x)", "[/]", "[bold]", "é", "日本", "😀", "\x1b[31m", "\x9b", "", "{0}", "%s"]
    for _ in range(200):
        cols = rng.randint(1, 5)
        t = PlainTable(*(rng.choice(["JOBID", "", "NODELIST(REASON)", "名前"]) for _ in range(cols)))
        for _ in range(rng.randint(0, 5)):
            t.add_row(*("".join(rng.choice(bits) for _ in range(rng.randint(0, 4))) for _ in range(cols)))
        out = io.StringIO()
        Console(file=out, width=4000, highlight=False, soft_wrap=False).print(t.rich())
        assert "\n".join(t.lines()) + "\n" == out.getvalue()


def test_a_table_on_a_terminal_is_rich_when_small_and_plain_when_long(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from gpuloom.cli import common

    term = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=term, force_terminal=True, width=30, color_system=None))
    small = common.PlainTable("ID", "REASON")
    small.add_row("1", "waiting for a node with eight free GPUs")
    common.print_table(small)
    assert capsys.readouterr().out == ""  # through Rich, fitted to the 30 columns
    assert max(len(line) for line in term.getvalue().splitlines()) <= 30
    long = common.PlainTable("ID", "REASON")
    for i in range(common.RICH_ROWS + 1):
        long.add_row(str(i), "waiting for a node with eight free GPUs")
    common.print_table(long)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == common.RICH_ROWS + 2
    assert lines[1] == " 0    waiting for a node with eight free GPUs "  # whole, not cut to the terminal


def test_a_plain_http_client_loads_no_certificates_and_could_verify_none() -> None:
    import ssl

    from gpuloom.runtime.api.connect import Endpoint, transport

    for ep in (Endpoint("http://127.0.0.1:1", None, frozenset({0}), 8642),
               Endpoint("unix:///run/x.sock", "/run/x.sock", frozenset({0}), 8642)):
        t, _ = transport(ep)
        ctx = t._pool._ssl_context
        # (never used for plain HTTP; were it ever, no certificate would pass)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.cert_store_stats() == {"x509": 0, "crl": 0, "x509_ca": 0}


def test_json_is_indented_as_before_and_escapes_what_a_terminal_would_obey(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuloom.cli.common import print_json

    job = {"id": 7, "name": "a\x1b[2Jb\x9bc\x7fé", "held_s": 1.5e-07, "nodes": [], "alloc": None}
    print_json([job])
    out = capsys.readouterr().out
    assert out == ('[\n  {\n    "id": 7,\n    "name": "a\\u001b[2Jb\\u009bc\\u007fé",\n    "held_s": 1.5e-7,\n'
                   '    "nodes": [],\n    "alloc": null\n  }\n]\n')
    assert json.loads(out) == [job]


def test_queue_lists_ten_thousand_jobs_as_plain_lines(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuloom.cli import app

    s = Server(tmp_path, "--cluster", "1x1", "--cpus-per-node", "2", "--round", "0.5",
               "--max-array-size", "1001").start()
    try:
        with s.client() as c:
            blocker = c.post("/jobs", json={"name": "blocker", "command": "sleep 600", "gpus": 1}).json()["id"]
            for k in range(10):
                r = c.post("/jobs", json={"name": f"p{k}", "command": "sleep 600", "gpus": 1, "array": "0-999"})
                assert r.status_code == 201, r.text
            wait_for(lambda: c.get(f"/jobs/{blocker + 10_000}").json()["pending_reason"] == "Resources",
                     what="the last task's reason", timeout=120)
            r = c.get("/jobs", params={"state": "waiting_for_initial_resource", "limit": 2, "fields": "id,st,array"})
            assert r.json() == [{"id": 2, "st": "PD", "array": "2_0"}, {"id": 3, "st": "PD", "array": "2_1"}]
            assert (r.headers["X-Next-After"], r.headers["X-Total-Count"]) == ("3", "10000")
            bob = c.post("/tokens", json={"user": "bob"}).json()["token"]  # another user sees no command
            r = c.get("/jobs", params={"limit": 1, "fields": "id,user,command"}, headers={"Authorization": f"Bearer {bob}"})
            assert r.json() == [{"id": 1, "user": "admin", "command": None}]
            for bad in ("id,secret", "id,,st", "<b>"):
                r = c.get("/jobs", params={"fields": bad})
                assert r.status_code == 422 and "of the list is no field of a job" in r.text
                assert "secret" not in r.text and "<b>" not in r.text  # (an error never echoes its input)
        runner = CliRunner()
        res = runner.invoke(app, ["queue", "--array", "--state", "PD", "--state-dir", str(tmp_path)])
        assert res.exit_code == 0, res.output
        lines = res.output.splitlines()
        assert len(lines) == 10_001
        # every column as wide as its widest cell (job 10001, task 9002_999, name p9), two spaces apart
        assert lines[:3] == [
            " JOBID  ARRAY     NAME  USER   QUEUE  ST  TIME  GPUS  ITER  NODELIST(REASON) ",
            " 2      2_0       p0    admin  -      PD  0:00  1     -     (Resources)      ",
            " 3      2_1       p0    admin  -      PD  0:00  1     -     (Resources)      ",
        ]
        assert lines[-1] == " 10001  9002_999  p9    admin  -      PD  0:00  1     -     (Resources)      "
        res = runner.invoke(app, ["queue", "--json", "--state-dir", str(tmp_path)])
        jobs = json.loads(res.output)
        assert [j["id"] for j in jobs] == list(range(1, 10_002)) and jobs[0]["command"] == "sleep 600"
        assert res.output.startswith('[\n  {\n    "id": 1,\n    "name": "blocker",\n')
    finally:
        s.stop()
        kill_jobs(tmp_path)
