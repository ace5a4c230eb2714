"""The store and a service round on PostgreSQL (a throw-away local server).

Skipped unless ``initdb``/``pg_ctl`` and the ``psycopg`` driver (extra
``postgres``) are installed.  The server listens on a Unix socket in a
temporary directory only.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

pytest.importorskip("psycopg")
# on PATH, or where Debian's postgresql packages put them
_PG_BIN = next((str(Path(p).parent) for p in [shutil.which("initdb") or "",
                                              *sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)]
                if p and os.access(p, os.X_OK) and os.access(Path(p).parent / "pg_ctl", os.X_OK)), None)
if _PG_BIN is None:
    pytest.skip("PostgreSQL server binaries not installed", allow_module_level=True)


def _as_pg_user(cmd: str) -> list[str]:
    if os.geteuid() != 0:
        return ["/bin/sh", "-c", cmd]
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and no 'postgres' user to run the server")
    return ["su", "postgres", "-s", "/bin/sh", "-c", cmd]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    # not under pytest's tmp root: that is private to this user, the server may run as another
    d = Path(tempfile.mkdtemp(prefix="gpuloom-pg-"))
    if os.geteuid() == 0:
        shutil.chown(d, "postgres")
        os.chmod(d, 0o755)
    data = d / "data"
    init = subprocess.run(_as_pg_user(f"{_PG_BIN}/initdb -D {data} -A trust -U gpuloom"), capture_output=True,
                          text=True)
    if init.returncode != 0:
        pytest.skip(f"initdb failed: {init.stderr[-300:]}")
    start = subprocess.run(
        _as_pg_user(f"{_PG_BIN}/pg_ctl -D {data} -w -o \"-k {d} -c listen_addresses=''\" -l {d}/log start"),
        capture_output=True, text=True,
    )
    if start.returncode != 0:
        pytest.skip(f"pg_ctl start failed: {start.stderr[-300:]}")
    try:
        yield f"postgresql+psycopg://gpuloom@/postgres?host={d}"
    finally:
        subprocess.run(_as_pg_user(f"{_PG_BIN}/pg_ctl -D {data} -m fast stop"), capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_store_on_postgres(pg_url: str) -> None:
    store = Store(pg_url)
    ids: list[int] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(25):
            jid = store.add_job({"name": f"w{k}-{i}", "command": "true", "gpus": 1}, f"u{k}", "standby")
            with lock:
                ids.append(jid)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 100 and store.count_jobs(["standby"]) == 100
    assert store.update_job(ids[0], {"state": "launching"}, "launch", expect_state=["standby"])
    assert not store.update_job(ids[0], {"state": "cancelled"}, "cancel", expect_state=["standby"])
    assert store.set_states(ids[1:3], "running", ["standby"]) == 2
    store.close()


def test_service_round_trip_on_postgres(pg_url: str, tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(pg_url)
    cluster = Cluster.homogeneous(1, 2)
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=100))
    jid = svc.submit({"name": "pg", "command": "echo on postgres", "gpus": 2}, "alice")
    svc.round()
    assert store.get_job(jid).state == "launching"  # type: ignore[union-attr]
    end = time.monotonic() + 10
    while store.get_job(jid).state != "finished" and time.monotonic() < end:  # type: ignore[union-attr]
        time.sleep(0.05)
        svc.round()
    row = store.get_job(jid)
    assert row is not None and row.state == "finished" and row.exit_code == 0
    assert svc.log_path(jid).read_text() == "on postgres\n"
    store.close()


def test_one_server_per_database_by_advisory_lock(pg_url: str, tmp_path: Path) -> None:
    """Two servers on one PostgreSQL database: the second is refused (each with its own state dir)."""
    from gpuloom.runtime.state.locks import AlreadyServed, ServerLocks

    s1, s2 = Store(pg_url), Store(pg_url)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = ServerLocks().acquire(tmp_path / "a", s1)
    with pytest.raises(AlreadyServed, match="another gpuloom server is using the database"):
        ServerLocks().acquire(tmp_path / "b", s2)
    first.release()  # the session ends: the lock is free
    second = ServerLocks().acquire(tmp_path / "b", s2)
    second.release()
    s1.close()
    s2.close()


def test_second_serve_on_the_same_postgres_exits_and_nul_bytes_get_422(pg_url: str, tmp_path: Path) -> None:
    import sys

    import httpx

    from service_util import Server

    (tmp_path / "a").mkdir()
    s = Server(tmp_path / "a", "--cluster", "1x1", "--db", pg_url).start()
    try:
        r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--cluster", "1x1",
                            "--state-dir", str(tmp_path / "b"), "--db", pg_url], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src")))
        assert r.returncode == 2 and "another gpuloom server is using the database" in r.stderr, r.stderr
        h = {"Authorization": f"Bearer {s.token}"}
        for body in ({"command": "a\x00b", "gpus": 1}, {"command": "true", "gpus": 1, "name": "\x00"},
                     {"command": "true", "gpus": 1, "env": {"K": "\x00"}}):
            assert httpx.post(s.url + "/jobs", json=body, headers=h).status_code == 422
        assert httpx.get(s.url + "/jobs/9223372036854775808", headers=h).status_code == 422
    finally:
        s.stop()


def test_submission_limits_count_on_postgres(pg_url: str) -> None:
    """What the pending limits count (per user, per queue: the spec's JSON) reads the same on PostgreSQL."""
    store = Store(pg_url)
    try:
        before = store.count_of(["standby"], queues=["qa", "qb"])
        store.add_jobs([{"command": "x", "gpus": 1, "queue": "qa"}] * 3, "pg-alice", "standby")
        store.add_jobs([{"command": "x", "gpus": 1, "queue": "qb"}] * 2, "pg-bob", "standby")
        store.add_jobs([{"command": "x", "gpus": 1}], "pg-bob", "running")
        assert store.count_of(["standby"], user="pg-alice") == 3
        assert store.count_of(["standby", "running"], user="pg-bob") == 3
        assert store.count_of(["standby"], queues=["qa", "qb"]) - before == 5
        assert store.count_of(["standby"], user="pg-bob", queues=["qa"]) == 0
    finally:
        store.close()
