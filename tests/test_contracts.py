"""Every registered policy name honours its stage's contract, tested as a pure function on a tiny input.

As Gavel tests its policies: each name in the registry gets a small view
(:func:`gpuloom.sim.contract.small_view`) and must return what its stage promises; then a whole
round of the scheduler with that stage (the others at their defaults) passes the round check.  The
checks live in :mod:`gpuloom.sim.contract`, so a plugin's own tests run the same ones; a new
built-in policy is covered by registering it.
"""

from __future__ import annotations

import pytest

from gpuloom.core.plan import Allocation, Part
from gpuloom.policies import base as pb
from gpuloom.scheduler import RequirementError, Scheduler
from gpuloom.sim.contract import check_round, check_stage, check_trace_reader, small_view


@pytest.mark.parametrize("stage,name", [(s, n) for s in ("order", "group", "size", "place") for n in pb.names(s)])
def test_each_policy_keeps_its_stage_promise(stage: str, name: str) -> None:
    pol = pb.lookup(stage, name)
    if "topology" in pol.requires_factors:  # no default: refused up front without --topology
        with pytest.raises(RequirementError, match="--topology"):
            Scheduler(pb.make("order", "fifo"), pb.make("group", "none"), pb.make("size", "proportional"),
                      pb.make("place", name)).bind(small_view().model)
        return
    check_stage(stage, name)


@pytest.mark.parametrize("stage,name", [(s, n) for s in pb.STAGES for n in pb.names(s)])
def test_a_round_with_each_policy_passes_the_round_check(stage: str, name: str) -> None:
    check_round(stage, name)


def test_the_checks_catch_a_broken_order(monkeypatch) -> None:  # noqa: ANN001
    class Drops(pb.OrderPolicy):  # loses a job
        name = "drops"

        def order(self, jobs, view):  # noqa: ANN001, ANN202
            return list(jobs)[1:]

    class Unkeyed(pb.OrderPolicy):  # declares keyed, sorts otherwise
        name = "unkeyed"
        keyed = True

        def sort_key(self, job, view):  # noqa: ANN001, ANN202
            return (float(job.spec.gpus), job.index)

        def order(self, jobs, view):  # noqa: ANN001, ANN202
            return list(jobs)

    import sys
    import types

    mod = types.ModuleType("contract_broken")
    mod.Drops, mod.Unkeyed = Drops, Unkeyed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "contract_broken", mod)
    with pytest.raises(AssertionError, match="not a permutation"):
        check_stage("order", "contract_broken:Drops")
    with pytest.raises(AssertionError, match="keyed, but not by sort_key"):
        check_stage("order", "contract_broken:Unkeyed")


def test_the_trace_check(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import sys
    import types

    from gpuloom.core.job import JobSpec
    from gpuloom.sim.traces import Trace

    p = tmp_path / "t.csv"
    p.write_text("id,arrival,gpus,duration\nb,5,1,10\na,0,2,10\n")
    assert [j.id for j in check_trace_reader("csv", p)] == ["a", "b"]

    def read_unsorted(path):  # noqa: ANN001, ANN202 (a Trace is taken as the reader gives it)
        return Trace([JobSpec("b", 5.0, 1, 10.0), JobSpec("a", 0.0, 1, 10.0)], "x", str(path), 2)

    mod = types.ModuleType("contract_reader")
    mod.read_unsorted = read_unsorted  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "contract_reader", mod)
    with pytest.raises(AssertionError, match="not sorted by arrival"):
        check_trace_reader("contract_reader:read_unsorted", p)


def test_a_running_job_keeps_its_gpus_under_sticky_placement(make_view) -> None:  # noqa: ANN001
    a = Allocation("j0", (Part(1, (4,), 3, 16_000),))
    view = make_view(current={"j0": a})
    sched = Scheduler.from_names("fifo", "none", "proportional", "packed-sticky")
    rnd = sched.schedule(view)
    assert rnd.plan.allocations["j0"] == a


def test_registering_a_class_of_the_wrong_stage_is_refused() -> None:
    with pytest.raises(pb.PolicyError, match="does not derive from OrderPolicy"):
        pb.register("order", "not-an-order")(type("X", (pb.PlacePolicy,), {}))
