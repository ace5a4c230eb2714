"""The simulator's half of the validation (sim/validate.py), and what the simulator learned from the service:
a round's launches wait for its stops; per-job lifecycle times measured by the service."""

from __future__ import annotations

import math
import shlex

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.core.lifecycle import JobState, Lifecycle, LifecycleTimes
from gpuloom.driver import Stack
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.validate import (
    STACKS,
    Outcome,
    SimSetup,
    TestbedJob,
    compare,
    gpu_util,
    lifecycle_attrs,
    outcomes_of,
    scale_workload,
    simulate,
    table,
    with_attrs,
)

S = JobState
CL = Cluster.homogeneous(1, 4, 48, 256_000)  # 12 cores per GPU


def test_a_start_may_wait_for_a_barrier() -> None:
    lc = Lifecycle("a", 0.0)
    lc.to(S.WAITING_FOR_INITIAL_RESOURCE, 0.0)
    ready = LifecycleTimes().schedule(lc, None, (S.STANDBY, S.LAUNCHING, S.RUNNING_PROTECTED), 1.0, (2.0, 0, 0), 4.0)
    assert ready == 6.0 and lc.state is S.STANDBY
    assert lc.planned == [(4.0, S.LAUNCHING), (6.0, S.RUNNING_PROTECTED)]


@pytest.mark.parametrize(("wait", "b_finish", "a_finish"), [(False, 16.0, 108.0), (True, 19.0, 111.0)])
def test_a_rounds_launches_wait_for_its_stops(wait: bool, b_finish: float, a_finish: float) -> None:
    # A runs from 0 (1 s launch); B arrives at 10 and preempts it (SRTF); A's checkpoint takes 3 s.
    # At the decision: B launches 10-11, done at 16; A relaunches at 16 (17-108).
    # Like the service: B launches once A's stop is done, 13-14, done at 19; A relaunches 19-20, done at 111.
    cl = Cluster.homogeneous(1, 1)
    specs = [JobSpec("a", 0.0, 1, 100.0), JobSpec("b", 10.0, 1, 5.0)]
    cfg = SimConfig(round_len=1000.0, reschedule_on_arrival=True, reschedule_on_completion=True,
                    lifecycle=LifecycleTimes(1.0, 3.0, 0.0, 0.0), starts_wait_for_stops=wait)
    sched, model = Stack("srtf").build(cl)
    res = Simulator(cl, specs, sched, model, cfg).run()
    assert (res.jct("b") + 10.0, res.jct("a")) == (b_finish, a_finish)


def test_measured_lifecycle_times_per_job() -> None:
    row = {"attrs": {"launch_time": 0.5, "exit_s": 0.4, "checkpoint_time": 1.25, "stop_time": 0.0,
                     "allocations": [{"launch_s": 0.4}, {"launch_s": 0.6}, {"launch_s": None}]}}
    assert lifecycle_attrs(row) == {"launch_time": 0.7, "checkpoint_time": 1.25, "stop_time": 0.0}
    assert lifecycle_attrs({"attrs": {}}) == {}
    specs = with_attrs([JobSpec("a", 0.0, 1, 10.0)], {"a": {"launch_time": 2.0}})
    res = simulate(specs, Cluster.homogeneous(1, 1), Stack(), SimSetup(round_s=1.0))
    assert res.jct("a") == 12.0  # the job's own launch time, not the setup's 0


def test_testbed_job_is_the_same_job_on_both_faces() -> None:
    j = TestbedJob("7", 3.0, 1, 40, (0.2, 0.1, 0.05), 12, 24, "dqn")
    assert j.iter_time == pytest.approx(0.35) and j.work == pytest.approx(14.0)
    # CPU stage 0.2 s at its 12 proportional cores, 0.1 s at 24 or more, 0.4 s at 6
    assert [j.step_time(c) for c in (6, 12, 24, 48)] == pytest.approx([0.55, 0.35, 0.25, 0.25])
    rec = j.profile_record(CL)
    assert rec["cpu_points"] == list(range(1, 49)) and rec["mem_points"] == [256_000]
    assert rec["matrix"][11] == [pytest.approx(1 / 0.35, abs=1e-6)]
    s = j.spec(CL, arrival=3.5, attrs={"launch_time": 0.3})
    assert (s.arrival, s.gpus, s.iterations, s.iter_time, s.model) == (3.5, 1, 40, pytest.approx(0.35), "dqn")
    assert s.attrs["resource_times"] == [0.2, 0.1, 0.05] and s.attrs["launch_time"] == 0.3
    assert s.profile.throughput_at(24, 1000, 1) == pytest.approx(4.0, abs=1e-5)
    cmd = shlex.split(j.command("/py", "/ex/sleepy_train.py", "/locks"))
    assert cmd == ["/py", "/ex/sleepy_train.py", "--steps", "40", "--stages", "0.100000,0.100000,0.050000",
                   "--cpu-ref", "24", "--gpu-lock-dir", "/locks"]
    body = j.submit_body(CL, "/py", "/ex/sleepy_train.py", "/locks")
    assert (body["iterations"], body["iteration_time"], body["resource_times"]) == (40, pytest.approx(0.35),
                                                                                    [0.2, 0.1, 0.05])


def test_scale_workload_slices_and_scales_a_trace() -> None:
    rt = {"resource_times": (0.5, 0.3, 0.2), "iteration_time": 1.0}
    specs = [JobSpec.from_iterations(str(i), 100.0 + 10 * i, g, n, 1.0, model="m", attrs=rt)
             for i, (g, n) in enumerate([(8, 100), (16, 300), (2, 200), (32, 10_000), (8, 50)])]
    w = scale_workload(specs, CL, n=4, start=1, step_s=0.5, median_s=20.0, lo_s=5.0, hi_s=60.0, span_s=30.0)
    assert [j.id for j in w] == ["1", "2", "3", "4"]
    assert [j.arrival for j in w] == [0.0, 10.0, 20.0, 30.0]
    assert [j.gpus for j in w] == [2, 1, 4, 1]  # divided by 8, at least 1, at most a node
    assert all(j.stages == (0.25, 0.15, 0.1) for j in w)  # the median iteration: 0.5 s
    # work scaled so the median (250 s) becomes 20 s, then clipped to [5, 60]: 24, 16, 60 (800), 5 (4)
    assert [j.iterations for j in w] == [48, 32, 120, 10]
    assert [(j.prop_cpus, j.cpu_ref) for j in w] == [(24, 48), (12, 24), (48, 48), (12, 24)]  # loading: half
    with pytest.raises(ValueError, match="no jobs from index 9"):
        scale_workload(specs, CL, start=9)


def test_compare_and_utilisation() -> None:
    real = {"a": Outcome(0.0, 10.0), "b": Outcome(1.0, 21.0), "c": Outcome(2.0, 7.0)}
    sim = {"a": Outcome(0.0, 11.0), "b": Outcome(1.0, 21.0), "d": Outcome(0.0, 1.0)}
    c = compare(real, sim, 0.5, 0.55)
    assert (c["jobs"], c["missing"]) == (2, ["c", "d"])
    assert c["jct_err_median"] == pytest.approx(0.05) and c["jct_err_p95"] == pytest.approx(0.095)
    assert (c["mean_jct_real"], c["mean_jct_sim"], c["mean_jct_err"]) == (15.0, 15.5, pytest.approx(1 / 30))
    assert (c["makespan_real"], c["makespan_sim"]) == (21.0, 21.0) and c["util_err"] == pytest.approx(0.05)
    assert "| s | 2 | 5.0% | 9.5% | 15.0 / 15.5 s (+3.3%) | 21.0 / 21.0 s (+0.0%) | 50% / 55% |" in table({"s": c})
    with pytest.raises(ValueError, match="no job finished on both sides"):
        compare({"a": Outcome(0, 1)}, {})
    # two GPUs over [0, 10]: GPU 0 held 0-4 by one job and 2-6 by a co-runner (counted once), GPU 1 5-10
    assert gpu_util([(0, 4, [0]), (2, 6, [0]), (5, 12, [1])], 2, 0, 10) == pytest.approx(11 / 20)
    assert gpu_util([], 2, 0, 0) == 0.0


def test_the_three_stacks_simulate_a_small_workload() -> None:
    jobs = [TestbedJob(str(i), 2.0 * i, g, 20, st, 12 * g, 24 * g if st[0] > 0.1 else 12 * g)
            for i, (g, st) in enumerate([(1, (0.2, 0.05, 0.0)), (2, (0.02, 0.2, 0.03)), (1, (0.0, 0.25, 0.0)),
                                         (4, (0.05, 0.1, 0.05)), (1, (0.15, 0.1, 0.0)), (2, (0.1, 0.1, 0.0))])]
    specs = [j.spec(CL) for j in jobs]
    for label, st in STACKS.items():
        res = simulate(specs, CL, st, SimSetup(round_s=2.0, lifecycle=LifecycleTimes(0.2, 0.5, 0.0, 3.0)))
        out = outcomes_of(res)
        assert len(out) == len(jobs), label
        # nobody finishes faster than alone at its best cores
        assert all(out[j.id].jct >= j.iterations * j.step_time(j.cpu_ref) - 1e-6 for j in jobs), label
        assert not math.isnan(res.summary()["gpu_util"])
