"""A wall-clock step (NTP, ``date -s``) of +-2 h while the service runs, or while it is down, changes no
scheduling decision: durations (held time, time limits, launch timeouts, protection, arrivals, profiling
windows) are measured on the monotonic clock; wall time is only what is shown and stored for people.

The service runs real processes (the local executor); its clock is a :class:`ManualClock` whose wall
reading the tests step alone (:meth:`ManualClock.jump`) while the monotonic reading runs on.
"""

from __future__ import annotations

import json
import math
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.lifecycle import JobState
from gpuloom.runtime.exec.clock import ManualClock, ServiceTime, resume
from gpuloom.runtime.exec.executor import InventoryChange
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.inventory import follow
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.history import history
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import JOB_PY, job_writable, shared_copy

S = JobState
T0 = 1_700_000_000.0
H2 = 7200.0
JUMPS = [pytest.param(H2, id="forward-2h"), pytest.param(-H2, id="back-2h")]


@pytest.fixture
def make(tmp_path: Path, cgroup_parent: str) -> Iterator[Callable[..., Service]]:
    """``make(clock, **service_options)`` -> a Service over the test's store (loop not started; a second
    call is a restart: the first one is abandoned as a killed server would be, its jobs running on)."""
    made: list[Service] = []
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")

    def _make(clock: ManualClock, cluster: Cluster | None = None, order: str = "fifo", **kw: object) -> Service:
        cl = cluster or Cluster.homogeneous(1, 4)
        opts: dict = {"round_s": 1000.0, "grace_s": 0.0, "launch_timeout_s": 60.0, **kw}
        svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent),
                      Scheduler.from_names(order, "none", "proportional", "packed-sticky"), ServiceConfig(tmp_path,
                      clock=clock, **opts))
        made.append(svc)
        return svc

    yield _make
    if made:
        made[-1].terminate_all()
        made[-1].shutdown()
    for svc in made[:-1]:  # the abandoned ones' stop threads (a killed server's die with it)
        svc.actuator.close()
    store.close()


def wait(cond: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def execed(pid: int, name: str) -> bool:
    """Whether a process under ``pid`` (the job's wrapper) runs ``name``, exec'd.  Before that a SIGTERM can
    be lost: the job's shell forks its command's child with the shell's own handler for TERM (its trap) and
    resets it only after the fork, so a signal in between is taken by that handler and dropped at the exec;
    the command then runs on until the SIGKILL after the grace (a job stopped just after printing "ready",
    on a loaded machine: exit 137, not 143)."""
    import psutil

    try:
        return any(p.name() == name for p in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return False


def flagged(flags: Path, name: str, then: str = "") -> str:
    """A command that waits for the file ``flags/name``, then runs ``then``."""
    return f"while [ ! -e {flags / name} ]; do sleep 0.02; done{'; ' + then if then else ''}"


# -- time limits and bills ----------------------------------------------------------------------
@pytest.mark.parametrize("jump", JUMPS)
def test_time_limits_and_bills_count_held_seconds_not_the_wall_step(make, jump: float) -> None:  # noqa: ANN001
    clock = ManualClock(T0)
    svc = make(clock)
    a = svc.submit({"name": "a", "command": "sleep 600", "gpus": 2, "time_limit": 60}, "alice")
    b = svc.submit({"name": "b", "command": "sleep 600", "gpus": 1, "time_limit": 30}, "alice")
    svc.round()  # both launch at 0
    assert set(svc.running) == {str(a), str(b)}
    clock.advance(10)
    clock.jump(jump)
    svc.round()  # 10 s held, whatever the wall clock says
    assert set(svc.running) == {str(a), str(b)}
    clock.advance(20)
    svc.round()  # b: 30 s held, at its limit, not over it
    assert set(svc.running) == {str(a), str(b)}
    clock.advance(0.5)
    svc.round()
    assert set(svc.running) == {str(a)}
    clock.advance(29.5)
    svc.round()  # a: 60 s
    assert set(svc.running) == {str(a)}
    clock.advance(0.5)
    svc.round()
    assert not svc.running
    for jid, held, gpus, limit in ((a, 60.5, 2, 60), (b, 30.5, 1, 30)):
        row = svc.store.get_job(jid)
        assert (row.state, row.reason) == ("failed", f"time limit of {limit} s reached")
        assert (row.held_time, row.held_gpu_time) == (held, held * gpus)
    # the bill: the seconds held, not the wall clock's 2 h
    recs = {r["id"]: r for r in history(svc.store, clock.time())}
    assert (recs[a]["held_s"], recs[a]["gpu_hours"]) == (60.5, 121.0 / 3600)
    assert (recs[b]["held_s"], recs[b]["gpu_hours"]) == (30.5, 30.5 / 3600)


# -- exits while launching ------------------------------------------------------------------------
@pytest.mark.parametrize("jump", JUMPS)
def test_exits_of_launching_jobs_across_a_step_end_them_and_the_rounds_go_on(make, tmp_path: Path,  # noqa: ANN001
                                                                               jump: float) -> None:
    flags = job_writable(tmp_path)
    clock = ManualClock(T0)
    svc = make(clock)
    a = svc.submit({"name": "a", "command": flagged(flags, "a"), "gpus": 2}, "alice")
    svc.round()  # a launches at 0 (launching: it prints no progress)
    clock.advance(5)
    b = svc.submit({"name": "b", "command": flagged(flags, "b"), "gpus": 2}, "alice")
    clock.jump(jump)
    svc.round()  # b launches at 5, after the step
    assert {j: svc.jobs[j].lifecycle.state for j in svc.jobs} == {str(a): S.LAUNCHING, str(b): S.LAUNCHING}
    (flags / "a").touch()
    (flags / "b").touch()
    wait(lambda: not svc.executor.alive(str(a)) and not svc.executor.alive(str(b)), "both jobs to exit")
    clock.advance(1)
    svc.round()  # both exits reaped at 6
    assert not svc.jobs and not svc.running
    for jid, held in ((a, 6.0), (b, 1.0)):
        row = svc.store.get_job(jid)
        assert (row.state, row.exit_code, row.held_time, row.held_gpu_time) == ("finished", 0, held, 2 * held)
    # the rounds go on: a new job launches
    c = svc.submit({"name": "c", "command": "sleep 600", "gpus": 4}, "alice")
    svc.round()
    assert set(svc.running) == {str(c)}


# -- launch timeout and protection ------------------------------------------------------------------
@pytest.mark.parametrize("jump", JUMPS)
def test_launch_timeout_and_protection_run_on_the_monotonic_clock(make, jump: float) -> None:  # noqa: ANN001
    clock = ManualClock(T0)
    svc = make(clock, protect_factor=3.0, launch_timeout_s=60.0)
    p = str(svc.submit({"name": "p", "command": "echo GPULOOM_PROGRESS iter=0; sleep 600", "gpus": 1}, "alice"))
    q = str(svc.submit({"name": "q", "command": "sleep 600", "gpus": 1}, "alice"))
    svc.round()  # both launch at 0
    wait(lambda: b"GPULOOM_PROGRESS" in svc.log_path(p).read_bytes(), "p's progress line")
    clock.advance(2)
    svc.observe()  # p's line (no t=) seen at 2: launched in 2 s, protected until 2 + 3 x 2 = 8
    lp, lq = svc.jobs[p].lifecycle, svc.jobs[q].lifecycle
    assert (lp.state, lp.last_launch_time, lp.protected_until) == (S.RUNNING_PROTECTED, 2.0, 8.0)
    clock.advance(1)
    clock.jump(jump)
    svc.observe()  # 3: still protected; q still within its launch timeout
    assert (lp.state, lq.state) == (S.RUNNING_PROTECTED, S.LAUNCHING)
    clock.advance(5.5)
    svc.observe()  # 8.5: protection over (at 8)
    assert (lp.state, lq.state) == (S.RUNNING, S.LAUNCHING)
    assert [(t, s) for t, s in lp.history if s in (S.RUNNING_PROTECTED, S.RUNNING)] == \
        [(2.0, S.RUNNING_PROTECTED), (8.0, S.RUNNING)]
    clock.advance(51.4)
    svc.observe()  # 59.9: q has not timed out
    assert lq.state is S.LAUNCHING
    clock.advance(0.1)
    svc.observe()  # 60: it has; it printed nothing, so it ran from its process start (at 0): no launch time,
    assert (lq.state, lq.last_launch_time, lq.since) == (S.RUNNING, 0.0, 0.0)  # and no protection


@pytest.mark.parametrize(("jump", "ready"), [pytest.param(H2, 1.0, id="forward-2h"),
                                             pytest.param(-H2, 3.0, id="back-2h")])
def test_a_progress_line_dated_across_a_step_counts_between_the_last_look_and_now(make, tmp_path: Path,  # noqa: ANN001
                                                                                  jump: float, ready: float) -> None:
    """The line says t = 2.5 s after the launch (wall), then the wall clock steps before the service
    reads it at 3: its date cannot be compared with the service's wall time; it counts at the nearer
    end of what the service knows (no line at its look at 1, the line at 3)."""
    flags = job_writable(tmp_path)
    clock = ManualClock(T0)
    svc = make(clock, protect_factor=3.0)
    line = f"echo GPULOOM_PROGRESS iter=0 t={T0 + 2.5!r}; sleep 600"
    j = str(svc.submit({"name": "j", "command": flagged(flags, "go", line), "gpus": 1, "iterations": 1000,
                        "iteration_time": 0.1}, "alice"))
    svc.round()  # launch at 0
    clock.advance(1)
    svc.observe()  # nothing printed yet
    lc = svc.jobs[j].lifecycle
    assert lc.state is S.LAUNCHING
    (flags / "go").touch()
    wait(lambda: b"GPULOOM_PROGRESS" in svc.log_path(j).read_bytes(), "the progress line")
    clock.advance(2)
    clock.jump(jump)
    svc.observe()
    assert (lc.state, lc.last_launch_time) == (S.RUNNING_PROTECTED, ready)
    assert svc.jobs[j].remaining == pytest.approx(100.0 - (3.0 - ready) * svc.jobs[j].speed, abs=1e-9)


# -- arrivals ----------------------------------------------------------------------------------------
def test_a_job_submitted_after_a_step_back_queues_behind_one_submitted_before(make) -> None:  # noqa: ANN001
    """Finish-time fairness puts the job waiting longest first: x, by its arrival (kept by a rebuild)."""
    clock = ManualClock(T0)
    src = Source()
    svc = make(clock, order="ftf", inventory=src)
    r = svc.submit({"name": "r", "command": "sleep 600", "gpus": 4}, "alice")
    svc.round()  # r holds every GPU
    clock.advance(1)
    x = svc.submit({"name": "x", "command": "sleep 600", "gpus": 4}, "alice")
    svc.round()  # x arrives at 1
    clock.jump(-H2)
    clock.advance(1)
    y = svc.submit({"name": "y", "command": "sleep 600", "gpus": 4}, "alice")
    svc.round()  # y arrives at 2, after x (its wall-clock submit time is 2 h earlier)
    assert (svc.jobs[str(x)].spec.arrival, svc.jobs[str(y)].spec.arrival) == (1.0, 2.0)
    clock.advance(1)
    src.next = InventoryChange(svc.cluster, frozenset(), 0.0)
    assert follow(svc)  # a rebuild (as when a node joins) loads them again
    assert (svc.jobs[str(x)].spec.arrival, svc.jobs[str(y)].spec.arrival) == (1.0, 2.0)
    svc.cancel(r, "alice", False)
    svc.round()
    assert set(svc.running) == {str(x)}


# -- display -------------------------------------------------------------------------------------------
def test_cluster_samples_keep_their_pace_and_show_the_wall_clock(make) -> None:  # noqa: ANN001
    clock = ManualClock(T0)
    svc = make(clock)
    svc.round()
    clock.advance(2)
    clock.jump(-H2)
    svc.round()  # 2 s after the first sample: the next one, dated as the wall clock says
    clock.advance(1)
    svc.round()  # 1 s later: none
    clock.jump(2 * H2)
    svc.round()  # the wall clock's 2 h ahead are no 2 s
    assert [p["time"] for p in svc.telemetry.samples] == [T0, T0 + 2 - H2]


# -- fences --------------------------------------------------------------------------------------------
class Source:
    """An inventory source the test changes by hand."""

    def __init__(self) -> None:
        self.next: InventoryChange | None = None

    def poll(self) -> InventoryChange | None:
        change, self.next = self.next, None
        return change


@pytest.mark.parametrize("jump", JUMPS)
def test_a_job_from_a_lost_node_waits_out_its_fence_whatever_the_wall_clock_does(make, jump: float) -> None:  # noqa: ANN001
    """Its old processes may run on until the fence has stopped them: released early, it would run twice."""
    nodes = (Node("n0", 2, 2, 4000), Node("n1", 2, 2, 4000))
    src = Source()
    clock = ManualClock(T0)
    svc = make(clock, cluster=Cluster(nodes), inventory=src)
    a = svc.submit({"name": "a", "command": "sleep 600", "gpus": 2}, "alice")
    svc.round()
    assert [p.node for p in svc.running[str(a)].procs.values()] == ["n0"]
    src.next = InventoryChange(Cluster(nodes[1:]), frozenset({"n0"}), fence_s=60.0)
    assert follow(svc)  # at 0: a is requeued, parked until 60
    assert svc.parked == {a: 60.0}
    clock.advance(1)
    clock.jump(jump)
    svc.round()
    clock.advance(58.9)
    svc.round()  # 59.9
    assert a in svc.parked and str(a) not in svc.running
    clock.advance(0.1)
    assert follow(svc)  # 60: its fence is over
    svc.round()
    assert [p.node for p in svc.running[str(a)].procs.values()] == ["n1"]


# -- restarts ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("jump", JUMPS)
@pytest.mark.parametrize("reboot", [False, True], ids=["same-boot", "other-boot"])
def test_a_restart_after_a_step_continues_held_time_from_where_it_was(make, jump: float, reboot: bool) -> None:  # noqa: ANN001
    """Killed at 20 s (marked at 20), down for 10 s during which the wall clock steps.  On the same boot the
    monotonic clock says how long it was down (10 s); on another boot only the wall clock does: a step
    back counts nothing, a step forward counts as downtime (nothing else can tell them apart)."""
    clock = ManualClock(T0)
    svc = make(clock)
    a = svc.submit({"name": "a", "command": "sleep 600", "gpus": 2, "time_limit": 60}, "alice")
    svc.round()  # launch at 0
    clock.advance(20)
    svc.round()
    assert json.loads(svc.store.get_meta("clock"))["service"] == 20.0
    # killed; down for 10 s
    if reboot:
        clock.reboot("boot-1")
    clock.advance(10)
    clock.jump(jump)
    svc = make(clock)
    svc.recover()
    down = 10.0 if not reboot else max(0.0, 10.0 + jump)
    assert svc.now() == 20.0 + down
    if down > 40:
        svc.round()  # over its limit at once: the wall gap, and no more, was counted
        row = svc.store.get_job(a)
        assert (row.state, row.held_time, row.held_gpu_time) == ("failed", 20.0 + down, 2 * (20.0 + down))
        return
    assert set(svc.running) == {str(a)}  # adopted
    clock.advance(40.0 - down)
    svc.round()  # 60 s held
    assert set(svc.running) == {str(a)}
    clock.advance(0.5)
    svc.round()
    row = svc.store.get_job(a)
    assert (row.state, row.held_time, row.held_gpu_time) == ("failed", 60.5, 121.0)


def test_resume_maps_the_mark_to_the_new_process() -> None:
    clock = ManualClock(T0 + 100)
    mark = json.dumps({"service": 40.0, "wall": T0 + 50, "monotonic": T0 + 50, "boot": "boot-0"})
    assert resume(clock, T0, None) == 100.0  # no mark: wall seconds since the epoch
    assert resume(clock, T0, "not json") == 100.0
    assert resume(clock, T0, json.dumps({"service": "x", "wall": 1, "monotonic": 1})) == 100.0
    assert resume(clock, T0, mark) == 90.0  # same boot: 50 monotonic seconds since the mark
    clock.jump(-H2)
    assert resume(clock, T0, mark) == 90.0  # ... whatever the wall clock says
    clock.reboot("boot-1")
    assert resume(clock, T0, mark) == 40.0  # another boot, a wall clock behind the mark: nothing counted
    clock.jump(2 * H2)
    assert resume(clock, T0, mark) == 40.0 + 50.0 + H2  # ahead: the wall gap, no more
    # a monotonic reading behind the mark's on the "same" boot (another time namespace): the wall gap
    clock = ManualClock(T0 + 100)
    clock.mono = 0.0
    assert resume(clock, T0, mark) == 90.0
    clock.jump(-H2)
    assert resume(clock, T0, mark) == 40.0
    st = ServiceTime(clock, 7.0)
    clock.advance(3)
    clock.jump(H2)
    assert st.now() == 10.0


# -- profiling ------------------------------------------------------------------------------------------
STEPPED = """\
import sys, time
base, step, at = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
k = 0
while True:
    # the job's own clock: 0.05 s a line, stepped by `step` from line `at` on
    print(f"GPULOOM_PROGRESS iter={k} t={base + 0.05 * k + (step if k >= at else 0.0)!r}", flush=True)
    k += 1
    time.sleep(0.05)
"""


@pytest.mark.serial  # a window of 0.5 s over lines 0.05 s apart
@pytest.mark.parametrize("jump", JUMPS)
def test_profiling_window_and_rate_survive_a_step_of_the_jobs_clock(tmp_path: Path, jump: float) -> None:
    """The profiled job's ``t=`` steps by 2 h at its 6th line: the window is measured after the step,
    the rate from lines on one side of it (20 it/s), and the run ends (it used to wait forever for
    a window that a step back never closes, or to measure 20 lines over 2 h)."""
    import os

    from gpuloom.runtime.exec.local import LocalExecutor
    from gpuloom.runtime.service.profiling import RealProfiler

    script = tmp_path / "stepped.py"
    script.write_text(STEPPED)
    cmd = f"{shlex.quote(JOB_PY)} {shared_copy(script)} {time.time()!r} {jump!r} 6"
    cores = sorted(os.sched_getaffinity(0))[:1]
    prof = RealProfiler(LocalExecutor("local"), f"p-{tmp_path.name[-12:]}", cmd, "local", (0,), cores, tmp_path,
                        warmup_s=0.1, window_s=0.5, startup_timeout_s=20.0, grace_s=1.0)
    out: list[float] = []
    th = threading.Thread(target=lambda: out.append(prof(1, 0)), daemon=True)
    th.start()
    th.join(30)  # (a run takes about 1 s)
    hung = th.is_alive()
    if hung:  # the window never closed: stop the run so that the test ends
        prof.executor.stop(prof.run_id(1, 0), 1.0)
        th.join(10)
    assert not hung
    # the job's t= near 1.7e9 s is a double 2.4e-7 s apart from the next: a rate over lines 0.05 s apart is
    # exact to 1e-5 of itself, not better (20.0000017 was seen); 20 lines over 2 h would read 0.0028
    assert out == [pytest.approx(20.0, rel=1e-5)]
    (run,) = prof.runs
    assert run.points >= 10 and math.isfinite(run.wall_s)


# -- processes: who they are, across a step ------------------------------------------------------------
@pytest.mark.parametrize("jump", JUMPS)
def test_a_process_recorded_before_a_wall_step_is_still_recognised(tmp_path: Path, jump: float) -> None:
    """A process's wall creation time is the boot time plus its age, and the boot time moves with the wall
    clock: recorded before a step, it no longer matches.  Its creation time since the boot (and the boot's
    id) does, so a restarted service adopts it, sees it alive, and stops it (it used to requeue the job,
    or, for a process already adopted, report it ended while it ran on)."""
    import dataclasses

    from gpuloom.runtime.exec.cgroups import CgroupManager
    from gpuloom.runtime.exec.executor import LaunchSpec
    from gpuloom.runtime.exec.local import NodeAgent

    first = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
    info = first.launch(LaunchSpec("j", "echo ready; sleep 30", "", (), (), 0, str(tmp_path / "j.log"), {}))
    try:
        assert info.since_boot is not None and info.boot is not None
        recorded = dataclasses.replace(info, start_time=info.start_time - jump)  # as the wall clock read then
        later = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")  # a restarted service
        for forged in (dataclasses.replace(recorded, since_boot=info.since_boot + 0.01),
                       dataclasses.replace(recorded, boot="another-boot")):
            assert not later.adopt(forged)  # pid reuse: another process, or another boot's
        assert later.adopt(recorded)
        assert later.alive("j") and later.poll() == {}
        wait(lambda: execed(info.pid, "sleep"), "the job's sleep to start")
        assert later.stop("j", 2.0) == 143
    finally:
        if first.alive("j"):
            first.stop("j", 0.5)


def test_orphans_are_found_by_their_pid_record_not_by_creation_times(tmp_path: Path) -> None:
    """A wrapper the previous service launched but never recorded is found from its pid file even when the
    wall clock stepped since (the file's time and the process's no longer compare); a process that
    merely shares the pid named there is not its wrapper and is left alone."""
    import os
    import subprocess

    from gpuloom.runtime.exec.cgroups import CgroupManager
    from gpuloom.runtime.exec.executor import LaunchSpec
    from gpuloom.runtime.exec.local import NodeAgent

    agent = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
    info = agent.launch(LaunchSpec("r", "echo ready; sleep 30", "", (), (), 0, str(tmp_path / "r.log"), {}))
    other = subprocess.Popen(["/bin/sh", "-c", "sleep 30; exit 0", "gpuloom-job"], start_new_session=True)
    try:
        pid_file = Path(agent.pid_path(info.exit_path))
        wait(lambda: pid_file.read_text().split() == [str(info.pid)], "the pid record")
        st = pid_file.stat()
        os.utime(pid_file, (st.st_atime, st.st_mtime - H2))  # written 2 h before the process began, it seems
        (tmp_path / "run" / "x.pid").write_text(f"{other.pid}\n")  # a record naming someone else's process
        later = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
        assert [(o.job_id, o.pid) for o in later.orphans()] == [("r", info.pid)]
    finally:
        other.kill()
        other.wait()
        if agent.alive("r"):
            agent.stop("r", 0.5)


@pytest.mark.parametrize("jump", JUMPS)
def test_a_nodes_fence_stops_processes_recorded_before_a_wall_step(tmp_path: Path, jump: float) -> None:
    """When a Ray node's raylet dies, its fence stops the job processes its agent recorded, so that the
    jobs, requeued elsewhere, never run twice; a record made before a wall step still names them."""
    import dataclasses
    import os
    import subprocess

    from gpuloom.runtime.exec.cgroups import CgroupManager
    from gpuloom.runtime.exec.executor import LaunchSpec
    from gpuloom.runtime.exec.local import NodeAgent
    from gpuloom.runtime.exec.ray_agent import fence_entry, fence_main

    run = tmp_path / "run"
    agent = NodeAgent(CgroupManager(enabled=False), run)
    info = agent.launch(LaunchSpec("j", "echo ready; sleep 30", "", (), (), 0, str(tmp_path / "j.log"), {}))
    try:
        wait(lambda: execed(info.pid, "sleep"), "the job's sleep to start")
        recorded = dataclasses.replace(info, start_time=info.start_time - jump)  # as the wall clock read then
        (run / "fence.json").write_text(json.dumps({"grace_s": 2.0, "cgroup_parent": None,
                                                    "procs": {"j": fence_entry(recorded)}}))
        gone = subprocess.Popen(["true"])
        gone.wait()  # the raylet: dead
        assert fence_main(gone.pid, str(run)) == 0
        # stopped on the SIGTERM (143), and gone once the fence ends; a record the fence could not match
        # would have left it running
        assert not agent.alive("j") and agent.poll() == {"j": 143}
    finally:
        if agent.alive("j"):
            os.killpg(info.pid, 9)
            agent.poll()
