"""The simulator and the service make the same plan for the same cluster and queue.

Both use ``Scheduler.from_names``; the simulator's jobs come from JobSpecs, the
service's from its store (submitted specs, time limit = duration).  The
service really carries its plan out (real ``sleep`` processes through the
process executor) and what it runs afterwards is compared with the simulator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.core.lifecycle import JobState
from gpuloom.core.plan import Allocation
from gpuloom.perf.assembly import build_model
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import HOLDING, Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from service_util import job_writable

# (gpus, duration): first wave at t=0, second wave at t=1
WAVE1 = [(2, 500.0), (4, 100.0), (1, 300.0), (3, 50.0), (2, 200.0)]
WAVE2 = [(1, 10.0), (4, 20.0)]
# Muri stage times (s per iteration: storage, CPU, GPU, network), alternating bottlenecks
STAGES = ([0.05, 0.3, 0.1, 0.05], [0.05, 0.1, 0.3, 0.05])


def stages(i: int) -> list[float]:
    return STAGES[i % 2]


def sim_plans(cluster: Cluster, order: str, place: str, group: str = "none") -> list[dict[str, Allocation]]:
    specs = [JobSpec(str(i + 1), 0.0, g, d, attrs={"resource_times": stages(i)}) for i, (g, d) in enumerate(WAVE1)]
    specs += [JobSpec(str(len(WAVE1) + i + 1), 1.0, g, d, attrs={"resource_times": stages(len(WAVE1) + i)})
              for i, (g, d) in enumerate(WAVE2)]
    plans: dict[float, dict[str, Allocation]] = {}

    def observe(sim: Simulator, what: str) -> None:
        if what == "round":  # the last round at each instant
            plans[sim.now] = dict(sim.current)

    sched = Scheduler.from_names(order, group, "proportional", place)
    cfg = SimConfig(round_len=1000.0, reschedule_on_arrival=True, max_time=1.5)
    # the same throughput model the service builds (as `simulate` does)
    Simulator(cluster, specs, sched, build_model(cluster), config=cfg, observers=[observe]).run()
    assert sorted(plans) == [0.0, 1.0]
    return [plans[0.0], plans[1.0]]


@pytest.mark.parametrize(
    "order,place,group",
    [("fifo", "packed-sticky", "none"), ("sjf", "packed-sticky", "none"), ("sjf", "packed-non-sticky", "none"),
     ("fifo", "random-sticky", "none"), ("sjf", "random-sticky", "none"), ("fifo", "packed-non-sticky", "none"),
     ("fifo", "packed-sticky", "muri")],
)
def test_simulator_and_service_make_the_same_plan(
    tmp_path: Path, order: str, place: str, group: str, cgroup_parent: str
) -> None:
    cluster = Cluster.homogeneous(2, 4)
    expected = sim_plans(cluster, order, place, group)
    assert len(expected) == 2
    if group == "muri":  # jobs really share GPUs in this scenario
        assert any(a.group for a in expected[0].values())

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names(order, group, "proportional", place),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0))
    try:
        got = []
        k = 0
        for wave in (WAVE1, WAVE2):
            for g, d in wave:
                svc.submit({"name": "j", "command": "sleep 60", "gpus": g, "time_limit": d,
                            "resource_times": stages(k)}, "alice")
                k += 1
            svc.round()
            got.append(dict(svc.current))
            # what the store says runs is what was planned
            running = {str(r.id) for r in store.list_jobs(HOLDING)}
            assert running == set(svc.current)
        assert got == expected
        assert any(len(p) for p in expected)
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


# ---------------------------------------------------------------------------------------------
# the same instant in both faces: a co-runner completion, then a service restart
# Muri pairs on one 4-GPU node: a GPU-heavy and a CPU-heavy job share 2 GPUs
PAIRS = [(2, 40.0, [0.0, 0.1, 0.3, 0.0]), (2, 400.0, [0.0, 0.3, 0.1, 0.0]),
         (2, 500.0, [0.0, 0.1, 0.3, 0.0]), (2, 600.0, [0.0, 0.3, 0.1, 0.0])]
ZERO = None  # set below: lifecycle times of zero, as a service whose jobs launch at once


def _sim_at_completion(cluster: Cluster) -> tuple[float, dict[str, tuple[float, tuple[str, ...], float]], float]:
    """The simulator's instant the first job completes: (time, id -> (remaining, group, speed), next event)."""
    from gpuloom.core.lifecycle import LifecycleTimes

    specs = [JobSpec(str(i + 1), 0.0, g, d, attrs={"resource_times": rt}) for i, (g, d, rt) in enumerate(PAIRS)]
    seen: dict = {}

    def observe(sim: Simulator, what: str) -> None:
        if what == "complete" and not seen:
            for j in sim.active.values():
                j.advance(sim.now)  # remaining work is kept lazily
            seen["t"] = sim.now
            seen["jobs"] = {jid: (j.remaining, j.alloc.group, j.speed) for jid, j in sim.active.items()
                            if j.alloc is not None}
            seen["next"] = min(j.predicted_finish(sim.now) for j in sim.active.values())

    cfg = SimConfig(round_len=100_000.0, reschedule_on_arrival=True,
                    lifecycle=LifecycleTimes(launch=0.0, checkpoint=0.0, stop=0.0, protect_factor=0.0))
    sched = Scheduler.from_names("fifo", "muri", "proportional", "packed-sticky")
    Simulator(cluster, specs, sched, build_model(cluster), config=cfg, observers=[observe]).run()
    return seen["t"], seen["jobs"], seen["next"]


def test_service_matches_simulator_at_a_co_runner_completion_and_after_a_restart(
    tmp_path: Path, cgroup_parent: str
) -> None:
    import time

    from gpuloom.runtime.exec.clock import ManualClock

    cluster = Cluster.homogeneous(1, 4)
    t_done, expect, t_next = _sim_at_completion(cluster)
    assert any(g == () for _, g, _ in expect.values())  # the finished job's partner now runs alone
    assert any(g != () for _, g, _ in expect.values())  # and another pair still shares
    flags = job_writable(tmp_path) / "flags"  # the jobs run as the service's job account
    flags.mkdir()
    clock = ManualClock()
    epoch = clock.time()
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")

    def service() -> Service:
        return Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                       Scheduler.from_names("fifo", "muri", "proportional", "packed-sticky"), ServiceConfig(tmp_path,
                       round_s=1000.0, grace_s=0.0, launch_timeout_s=0.0, protect_factor=0.0, clock=clock))

    svc = killed = service()
    try:
        for g, d, rt in PAIRS:  # each job runs until its flag file appears
            svc.submit({"name": "j", "command": f"while [ ! -e {flags}/$GPULOOM_JOB_ID ]; do sleep 0.02; done",
                        "gpus": g, "time_limit": d, "resource_times": rt}, "alice")
        svc.round()  # t = 0: plan and launch
        svc.observe()  # t = 0: no progress lines, launch timeout 0: progressing from now on
        assert all(j.lifecycle.makes_progress and j.busy_until == 0.0 for j in svc.jobs.values())
        # the first job completes at the simulator's instant
        clock.set(epoch + t_done)
        first = next(jid for jid in svc.jobs if jid not in expect)
        (flags / first).touch()
        deadline = time.monotonic() + 20
        while svc.executor.alive(first) and time.monotonic() < deadline:
            time.sleep(0.02)
        svc.observe()
        assert first not in svc.jobs and store.get_job(int(first)).state == "finished"
        for j in svc.jobs.values():
            j.advance(svc.now())  # remaining work is kept lazily, as in the simulator
        got = {jid: (j.remaining, svc.current[jid].group, j.speed) for jid, j in svc.jobs.items()}
        assert got.keys() == expect.keys()
        for jid, (rem, group, speed) in expect.items():
            assert got[jid][0] == pytest.approx(rem, rel=1e-9, abs=1e-9)
            assert got[jid][1] == group and got[jid][2] == pytest.approx(speed, rel=1e-12)
        # the service is killed (nothing shut down) and restarts later: same work, group and speed
        t_restart = t_done + 7.0
        assert t_restart < t_next  # the simulator has no event in between
        clock.set(epoch + t_restart)
        svc2 = service()
        svc2.recover()
        assert svc2.jobs.keys() == expect.keys()
        for jid, (rem, group, speed) in expect.items():
            j = svc2.jobs[jid]
            assert j.speed == pytest.approx(speed, rel=1e-12) and svc2.current[jid].group == group
            assert j.remaining == pytest.approx(rem - (t_restart - t_done) * speed, rel=1e-9, abs=1e-9)
        svc = svc2
    finally:
        for jid in list(svc.jobs):
            (flags / jid).touch()
        svc.terminate_all()
        svc.shutdown()
        if killed is not svc:  # the killed one's stop threads (a killed server's die with it)
            killed.actuator.close()
        store.close()


def test_a_launch_ends_when_the_job_printed_its_first_progress_line_not_when_a_round_saw_it(
    tmp_path: Path, cgroup_parent: str
) -> None:
    """Rounds are seconds apart: a job ready 0.5 s after its launch and noticed at 3 s was working for 2.5 s
    (its remaining work, its launch time and its protection say so); a line dated outside [launch, now]
    (a wrong clock, a lying job) counts as printed at the nearer end."""
    import time

    from gpuloom.runtime.exec.clock import ManualClock

    cluster = Cluster.homogeneous(1, 4)
    clock = ManualClock()
    epoch = clock.time()
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"), ServiceConfig(tmp_path,
                  round_s=1000.0, grace_s=0.0, launch_timeout_s=60.0, protect_factor=3.0, clock=clock))
    try:
        ids = [svc.submit({"name": "j", "command": f"echo GPULOOM_PROGRESS iter=0 t={t!r}; sleep 60", "gpus": 1,
                           "iterations": 1000, "iteration_time": 0.1}, "alice")
               for t in (epoch + 0.5, epoch - 50.0, epoch + 50.0)]
        svc.round()  # t = 0: launch
        jobs = [svc.jobs[str(i)] for i in ids]
        assert all(j.lifecycle.state is JobState.LAUNCHING for j in jobs)
        deadline = time.monotonic() + 20
        while not all(svc.log_path(i).exists() and b"GPULOOM" in svc.log_path(i).read_bytes() for i in ids):
            assert time.monotonic() < deadline, "the jobs printed nothing"
            time.sleep(0.02)
        clock.set(epoch + 3.0)
        svc.observe()
        for j, ready in zip(jobs, (0.5, 0.0, 3.0), strict=True):
            lc = j.lifecycle
            assert [(t, s) for t, s in lc.history if s is JobState.RUNNING_PROTECTED] == [(pytest.approx(ready), JobState.RUNNING_PROTECTED)]
            assert lc.last_launch_time == pytest.approx(ready, abs=1e-6)
            # protected for 3 x the launch time from the line on (not from when the round saw it)
            expect = [(JobState.RUNNING, 4 * ready)] if 4 * ready <= 3.0 else [(JobState.RUNNING_PROTECTED, ready)]
            assert [(lc.state, lc.since)] == [(s, pytest.approx(t)) for s, t in expect]
            assert j.remaining == pytest.approx(100.0 - (3.0 - ready) * j.speed, abs=1e-6)
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
