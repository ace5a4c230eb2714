"""Size policies that plan where jobs go themselves (Synergy's ``opt`` LPs, ``elastic`` and its hysteresis)
keep off nodes out of service and what work outside the plan holds, with no plan hook re-placing after them."""

from __future__ import annotations

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Part
from gpuloom.policies import base as pb
from gpuloom.scheduler import Scheduler
from gpuloom.sim.contract import small_view
from test_blocked_nodes import _drain_round

EVICT0 = pb.Blocked({0: -1.0}, lambda jid: None, frozenset({0}))


@pytest.mark.parametrize("size", ["opt", "elastic"])
def test_a_job_on_an_evicting_node_is_moved_off_it_by_the_sizer_itself(size: str) -> None:
    first, second, _, _ = _drain_round("packed-sticky", EVICT0, size)  # (no plan hook: the policy alone)
    on0 = {j for j, a in first.items() if 0 in a.nodes}
    assert on0 and set(second) == {"a", "b", "c"}
    assert all(0 not in a.nodes for a in second.values())


def test_opt_moves_the_job_on_an_evicting_node_to_the_gpus_left_free() -> None:
    # round 1 (LP placement): a -> GPUs 0,1, c -> GPU 2 (node 0), b -> GPUs 4,5 (node 1).  Node 0 evicts:
    # the placement LP keeps b, puts c next to it (GPU 6) and a on node 2 (GPUs 8,9)
    first, second, _, _ = _drain_round("packed-sticky", EVICT0, "opt")
    assert {j: a.gpu_ids for j, a in first.items()} == {"a": (0, 1), "c": (2,), "b": (4, 5)}
    assert {j: a.gpu_ids for j, a in second.items()} == {"b": (4, 5), "c": (6,), "a": (8, 9)}
    assert second["b"] == first["b"]


def test_elastic_hysteresis_does_not_keep_the_running_plan_on_an_evicting_node() -> None:
    # round 1 fills the 3x4 cluster: a node 0, b node 1, c node 2 (4 GPUs each).  Node 0 evicts: the
    # running plan without a is the baseline, so the new plan applies even below the threshold
    first, second, sched, _ = _drain_round("packed-sticky", EVICT0, "elastic")
    assert {j: a.gpu_ids for j, a in first.items()} == {"a": (0, 1, 2, 3), "b": (4, 5, 6, 7), "c": (8, 9, 10, 11)}
    assert {j: a.gpu_ids for j, a in second.items()} == {"a": (4, 5, 6), "b": (7,), "c": (8, 9, 10, 11)}
    assert [h.rejected for h in sched.hooks] == [0]


@pytest.mark.parametrize("size", ["opt", "elastic"])
def test_a_drain_that_waits_keeps_the_sizers_running_jobs_where_they_run(size: str) -> None:
    first, second, _, _ = _drain_round("packed-sticky", pb.Blocked({0: -1.0}, lambda jid: None), size)
    assert second == first


def test_elastic_sizes_over_the_gpus_work_outside_the_plan_leaves() -> None:
    # 2x4 cluster, a direct job holds GPUs 4,5 of node 1.  Two elastic jobs (f = 1, 1.8, 3.2 it/s at 1, 2,
    # 4 GPUs) both start on node 0, the one with the most room, and grow to 2 each there: no request
    # counts the held GPUs (seeing all 8, each grew to 4 and b found no room)
    cl = Cluster.homogeneous(2, 4, 12, 64_000)
    jobs = [Job(JobSpec(jid, float(i), 1, 100.0, model="resnet50", attrs={"throughput": {1: 1.0, 2: 1.8, 4: 3.2}}), i)
            for i, jid in enumerate("ab")]
    view = small_view(jobs, cluster=cl)
    blocked = view.blocked = pb.Blocked({}, lambda jid: None, held=(Part(1, (4, 5), 0, 0),))
    d = pb.STAGE_DEFAULTS
    sched = Scheduler.from_names(d["order"], d["group"], "elastic", "packed-sticky")
    sched.bind(view.model)
    assert [(r.jobs[0].id, r.gpus) for r in sched.size.size([(j,) for j in jobs], view)] == [("a", 2), ("b", 2)]
    sched.blocked = lambda v: blocked
    rnd = sched.schedule(view)
    sched.check(rnd, view)
    assert {j: a.gpu_ids for j, a in rnd.plan.allocations.items()} == {"a": (6, 7), "b": (0, 1)}
