"""The plan hook that keeps gpuloom's plan off what jobs submitted to Slurm directly hold
(runtime/exec/slurm_plan.py), on small hand-made clusters; the same against a real Slurm is in
tests/test_slurm.py (test_serve_slurm_plans_around_a_job_submitted_directly)."""

from __future__ import annotations

import numpy as np

from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.plan import Allocation, Part, Plan
from gpuloom.perf.model import ThroughputModel
from gpuloom.policies.base import View
from gpuloom.runtime.exec.slurm_plan import ForeignJobs, Held, foreign_free

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


def test_a_new_job_on_held_gpus_moves_to_free_ones_on_its_node_then_elsewhere_then_waits() -> None:
    held = {"a": Held(frozenset({0, 1}), 2, 2000)}
    plan = Plan({"x": alloc("x", 0, (0, 1)), "y": alloc("y", 0, (2, 3)), "z": alloc("z", 1, (4, 5, 6, 7)),
                 "w": alloc("w", 0, (1,))})
    out = hook(held)(plan, view())
    # y kept (free), x moved: its own node is full now (0-1 held, 2-3 y's), b is full (z): x waits; then w
    # has nowhere either
    assert out.allocations == {"y": alloc("y", 0, (2, 3)), "z": alloc("z", 1, (4, 5, 6, 7))}
    plan = Plan({"x": alloc("x", 0, (0, 1)), "z": alloc("z", 1, (4, 5))})
    out = hook(held)(plan, view())
    assert out.allocations == {"x": alloc("x", 0, (2, 3)), "z": alloc("z", 1, (4, 5))}
    plan = Plan({"y": alloc("y", 0, (2, 3)), "x": alloc("x", 0, (0, 1)), "z": alloc("z", 1, (4, 5))})
    assert hook(held)(plan, view()).allocations == {"y": alloc("y", 0, (2, 3)), "x": alloc("x", 1, (6, 7)),
                                                   "z": alloc("z", 1, (4, 5))}


def test_cores_and_memory_held_directly_count_too() -> None:
    held = {"a": Held(frozenset(), 6, 1000)}  # no GPU, 6 of a's 8 cores
    plan = Plan({"x": alloc("x", 0, (0,), cpus=2), "y": alloc("y", 0, (1,), cpus=1)})
    assert hook(held)(plan, view()).allocations == {"x": alloc("x", 0, (0,), cpus=2), "y": alloc("y", 1, (4,), cpus=1)}
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


def test_a_group_on_held_gpus_is_not_moved_as_a_group() -> None:
    held = {"a": Held(frozenset({0}), 1, 100)}
    plan = Plan({"p": alloc("p", 0, (0, 1), group=("q",)), "q": alloc("q", 0, (0, 1), group=("p",))})
    # p waits; q, alone now, moves to the first free GPUs
    assert hook(held)(plan, view()).allocations == {"q": alloc("q", 0, (1, 2))}
    # sharing free GPUs: both kept, the GPUs counted once, cores and memory twice
    plan = Plan({"p": alloc("p", 0, (2, 3), cpus=3, group=("q",)), "q": alloc("q", 0, (2, 3), cpus=3, group=("p",))})
    assert hook(held)(plan, view()).allocations == plan.allocations
    plan = Plan({"p": alloc("p", 0, (2, 3), cpus=4, group=("q",)), "q": alloc("q", 0, (2, 3), cpus=4, group=("p",))})
    assert hook(held)(plan, view()).allocations == {"p": alloc("p", 0, (2, 3), cpus=4)}  # 7 cores left: q waits
