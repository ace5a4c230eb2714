"""Every registered policy name honours its stage's contract, tested as a pure function on a tiny input.

As Gavel tests its policies: each name in the registry gets a small view
(``make_view``) and must return what its stage promises; then a whole round of
the scheduler with that stage (the others at their defaults) passes the round
check.  A new policy is covered by registering it.
"""

from __future__ import annotations

import warnings

import pytest

from gpuloom.core.plan import Allocation, Part, check_plan
from gpuloom.policies import base as pb
from gpuloom.scheduler import RequirementError, Scheduler

# stages that need a partner to make sense (static slots size and place together)
PARTNER = {("size", "static"): {"place": "static"}, ("place", "static"): {"size": "static"}}
PARAMS = {"static": {"slot": 1}}


def _names(stage: str) -> list[str]:
    return pb.names(stage)


def _stack(stage: str, name: str) -> dict[str, str]:
    chosen = {"order": "fifo", "group": "none", "size": "proportional", "place": "packed-sticky", stage: name}
    chosen.update(PARTNER.get((stage, name), {}))
    return chosen


@pytest.mark.parametrize("name", _names("order"))
def test_order_returns_a_permutation_of_the_active_jobs(name: str, make_view) -> None:  # noqa: ANN001
    view = make_view()
    pol = pb.make("order", name)
    out = pol.order(view.jobs, view)
    assert sorted(j.id for j in out) == sorted(j.id for j in view.jobs)
    assert [j.id for j in pol.order(view.jobs, view)] == [j.id for j in out]  # deterministic
    assert isinstance(pol.dynamic, bool)


@pytest.mark.parametrize("name", _names("group"))
def test_group_covers_every_job_once_in_units_of_equal_gpus(name: str, make_view) -> None:  # noqa: ANN001
    view = make_view()
    units = pb.make("group", name).group(view.jobs, view)
    ids = [j.id for u in units for j in u]
    assert sorted(ids) == sorted(j.id for j in view.jobs)
    for u in units:
        assert len({j.spec.gpus for j in u}) == 1  # a group shares one GPU set


@pytest.mark.parametrize("name", _names("size"))
def test_size_answers_every_unit(name: str, make_view) -> None:  # noqa: ANN001
    view = make_view()
    pol = pb.make("size", name, PARAMS.get(name))
    Scheduler(pb.make("order", "fifo"), pb.make("group", "none"), pol, pb.make("place", "packed-sticky")).bind(view.model)
    units = [(j,) for j in view.jobs]
    reqs = pol.size(units, view)
    assert len(reqs) == len(units)
    for r, u in zip(reqs, units, strict=True):
        assert r.jobs == u and r.gpus >= 1
        if pol.fixed_gpus:
            assert r.gpus == u[0].spec.gpus


@pytest.mark.parametrize("name", _names("place"))
def test_place_gives_whole_gangs_without_double_booking(name: str, make_view) -> None:  # noqa: ANN001
    view = make_view()
    pol = pb.make("place", name, PARAMS.get(name))
    if "topology" in pol.requires_factors:
        from gpuloom.perf.topology import add_topology, load_topology  # noqa: F401

        with pytest.raises(RequirementError, match="--topology"):
            Scheduler(pb.make("order", "fifo"), pb.make("group", "none"), pb.make("size", "proportional"),
                      pol).bind(view.model)
        return
    slot = PARAMS.get(name, {}).get("slot")
    reqs = [pb.Request((j,), slot or j.spec.gpus) for j in view.jobs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PAL without PM-scores says so
        plan = pol.place(reqs, view)
    check_plan(plan, view.cluster, {r.job.id: r.gpus for r in reqs})
    assert set(plan.allocations) <= {j.id for j in view.jobs}
    assert plan.allocations  # something fits an empty cluster


@pytest.mark.parametrize("stage,name", [(s, n) for s in pb.STAGES for n in _names(s)])
def test_a_round_with_each_policy_passes_the_round_check(stage: str, name: str, make_view) -> None:  # noqa: ANN001
    chosen = _stack(stage, name)
    params = {k: v for n in chosen.values() for k, v in PARAMS.get(n, {}).items()}
    sched = Scheduler.from_names(**chosen, params=params)
    view = make_view()
    missing = [f for st in sched.stages for f, make in st.requires_factors.items()
               if make is None and view.model.get(f) is None]
    if missing:  # a factor with no default that the view's model lacks (node topologies)
        with pytest.raises(RequirementError):
            sched.bind(view.model)
        return
    sched.bind(view.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rnd = sched.schedule(view)
    sched.check(rnd, view)
    # the declared capabilities are plain values on the common base
    for st in sched.stages:
        assert isinstance(st, pb.Stage) and st.stage in pb.STAGES and st.name
        assert isinstance(st.dynamic, bool) and isinstance(st.needs_profiles, bool)
        assert isinstance(st.stats(), dict) and all(callable(h) for h in st.plan_hooks())


def test_a_running_job_keeps_its_gpus_under_sticky_placement(make_view) -> None:  # noqa: ANN001
    a = Allocation("j0", (Part(1, (4,), 3, 16_000),))
    view = make_view(current={"j0": a})
    sched = Scheduler.from_names("fifo", "none", "proportional", "packed-sticky")
    rnd = sched.schedule(view)
    assert rnd.plan.allocations["j0"] == a


def test_registering_a_class_of_the_wrong_stage_is_refused() -> None:
    with pytest.raises(pb.PolicyError, match="does not derive from OrderPolicy"):
        pb.register("order", "not-an-order")(type("X", (pb.PlacePolicy,), {}))
