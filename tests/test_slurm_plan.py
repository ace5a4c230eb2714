"""What jobs submitted to Slurm directly hold (runtime/exec/slurm_plan.py): the place policy chooses
around it, and the plan hook checks the plan against it, on small hand-made clusters; the same against a real Slurm is in
tests/test_slurm.py (test_serve_slurm_plans_around_a_job_submitted_directly)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part, Plan
from gpuloom.perf.assembly import build_model
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.sensitivity import add_sensitivity
from gpuloom.perf.topology import add_topology, parse_topology
from gpuloom.policies.base import View
from gpuloom.policies.free import FreeState
from gpuloom.runtime.exec.slurm_plan import ForeignJobs, Held, foreign_free, held_parts
from gpuloom.scheduler import Scheduler
from gpuloom.sim.contract import small_view

CL = Cluster((Node("a", 4, 8, 8000), Node("b", 4, 8, 8000)))  # GPUs 0-3 on a, 4-7 on b


def view(current: dict[str, Allocation] | None = None) -> View:
    return View(0.0, CL, [], current or {}, ThroughputModel(CL, []), np.random.default_rng(0))


def alloc(jid: str, node: int, gpus: tuple[int, ...], cpus: int = 2, mem: int = 1000,
          group: tuple[str, ...] = ()) -> Allocation:
    return Allocation(jid, (Part(node, gpus, cpus, mem),), group)


def hook(held: dict[str, Held]) -> ForeignJobs:
    return ForeignJobs(lambda: held)


def test_foreign_free_takes_gpus_cores_and_memory_by_node_name() -> None:
    free = foreign_free(CL, {"b": Held(frozenset({1, 3, 9}), 3, 2500), "gone": Held(frozenset({0}), 1, 1)})
    assert free.free_on(0) == [0, 1, 2, 3] and free.free_on(1) == [4, 6]  # (index 9: not on b)
    assert (free.cpu_counts, free.mem_counts) == ([8, 5], [8000, 5500])
    # more than the node has (Slurm oversubscribed, or a record read mid-change): none left, not negative
    free = foreign_free(CL, {"a": Held(frozenset(), 20, 9000)})
    assert (free.cpu_counts, free.mem_counts) == ([0, 8], [0, 8000])


def test_no_direct_job_leaves_the_plan_as_it_is() -> None:
    plan = Plan({"x": alloc("x", 0, (0, 1))})
    assert hook({})(plan, view()) is plan


def test_a_new_job_on_held_gpus_is_not_made_by_the_hook_it_waits() -> None:
    held = {"a": Held(frozenset({0, 1}), 2, 2000)}
    plan = Plan({"x": alloc("x", 0, (0, 1)), "y": alloc("y", 0, (2, 3)), "z": alloc("z", 1, (4, 5, 6, 7)),
                 "w": alloc("w", 0, (1,))})
    # y and z fit beside what is held: kept; x and w are on held GPUs: not made (the place policy, which
    # sees what is held, places them around it next round)
    assert hook(held)(plan, view()).allocations == {"y": alloc("y", 0, (2, 3)), "z": alloc("z", 1, (4, 5, 6, 7))}


def test_cores_and_memory_held_directly_count_too() -> None:
    held = {"a": Held(frozenset(), 6, 1000)}  # no GPU, 6 of a's 8 cores
    plan = Plan({"x": alloc("x", 0, (0,), cpus=2), "y": alloc("y", 0, (1,), cpus=1)})
    assert hook(held)(plan, view()).allocations == {"x": alloc("x", 0, (0,), cpus=2)}  # y: no core left
    held = {"a": Held(frozenset(), 0, 7500), "b": Held(frozenset(), 0, 7500)}
    assert hook(held)(plan, view()).allocations == {}  # 1000 MB each: 500 left on either node


def test_running_jobs_keep_their_allocation_and_a_change_onto_held_gpus_is_not_made() -> None:
    held = {"a": Held(frozenset({2}), 1, 100)}
    run = alloc("r", 0, (0, 1))
    grow = alloc("r", 0, (0, 1, 2, 3))  # a resize the plan wants: GPU 2 is held, b is full
    plan = Plan({"r": grow, "z": alloc("z", 1, (4, 5, 6, 7))})
    out = hook(held)(plan, view({"r": run, "z": alloc("z", 1, (4, 5, 6, 7))}))
    assert out.allocations == {"r": run, "z": alloc("z", 1, (4, 5, 6, 7))}
    # one staying where it runs is kept even where a direct job's record claims the same GPU
    out = hook({"a": Held(frozenset({0}), 1, 100)})(Plan({"r": run}), view({"r": run}))
    assert out.allocations == {"r": run}


def test_a_group_on_held_gpus_is_not_made() -> None:
    held = {"a": Held(frozenset({0}), 1, 100)}
    plan = Plan({"p": alloc("p", 0, (0, 1), group=("q",)), "q": alloc("q", 0, (0, 1), group=("p",))})
    assert hook(held)(plan, view()).allocations == {}  # p waits; so does q, alone now on GPU 0
    # sharing free GPUs: both kept, the GPUs counted once, cores and memory twice
    plan = Plan({"p": alloc("p", 0, (2, 3), cpus=3, group=("q",)), "q": alloc("q", 0, (2, 3), cpus=3, group=("p",))})
    assert hook(held)(plan, view()).allocations == plan.allocations
    plan = Plan({"p": alloc("p", 0, (2, 3), cpus=4, group=("q",)), "q": alloc("q", 0, (2, 3), cpus=4, group=("p",))})
    assert hook(held)(plan, view()).allocations == {"p": alloc("p", 0, (2, 3), cpus=4)}  # 7 cores left: q waits


TOPO_4 = ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
          "GPU0\t X \tPHB\tSYS\tSYS\t0-7\nGPU1\tPHB\t X \tSYS\tSYS\t0-7\n"
          "GPU2\tSYS\tSYS\t X \tPHB\t0-7\nGPU3\tSYS\tSYS\tPHB\t X \t0-7\n")


def _placed(place: str, held: dict[str, Held], current: dict[str, Allocation] | None = None) -> dict[str, tuple[int, ...]]:
    """The GPUs a round of jobs ``x`` (2 GPUs) and ``r`` (1 GPU, running on ``current``'s) get under ``place``,
    told what direct jobs hold the way the service tells it (the scheduler's ``outside``, then the hook)."""
    model = add_topology(build_model(CL), parse_topology(TOPO_4, "pcie4"))
    jobs = [Job(JobSpec("x", 0.0, 2, 100.0), 0)] + ([Job(JobSpec("r", 0.0, 1, 100.0), 1)] if current else [])
    v = small_view(jobs, current, cluster=CL, model=model)
    sched = Scheduler.from_names("fifo", "none", "proportional", place)
    sched.bind(model)
    fj = hook(held)
    sched.hooks.append(fj)
    sched.outside.append(fj.held_parts)
    rnd = sched.schedule(v)
    sched.check(rnd, v)
    return {j: a.gpu_ids for j, a in rnd.plan.allocations.items()}


def test_the_place_policy_chooses_among_the_gpus_direct_jobs_leave() -> None:
    held = {"a": Held(frozenset({0, 2}), 1, 500)}  # a keeps GPUs 1 and 3 (across the SYS link), b all four
    assert _placed("packed-sticky", {}) == {"x": (0, 1)}
    assert _placed("topo-pack", {}) == {"x": (0, 1)}
    # packed: the best fit left is a's two free GPUs; topology: a PHB pair, on b, over a's SYS pair
    assert _placed("packed-sticky", held) == {"x": (1, 3)}
    assert _placed("topo-pack", held) == {"x": (4, 5)}
    assert _placed("topo-spread", held) == {"x": (1, 3)}  # (spread: the SYS pair)
    # cores: a's 4 left are the 4 x's two GPUs take there (counted once, not again per choice); with 5 held, b
    assert _placed("packed-sticky", {"a": Held(frozenset(), 4, 500)}) == {"x": (0, 1)}
    assert _placed("packed-sticky", {"a": Held(frozenset(), 5, 500)}) == {"x": (4, 5)}
    # one GPU left on each node: the job spans them (no PHB pair anywhere)
    assert _placed("topo-pack", {"a": Held(frozenset({0, 1, 2}), 1, 500), "b": Held(frozenset({0, 1, 2}), 1, 500)}) \
        == {"x": (3, 7)}


def test_a_running_job_stays_on_its_gpus_while_new_work_goes_around_what_direct_jobs_hold() -> None:
    run = Allocation("r", (Part(1, (4,), 2, 2000),), (), (1, None, None, "r"))
    held = {"a": Held(frozenset({0, 2}), 1, 500)}
    # r keeps GPU 4; x's PHB pair on b is taken by r, a's pair left is across SYS: the policy takes b's other pair
    assert _placed("topo-pack", held, {"r": run}) == {"r": (4,), "x": (6, 7)}


def test_holding_takes_what_is_free_of_the_held_parts_and_gives_it_back() -> None:
    free = FreeState.of(CL, {"x": alloc("x", 0, (0,), cpus=2, mem=1000)})
    before = (free.free_on(0), free.free_on(1), free.cpu_counts[:], free.mem_counts[:], free.free_gpus)
    held = held_parts(CL, {"a": Held(frozenset({0, 1}), 9, 500), "b": Held(frozenset({3}), 1, 9000)})
    assert held == (Part(0, (0, 1), 8, 500), Part(1, (7,), 1, 8000))  # capped at what each node has
    with free.holding(held):
        # GPU 0 (x's) is not taken twice; a's cores: 6 left, so 6 taken; b's memory: all of it
        assert (free.free_on(0), free.free_on(1), free.free_gpus) == ([2, 3], [4, 5, 6], 5)
        assert (free.cpu_counts, free.mem_counts) == ([0, 7], [6500, 0])
        assert list(free.gpu_counts) == [2, 3]
    assert (free.free_on(0), free.free_on(1), free.cpu_counts, free.mem_counts, free.free_gpus) == before
    # taken in for a round (place() does so), a choice's holding takes nothing twice
    free.take_held(held)
    taken = (free.free_on(0), free.free_on(1), free.cpu_counts[:], free.mem_counts[:], free.free_gpus)
    assert taken == ([2, 3], [4, 5, 6], [0, 7], [6500, 0], 5)
    with free.holding(held):
        assert (free.free_on(0), free.free_on(1), free.cpu_counts, free.mem_counts, free.free_gpus) == taken
    assert free.copy().outside is held


@pytest.mark.parametrize("size", ["greedy", "tune", "opt"])
def test_synergy_sizers_place_around_what_direct_jobs_hold(size: str) -> None:
    # a holds GPUs 0-2: x (2 GPUs) goes to b, y (1) to a's last GPU; opt's LP reads the counts left too
    model = add_sensitivity(build_model(CL))
    v = small_view([Job(JobSpec("x", 0.0, 2, 100.0), 0), Job(JobSpec("y", 1.0, 1, 100.0), 1)], cluster=CL,
                   model=model)
    sched = Scheduler.from_names("fifo", "none", size, "packed-sticky")
    sched.bind(model)
    fj = hook({"a": Held(frozenset({0, 1, 2}), 1, 500)})
    sched.hooks.append(fj)
    sched.outside.append(fj.held_parts)
    rnd = sched.schedule(v)
    sched.check(rnd, v)
    assert {j: a.gpu_ids for j, a in rnd.plan.allocations.items()} == {"x": (4, 5), "y": (3,)}


def test_a_refused_launch_names_who_holds_its_gpus_a_job_of_ours_still_ending_or_a_direct_one(tmp_path) -> None:
    """GPUs that a job of this executor's, stopped or ended here, still holds while Slurm tears it down are
    not free, like a direct job's; the refusal names it rather than calling it a job submitted directly."""
    from gpuloom.runtime.exec.executor import ProcInfo
    from gpuloom.runtime.exec.slurm import SlurmExecutor

    ex = SlurmExecutor("t", out_dir=str(tmp_path / "out"), launcher="srun")
    ex.procs["5"] = ProcInfo("5", "gpn0", 12, 0.0, str(tmp_path / "5.log"))
    ex.jobs = {11: {"JobState": "RUNNING", "NodeList": "gpn0", "GRES": "gpu:g0:1(IDX:0)"},
               12: {"JobState": "COMPLETING", "NodeList": "gpn0", "GRES": "gpu:g0:1(IDX:1)"}}
    assert ex._foreign_gpus("gpn0") == {0}  # 12 is this executor's running job
    ex._forget("5")  # stopped (cancelled): let go while Slurm still tears it down
    assert ex._foreign_gpus("gpn0") == {0, 1}  # not free: a launch onto GPU 1 is refused
    assert ex.holders("gpn0", {1}) == "Slurm job 12 (gpuloom's 5, ended or stopped, still ending in Slurm)"
    assert ex.holders("gpn0", {0}) == "jobs submitted to Slurm directly"
    assert ex.holders("gpn0", {0, 1}) == ("Slurm job 12 (gpuloom's 5, ended or stopped, still ending in Slurm) and "
                                          "jobs submitted to Slurm directly")
