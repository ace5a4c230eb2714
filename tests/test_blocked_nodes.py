"""Nodes out of service (drained, in or before a maintenance window) are kept out by the place policy
itself: every built-in placement leaves them empty, and a job's time limit decides before a window."""

from __future__ import annotations

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.perf.assembly import build_model
from gpuloom.perf.sensitivity import add_sensitivity
from gpuloom.perf.topology import add_topology, parse_topology
from gpuloom.policies import base as pb
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
