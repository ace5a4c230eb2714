"""Nodes out of service (drained, in or before a maintenance window) are kept out by the place policy
itself: every built-in placement leaves them empty, and a job's time limit decides before a window."""

from __future__ import annotations

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.assembly import build_model
from gpuloom.perf.sensitivity import add_sensitivity
from gpuloom.perf.topology import add_topology, parse_topology
from gpuloom.policies import base as pb
from gpuloom.policies.free import FreeState
from gpuloom.scheduler import Scheduler
from gpuloom.sim.contract import PARAMS, PARTNER, small_view

TOPO_4 = ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
          "GPU0\t X \tPHB\tSYS\tSYS\t0-7\nGPU1\tPHB\t X \tSYS\tSYS\t0-7\n"
          "GPU2\tSYS\tSYS\t X \tPHB\t8-15\nGPU3\tSYS\tSYS\tPHB\t X \t8-15\n")


def _round(place: str, blocked: pb.Blocked) -> set[int]:
    """The nodes a round of the small case uses under ``place`` with ``blocked``."""
    cl = Cluster.homogeneous(2, 4, 12, 64_000)
    model = add_topology(add_sensitivity(build_model(cl)), parse_topology(TOPO_4, "pcie4"))
    view = small_view(cluster=cl, model=model)
    chosen = {**pb.STAGE_DEFAULTS, "place": place, **PARTNER.get(("place", place), {})}
    sched = Scheduler.from_names(chosen["order"], chosen["group"], chosen["size"], chosen["place"],
                                 params=PARAMS.get(place, {}))
    sched.bind(view.model)
    sched.blocked = lambda v: blocked
    rnd = sched.schedule(view)
    sched.check(rnd, view)
    return {p.node for a in rnd.plan.allocations.values() for p in a.parts}


@pytest.mark.parametrize("place", pb.names("place"))
def test_a_drained_node_gets_no_job_under_any_place_policy(place: str) -> None:
    assert _round(place, pb.Blocked({0: -1.0}, lambda jid: None)) == {1}
    assert _round(place, pb.Blocked({}, lambda jid: None)) == {0, 1}  # (the case does use both nodes)


def _named(jid: str) -> Job:
    return Job(JobSpec(jid, 0.0, 1, 100.0))


def test_before_a_window_only_jobs_that_end_by_its_start_may_start() -> None:
    # node 0 drained, node 1's window starts in 250 s, node 2 not held
    blocked = pb.Blocked({0: -1.0, 1: 250.0}, {"short": 200.0, "exact": 250.0, "long": 300.0}.get)
    cl = Cluster.homogeneous(3, 2)
    for jid, want in (("short", [0, 1, 1]), ("exact", [0, 1, 1]), ("long", [0, 0, 1]), ("none", [0, 0, 1])):
        node_ok, gpu_ok = blocked.masks(cl, [_named(jid)])
        assert (node_ok.tolist(), gpu_ok.tolist()) == (want, [w for w in want for _ in range(2)]), jid
    # a group starts only where all its members may
    node_ok, _ = blocked.masks(cl, [_named("short"), _named("long")])
    assert node_ok.tolist() == [0, 0, 1]


STICKY = [n for n in pb.names("place") if pb.lookup("place", n).sticky]


def _sched(place: str, size: str | None = None) -> Scheduler:
    chosen = {**pb.STAGE_DEFAULTS, "place": place, **PARTNER.get(("place", place), {})}
    return Scheduler.from_names(chosen["order"], chosen["group"], size or chosen["size"], chosen["place"],
                                params=PARAMS.get(place, {}))


def _three_jobs() -> list[Job]:
    return [Job(JobSpec(jid, float(i), g, 100.0, model="resnet50"), i) for i, (jid, g) in
            enumerate((("a", 2), ("b", 2), ("c", 1)))]


def _drain_round(place: str, blocked: pb.Blocked, size: str | None = None,
                 ) -> tuple[dict[str, Allocation], dict[str, Allocation], Scheduler, pb.View]:
    """The allocations of a first round of a, b, c on a free 3x4 cluster, and those of a second round
    with ``blocked`` (no plan hook: the policy alone), with its scheduler and view."""
    cl = Cluster.homogeneous(3, 4, 12, 64_000)
    model = add_topology(add_sensitivity(build_model(cl)), parse_topology(TOPO_4, "pcie4"))
    sched = _sched(place, size)
    sched.bind(model)
    first = sched.schedule(small_view(_three_jobs(), cluster=cl, model=model)).plan.allocations
    view = small_view(_three_jobs(), dict(first), cluster=cl, model=model, seed=1)
    sched.blocked = lambda v: blocked
    rnd = sched.schedule(view)
    sched.check(rnd, view)
    return dict(first), dict(rnd.plan.allocations), sched, view


@pytest.mark.parametrize("place", STICKY)
def test_a_job_on_an_evicting_node_is_moved_off_it_by_the_sticky_policy_itself(place: str) -> None:
    blocked = pb.Blocked({0: -1.0}, lambda jid: None, frozenset({0}))
    first, second, sched, view = _drain_round(place, blocked)
    on0 = sorted(j for j, a in first.items() if 0 in a.nodes)
    assert on0 and set(second) == {"a", "b", "c"}
    assert all(0 not in a.nodes for a in second.values())
    for j in first.keys() - set(on0):  # the others stay as they were
        assert second[j] == first[j]
    # each moved job got what the policy chooses, in order, on what the others leave (node 0 masked)
    again = small_view(_three_jobs(), dict(first), cluster=view.cluster, model=view.model, seed=1)
    again.blocked = blocked
    free = FreeState.of(view.cluster, {j: a for j, a in first.items() if j not in on0})
    for j in on0:
        req = sched.size.request(next(x for x in again.jobs if x.id == j), again)
        parts = sched.place.choose_for(req, free, again)
        assert parts is not None and second[j].parts == parts, j
        free.take(parts)


def test_packed_sticky_moves_the_jobs_of_a_drained_node_to_the_best_fit_left() -> None:
    # round 1: a -> node 0 GPUs 0,1; b -> node 0 GPUs 2,3; c -> node 1 GPU 4.  Node 0 evicts: a takes
    # the best fit left (node 1, 3 free: GPUs 5,6), then b (node 1 has 1 free, node 2 has 4: GPUs 8,9)
    first, second, _, _ = _drain_round("packed-sticky", pb.Blocked({0: -1.0}, lambda jid: None, frozenset({0})))
    assert {j: a.gpu_ids for j, a in first.items()} == {"a": (0, 1), "b": (2, 3), "c": (4,)}
    assert {j: a.gpu_ids for j, a in second.items()} == {"a": (5, 6), "b": (8, 9), "c": (4,)}


@pytest.mark.parametrize("size", ["greedy", "tune"])
def test_a_sizer_placing_job_by_job_moves_jobs_off_an_evicting_node(size: str) -> None:
    first, second, _, _ = _drain_round("packed-sticky", pb.Blocked({0: -1.0}, lambda jid: None, frozenset({0})),
                                       size)
    assert any(0 in a.nodes for a in first.values())
    assert set(second) == {"a", "b", "c"} and all(0 not in a.nodes for a in second.values())


@pytest.mark.parametrize("place", STICKY)
def test_a_drain_that_waits_keeps_its_running_jobs_where_they_run(place: str) -> None:
    first, second, _, _ = _drain_round(place, pb.Blocked({0: -1.0}, lambda jid: None))
    assert second == first


def test_keep_parts_keeps_a_changed_request_only_where_the_job_may_start() -> None:
    cl = Cluster.homogeneous(2, 4, 12, 64_000)
    job = Job(JobSpec("a", 0.0, 2, 100.0), 0)
    was = Allocation("a", (Part(0, (0, 1), 6, 32_000),), (), (2, None, None, "a"))
    view = small_view([job], {"a": was}, cluster=cl)
    place = pb.make("place", "packed-sticky")
    free = FreeState.of(cl, {})
    same, changed = pb.Request((job,), 2), pb.Request((job,), 2, 4, 16_000)
    assert same.key == was.key
    want = (Part(0, (0, 1), 4, 16_000),)
    assert place.keep_parts(changed, free, view) == want  # (nothing blocked)
    view.blocked = pb.Blocked({0: -1.0}, lambda jid: None)  # drained, running jobs stay
    assert place.keep_parts(same, free, view) == was.parts
    assert place.keep_parts(changed, free, view) is None  # a changed allocation is a new start there
    view.blocked = pb.Blocked({0: 300.0}, {"a": 200.0}.get)  # a window in 300 s, the job ends by then
    assert place.keep_parts(changed, free, view) == want
    view.blocked = pb.Blocked({0: -1.0}, lambda jid: None, frozenset({0}))  # evicting
    assert place.keep_parts(same, free, view) is None
