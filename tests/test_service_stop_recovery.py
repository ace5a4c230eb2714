"""A stop the service made to end a job (a cancel, a time limit, the other parts of a job one part of which
failed) whose end the store had not taken when the server died: the processes' exit statuses are those of
the stop (143 from SIGTERM), and a new server ends the job as the live service would have, once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec.local import LocalExecutor, read_exit_record
from gpuloom.runtime.service.service import Service
from service_util import job_writable, wait_for
from test_service_unconfirmed import Crash, World


def until_crash(svc: Service, what: str) -> None:
    """Run rounds until the server dies (a :class:`Crash` out of one)."""
    def died() -> bool:
        try:
            svc.round()
        except Crash:
            return True
        return False
    wait_for(died, what=what)


class DyingWorld(World):
    """The server dies when it is about to store a given event (the store never takes it)."""

    def __init__(self, tmp_path: Path, cgroup_parent: str) -> None:
        super().__init__(tmp_path, cgroup_parent)
        self.die_at: str | None = None
        real = self.store.update_job

        def update_job(jid: int, fields: Any, event: str | None = None, *a: Any, **k: Any) -> Any:
            if event is not None and event == self.die_at:
                self.die_at = None  # (once: the dead server's clean-up may store it afterwards)
                raise Crash
            return real(jid, fields, event, *a, **k)

        self.store.update_job = update_job  # type: ignore[method-assign]

    def die_storing(self, svc: Service, event: str) -> None:
        """Run rounds until the server dies storing ``event``."""
        self.die_at = event
        until_crash(svc, f"the server to die storing {event!r}")

    def close(self) -> None:
        self.die_at = None
        super().close()

    def events(self, jid: int) -> list[str]:
        return [e["kind"] for e in self.store.events(jid)]


@pytest.fixture
def world(tmp_path: Path, cgroup_parent: str) -> Iterator[DyingWorld]:
    w = DyingWorld(tmp_path, cgroup_parent)
    try:
        yield w
    finally:
        w.close()


def started(w: DyingWorld, svc: Service, jid: int, up: Path) -> None:
    """Run rounds until the job's process runs (it touched ``up``)."""
    svc.round()
    wait_for(up.exists, what="the job to start")
    row = w.store.get_job(jid)
    assert row is not None and row.state == "launching" and row.procs is not None


def test_a_cancel_whose_end_was_not_stored_is_cancelled_once_after_a_restart(
        world: DyingWorld, tmp_path: Path) -> None:
    up = job_writable(tmp_path) / "up"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"touch {up}; sleep 60", "gpus": 1}, "alice")
    started(world, svc, jid, up)
    svc.cancel(jid, "alice", admin=False)
    world.die_storing(svc, "cancelled")  # its process was stopped (143), its end not stored
    exit_path = str(tmp_path / "run" / f"{jid}.exit")
    assert read_exit_record(exit_path) == 143
    row = world.store.get_job(jid)
    assert row is not None and row.state == "launching" and row.cancel_requested
    svc2 = world.server()
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code, row.reason) == ("cancelled", None, "cancelled")
    assert row.attempts == 1 and row.procs is None
    for _ in range(3):
        svc2.round()
    assert world.events(jid).count("cancelled") == 1 and "failed" not in world.events(jid)


def test_a_time_limits_stop_whose_end_was_not_stored_ends_as_the_limit_after_a_restart(
        world: DyingWorld, tmp_path: Path) -> None:
    up = job_writable(tmp_path) / "up"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"touch {up}; sleep 60", "gpus": 1, "time_limit": 1.0}, "alice")
    started(world, svc, jid, up)
    world.die_storing(svc, "failed")  # over its limit: stopped (143), its end not stored
    assert read_exit_record(str(tmp_path / "run" / f"{jid}.exit")) == 143
    svc2 = world.server()
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code) == ("failed", None)
    assert row.reason == "time limit of 1.0 s reached" and row.attempts == 1
    assert row.held_time >= 1.0 - 0.1  # up to its exit record (a file's time: a tick of the kernel's clock)
    for _ in range(3):
        svc2.round()
    assert world.events(jid).count("failed") == 1


def test_a_job_over_two_nodes_is_reported_with_the_part_that_failed_after_a_restart(
        world: DyingWorld, tmp_path: Path) -> None:
    # part 1 exits 3 once part 0 runs; part 0 is stopped for it (143); the server dies storing the failure
    d = job_writable(tmp_path)
    up, ledger = d / "up", d / "ledger"
    svc = world.server(nodes=2)
    cmd = (f"if [ $GPULOOM_NODE_RANK = 1 ]; then until [ -e {up} ]; do sleep 0.05; done; exit 3; fi; "
           f"echo ran >> {ledger}; touch {up}; sleep 60")
    jid = svc.submit({"name": "a", "command": cmd, "gpus": 2}, "alice")
    started(world, svc, jid, up)
    world.die_storing(svc, "failed")
    assert read_exit_record(str(tmp_path / "run" / f"{jid}.0.exit")) == 143
    assert read_exit_record(str(tmp_path / "run-1" / f"{jid}.1.exit")) == 3
    svc2 = world.server(nodes=2)
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code) == ("failed", 3) and row.attempts == 1
    assert row.reason == f"process {jid}.1 ended with code 3 while the service was down"
    for _ in range(3):
        svc2.round()
    assert world.events(jid).count("failed") == 1 and ledger.read_text() == "ran\n"


def test_a_part_that_failed_while_the_server_was_down_fails_the_job_though_the_other_runs(
        world: DyingWorld, tmp_path: Path) -> None:
    # the server dies with both parts running; part 1 then exits 3 while part 0 runs on: a new server
    # fails the job with 3 (as the live one would have) and stops part 0, not queue it to run again
    d = job_writable(tmp_path)
    up, ledger, go = d / "up", d / "ledger", d / "go"
    svc = world.server(nodes=2)
    cmd = (f"if [ $GPULOOM_NODE_RANK = 1 ]; then until [ -e {go} ]; do sleep 0.05; done; exit 3; fi; "
           f"echo ran >> {ledger}; touch {up}; sleep 60")
    jid = svc.submit({"name": "a", "command": cmd, "gpus": 2}, "alice")
    started(world, svc, jid, up)
    go.touch()  # the server is dead by now
    wait_for(lambda: read_exit_record(str(tmp_path / "run-1" / f"{jid}.1.exit")) == 3, what="part 1 to exit")
    svc2 = world.server(nodes=2)
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code) == ("failed", 3) and row.attempts == 1
    assert row.reason == f"process {jid}.1 ended with code 3 while the service was down"
    assert read_exit_record(str(tmp_path / "run" / f"{jid}.0.exit")) == 143  # part 0 stopped
    for _ in range(3):
        svc2.round()
    assert world.events(jid).count("failed") == 1 and ledger.read_text() == "ran\n"


def test_an_exit_record_without_the_stop_mark_is_read_as_before(world: DyingWorld, tmp_path: Path) -> None:
    # an older version's record (no stop mark): its 143 is taken for the job's own end, as it was
    up = job_writable(tmp_path) / "up"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"touch {up}; sleep 60", "gpus": 1}, "alice")
    started(world, svc, jid, up)
    svc.cancel(jid, "alice", admin=False)
    world.die_storing(svc, "cancelled")
    exit_record = tmp_path / "run" / f"{jid}.exit"
    assert exit_record.read_text().split() == ["143", "!", "@1"]
    exit_record.write_text(exit_record.read_text().replace("!", " "))
    svc2 = world.server()
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code) == ("failed", 143)
    assert row.reason == f"process {jid} ended with code 143 while the service was down"


class DiesStoppingPart1(LocalExecutor):
    """The server dies as it is about to stop part 1 of a job (part 0's stop may be done)."""

    armed = True

    def stop(self, job_id: str, grace_s: float) -> int | None:
        if job_id.endswith(".1") and DiesStoppingPart1.armed:
            DiesStoppingPart1.armed = False
            raise Crash
        return super().stop(job_id, grace_s)


def test_a_time_limits_stop_cut_short_by_a_crash_is_finished_and_ends_the_job(
        world: DyingWorld, tmp_path: Path) -> None:
    # over its time limit, the job's parts are being stopped when the server dies: part 0 stopped, part 1
    # still running.  A new server stops part 1 and ends the job at its limit, not queue it to run again
    d = job_writable(tmp_path)
    up, ledger = d / "up", d / "ledger"
    svc = world.server(DiesStoppingPart1, nodes=2)
    jid = svc.submit({"name": "a", "command": f"echo ran-$GPULOOM_NODE_RANK >> {ledger}; touch {up}-$GPULOOM_NODE_RANK; "
                                              "sleep 60", "gpus": 2, "time_limit": 1.0}, "alice")
    svc.round()
    wait_for(lambda: all(Path(f"{up}-{r}").exists() for r in (0, 1)), what="both parts to start")
    until_crash(svc, "the server to die stopping part 1")
    assert read_exit_record(str(tmp_path / "run-1" / f"{jid}.1.exit")) is None  # still running
    svc2 = world.server(nodes=2)
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code) == ("failed", None) and row.attempts == 1
    assert row.reason == "time limit of 1.0 s reached"
    assert read_exit_record(str(tmp_path / "run-1" / f"{jid}.1.exit")) == 143  # stopped now
    for _ in range(3):
        svc2.round()
    assert world.events(jid).count("failed") == 1
    assert sorted(ledger.read_text().split()) == ["ran-0", "ran-1"]
