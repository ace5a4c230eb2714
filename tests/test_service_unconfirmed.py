"""A launch the service did not confirm: the server dies after the job's process started and before the store
took the launch's confirmation, so a new server finds only the launch's intent.  A job whose process ran and
ended meanwhile ends as its exit record says, once, never launched again; one still running is stopped and
queued again (it resumes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.cgroups import CgroupManager
from gpuloom.runtime.exec.executor import Executor, LaunchSpec, ProcInfo
from gpuloom.runtime.exec.local import RECORD_ROOM, LocalExecutor, NodeAgent, read_exit_record
from gpuloom.runtime.exec.router import NodeRouter
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store, StoreUnavailable
from gpuloom.scheduler import Scheduler
from service_util import Crash, job_writable, wait_for
from service_util import crashed_launch as service_crashed_launch


def test_the_run_records_name_their_launch_and_a_stop(tmp_path: Path) -> None:
    run = tmp_path / "run"
    agent = NodeAgent(CgroupManager(enabled=False), run)

    def launch(job: str, command: str, attempt: int) -> ProcInfo:
        return agent.launch(LaunchSpec(job, command, "", (), (), 0, str(tmp_path / f"{job}.log"), attempt=attempt))

    r = launch("r", f"touch {tmp_path / 'r-up'}; sleep 30", 2)
    wait_for(lambda: (tmp_path / "r-up").exists(), what="r to start")
    assert (run / "r.exit").read_text() == " " * (RECORD_ROOM - 3) + "@2\n"  # a placeholder of launch 2
    assert (run / "r.pid").read_text().split() == [str(r.pid), "@2"]
    later = NodeAgent(CgroupManager(enabled=False), run)  # a restarted server
    assert later.launched("r", 1) is None and later.launched("x", 2) is None
    found = later.launched("r", 2)
    assert found is not None and found.pid == r.pid and later.adopt(found)
    assert later.stop("r", 30.0) == 143
    assert (run / "r.exit").read_text().split() == ["143", "!", "@2"]  # a stop's end
    assert later.stopped(found) and not later.stopped(ProcInfo("x", "", 0, 0.0, "", str(run / "x.exit"), -1.0, ""))
    assert NodeAgent(CgroupManager(enabled=False), run).launched("r", 2) is None
    q = launch("q", "exit 5", 1)
    wait_for(lambda: read_exit_record(q.exit_path) == 5, what="q to end")
    again = NodeAgent(CgroupManager(enabled=False), run)
    found = again.launched("q", 1)  # ended on its own, its end not consumed
    assert found is not None and found.pid == q.pid and found.start_time > 0 and not again.adopt(found)
    assert again.exit_code(found) == 5 and again.exit_time(found) is not None and not again.stopped(found)
    assert agent.poll()["q"] == 5 and not (run / "q.pid").exists()  # consumed: its pid record goes
    found = again.launched("q", 1)
    assert found is not None and found.pid == 0 and not again.adopt(found) and again.exit_code(found) == 5


class CrashAfterLaunch(LocalExecutor):
    """The server dies right after its first launch started the process."""

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        super().launch(spec)
        raise Crash


class CrashBeforeLaunch(LocalExecutor):
    """The server dies after storing a launch's intent, before the executor made the launch's records."""

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        raise Crash


class World:
    """One store and run directory, and the servers started on them one after the other."""

    def __init__(self, tmp_path: Path, cgroup_parent: str) -> None:
        self.tmp_path, self.cgroup_parent = tmp_path, cgroup_parent
        self.store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        self.down = False  # the store refuses every job update (the database down)
        real = self.store.update_job

        def update_job(*a: Any, **k: Any) -> Any:
            if self.down:
                raise StoreUnavailable("the database is down")
            return real(*a, **k)

        self.store.update_job = update_job  # type: ignore[method-assign]
        self.servers: list[Service] = []

    def server(self, cls: type[LocalExecutor] = LocalExecutor, nodes: int = 1) -> Service:
        """A server of ``nodes`` one-GPU nodes on this machine (node-0's records in run/, node-N's in run-N/)."""
        cl = Cluster.homogeneous(nodes, 1)
        ex: Executor = cls("node-0", cgroups=CgroupManager(parent=self.cgroup_parent),
                           run_dir=self.tmp_path / "run", fold_cores=True)
        if nodes > 1:
            ex = NodeRouter({"node-0": ex, **{
                n.name: cls(n.name, cgroups=CgroupManager(parent=self.cgroup_parent),
                            run_dir=self.tmp_path / f"run-{i}", fold_cores=True)
                for i, n in enumerate(cl.nodes) if i}})
        svc = Service(self.store, cl, ex, Scheduler.from_names(),
                      ServiceConfig(self.tmp_path, round_s=1000.0, grace_s=5.0))
        self.servers.append(svc)
        return svc

    def until_final(self, svc: Service, jid: int) -> Any:
        def final() -> Any:
            svc.round()
            row = self.store.get_job(jid)
            return row if row is not None and row.state in ("finished", "failed", "cancelled") else None
        return wait_for(final, what="the job to end")

    def close(self) -> None:
        """The store up again, every server's jobs stopped, the servers and the store closed."""
        self.down = False
        for svc in reversed(self.servers):
            svc.terminate_all()
        for svc in self.servers[:-1]:  # (the servers that died: their threads alone)
            svc.actuator.close()
        self.servers[-1].shutdown()
        self.store.close()

    def unconfirmed(self, jid: int) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.store.events(jid) if e["kind"] == "launch-unconfirmed"]


@pytest.fixture
def world(tmp_path: Path, cgroup_parent: str) -> Iterator[World]:
    w = World(tmp_path, cgroup_parent)
    try:
        yield w
    finally:
        w.close()


def crashed_launch(w: World, command: str) -> int:
    """Submit a job whose first launch the server does not live to confirm: only its intent is stored."""
    return service_crashed_launch(w.server(CrashAfterLaunch), command, "node-0")


def test_a_job_that_ran_to_its_end_after_its_server_died_finishes_once(world: World, tmp_path: Path) -> None:
    ledger = job_writable(tmp_path) / "ledger"
    jid = crashed_launch(world, f"echo ran >> {ledger}")
    wait_for(lambda: read_exit_record(str(tmp_path / "run" / f"{jid}.exit")) == 0, what="the job's exit record")
    svc = world.server()
    svc.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "finished" and row.exit_code == 0 and row.attempts == 1
    assert row.procs is None and row.reason == "finished while the service was down, its launch unconfirmed"
    # it ran from when its wrapper wrote its pid to when it wrote its exit status (wall times of the records)
    began, ended = ((tmp_path / "run" / f"{jid}.{r}").stat().st_mtime for r in ("pid", "exit"))
    assert row.first_start == row.last_start == began
    assert row.held_time == row.held_gpu_time == ended - began
    (found,) = world.unconfirmed(jid)
    assert found["found"] == "ended on its own" and found["exit_codes"] == {str(jid): 0}
    for _ in range(3):
        svc.round()
    assert ledger.read_text() == "ran\n"
    kinds = [e["kind"] for e in world.store.events(jid)]
    assert "launch" not in kinds and kinds.index("launch-unconfirmed") < kinds.index("finished"), kinds


def test_a_job_that_failed_after_its_server_died_fails_with_its_code_once(world: World, tmp_path: Path) -> None:
    ledger = job_writable(tmp_path) / "ledger"
    jid = crashed_launch(world, f"echo ran >> {ledger}; exit 3")
    wait_for(lambda: read_exit_record(str(tmp_path / "run" / f"{jid}.exit")) == 3, what="the job's exit record")
    svc = world.server()
    svc.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "failed" and row.exit_code == 3 and row.attempts == 1
    assert row.reason == f"process {jid} ended with code 3 while the service was down, its launch unconfirmed"
    for _ in range(3):
        svc.round()
    assert ledger.read_text() == "ran\n"


def test_a_job_still_running_at_the_restart_is_stopped_and_runs_again(world: World, tmp_path: Path) -> None:
    d = job_writable(tmp_path)
    ledger, go = d / "ledger", d / "go"
    jid = crashed_launch(world, f"echo started >> {ledger}; until [ -e {go} ]; do sleep 0.05; done; "
                                f"echo ran >> {ledger}")
    wait_for(ledger.exists, what="the job to start")
    svc = world.server()
    svc.recover()  # its process is stopped (SIGTERM: the shell ends with 143), the job queued again
    row = world.store.get_job(jid)
    assert row is not None and row.state == "waiting_for_initial_resource" and row.procs is None
    (found,) = world.unconfirmed(jid)
    assert found["found"] == "still running: stopped"
    go.touch()
    row = world.until_final(svc, jid)
    assert row.state == "finished" and row.attempts == 2
    assert ledger.read_text() == "started\nstarted\nran\n"


def test_a_job_whose_launch_stood_unrecorded_and_ended_is_not_run_again_after_a_crash(
        world: World, tmp_path: Path) -> None:
    # the store refuses the launch's confirmation once the job has run to its end: the launch stands, its
    # confirmation and end waiting in memory; the store stays down and the server dies
    ledger = job_writable(tmp_path) / "ledger"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"echo ran >> {ledger}", "gpus": 1}, "alice")
    real_write = svc.actuator.mirror.write

    def write(j: str, fields: dict[str, Any], event: str | None = None, *a: Any, **k: Any) -> Any:
        if event == "launch":
            wait_for(lambda: ledger.exists() and not svc.executor.alive(j), what="the job to end")
            world.down = True
        return real_write(j, fields, event, *a, **k)

    svc.actuator.mirror.write = write  # type: ignore[method-assign]
    svc.round()
    assert str(jid) in svc.actuator.running
    svc.round()  # its end is seen (the executor's records consumed), not stored
    assert not svc.actuator.running and len(svc.outbox) > 0
    row = world.store.get_job(jid)
    assert row is not None and row.state == "waiting_for_initial_resource" and row.procs is not None
    world.down = False  # the server died: a new one finds the intent alone
    svc2 = world.server()
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "finished" and row.exit_code == 0 and row.attempts == 1
    for _ in range(3):
        svc2.round()
    assert ledger.read_text() == "ran\n"
    assert [e["kind"] for e in world.store.events(jid)].count("finished") == 1


def test_a_refused_launch_undone_then_a_crash_runs_the_job_again(world: World, tmp_path: Path) -> None:
    # the store refuses the confirmation while the process runs: the launch is undone (its process
    # stopped, its exit record written); the server dies with the intent stored: that stop is not an end
    d = job_writable(tmp_path)
    ledger, go = d / "ledger", d / "go"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"echo started >> {ledger}; until [ -e {go} ]; do sleep 0.05; done; "
                                              f"echo ran >> {ledger}", "gpus": 1}, "alice")
    real_write = svc.actuator.mirror.write

    def write(j: str, fields: dict[str, Any], event: str | None = None, *a: Any, **k: Any) -> Any:
        if event == "launch":
            wait_for(ledger.exists, what="the job to start")
            world.down = True
        return real_write(j, fields, event, *a, **k)

    svc.actuator.mirror.write = write  # type: ignore[method-assign]
    svc.round()
    assert not svc.actuator.running
    assert read_exit_record(str(tmp_path / "run" / f"{jid}.exit")) == 143
    world.down = False
    svc2 = world.server()
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "waiting_for_initial_resource" and row.procs is None
    assert world.unconfirmed(jid)[-1]["found"] == "no process started"
    go.touch()
    row = world.until_final(svc2, jid)
    assert row.state == "finished" and row.attempts == 2
    assert ledger.read_text() == "started\nstarted\nran\n"


def test_an_earlier_launchs_records_are_not_taken_for_an_unconfirmed_launchs(world: World, tmp_path: Path) -> None:
    # launch 1 runs; its wrapper is killed while the server is down (no exit record, its pid record kept):
    # the job is queued again.  Launch 2's intent is stored and the server dies before that launch made its
    # records: launch 1's are still there, a dead pid and no exit code, and say nothing of launch 2
    d = job_writable(tmp_path)
    ledger, go = d / "ledger", d / "go"
    svc = world.server()
    jid = svc.submit({"name": "a", "command": f"echo started >> {ledger}; until [ -e {go} ]; do sleep 0.05; done; "
                                              f"echo ran >> {ledger}", "gpus": 1}, "alice")
    svc.round()
    wait_for(ledger.exists, what="the job to start")
    pid = svc.actuator.running[str(jid)].procs[str(jid)].pid
    os.killpg(pid, signal.SIGKILL)  # the server is dead by now
    svc2 = world.server(CrashBeforeLaunch)
    svc2.recover()  # the process lost: queued again
    with pytest.raises(Crash):
        svc2.round()
    row = world.store.get_job(jid)
    assert row is not None and row.attempts == 2 and row.procs == [{"job_id": str(jid), "node": "node-0",
                                                                     "pending": True}]
    assert (tmp_path / "run" / f"{jid}.pid").read_text().split() == [str(pid), "@1"]
    svc3 = world.server()
    svc3.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "standby" and row.procs is None
    assert world.unconfirmed(jid)[-1]["found"] == "no process started"
    go.touch()
    row = world.until_final(svc3, jid)
    assert row.state == "finished" and row.attempts == 3
    assert ledger.read_text() == "started\nstarted\nran\n"


def test_a_job_over_two_nodes_whose_second_part_never_started_fails_once(world: World, tmp_path: Path) -> None:
    # the server dies right after launching the first part; that part runs to its end, the second never starts
    ledger = job_writable(tmp_path) / "ledger"
    svc = world.server(CrashAfterLaunch, nodes=2)
    jid = svc.submit({"name": "a", "command": f"echo ran-$GPULOOM_NODE_RANK >> {ledger}", "gpus": 2}, "alice")
    with pytest.raises(Crash):
        svc.round()
    row = world.store.get_job(jid)
    assert row is not None and [p["job_id"] for p in row.procs or []] == [f"{jid}.0", f"{jid}.1"]
    wait_for(lambda: read_exit_record(str(tmp_path / "run" / f"{jid}.0.exit")) == 0, what="part 0's exit record")
    svc2 = world.server(nodes=2)
    svc2.recover()
    row = world.store.get_job(jid)
    assert row is not None and row.state == "failed" and row.exit_code is None and row.attempts == 1
    assert row.reason == f"process {jid}.1 never started and the others ended while the service was down, " \
                         "its launch unconfirmed"
    assert world.unconfirmed(jid)[-1]["exit_codes"] == {f"{jid}.0": 0, f"{jid}.1": None}
    for _ in range(3):
        svc2.round()
    assert ledger.read_text() == "ran-0\n"
