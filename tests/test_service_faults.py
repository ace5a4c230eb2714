"""Faults of what the service stands on: its database stopped and restarted, its state disk full, a second
server after a database restart, a restart with a job's end unrecorded and the disk still full.

Each scenario ends with 0 lost (every acknowledged job is there), 0 stuck (every job reaches a final state),
every job run to its end exactly once (a ledger line per job), 0 GPU overlaps in the allocation records and
``/cluster`` matching the jobs that hold GPUs; the scenarios print their time to recover.  The in-process
tests stop PostgreSQL at chosen points of a round: what is observed meanwhile is recorded once it is back,
and nothing is started or preempted on a store that cannot record it.

PostgreSQL is a throw-away server per test (``initdb``/``pg_ctl``, on a Unix socket only); those tests skip
without its binaries or ``psycopg``.  The full-disk tests mount a small tmpfs and need root.
"""

from __future__ import annotations

import gc
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.lifecycle import JobState
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.health import liveness, readiness
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.locks import AlreadyServed, ServerLocks
from gpuloom.runtime.state.store import JobRow, Store, unavailable
from gpuloom.scheduler import Scheduler
from service_util import REPO, Server, fill, job, job_writable, kill_jobs, running, wait_for

S = JobState
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
# on PATH, or where Debian's postgresql packages put them
_PG_BIN = next((str(Path(p).parent) for p in [shutil.which("initdb") or "",
                                              *sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)]
                if p and os.access(p, os.X_OK) and os.access(Path(p).parent / "pg_ctl", os.X_OK)), None)


class Postgres:
    """A throw-away PostgreSQL server on a Unix socket in a directory of its own, stopped and started at will."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpuloom-pg-"))  # not under pytest's (private) tmp root
        if ROOT:
            shutil.chown(self.dir, "postgres")
            os.chmod(self.dir, 0o755)
        self.data = self.dir / "data"
        self.url = f"postgresql+psycopg://gpuloom@/postgres?host={self.dir}"
        r = self._run(f"{_PG_BIN}/initdb -D {self.data} -A trust -U gpuloom")
        if r.returncode != 0:
            pytest.skip(f"initdb failed: {r.stderr[-300:]}")

    def _run(self, cmd: str) -> subprocess.CompletedProcess[str]:
        argv = ["su", "postgres", "-s", "/bin/sh", "-c", cmd] if ROOT else ["/bin/sh", "-c", cmd]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def start(self) -> float:
        """Start the server and wait until it accepts connections; the monotonic time it did."""
        r = self._run(f"{_PG_BIN}/pg_ctl -D {self.data} -w -o \"-k {self.dir} -c listen_addresses=''\" "
                      f"-l {self.dir}/log start")
        assert r.returncode == 0, r.stderr[-500:]
        return time.monotonic()

    def stop(self) -> None:
        r = self._run(f"{_PG_BIN}/pg_ctl -D {self.data} -m fast -w stop")
        assert r.returncode == 0, r.stderr[-500:]

    def close(self) -> None:
        self._run(f"{_PG_BIN}/pg_ctl -D {self.data} -m immediate -w stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def pg() -> Iterator[Postgres]:
    pytest.importorskip("psycopg")
    if _PG_BIN is None:
        pytest.skip("PostgreSQL server binaries not installed")
    if ROOT:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run the server")
    server = Postgres()
    server.start()
    try:
        yield server
    finally:
        server.close()


# -- checks every scenario ends with ----------------------------------------------------------------------

def overlaps(store: Store) -> list[tuple[int, int, str]]:
    """Pairs of allocation records that held one GPU at once: (job, job, node:gpu)."""
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for a in store.allocations():
        end = a["end_time"] if a["end_time"] is not None else float("inf")
        for p in a["alloc"]["parts"]:
            for g in p.get("local_gpus", p.get("gpus", [])):
                spans.setdefault(f"{p['node']}:{g}", []).append((a["start_time"], end, a["job_id"]))
    out = []
    for gpu, ss in spans.items():
        ss.sort()
        end, holder = float("-inf"), -1  # the latest end so far, and whose
        for start, stop, jid in ss:
            if start < end:
                out.append((holder, jid, gpu))
            if stop > end:
                end, holder = stop, jid
    return out


def held_gpus(rows: list[JobRow]) -> dict[str, set[int]]:
    """Per node: the node-local GPUs the stored jobs in a holding state hold."""
    out: dict[str, set[int]] = {}
    for r in rows:
        for p in (r.alloc or {}).get("parts", []):
            out.setdefault(p["node"], set()).update(p.get("local_gpus", p.get("gpus", [])))
    return out


def cluster_matches_store(c: httpx.Client, store: Store) -> bool:
    """Whether ``/cluster`` shows allocated exactly the GPUs the store's holding jobs hold (read twice around
    the store, so a round between the reads cannot make a match out of two different moments)."""
    from gpuloom.runtime.service.service import HOLDING

    def shown() -> dict[str, set[int]]:
        nodes = c.get("/cluster").json()["nodes"]
        return {n["name"]: {s["gpu"] for s in n["slots"] if s["jobs"]} for n in nodes if any(s["jobs"] for s in n["slots"])}

    before = shown()
    stored = held_gpus(store.list_jobs(HOLDING))
    return before == stored == shown()


def ledger_counts(path: Path) -> dict[int, int]:
    """How many times each job ran to its end (the line each appends as its last act)."""
    out: dict[int, int] = {}
    if path.exists():
        for line in path.read_text().split():
            out[int(line)] = out.get(int(line), 0) + 1
    return out


def final_check(store: Store, acked: set[int], ledger: Path) -> dict[str, Any]:
    """The scenario's end: every acknowledged job present and finished, each run to its end once, no overlap."""
    from gpuloom.runtime.service.service import FINAL_STATES

    rows = {r.id: r for r in store.list_jobs()}
    lost = sorted(acked - set(rows))
    stuck = sorted(j for j in acked if j in rows and rows[j].state not in FINAL_STATES)
    not_finished = {j: (rows[j].state, rows[j].reason) for j in acked if j in rows and rows[j].state != "finished"}
    counts = ledger_counts(ledger)
    ran = {j: counts.get(j, 0) for j in acked if counts.get(j, 0) != 1}
    assert (lost, stuck, not_finished, ran, overlaps(store)) == ([], [], {}, {}, [])
    return {"jobs": len(acked), "launches": sum(rows[j].attempts for j in acked)}


# -- a workload that keeps arriving -------------------------------------------------------------------------

class Arrivals:
    """Submits a short job every ``gap`` seconds from a thread (each appends its id to ``ledger`` as its last
    act, after running ``first``), retrying a refused or failed submission with the same idempotency key until
    it is acknowledged."""

    def __init__(self, url: str, token: str, ledger: Path, gap: float = 0.25, seed: int = 0, first: str = "") -> None:
        self.url, self.token, self.ledger, self.gap, self.first = url, token, ledger, gap, first
        self.rng = random.Random(seed)
        self.acked: set[int] = set()
        self.refused = 0  # answers other than 200/201 (503 while the store is down or full)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Arrivals:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10) as c:
            while not self._stop.is_set():
                body = {"command": f"{self.first}sleep {self.rng.uniform(0.3, 2.0):.2f}; echo $GPULOOM_JOB_ID >> {self.ledger}",
                        "gpus": self.rng.choice([1, 1, 2])}
                key = uuid.uuid4().hex
                while True:
                    try:
                        r = c.post("/jobs", json=body, headers={"Idempotency-Key": key})
                    except httpx.HTTPError:
                        r = None
                    if r is not None and r.status_code in (200, 201):
                        self.acked.add(int(r.json()["id"]))
                        break
                    if r is not None and r.status_code != 503:
                        self.errors.append(f"{r.status_code}: {r.text[:200]}")
                    self.refused += 1
                    time.sleep(0.2)
                self._stop.wait(self.gap)


def ready(c: httpx.Client) -> tuple[int, dict[str, Any]]:
    r = c.get("/ready")
    return r.status_code, r.json()


# -- in process: the store fails at a chosen point ------------------------------------------------------------

def service(store: Store, cl: Cluster, tmp_path: Path, cgroup_parent: str, **kw: Any) -> Service:
    sched = kw.pop("scheduler", None) or Scheduler.from_names()
    return Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), sched, ServiceConfig(tmp_path,
                   round_s=1000.0, grace_s=2.0, **kw))


def round_despite(svc: Service) -> None:
    """A round, which may fail on the store's state (and on nothing else)."""
    try:
        svc.round()
    except Exception as e:
        assert unavailable(e), e


def test_an_exit_while_the_database_is_down_is_recorded_when_it_is_back_and_nothing_starts_before(
        pg: Postgres, tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(pg.url)
    svc = service(store, Cluster.homogeneous(1, 1), tmp_path, cgroup_parent)
    go = job_writable(tmp_path)
    try:
        a = svc.submit({"command": f"while [ ! -e {go}/a ]; do sleep 0.02; done", "gpus": 1}, "alice")
        b = svc.submit({"command": "true", "gpus": 1}, "alice")
        svc.round()
        assert list(svc.running) == [str(a)] and str(b) in svc.jobs
        pg.stop()
        (go / "a").touch()
        wait_for(lambda: (round_despite(svc), str(a) not in svc.jobs)[1], what="a's exit to be observed")
        ended = time.time()
        # its end waits, in memory; its GPU is free there, and still nothing starts on it
        assert svc.outbox.jobs() == {a} and svc.current == {} and list(svc.running) == []
        for _ in range(3):
            round_despite(svc)
        assert list(svc.running) == [] and str(b) in svc.jobs
        assert liveness(svc)["status"] == "ok" and liveness(svc)["unrecorded"] == len(svc.outbox) > 0
        ok, body = readiness(svc)
        assert not ok and body["checks"]["store"].startswith("unreachable: OperationalError")
        time.sleep(0.3)
        pg.start()
        svc.round()  # what waited is recorded, then the round acts
        assert len(svc.outbox) == 0 and list(svc.running) == [str(b)]
        row = store.get_job(a)
        assert row is not None and (row.state, row.exit_code, row.attempts) == ("finished", 0, 1)
        (rec_a,) = store.allocations([a])
        (rec_b,) = store.allocations([b])
        # a's GPU was given up when it exited (the record keeps that time), before b took it
        assert rec_a["end_time"] <= ended < rec_b["start_time"] and rec_a["closed_by"] == "finished"
        wait_for(lambda: (svc.round(), store.get_job(b).state == "finished")[1],  # type: ignore[union-attr]
                 what="b to finish")
        assert overlaps(store) == []
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def test_a_launch_the_store_refuses_is_rolled_back_not_failed(pg: Postgres, tmp_path: Path,
                                                               cgroup_parent: str) -> None:
    """The plan is applied only as far as the store takes it: a launch whose intent it refuses leaves the
    job queued, holding nothing, no process started (it used to fail the job, or leave its GPUs reserved)."""
    store = Store(pg.url)
    svc = service(store, Cluster.homogeneous(1, 2), tmp_path, cgroup_parent)
    ledger = job_writable(tmp_path) / "ledger"
    try:
        ids = [svc.submit({"command": f"echo $GPULOOM_JOB_ID >> {ledger}", "gpus": 1}, "alice") for _ in range(2)]
        svc.observe()
        pg.stop()
        actions = svc.act()  # (called without may_act: the store goes down between the two)
        assert [a.kind.value for a in actions] == ["start", "start"]
        assert svc.running == {} and svc.current == {} and svc.driver.used == [0, 0, 0]
        for j in ids:
            lc = svc.jobs[str(j)].lifecycle
            assert lc is not None and lc.state is S.WAITING_FOR_INITIAL_RESOURCE
        pg.start()
        wait_for(lambda: (svc.round(), all(store.get_job(j).state == "finished" for j in ids))[1],  # type: ignore[union-attr]
                 what="both jobs to finish")
        assert [store.get_job(j).attempts for j in ids] == [1, 1]  # type: ignore[union-attr]
        assert ledger_counts(ledger) == {ids[0]: 1, ids[1]: 1} and overlaps(store) == []
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def test_a_resize_the_store_refuses_is_not_applied(pg: Postgres, tmp_path: Path, cgroup_parent: str) -> None:
    """A round that would stop a job (here to shrink it for a newcomer) stores the stop before it applies
    anything: refused, the job keeps its GPUs and runs on, in memory as in the store.  (The driver used to
    release its GPUs first and then fail on the stop's record, the process running on GPUs it had given up.)"""
    store = Store(pg.url)
    svc = service(store, Cluster.homogeneous(1, 4), tmp_path, cgroup_parent,
                  scheduler=Scheduler.from_names(size="elastic"), launch_timeout_s=0.0)
    go = job_writable(tmp_path)
    curve = [1.0, 2.0, 3.0, 4.0]
    try:
        a = svc.submit({"command": f"while [ ! -e {go}/a ]; do sleep 0.02; done", "gpus": 1, "throughput": curve},
                       "alice")
        # promoted at the next round (no progress lines: at once), then protected for 3x its launch time
        wait_for(lambda: (svc.round(), svc.jobs[str(a)].lifecycle.state is S.RUNNING)[1],  # type: ignore[union-attr]
                 what="a out of its protection")
        assert svc.current[str(a)].num_gpus == 4
        pid = svc.running[str(a)].procs[str(a)].pid
        b = svc.submit({"command": f"while [ ! -e {go}/b ]; do sleep 0.02; done", "gpus": 1, "throughput": curve},
                       "alice")
        svc.observe()
        pg.stop()
        with pytest.raises(Exception) as e:
            svc.act()  # a resize of a (stop, relaunch on 2 GPUs) and a start of b: the stop's record is refused
        assert unavailable(e.value)
        assert list(svc.current) == [str(a)] and svc.current[str(a)].num_gpus == 4 and svc.driver.used[0] == 4
        assert list(svc.running) == [str(a)] and running(pid)
        lc = svc.jobs[str(a)].lifecycle
        assert lc is not None and lc.state is S.RUNNING
        pg.start()
        svc.round()  # resized now, recorded, and b started
        assert {j: al.num_gpus for j, al in svc.current.items()} == {str(a): 2, str(b): 2} and not running(pid)
        row = store.get_job(a)
        assert row is not None and (row.state, row.attempts) == ("launching", 2)
        (go / "a").touch()
        (go / "b").touch()
        wait_for(lambda: (svc.round(), all(store.get_job(j).state == "finished" for j in (a, b)))[1],  # type: ignore[union-attr]
                 what="both jobs to finish")
        assert overlaps(store) == []
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def test_the_database_lock_is_taken_again_after_a_restart_or_given_up(pg: Postgres, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    s1, s2 = Store(pg.url), Store(pg.url)
    first = ServerLocks().acquire(tmp_path / "a", s1)
    try:
        first.check()  # held: nothing to do
        pg.stop()
        with pytest.raises(Exception) as e:
            first.check()
        assert unavailable(e.value)
        pg.start()
        first.check()  # its session was lost with the restart: taken again on a new one
        with pytest.raises(AlreadyServed):
            ServerLocks().acquire(tmp_path / "b", s2)
        pg.stop()
        pg.start()
        second = ServerLocks().acquire(tmp_path / "b", s2)  # first lost it with the restart, and has not checked
        with pytest.raises(AlreadyServed, match="another gpuloom server took the database .* while this one's "
                                                 "session was lost"):
            first.check()
        second.release()
    finally:
        first.release()
        s1.close()
        s2.close()


# -- health: liveness, readiness, systemd's watchdog -----------------------------------------------------------

def test_ready_names_what_fails(tmp_path: Path, cgroup_parent: str) -> None:
    from fastapi.testclient import TestClient

    from gpuloom.runtime.api.app import create_app
    from gpuloom.runtime.exec.clock import ManualClock

    clock = ManualClock()
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = service(store, Cluster.homogeneous(1, 2), tmp_path, cgroup_parent, clock=clock)
    try:
        with TestClient(create_app(svc)) as c:
            r = c.get("/ready")
            assert r.status_code == 503 and r.json()["checks"] == {"store": "ok", "lock": "ok",
                                                                   "rounds": "not started"}
            svc.round()
            r = c.get("/ready")
            assert r.status_code == 200 and r.json() == {"status": "ready", "rounds": 1, "unrecorded": 0,
                                                         "checks": {"store": "ok", "lock": "ok", "rounds": "ok"}}
            clock.advance(3001.0)  # three rounds' time (round_s = 1000) without one
            assert c.get("/ready").json()["checks"]["rounds"] == "no round completed for 3001 s"
            h = c.get("/health")  # (200 while the database is down: the scenarios below)
            assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["rounds"] == 1
    finally:
        svc.shutdown()
        store.close()


def test_watchdog_pings_while_the_loop_goes_round_not_while_it_is_stuck(tmp_path: Path,
                                                                      cgroup_parent: str) -> None:
    from gpuloom.runtime.service.health import Watchdog

    w = Watchdog.from_env({"NOTIFY_SOCKET": "@gpuloom-test", "WATCHDOG_USEC": "2000000"})
    assert (w.address, w.every) == ("\0gpuloom-test", 1.0)
    assert Watchdog.from_env({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).every \
        is None  # another process's watchdog
    sock = tmp_path / "notify"
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = service(store, Cluster.homogeneous(1, 2), tmp_path, cgroup_parent)
    svc.round_s = 0.2
    svc.watchdog = Watchdog(str(sock), 0.2)  # a ping every 0.1 s
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sk:
        sk.bind(str(sock))
        sk.setblocking(False)

        def pings(seconds: float) -> int:
            time.sleep(seconds)
            n = 0
            while True:
                try:
                    assert sk.recv(64) == b"WATCHDOG=1"
                except BlockingIOError:
                    return n
                n += 1

        try:
            svc.start()
            assert pings(1.0) >= 5
            with svc.lock:  # the loop cannot go round: no ping (one may have left before it stopped)
                pings(0.2)
                assert pings(1.0) == 0
            assert pings(1.0) >= 5
        finally:
            svc.shutdown()
            store.close()


# -- /metrics beside the loop ---------------------------------------------------------------------------------

def test_metrics_never_iterate_the_loops_dicts_live(tmp_path: Path, cgroup_parent: str) -> None:
    """The loop changes the mirror's rows while ``/metrics`` reads them (another thread, which can run whenever
    the garbage collector does).  Here every collection inserts into the rows: iterating them live (as
    ``list(rows.items())`` did) raised "dictionary changed size during iteration"."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = service(store, Cluster.homogeneous(1, 2), tmp_path, cgroup_parent)
    try:
        for _ in range(50):
            svc.submit({"command": "true", "gpus": 1}, "alice")
        svc.observe()  # mirrored, queued (no round acts here)
        rows = svc.mirror.rows
        assert len(rows) == 50
        extra = iter(range(10_000, 20_000))

        def meddle(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                k = str(next(extra))
                rows[k] = rows["1"]  # a row appears, as one does when the loop mirrors a new job
                del rows[k]
                rows[str(next(extra))] = rows["1"]

        threshold = gc.get_threshold()
        gc.callbacks.append(meddle)
        gc.set_threshold(1)  # a collection at every allocation of a tracked object
        try:
            text = svc.telemetry.metrics_text().decode()
        finally:
            gc.set_threshold(*threshold)
            gc.callbacks.remove(meddle)
        assert 'gpuloom_queue_jobs{queue="",st="PD"} 50.0' in text
        assert 'gpuloom_ready{check="store"} 1.0' in text and "gpuloom_unrecorded_changes 0.0" in text
    finally:
        svc.shutdown()
        store.close()


# -- a real server: the scenarios ---------------------------------------------------------------------------

def serve_args(*more: str) -> tuple[str, ...]:
    return ("--cluster", "2x2", "--round", "0.2", "--grace", "2", *more)


def settle(c: httpx.Client, store: Store, arrivals: Arrivals, ledger: Path) -> None:
    """After the fault: nothing left to record, the cluster as the store has it; arrivals go on 3 s more,
    then every job acknowledged ends, and the cluster still matches the store."""
    assert c.get("/health").json()["unrecorded"] == 0
    wait_for(lambda: cluster_matches_store(c, store), timeout=10, what="/cluster to match the store")
    time.sleep(3.0)  # arrivals go on
    arrivals.stop()
    wait_for(lambda: all(j in ledger_counts(ledger) for j in arrivals.acked), timeout=90, what="every job to end")
    time.sleep(0.5)
    assert cluster_matches_store(c, store)


def test_postgres_stopped_for_20_s_and_restarted_mid_run(pg: Postgres, tmp_path: Path) -> None:
    ledger = job_writable(tmp_path) / "ledger"
    s = Server(tmp_path, *serve_args("--db", pg.url)).start()
    store = Store(pg.url)
    arrivals = Arrivals(s.url, s.token, ledger).start()
    try:
        with s.client() as c:
            wait_for(lambda: len(arrivals.acked) >= 8, what="jobs to arrive")
            wait_for(lambda: len(ledger_counts(ledger)) >= 2, what="jobs to end")
            # a job that runs until the test lets it end, once the database is down: the others, of 0.3-2 s, can
            # all end while pg_ctl stops it under load, and none starts before it is back
            started, go = job_writable(tmp_path) / "started", job_writable(tmp_path) / "go"
            r = c.post("/jobs", json={"command": f"touch {started}; until [ -e {go} ]; do sleep 0.05; done; "
                                                 f"echo $GPULOOM_JOB_ID >> {ledger}", "gpus": 1})
            assert r.status_code == 201, r.text
            held = int(r.json()["id"])
            # started, and its launch recorded (pids stored): a launch whose record the stopping database refuses
            # is undone (its process stopped, the job queued) and, with nothing started meanwhile, waits for it
            wait_for(lambda: started.exists() and launched(job(c, held)), timeout=60,
                     what="the held job to start and its launch to be recorded")
            pg.stop()
            t_stop = time.monotonic()
            wait_for(lambda: ready(c)[0] == 503, what="/ready to say so")
            code, body = ready(c)
            assert body["checks"]["store"].startswith("unreachable: ")
            h = c.get("/health")
            assert h.status_code == 200 and h.json()["status"] == "ok"  # alive, if not ready
            assert c.get("/jobs").status_code == 503 and c.get("/metrics").status_code == 503
            go.touch()
            wait_for(lambda: held in ledger_counts(ledger), what="a job to end while the database is down")
            wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, what="an end waiting to be recorded")
            time.sleep(max(0.0, 20.0 - (time.monotonic() - t_stop)))
            t_start = pg.start()
            wait_for(lambda: ready(c)[0] == 200, timeout=60, what="/ready after the restart")
            recovered = time.monotonic() - t_start
            assert "gpuloom_unrecorded_changes 0.0" in c.get("/metrics").text
            settle(c, store, arrivals, ledger)
        assert arrivals.errors == []
        out = final_check(store, arrivals.acked, ledger)
        row = store.get_job(held)  # launched once, ran through the outage to its end, once
        assert row is not None and (row.state, row.attempts, ledger_counts(ledger)[held]) == ("finished", 1, 1)
        print(f"\nPostgreSQL down {t_start - t_stop:.1f} s: {out['jobs']} jobs, {out['launches']} launches, "
              f"{arrivals.refused} submissions refused meanwhile (503, retried); ready again {recovered:.2f} s "
              "after it restarted; 0 lost, 0 stuck, 0 overlaps")
    finally:
        arrivals.stop()
        s.stop()
        store.close()
        kill_jobs(tmp_path)


@needs_root
def test_state_disk_filled_and_freed_mid_run(tmp_path: Path, tmpfs: Callable[[str, str], Path]) -> None:
    state = tmpfs("state", "48m")
    ledger = job_writable(tmp_path) / "ledger"
    s = Server(state, *serve_args()).start()
    store = Store(f"sqlite:///{state / 'gpuloom.db'}")
    arrivals = Arrivals(s.url, s.token, ledger).start()
    try:
        with s.client() as c:
            wait_for(lambda: len(arrivals.acked) >= 8, what="jobs to arrive")
            wait_for(lambda: len(ledger_counts(ledger)) >= 2, what="jobs to end")
            filler = fill(state)
            t_full = time.monotonic()
            ended = len(ledger_counts(ledger))
            code, body = ready(c)
            assert code == 503 and body["checks"]["store"].startswith("full: the state disk is full: ")
            assert c.get("/health").status_code == 200
            wait_for(lambda: len(ledger_counts(ledger)) > ended, what="a job to end on the full disk")
            wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, what="an end waiting to be recorded")
            time.sleep(max(0.0, 5.0 - (time.monotonic() - t_full)))
            filler.unlink()
            t_free = time.monotonic()
            wait_for(lambda: ready(c)[0] == 200, timeout=60, what="/ready once space is freed")
            recovered = time.monotonic() - t_free
            settle(c, store, arrivals, ledger)
        assert arrivals.errors == []
        out = final_check(store, arrivals.acked, ledger)
        print(f"\nstate disk full {t_free - t_full:.1f} s: {out['jobs']} jobs, {out['launches']} launches, "
              f"{arrivals.refused} submissions refused meanwhile (503, retried); ready again {recovered:.2f} s "
              "after space was freed; 0 lost, 0 stuck, 0 overlaps")
    finally:
        arrivals.stop()
        s.stop()
        store.close()
        kill_jobs(state)


def free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def serve_on(state: Path, port: int, out: Path, *args: str) -> subprocess.Popen[bytes]:
    """``gpuloom serve`` on a given port, found without its ``server.json`` (which a full disk cannot take)."""
    with open(out, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuloom", "serve", "--port", str(port), "--state-dir",
                                 str(state), "--log-level", "warning", *args],
                                env=dict(os.environ, PYTHONPATH=str(REPO / "src")), stdout=f,
                                stderr=subprocess.STDOUT, cwd=REPO)

    def up() -> bool:
        assert proc.poll() is None, out.read_text()[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=120, what="the server to answer")  # (its start takes many seconds under load)
    return proc


@needs_root
def test_a_restart_with_an_end_unrecorded_and_the_disk_still_full_runs_no_job_again(
        tmp_path: Path, tmpfs: Callable[[str, str], Path]) -> None:
    """The job ends on a full disk (its exit record, made at its launch, is written in place), the server is
    killed before it could record that, and starts again on the still full disk: recovery reads the exit
    record and the job ends, once, when the disk has room; it is never launched again."""
    state = tmpfs("state", "48m")
    go = job_writable(tmp_path)
    port = free_port()
    args = ("--cluster", "1x2", "--round", "0.2")
    out = tmp_path / "serve.out"
    proc = serve_on(state, port, out, *args)
    token = (state / "admin.token").read_text().strip()
    c = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    try:
        r = c.post("/jobs", json={"command": f"echo started; while [ ! -e {go}/a ]; do sleep 0.05; done", "gpus": 1})
        assert r.status_code == 201
        a = int(r.json()["id"])
        # started, and its launch recorded (pids stored): the process runs before its launch is recorded, and a
        # launch whose record the full disk refuses is undone
        wait_for(lambda: "started" in c.get(f"/jobs/{a}/logs").text and launched(c.get(f"/jobs/{a}").json()),
                 what="the job to start and its launch to be recorded")
        pid = c.get(f"/jobs/{a}").json()["procs"][0]["pid"]
        filler = fill(state)
        (go / "a").touch()
        wait_for(lambda: not running(pid), what="the job's process to end")
        wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, what="its end waiting to be recorded")
        proc.kill()  # the server dies with the end unrecorded
        proc.wait()
        c.close()
        assert Store(f"sqlite:///{state / 'gpuloom.db'}").get_job(a).state == "launching"  # type: ignore[union-attr]
        proc = serve_on(state, port, out, *args)  # on the full disk
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                         timeout=10)
        wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, what="recovery's verdict waiting")
        code, body = ready(c)
        assert code == 503 and body["checks"]["store"].startswith("full: ")
        time.sleep(1.0)  # rounds on the full disk: nothing launched
        assert c.get(f"/jobs/{a}").json()["state"] == "launching"
        filler.unlink()
        t_free = time.monotonic()
        done = wait_for(lambda: (j := c.get(f"/jobs/{a}").json())["state"] == "finished" and j,
                        what="the end to be recorded")
        recorded = time.monotonic() - t_free
        time.sleep(1.0)  # rounds after: nothing to rerun
        j = c.get(f"/jobs/{a}").json()
        assert (j["state"], j["attempts"], j["exit_code"]) == ("finished", 1, 0) and done["attempts"] == 1
        events = [e["kind"] for e in c.get(f"/jobs/{a}/events").json()]
        assert [k for k in events if k in ("launch", "finished", "requeue", "adopt")] == ["launch", "finished"]
        assert c.get(f"/jobs/{a}/logs").text.count("started") == 1  # launched once, exactly
        store = Store(f"sqlite:///{state / 'gpuloom.db'}")
        assert overlaps(store) == [] and store.allocations([a])[0]["end_time"] is not None
        store.close()
        print(f"\nrestart on a full disk with an end unrecorded: recorded {recorded:.2f} s after space was freed; "
              "launched once")
    finally:
        c.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        kill_jobs(state)


@needs_root
def test_a_server_started_on_a_full_disk_waits_for_room_and_keeps_the_stored_queues(
        tmp_path: Path, tmpfs: Callable[[str, str], Path]) -> None:
    """A server stopped cleanly (SQLite's WAL gone with it), the state disk then filled: a new server cannot
    open the database (no room for its WAL) nor write its epoch.  It waits, saying why, instead of exiting;
    once there is room it starts with the tree and policy it had stored, and runs jobs."""
    state = tmpfs("state", "16m")
    tree = tmp_path / "q.toml"
    tree.write_text('default = "small"\n[[queue]]\nname = "small"\nguarantee = 2\n')
    args = ("--cluster", "1x2", "--round", "0.2")
    first = Server(state, *args, "--queues", str(tree), "--queue-policy", "drf").start()
    with first.client() as c:
        a = c.post("/jobs", json={"command": "true", "gpus": 1}).json()["id"]
    wait_for(lambda: first.client().get(f"/jobs/{a}").json()["state"] == "finished", what="the first job's end")
    first.stop()
    store = Store(f"sqlite:///{state / 'gpuloom.db'}")
    with store.engine.connect() as conn:  # the WAL emptied: a new server's first write must grow it
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    token = (state / "admin.token").read_text().strip()
    filler = fill(state)
    port = free_port()
    out = tmp_path / "serve.out"
    with open(out, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuloom", "serve", "--port", str(port), "--state-dir",
                                 str(state), "--log-level", "warning", *args],
                                env=dict(os.environ, PYTHONPATH=str(REPO / "src")), stdout=f,
                                stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for(lambda: proc.poll() is not None or "the state disk is full: waiting for room" in out.read_text(),
                 timeout=120, what="the server to say it waits")
        assert proc.poll() is None, out.read_text()[-3000:]  # waiting, not exited
        filler.unlink()
        t_free = time.monotonic()
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                         timeout=10)

        def up() -> bool:
            assert proc.poll() is None, out.read_text()[-3000:]
            try:
                return c.get("/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, what="the server to answer once there is room")
        started = time.monotonic() - t_free
        q = c.get("/queues").json()
        assert q["policy"] == "drf" and [x["name"] for x in q["queues"]] == ["small"]
        assert c.get(f"/jobs/{a}").json()["state"] == "finished"
        b = c.post("/jobs", json={"command": "true", "gpus": 1}).json()["id"]
        wait_for(lambda: c.get(f"/jobs/{b}").json()["state"] == "finished", what="a new job's end")
        c.close()
        print(f"\nstarted on a full disk: up {started:.2f} s after space was freed")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        kill_jobs(state)


def test_open_served_waits_only_while_the_disk_is_full(tmp_path: Path) -> None:
    from gpuloom.runtime.state.locks import open_served

    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    tries: list[int] = []

    def opener(u: str) -> Store:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("database or disk is full")  # (what SQLite says, as a store's error would)
        return Store(u)

    store, locks = open_served(url, tmp_path, opener, retry_s=0.01)
    try:
        assert len(tries) == 3 and store.fence == 1
        with pytest.raises(AlreadyServed):  # another server: at once, not waited for
            open_served(url, tmp_path, Store, retry_s=0.01)
    finally:
        locks.release()
        store.close()
    tries.clear()

    def broken(u: str) -> Store:
        tries.append(1)
        raise RuntimeError("no such database driver")

    with pytest.raises(RuntimeError, match="no such database driver"):  # any other error: at once
        open_served(url, tmp_path, broken, retry_s=0.01)
    assert len(tries) == 1


def kill_stored_jobs(store: Store) -> None:
    """Kill the job processes a store still records (clean-up when a scenario fails half way)."""
    import psutil

    for row in store.list_jobs():
        for p in row.procs or []:
            try:
                proc = psutil.Process(int(p["pid"]))
                if abs(proc.create_time() - float(p["start_time"])) < 1.0:
                    os.killpg(proc.pid, signal.SIGKILL)
            except (KeyError, psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                pass


def launched(job: dict[str, Any]) -> bool:
    """Whether the store has the job's launch confirmed: every process with its pid (an intent has none)."""
    procs = job["procs"] or []
    return bool(procs) and all(p.get("pid") for p in procs)


def test_a_second_server_after_a_database_restart_is_refused_or_the_first_gives_up(
        pg: Postgres, tmp_path: Path) -> None:
    """Never two schedulers: after the database restarts, the first server takes its lock again at once (a
    second one is refused); a second one that got there first (the first was stopped meanwhile) keeps it, and
    the first stops scheduling and exits saying why; the second adopts the jobs and ends them."""
    go = job_writable(tmp_path)
    ledger = go / "ledger"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Server(tmp_path / "a", *serve_args("--db", pg.url)).start()
    b: Server | None = None
    store = Store(pg.url)
    try:
        with a.client() as c:
            cmd = f"while [ ! -e {go}/end ]; do sleep 0.05; done; echo $GPULOOM_JOB_ID >> {ledger}"
            ids = [int(c.post("/jobs", json={"command": cmd, "gpus": 1}).json()["id"]) for _ in range(4)]
            # launched and confirmed (pids stored), not only intended: a launch whose confirmation the stopping
            # database refuses is undone and made again, a second attempt by design
            wait_for(lambda: all(launched(c.get(f"/jobs/{j}").json()) for j in ids), what="the jobs to run")
            # the database restarts: the first server takes its lock again, and a second one is refused
            pg.stop()
            wait_for(lambda: ready(c)[1]["checks"]["lock"].startswith("unknown: "), what="the lock's loss noticed")
            pg.start()
            wait_for(lambda: ready(c)[0] == 200, what="the first server's lock taken again")
        r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--cluster", "2x2",
                            "--state-dir", str(tmp_path / "b"), "--db", pg.url], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
        assert r.returncode == 2 and "another gpuloom server is using the database" in r.stderr, r.stderr
        # the first server is stopped while the database restarts: the second takes the lock first
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        pg.stop()
        pg.start()
        b = Server(tmp_path / "b", *serve_args("--db", pg.url)).start()
        with b.client() as c:
            wait_for(lambda: all("adopt" in [e["kind"] for e in c.get(f"/jobs/{j}/events").json()] for j in ids),
                     what="the second server to adopt the jobs")
            a.proc.send_signal(signal.SIGCONT)
            t_cont = time.monotonic()
            code = a.proc.wait(timeout=30)
            gave_up = time.monotonic() - t_cont
            said = (tmp_path / "a" / "serve.out").read_text()
            assert code == 3, said[-2000:]
            assert "another gpuloom server took the database" in said and "this server stops" in said
            (go / "end").touch()
            wait_for(lambda: all(c.get(f"/jobs/{j}").json()["state"] == "finished" for j in ids), timeout=60,
                     what="the jobs to end under the second server")
            assert cluster_matches_store(c, store)
        out = final_check(store, set(ids), ledger)
        assert out["launches"] == 4  # adopted, not launched again
        print(f"\nsecond server after a database restart: refused while the first held its lock again; taken "
              f"over while the first was stopped, which gave up {gave_up:.2f} s after it resumed; 4 jobs adopted, "
              "each run once")
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        a.stop()
        if b is not None:
            b.stop()
        kill_stored_jobs(store)
        store.close()
