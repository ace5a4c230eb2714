"""Jobs that can never run: detected at load (core.fit), and the simulator's stall guard."""

from __future__ import annotations

import pytest

from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.fit import FitChecker, impossible_jobs, impossible_message, never_fits
from gpuloom.core.job import JobError, JobSpec
from gpuloom.policies.base import PlacePolicy, make
from gpuloom.scheduler import Scheduler
from gpuloom.sim import Simulator, simulate
from gpuloom.sim.engine import STALL_ROUNDS, SimConfig

ONE_BY_EIGHT = Cluster.homogeneous(1, 8)  # 24 cores, 512,000 MB
TWO_BY_TWO = Cluster.homogeneous(2, 2, cpus_per_node=4, mem_mb_per_node=1000)


def spec(gpus: int = 1, cpus: int | None = None, mem_mb: int | None = None, **attrs: object) -> JobSpec:
    return JobSpec("j", 0, gpus, 100, cpus=cpus, mem_mb=mem_mb, attrs=attrs)


def test_gpus_cores_and_memory_beyond_the_cluster() -> None:
    assert never_fits(spec(9), ONE_BY_EIGHT) == "needs 9 GPUs, the cluster has 8"
    assert never_fits(spec(1, cpus=100), ONE_BY_EIGHT) == "needs 100 CPU cores, the cluster has 24"
    assert never_fits(spec(1, mem_mb=600_000), ONE_BY_EIGHT) == "needs 600000 MB of memory, the cluster has 512000"
    assert never_fits(spec(8, cpus=24, mem_mb=512_000), ONE_BY_EIGHT) is None
    assert never_fits(spec(1), ONE_BY_EIGHT) is None


def test_cores_per_node_decide_for_single_and_spanning_jobs() -> None:
    four = Cluster.homogeneous(4, 8)  # 96 cores in all, 24 per node
    # one GPU lives on one node: 30 cores never fit, although the cluster has 96
    why = never_fits(spec(1, cpus=30), four)
    assert why == "needs 30 CPU cores: no placement gives it that (the largest node has 24 cores)"
    # 2 GPUs, 6 cores on 2x(2 GPUs, 4 cores): one GPU per node with 3 cores each -> fits (spanning)
    assert never_fits(spec(2, cpus=6), TWO_BY_TWO) is None
    # 2 GPUs, 9 cores on 3x(2 GPUs, 4 cores): 12 cores in all, but a node holding one of its GPUs
    # must give ceil(9/2) = 5 > 4 cores
    three = Cluster.homogeneous(3, 2, cpus_per_node=4)
    assert never_fits(spec(2, cpus=9), three) == (
        "needs 9 CPU cores with 2 GPUs (4.5 per GPU): no placement gives it that (the largest node has 4 cores)")
    # 2 GPUs, 1,500 MB: 750 MB per GPU, one GPU on each node fits
    assert never_fits(spec(2, mem_mb=1500), TWO_BY_TWO) is None
    # 4 GPUs, 1,500 MB on 2,000 MB in all: a node with 2 of its GPUs must give 750 MB -> fits
    assert never_fits(spec(4, mem_mb=1500), TWO_BY_TWO) is None
    assert "MB of memory with 3 GPUs" in never_fits(spec(3, mem_mb=1900), TWO_BY_TWO)  # ceil(1900*2/3) > 1000


def test_gpu_type_restricts_the_nodes() -> None:
    mixed = Cluster((Node("v0", 8, 24, 500_000, "V100"), Node("a0", 4, 64, 1_000_000, "A100")))
    assert never_fits(spec(1, gpu_type="H100"), mixed) == "needs GPU type H100, the cluster has A100, V100"
    assert never_fits(spec(6, gpu_type="A100"), mixed) == "needs 6 GPUs, the cluster has 4 of type A100"
    assert never_fits(spec(6, gpu_type=["A100", "V100"]), mixed) is None
    assert never_fits(spec(1, cpus=40, gpu_type="V100"), mixed) == (
        "needs 40 CPU cores, the cluster has 24 on nodes of type V100")
    assert never_fits(spec(1, cpus=40), mixed) is None  # the A100 node has 64 cores
    assert never_fits(spec(1, gpu_type="V100|A100"), mixed) is None


def test_impossible_jobs_lists_all_and_caches_by_request() -> None:
    specs = [JobSpec(f"j{i}", 0, 1, 10, cpus=c) for i, c in enumerate([4, 100, 8, 100, 30])]
    assert impossible_jobs(specs, ONE_BY_EIGHT) == {
        "j1": "needs 100 CPU cores, the cluster has 24", "j3": "needs 100 CPU cores, the cluster has 24",
        "j4": "needs 30 CPU cores, the cluster has 24"}
    check = FitChecker(ONE_BY_EIGHT)
    for s in specs:
        check.never_fits(s)
    assert len(check._cache) == 4
    msg = impossible_message(impossible_jobs(specs, ONE_BY_EIGHT), "--drop-impossible")
    assert msg == ("job j1: needs 100 CPU cores, the cluster has 24; 2 more jobs can never run either "
                   "(use --drop-impossible to count such jobs as unfinished)")


def test_impossible_jobs_answers_jobs_of_one_shape_by_their_gpu_types() -> None:
    # one answer per shape for jobs asking no GPU type (none, None or ""); a type asked is checked each time
    mixed = Cluster((Node("v0", 8, 24, 500_000, "V100"), Node("a0", 4, 64, 1_000_000, "A100")))
    specs = [JobSpec("any", 0, 6, 10), JobSpec("a100", 0, 6, 10, attrs={"gpu_type": "A100"}),
             JobSpec("none", 0, 6, 10, attrs={"gpu_type": None}), JobSpec("v100", 0, 6, 10, attrs={"gpu_type": "V100"}),
             JobSpec("empty", 0, 6, 10, attrs={"gpu_type": ""}), JobSpec("h100", 0, 1, 10, attrs={"gpu_type": "H100"}),
             JobSpec("cores", 0, 1, 10, cpus=70), JobSpec("big", 0, 13, 10, attrs={"queue": "q"})]
    assert impossible_jobs(specs, mixed) == {
        "a100": "needs 6 GPUs, the cluster has 4 of type A100",
        "h100": "needs GPU type H100, the cluster has A100, V100",
        "cores": "needs 70 CPU cores: no placement gives it that (the largest node has 64 cores)",
        "big": "needs 13 GPUs, the cluster has 12"}
    assert impossible_jobs(specs, mixed) == {s.id: why for s in specs if (why := never_fits(s, mixed)) is not None}


def test_simulator_refuses_or_drops_impossible_jobs_and_terminates() -> None:
    # formerly a hang: one job of 100 cores on 1x8, with or without drop_impossible
    big = [JobSpec("j1", 0, 1, 100, cpus=100)]
    with pytest.raises(JobError, match="job j1: needs 100 CPU cores, the cluster has 24"):
        simulate(ONE_BY_EIGHT, big)
    r = simulate(ONE_BY_EIGHT, big + [JobSpec("ok", 5, 1, 50)], drop_impossible=True, round_len=10)
    assert r.impossible == {"j1": "needs 100 CPU cores, the cluster has 24"}
    s = r.summary()
    assert (s["completed"], s["unfinished"], s["impossible"], s["stalled"]) == (1, 1, 1, 0)
    assert r.jct("ok") == 55 and r.end_time == 60  # starts at the round at 10


class NeverPlace(PlacePolicy):
    """Places nothing: every job waits forever."""

    name = "never"

    def choose(self, req, free, view):  # noqa: ANN001, ANN201
        return None


@pytest.mark.parametrize("order", ["fifo", "las"])
def test_stall_guard_stops_and_names_the_stuck_jobs(order: str) -> None:
    sched = Scheduler(make("order", order), make("group", "none"), make("size", "proportional"), NeverPlace())
    specs = [JobSpec("a", 0, 1, 100), JobSpec("b", 50, 2, 100)]
    r = Simulator(ONE_BY_EIGHT, specs, sched, config=SimConfig(round_len=100)).run()
    assert r.stalled == ["a", "b"]
    # rounds at 0 and 100 (b arrived at 50: nothing arrives after it), then STALL_ROUNDS rounds with no way forward
    assert r.end_time == 100 * STALL_ROUNDS
    assert r.summary()["stalled"] == 2 and r.summary()["unfinished"] == 2


def test_stall_guard_lets_a_blocked_queue_finish_what_it_can() -> None:
    # b can only run once a is done; a finishes, b runs: no stall
    sched = Scheduler.from_names("fifo")
    specs = [JobSpec("a", 0, 8, 100), JobSpec("b", 0, 8, 100)]
    r = Simulator(ONE_BY_EIGHT, specs, sched, config=SimConfig(round_len=1000)).run()
    assert r.stalled == [] and r.jct("b") == 1100


def test_themis_rho_two_jobs_by_hand() -> None:
    # one GPU; a and b (100 s each) arrive at 0; FIFO: a 0-100, b 100-200; active: 2 then 1
    r = simulate(Cluster.homogeneous(1, 1), [JobSpec("a", 0, 1, 100), JobSpec("b", 0, 1, 100)],
                 round_len=50, restart_overhead=0)
    N, rho = r.themis()
    # a: N = 2, T_id = 100 * 2 = 200, rho = 100/200;  b: N = (2*100 + 1*100)/200 = 1.5, T_id = 150, rho = 200/150
    assert N.tolist() == [2.0, 1.5] and rho.tolist() == pytest.approx([0.5, 4 / 3], rel=1e-12)
    assert [j.slowdown for j in r.jobs] == [1.0, 2.0]


def test_themis_rho_counts_the_share_of_gpus() -> None:
    # 1x4: a (4 GPUs) and b (1 GPU) at 0, 100 s each; FIFO: a 0-100, b 100-200
    r = simulate(Cluster.homogeneous(1, 4), [JobSpec("a", 0, 4, 100), JobSpec("b", 0, 1, 100)],
                 round_len=50, restart_overhead=0)
    N, rho = r.themis()
    # a: N = 2, a 1/2 share is 2 of its 4 GPUs -> T_id = 100 * 2*4/4 = 200, rho = 0.5
    # b: N = 1.5, a 1/1.5 share is 2.67 GPUs >= 1 -> T_id = 100, rho = 200/100 = 2
    assert N.tolist() == [2.0, 1.5] and rho.tolist() == pytest.approx([0.5, 2.0], rel=1e-12)
    s = r.summary()
    assert s["mean_ftf_rho"] == pytest.approx(1.25) and s["max_ftf_rho"] == pytest.approx(2.0)
    assert s["mean_slowdown"] == pytest.approx(1.5) and s["max_slowdown"] == 2.0
