"""The server epoch, a fencing token: a server that resumes after another took its database writes nothing.

A server holds its database by a lock (:mod:`gpuloom.runtime.state.locks`) that it confirms before each round
that acts; one paused after that check (a VM pause, SIGSTOP) while the database restarts and another server
takes over could still act once.  Taking the lock raises the stored epoch, and every write checks in its own
transaction that the epoch is still its own: the stale server's launch is refused before any process starts.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text

import test_service_faults as faults
from gpuloom.core.cluster import Cluster
from gpuloom.runtime.service.health import readiness
from gpuloom.runtime.state.locks import AlreadyServed, ServerLocks
from gpuloom.runtime.state.store import Fenced, Store, unavailable
from service_util import Server, job_writable, kill_jobs, wait_for

# the fault suite's throw-away PostgreSQL server (skipped without its binaries)
pg = faults.pg


def test_a_write_after_another_server_took_the_epoch_is_refused_and_rolled_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    a, b = Store(url), Store(url)
    try:
        assert a.stored_epoch() is None and a.take_epoch() == 1 and a.fence == 1
        jid = a.add_job({"command": "true", "gpus": 1}, "alice", "queued")
        assert a.update_job(jid, {"attempts": 1}, "launch-intent", {})  # its own epoch: taken
        assert b.take_epoch() == 2
        with pytest.raises(Fenced, match=r"another gpuloom server took the database \(its server epoch is 2, "
                                         r"this server's 1\)"):
            a.update_job(jid, {"attempts": 2}, "launch-intent", {})
        row = b.get_job(jid)
        assert row is not None and row.attempts == 1  # rolled back: neither the row nor its event
        assert [e["kind"] for e in b.events(jid)] == ["submit", "launch-intent"]
        # every later write is refused at once, whatever it touches; the new holder's go in
        with pytest.raises(Fenced):
            a.set_meta("k", "a")
        with pytest.raises(Fenced):
            a.add_job({"command": "true", "gpus": 1}, "alice", "queued")
        b.set_meta("k", "b")
        assert a.get_meta("k") == "b" and a.count_jobs() == 1
        # the service treats it as the store's state: nothing recorded is dropped, nothing acts on it
        assert unavailable(Fenced("x"))
    finally:
        a.close()
        b.close()


def test_a_submission_to_a_server_whose_database_another_took_is_refused_too(tmp_path: Path) -> None:
    """Submissions stay fenced: the new server reads new jobs by id (``after_id``), so on PostgreSQL a
    job the stale server committed after the new one read a higher id would never be scheduled."""
    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    a, b = Store(url), Store(url)
    try:
        a.take_epoch()
        a.add_job({"command": "true", "gpus": 1}, "alice", "queued")
        b.take_epoch()
        with pytest.raises(Fenced):  # its first write since: a submission, with or without a key
            a.add_jobs_once([{"command": "true", "gpus": 1}], "alice", "queued", "k1")
        with pytest.raises(Fenced):
            a.add_jobs_row([{"command": "true", "gpus": 1}], "alice", "queued")
        assert b.count_jobs() == 1 and b.job_for_key("alice", "k1") is None  # nothing of either stored
    finally:
        a.close()
        b.close()


def test_a_database_made_before_the_epoch_opens_and_a_store_without_a_fence_is_not_checked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    old = Store(url)
    with old.engine.begin() as c:  # as an older release left it
        c.execute(text("DROP TABLE server_epoch"))
    jid = old.add_job({"command": "true", "gpus": 1}, "alice", "queued")
    old.close()
    s, tool = Store(url), Store(url)
    try:
        assert s.stored_epoch() is None and s.take_epoch() == 1 and s.take_epoch(expect=1) == 2
        assert s.take_epoch(expect=1) is None and s.fence == 2  # (only from the epoch it expects)
        # a store no server took the epoch with (a command-line tool's) writes as before
        assert tool.fence is None and tool.update_job(jid, {"name": "x"}, "renamed", {})
    finally:
        s.close()
        tool.close()


def test_server_locks_take_an_epoch_and_a_second_server_on_sqlite_is_refused_without_moving_it(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    a, b = Store(url), Store(url)
    la = ServerLocks().acquire(tmp_path / "a", a)
    try:
        assert a.fence == 1
        with pytest.raises(AlreadyServed):
            ServerLocks().acquire(tmp_path / "b", b)
        assert b.fence is None and a.stored_epoch() == 1
        la.check()  # file locks: nothing to take again, the epoch stays
        assert a.update_job(a.add_job({"command": "true", "gpus": 1}, "alice", "queued"), {"attempts": 1})
    finally:
        la.release()
        a.close()
        b.close()


def test_a_lock_taken_again_after_another_server_held_the_database_meanwhile_is_given_up(
        pg: faults.Postgres, tmp_path: Path) -> None:
    """After a database restart a server takes its lock again only if no other server held the database
    since (its view would be stale); otherwise it stops, and leaves the lock free for a third."""
    for d in "abc":
        (tmp_path / d).mkdir()
    a = Store(pg.url)
    la = ServerLocks().acquire(tmp_path / "a", a)
    stores = [a]
    try:
        assert a.fence == 1
        pg.stop()
        pg.start()
        la.check()  # nobody else held it: taken again, on the same epoch
        assert a.fence == a.stored_epoch() == 1
        pg.stop()
        pg.start()
        b = Store(pg.url)
        stores.append(b)
        lb = ServerLocks().acquire(tmp_path / "b", b)  # another server got there first, and went away
        assert b.fence == 2
        lb.release()
        with pytest.raises(AlreadyServed, match=r"another gpuloom server took the database .* \(its server epoch is "
                                                r"2, this server's 1\); this server stops"):
            la.check()
        c = Store(pg.url)
        stores.append(c)
        lc = ServerLocks().acquire(tmp_path / "c", c)  # the lock taken again was let go
        assert c.fence == 3
        lc.release()
    finally:
        la.release()
        for s in stores:
            s.close()


def test_a_server_paused_after_its_lock_check_launches_nothing_once_another_took_the_database(
        pg: faults.Postgres, tmp_path: Path, cgroup_parent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Server A checks its lock and is paused before it acts; the database restarts and server B takes it,
    launching A's planned jobs itself.  Resumed, A launches nothing (its launch intent is refused in its own
    transaction), stops scheduling and says why; B runs each job once, no GPU given twice."""
    go = job_writable(tmp_path)
    ledger = go / "ledger"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    store = Store(pg.url)
    locks = ServerLocks().acquire(tmp_path / "a", store)
    svc = faults.service(store, Cluster.homogeneous(2, 2), tmp_path / "a", cgroup_parent)  # as B's --cluster 2x2
    svc.server_locks = locks
    checked, resume = threading.Event(), threading.Event()
    real_check = svc.check_lock

    def check_then_pause() -> bool:
        ok = real_check()
        checked.set()
        resume.wait(120)
        return ok

    monkeypatch.setattr(svc, "check_lock", check_then_pause)
    reader = Store(pg.url)
    b: Server | None = None
    errors: list[BaseException] = []

    def a_round() -> None:
        try:
            svc.round()
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    try:
        cmd = f"while [ ! -e {go}/end ]; do sleep 0.05; done; echo $GPULOOM_JOB_ID >> {ledger}"
        ids = [svc.submit({"command": cmd, "gpus": 1}, "alice") for _ in range(2)]
        t = threading.Thread(target=a_round, daemon=True)
        t.start()
        assert checked.wait(60), "A's round never reached its lock check"
        pg.stop()  # A's session, and its lock, are gone
        pg.start()
        b = Server(tmp_path / "b", *faults.serve_args("--db", pg.url)).start()
        with b.client() as c:
            wait_for(lambda: all(faults.launched(c.get(f"/jobs/{j}").json()) for j in ids), timeout=60,
                     what="B to launch both jobs")
            resume.set()
            t.join(60)
            assert not t.is_alive() and errors == []
            assert svc.running == {} and svc.driver.current == {}  # A started no process
            assert svc.gave_up is not None and "another gpuloom server took the database" in svc.gave_up
            ok, body = readiness(svc)
            assert not ok and body["checks"]["lock"].startswith("lost: another gpuloom server took the database")
            rows = reader.get_jobs(ids)
            assert [rows[j].attempts for j in ids] == [1, 1]
            assert [[e["kind"] for e in reader.events(j)].count("launch-intent") for j in ids] == [1, 1]
            (go / "end").touch()
            wait_for(lambda: all(c.get(f"/jobs/{j}").json()["state"] == "finished" for j in ids), timeout=60,
                     what="the jobs to end under B")
            assert faults.cluster_matches_store(c, reader)
        out = faults.final_check(reader, set(ids), ledger)  # each ran to its end once, no GPU overlap
        assert out["launches"] == 2
    finally:
        resume.set()
        svc.terminate_all()
        svc.shutdown()
        if b is not None:
            b.stop()
        faults.kill_stored_jobs(reader)
        kill_jobs(tmp_path / "a")
        locks.release()
        reader.close()
        store.close()


def test_a_serving_loop_whose_write_is_fenced_steps_down_and_launches_nothing(tmp_path: Path,
                                                                                cgroup_parent: str) -> None:
    """The loop of a server whose database another took (here: the epoch raised by another store) gives up
    at its first write, before it launches anything; SQLite, so it runs wherever the suite does."""
    url = f"sqlite:///{tmp_path / 'gpuloom.db'}"
    store, other = Store(url), Store(url)
    locks = ServerLocks().acquire(tmp_path, store)
    svc = faults.service(store, Cluster.homogeneous(1, 2), tmp_path, cgroup_parent)
    svc.server_locks = locks
    ledger = job_writable(tmp_path) / "ledger"
    try:
        svc.start()
        assert other.take_epoch() == 2
        ids = [other.add_job({"command": f"echo $GPULOOM_JOB_ID >> {ledger}", "gpus": 1}, "alice",
                             faults.S.WAITING_FOR_INITIAL_CONTACT.value) for _ in range(2)]
        svc.wake()
        wait_for(lambda: svc.gave_up is not None, timeout=20, what="the server to step down")
        assert svc.gave_up == ("another gpuloom server took the database (its server epoch is 2, this server's 1); "
                               "this server stops, the other one schedules")
        assert not readiness(svc)[0] and svc.running == {}
        rows = other.get_jobs(ids)
        assert [(rows[j].state, rows[j].attempts) for j in ids] == [("waiting_for_initial_contact", 0)] * 2
        assert {e["kind"] for j in ids for e in other.events(j)} == {"submit"}
        assert not ledger.exists()
    finally:
        svc.shutdown()
        locks.release()
        kill_jobs(tmp_path)
        store.close()
        other.close()
