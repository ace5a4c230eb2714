"""Scaling curves, elastic F-scheduling sizing, hysteresis, static slots and the lifecycle in the simulator.

Expected numbers are worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobError, JobSpec
from gpuloom.core.lifecycle import JobState, Lifecycle
from gpuloom.core.plan import Allocation, Part, Plan, check_plan
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.scaling import (
    PAL,
    SYNERGY,
    TIRESIAS,
    ScalingCurve,
    ScalingError,
    ScalingFactor,
    builtin_curve,
    canonical_model,
    pal_curves,
    slowdown,
    spec_curve,
    synergy_curves,
    tiresias_curves,
    unfairness,
)
from gpuloom.policies import base as pb
from gpuloom.policies.elastic import ElasticSize, Hysteresis, StaticPlace, StaticSize, is_protected
from gpuloom.scheduler import Scheduler
from gpuloom.sim.elastic import (
    compare_elastic_static,
    phase_breakdown,
    plot_phase_breakdown,
    plot_utilisation_cdf,
    thesis_specs,
    utilisation_cdf,
)
from gpuloom.sim.engine import LifecycleTimes, SimConfig, SimulationError, Simulator, simulate

S = JobState


# ---------------------------------------------------------------------------
# scaling curves
def test_curve_interpolates_is_flat_above_and_zero_below() -> None:
    c = ScalingCurve({1: 2.0, 2: 3.0, 4: 5.0})
    assert [c(n) for n in range(7)] == [0.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0]
    assert c.min_gpus == 1 and c.max_known == 4
    c2 = ScalingCurve({2: 10.0, 4: 18.0})  # needs 2 GPUs
    assert c2(1) == 0.0 and c2(3) == 14.0 and c2.min_gpus == 2
    c3 = ScalingCurve({1: 0.0, 2: 4.0, 4: 6.0})  # explicit 0: cannot run on 1 GPU (memory)
    assert c3(1) == 0.0 and c3(3) == 5.0 and c3.min_gpus == 2


def test_curve_multi_node_entries() -> None:
    c = ScalingCurve.parse({1: 1, 2: 2, 4: 4, "4x2": 3.0, (8, 2): 5.5})
    assert c(4) == 4.0 and c(4, 2) == 3.0 and c(8, 2) == 5.5
    assert c(2, 2) == 2.0  # unknown spread: the single-node value (locality factor charges it)


def test_curve_parse_list_and_errors_name_the_job() -> None:
    assert ScalingCurve.parse([1.0, 1.8, 2.4]).points == {1: 1.0, 2: 1.8, 3: 2.4}
    with pytest.raises(ScalingError, match="job j7"):
        spec_curve(JobSpec("j7", 0, 1, 10, attrs={"throughput": {"two": 3}}))
    with pytest.raises(ScalingError, match=">= 0"):
        ScalingCurve({1: -1.0})
    with pytest.raises(ScalingError, match="at least one"):
        ScalingCurve({})
    with pytest.raises(ScalingError, match="impossible"):
        ScalingCurve({1: 1.0}, {(2, 3): 1.0})
    with pytest.raises(ScalingError, match="mapping"):
        ScalingCurve.parse(3.0, "job x")


def test_model_names_and_catalogue() -> None:
    assert canonical_model("ResNet-50 (batch size 64)") == "resnet50"
    assert canonical_model("InceptionV3") == "inception3"
    assert canonical_model("res18") == "resnet18"
    c = builtin_curve("ResNet-50")
    assert c is not None and c.source == "tiresias:resnet50"
    # f(6) for ResNet-50 interpolates between 4 (12.062) and 8 (23.714) GPUs
    assert c(6) == pytest.approx((12.062 + 23.714) / 2)
    assert builtin_curve("dcgan").source == "pal:dcgan"  # type: ignore[union-attr]
    assert builtin_curve("transformer").source == "synergy:transformer"  # type: ignore[union-attr]
    assert builtin_curve("resnet50", ("pal",))(8) == 111.92  # type: ignore[misc]
    assert builtin_curve("no-such-model") is None
    with pytest.raises(ScalingError, match="catalogue"):
        builtin_curve("resnet50", ("nope",))


def test_builtin_catalogues_match_the_data(data_dir) -> None:  # noqa: ANN001
    assert tiresias_curves(data_dir / "tiresias" / "60_job.csv") == TIRESIAS
    assert pal_curves(data_dir / "pal" / "blox" / "raw_single.csv") == PAL
    derived = synergy_curves(data_dir / "synergy" / "model_sensitivity_profiles.csv")
    for model, pts in SYNERGY.items():
        assert derived[model] == pts


def test_scaling_factor_speed_is_relative_to_the_request() -> None:
    cl = Cluster.homogeneous(1, 4)
    sf = ScalingFactor()
    j = Job(JobSpec("a", 0, 2, 100, attrs={"throughput": {1: 3.0, 2: 5.0, 4: 8.0}}))
    alloc = lambda n: Allocation("a", (Part(0, tuple(range(n)), 0, 0),))  # noqa: E731
    assert sf(j, alloc(2)) == 1.0
    assert sf(j, alloc(4)) == pytest.approx(8.0 / 5.0)
    assert sf(j, alloc(1)) == pytest.approx(3.0 / 5.0)
    m = ThroughputModel(cl, [sf])
    assert m.iterations_per_second(j, alloc(4)) == pytest.approx(1.6)  # no iter_time: work-s/s
    rigid = Job(JobSpec("r", 0, 2, 100))
    assert sf(rigid, alloc(2)) == 1.0 and sf(rigid, alloc(4)) == 0.0
    assert ScalingFactor(fallback="linear")(rigid, alloc(4)) == 2.0
    bad = Job(JobSpec("b", 0, 1, 100, attrs={"throughput": {2: 4.0}}))
    with pytest.raises(JobError, match="job b"):
        sf(bad, alloc(2))
    with pytest.raises(ValueError, match="fallback"):
        ScalingFactor(fallback="magic")


def test_slowdown_and_unfairness() -> None:
    cl = Cluster.homogeneous(1, 6)
    lin = ScalingCurve({1: 1.0, 6: 6.0})
    assert slowdown(lin, 3, cl) == 0.5
    assert slowdown(ScalingCurve({2: 1.0}), 1, cl) == 0.0
    # a curve that falls: f(U) is the best the job can do on the cluster (1 GPU here), not f(6)
    alex = builtin_curve("alexnet")
    assert alex(6) == pytest.approx((10.937 + 17.983) / 2)
    assert slowdown(alex, 1, cl) == 1.0  # type: ignore[arg-type]
    assert slowdown(alex, 2, cl) == pytest.approx(7.429 / 18.354)  # type: ignore[arg-type]
    assert ScalingFactor().cluster_throughput(Job(JobSpec("r", 0, 2, 10.0, iter_time=0.5)), cl) == 2.0
    assert ScalingFactor().cluster_throughput(Job(JobSpec("r", 0, 8, 10.0)), cl) == 0.0
    assert unfairness([0.5]) == 0.0
    assert unfairness([1 / 6, 5 / 6]) == pytest.approx(1 / 9)


# ---------------------------------------------------------------------------
# elastic sizing
def _job(jid: str, table: dict, gpus: int = 1, arrival: float = 0.0, **attrs: object) -> Job:
    j = Job(JobSpec(jid, arrival, gpus, 100.0, attrs={"throughput": table, **attrs}))
    j.arrive(j.arrival)
    return j


def _view(cl: Cluster, jobs: list[Job], current: dict | None = None, now: float = 0.0) -> pb.View:
    model = ThroughputModel.default(cl).add(ScalingFactor())
    return pb.View(now, cl, jobs, current or {}, model, np.random.default_rng(0))


def _sizes(policy: ElasticSize, jobs: list[Job], cl: Cluster, **kw: object) -> dict[str, int]:
    reqs = policy.size([(j,) for j in jobs], _view(cl, jobs, **kw))  # type: ignore[arg-type]
    return {r.job.id: r.gpus for r in reqs}


FAST = {1: 10.0, 6: 60.0}  # linear, 10 it/s per GPU
SLOW = {1: 1.0, 6: 6.0}  # linear, 1 it/s per GPU


def test_elastic_fraction_bound_never_binds_and_maximises_throughput() -> None:
    # S = f(R)/f(U) <= 1, so its variance <= 0.25 < 0.5: every extra GPU goes to the fast job
    cl = Cluster.homogeneous(1, 6)
    pol = ElasticSize(v_bound=0.5)
    assert _sizes(pol, [_job("a", FAST), _job("b", SLOW)], cl) == {"a": 5, "b": 1}
    assert pol.last_unfairness == pytest.approx(((5 / 6 - 1 / 6) / 2) ** 2)


def test_elastic_tight_bound_balances() -> None:
    # v_bound 0.01 with S = n/6 for both: (1,1) -> a2 (var 1/144 ok, gain 10) -> a3 would give var 1/36:
    # b2 (var 0) -> a3 (1/144) -> b3 (0)
    cl = Cluster.homogeneous(1, 6)
    assert _sizes(ElasticSize(v_bound=0.01), [_job("a", FAST), _job("b", SLOW)], cl) == {"a": 3, "b": 3}


def test_elastic_factor_slowdown_binds_at_half() -> None:
    # S = 6/n: (1,1) S=(6,6); a2 or b2 both var 2.25 > 0.5 -> lowest variance, tie -> more throughput: a2;
    # then b2 (var 0); a3 (var .25, gain 10); a4 would be var .5625 -> b3 (var 0)
    cl = Cluster.homogeneous(1, 6)
    pol = ElasticSize(v_bound=0.5, slowdown="factor")
    assert _sizes(pol, [_job("a", FAST), _job("b", SLOW)], cl) == {"a": 3, "b": 3}


def test_elastic_minimum_in_order_while_it_fits_and_useless_gpus_stay_free() -> None:
    cl = Cluster.homogeneous(1, 6)
    a = _job("a", {2: 4.0, 4: 6.0})  # needs 2, flat above 4
    b = _job("b", {3: 3.0}, gpus=3)  # rigid 3 (flat above 3 -> no gain)
    c = _job("c", {2: 1.0}, gpus=2)  # does not fit after a and b: waits
    reqs = ElasticSize().size([(a,), (b,), (c,)], _view(cl, [a, b, c]))
    assert [(r.job.id, r.gpus) for r in reqs] == [("a", 3), ("b", 3), ("c", 2)]  # c last, unassigned
    plan = ElasticSize().allocate(reqs, _view(cl, [a, b, c]), pb.lookup("place", "packed-sticky")(), True)
    assert set(plan.allocations) == {"a", "b"}
    # min/max from attrs; a GPU that raises nobody's throughput stays free
    d = _job("d", {1: 1.0, 2: 2.0, 6: 6.0}, max_gpus=2)
    e = _job("e", {1: 1.0, 2: 1.0})
    assert _sizes(ElasticSize(), [d, e], cl) == {"d": 2, "e": 1}


def test_elastic_keeps_protected_jobs_whatever_the_order() -> None:
    cl = Cluster.homogeneous(1, 6)
    a, b = _job("a", SLOW), _job("b", FAST)
    lc = Lifecycle("a", 0.0)
    for st in (S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY, S.LAUNCHING):
        lc.to(st, 0.0)
    lc.to(S.RUNNING_PROTECTED, 10.0)  # protected until 40
    a.lifecycle = lc
    cur = {"a": Allocation("a", (Part(0, (0, 1, 2, 3), 12, 256_000),))}
    assert is_protected(a, 20.0) and not is_protected(a, 40.0) and not is_protected(b, 20.0)
    # b comes first in the order, yet a keeps its 4 GPUs while protected
    assert _sizes(ElasticSize(), [b, a], cl, current=cur, now=20.0) == {"b": 2, "a": 4}
    lc.refresh(41.0)
    assert _sizes(ElasticSize(), [b, a], cl, current=cur, now=41.0) == {"b": 5, "a": 1}
    assert _sizes(ElasticSize(respect_protection=False), [b, a], cl, current=cur, now=20.0) == {"b": 5, "a": 1}


def test_elastic_multi_node_keeps_each_job_on_one_node() -> None:
    cl = Cluster.homogeneous(2, 4)
    jobs = [_job(x, {1: 1.0, 8: 8.0}) for x in "abc"]
    got = _sizes(ElasticSize(), jobs, cl)
    assert sum(got.values()) == 8 and max(got.values()) <= 4


def test_elastic_job_larger_than_a_node_spans_at_its_minimum() -> None:
    cl = Cluster.homogeneous(2, 4)
    big = Job(JobSpec("big", 0, 6, 100.0))  # no curve: rigid 6 GPUs
    small = _job("s", {1: 1.0, 4: 4.0})
    for j in (big,):
        j.arrive(j.arrival)
    view = _view(cl, [big, small])
    reqs = ElasticSize().size([(big,), (small,)], view)
    assert [(r.job.id, r.gpus) for r in reqs] == [("big", 6), ("s", 2)]
    plan = pb.lookup("place", "packed-sticky")().place(reqs, view)
    check_plan(plan, cl)
    assert plan.allocations["big"].spans_nodes and plan.allocations["s"].num_gpus == 2


def test_elastic_bad_parameters() -> None:
    with pytest.raises(pb.PolicyError, match="v_bound"):
        pb.make("size", "elastic", {"v_bound": -1})
    with pytest.raises(pb.PolicyError, match="slowdown"):
        pb.make("size", "elastic", {"slowdown": "ratio"})
    with pytest.raises(pb.PolicyError, match="slot"):
        pb.make("size", "static", {"slot": 0})
    cl = Cluster.homogeneous(1, 6)
    with pytest.raises(pb.PolicyError, match="min_gpus"):
        _sizes(ElasticSize(), [_job("a", SLOW, min_gpus=3, max_gpus=2)], cl)
    with pytest.raises(pb.PolicyError, match="curve is 0"):
        _sizes(ElasticSize(), [_job("a", {2: 1.0}, gpus=2, min_gpus=1)], cl)
    with pytest.raises(pb.PolicyError, match="the cluster has 6"):
        _sizes(ElasticSize(), [_job("a", {8: 1.0}, gpus=8)], cl)


# ---------------------------------------------------------------------------
# static slots
def test_static_slots_one_job_per_slot() -> None:
    cl = Cluster.homogeneous(1, 6)
    jobs = [_job(x, SLOW) for x in "abcd"]
    view = _view(cl, jobs)
    reqs = StaticSize(slot=2).size([(j,) for j in jobs], view)
    assert [r.gpus for r in reqs] == [2, 2, 2, 2]
    plan = StaticPlace(slot=2).place(reqs, view)
    check_plan(plan, cl)
    assert {jid: a.gpu_ids for jid, a in plan.allocations.items()} == {"a": (0, 1), "b": (2, 3), "c": (4, 5)}
    # slots of 4 on 6 GPUs: one slot, GPUs 4-5 never used
    plan4 = StaticPlace(slot=4).place(StaticSize(slot=4).size([(j,) for j in jobs], view), view)
    assert {jid: a.gpu_ids for jid, a in plan4.allocations.items()} == {"a": (0, 1, 2, 3)}


def test_static_rejects_jobs_that_cannot_run_on_a_slot() -> None:
    cl = Cluster.homogeneous(1, 6)
    rigid = Job(JobSpec("r", 0, 2, 100))
    with pytest.raises(pb.PolicyError, match="job r"):
        StaticSize(slot=1).size([(rigid,)], _view(cl, [rigid]))
    with pytest.raises(pb.PolicyError, match="larger than any node"):
        StaticSize(slot=8).size([(rigid,)], _view(cl, [rigid]))


# ---------------------------------------------------------------------------
# hysteresis
def _alloc(jid: str, gpus: tuple[int, ...]) -> Allocation:
    return Allocation(jid, (Part(0, gpus, 0, 0),))


def test_hysteresis_threshold_and_starts() -> None:
    cl = Cluster.homogeneous(1, 6)
    a = _job("a", {1: 1.0, 2: 1.5, 3: 1.9})
    b = _job("b", SLOW)
    view = _view(cl, [a, b], current={"a": _alloc("a", (0, 1))})
    h = Hysteresis(threshold=1.0)
    grow = Plan({"a": _alloc("a", (0, 1, 2))})  # +0.4 it/s: not worth a reallocation
    assert h(grow, view).allocations == {"a": _alloc("a", (0, 1))}
    assert h.rejected == 1
    start = Plan({"a": _alloc("a", (0,)), "b": _alloc("b", (1,))})  # b starts: applied although slower
    assert h(start, view) is start
    assert Hysteresis(threshold=0.4)(grow, view) is grow
    with pytest.raises(ValueError):
        Hysteresis(threshold=-1)


def test_hysteresis_never_reallocates_a_protected_job() -> None:
    cl = Cluster.homogeneous(1, 6)
    a, b = _job("a", SLOW), _job("b", FAST)
    lc = Lifecycle("a", 0.0)
    for st in (S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY, S.LAUNCHING):
        lc.to(st, 0.0)
    lc.to(S.RUNNING_PROTECTED, 10.0)  # protected until 40
    a.lifecycle = lc
    cur = {"a": _alloc("a", (0, 1, 2, 3))}
    view = _view(cl, [a, b], current=cur, now=20.0)
    cand = Plan({"a": _alloc("a", (0,)), "b": _alloc("b", (1, 2, 3, 4, 5))})
    out = Hysteresis()(cand, view)
    # repaired: a keeps its 4 GPUs, b's GPUs collide with them so b does not start
    assert out.allocations == cur
    cand2 = Plan({"a": _alloc("a", (0,)), "b": _alloc("b", (4, 5))})
    assert Hysteresis()(cand2, view).allocations == {"a": cur["a"], "b": _alloc("b", (4, 5))}


def test_scheduler_gang_requests_follow_a_hook_that_keeps_a_job() -> None:
    cl = Cluster.homogeneous(1, 6)
    a = _job("a", {1: 1.0, 2: 1.5, 3: 1.9})
    cur = {"a": _alloc("a", (0, 1))}
    sched = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky", params={"v_bound": 0.5})
    assert len(sched.hooks) == 1 and isinstance(sched.hooks[0], Hysteresis)
    rnd = sched.schedule(_view(cl, [a], current=cur))
    plan = rnd.plan
    assert plan.allocations == cur  # growing to 6 GPUs gains 0.4 it/s < 1
    assert [r.gpus for r in rnd.requests] == [2]
    no_h = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky", params={"hysteresis": None})
    assert no_h.hooks == []


def test_a_hook_that_keeps_a_grouped_job_splits_the_groups_request() -> None:
    # one node of 8 GPUs; b (8 GPUs, waiting, first in the order) and a (asks 8, elastic sizing gave it 1 GPU,
    # still protected) stress different resources, so Muri groups them: one request (b, a) for 8 GPUs.  The
    # hysteresis hook keeps the protected a on its one GPU (a plan with a group is not repaired): a's request
    # must become its own, of 1 GPU (the gang check compares every member with its request's count), and
    # b's stays 8; before, only the request's first member was matched with the kept plan: "a: gang broken"
    from gpuloom.perf.assembly import build_model

    cl = Cluster.homogeneous(1, 8, 24, 128_000)
    curve = {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.0}
    b = _job("b", curve, 8, resource_times=[0.0, 0.1, 0.4, 0.0])
    a = _job("a", curve, 8, arrival=1.0, resource_times=[0.0, 0.4, 0.1, 0.0])
    a.index = 1
    lc = Lifecycle("a", 0.0)
    for st in (S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY, S.LAUNCHING):
        lc.to(st, 0.0)
    lc.to(S.RUNNING_PROTECTED, 5.0)  # protected until 20
    a.lifecycle = lc
    a.alloc = Allocation("a", (Part(0, (0,), 3, 16_000),), (), (1, None, None, "a"))
    sched = Scheduler.from_names("fifo", "muri", "elastic", "packed-sticky")
    model = build_model(cl)
    sched.bind(model)
    model.bind({"a": a, "b": b})
    view = pb.View(10.0, cl, [b, a], {"a": a.alloc}, model, np.random.default_rng(0))
    rnd = sched.schedule(view)
    assert rnd.plan.allocations == {"a": a.alloc}  # the hook kept the running plan
    assert sorted(([j.id for j in r.jobs], r.gpus) for r in rnd.requests) == [(["a"], 1), (["b"], 8)]
    sched.check(rnd, view)


# ---------------------------------------------------------------------------
# the lifecycle in the simulator
LIN2 = {1: 1.0, 2: 2.0}


def _lin_spec(jid: str, arrival: float) -> JobSpec:
    return JobSpec.from_iterations(jid, arrival, 1, 100, 1.0, attrs={"throughput": LIN2})


def _run_two_jobs() -> tuple[Simulator, object]:
    cl = Cluster.homogeneous(1, 2)
    sched = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky")
    cfg = SimConfig(round_len=10, reschedule_on_arrival=True, reschedule_on_completion=True,
                    lifecycle=LifecycleTimes(launch=10, checkpoint=5, stop=2))
    sim = Simulator(cl, [_lin_spec("a", 0), _lin_spec("b", 50)], sched, None, cfg)
    return sim, sim.run()


def test_lifecycle_timeline_hand_checked() -> None:
    # a: starts on 2 GPUs at 0, launches until 10 (protected until 40), runs at 2 it/s: 80 done at 50.
    # b arrives at 50: a shrinks to 1 (checkpoint 50-55, stop 55-57, launch 57-67), b launches 50-60.
    # a: 20 left at 1 it/s from 67 -> finishes at 87.  b: protected until 90, so it grows in the
    # round at 90 (+1 it/s >= threshold): 30 done, 70 left; 90-107 reallocating, 2 it/s -> 142.
    sim, res = _run_two_jobs()
    a, b = res.job("a"), res.job("b")  # type: ignore[attr-defined]
    assert a.finish == pytest.approx(87.0) and b.finish == pytest.approx(142.0)
    assert (a.resizes, b.resizes) == (1, 1)
    la = sim.by_id["a"].lifecycle
    assert [(t, s) for t, s in la.history] == [
        (0, S.WAITING_FOR_INITIAL_CONTACT), (0, S.WAITING_FOR_INITIAL_RESOURCE), (0, S.STANDBY),
        (0, S.LAUNCHING), (10, S.RUNNING_PROTECTED), (40, S.RUNNING), (50, S.CHECKPOINTING),
        (55, S.STOPPING), (57, S.STANDBY), (57, S.LAUNCHING), (67, S.RUNNING_PROTECTED), (87, S.FINISHED),
    ]
    lb = sim.by_id["b"].lifecycle
    assert [(t, s) for t, s in lb.history][3:] == [
        (50, S.LAUNCHING), (60, S.RUNNING_PROTECTED), (90, S.RUNNING), (90, S.CHECKPOINTING),
        (95, S.STOPPING), (97, S.STANDBY), (97, S.LAUNCHING), (107, S.RUNNING_PROTECTED),
        (137, S.RUNNING), (142, S.FINISHED),  # protection: 3 x 10 s launch
    ]
    assert b.phases == pytest.approx({"queued": 0.0, "launching": 27.0, "running": 65.0})
    assert a.phases == pytest.approx({"queued": 0.0, "launching": 27.0, "running": 60.0})


def test_lifecycle_without_hysteresis_overrides_protection_visibly() -> None:
    cl = Cluster.homogeneous(1, 2)
    sched = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky",
                                 params={"hysteresis": None, "respect_protection": False})
    cfg = SimConfig(round_len=10, reschedule_on_arrival=True, lifecycle=LifecycleTimes(10, 5, 2))
    sim = Simulator(cl, [_lin_spec("a", 0), _lin_spec("b", 15)], sched, None, cfg)
    sim.run()
    hist = sim.by_id["a"].lifecycle.history
    # a is protected 10-40, but the plan at 15 shrinks it: protection ends at 15, then a checkpoint
    assert (15, S.RUNNING) in hist and (15, S.CHECKPOINTING) in hist


def test_lifecycle_preemption_and_resume() -> None:
    # SRTF with proportional sizing: b (short) preempts a; a waits for its stop, then relaunches
    cl = Cluster.homogeneous(1, 1)
    specs = [JobSpec("a", 0, 1, 100.0), JobSpec("b", 30, 1, 10.0)]
    res = simulate(cl, specs, order="srtf", round_len=10, reschedule_on_arrival=True,
                   reschedule_on_completion=True, lifecycle=LifecycleTimes(launch=4, checkpoint=3, stop=1))
    # a: launch 0-4, runs 4-30 (26 done). b: arrives 30, launch 30-34, runs 34-44.
    # a: checkpoint 30-33, stop 33-34; restarts at 44: launch 44-48, 74 left -> 122
    assert res.job("b").finish == pytest.approx(44.0)
    assert res.job("a").finish == pytest.approx(122.0)
    assert res.job("a").phases == pytest.approx({"queued": 10.0, "launching": 12.0, "running": 100.0})
    assert res.job("a").preemptions == 1


def test_lifecycle_durations_per_job_and_bad_values() -> None:
    cl = Cluster.homogeneous(1, 1)
    spec = JobSpec("a", 0, 1, 10.0, attrs={"launch_time": 2.5})
    res = simulate(cl, [spec], round_len=10, lifecycle=LifecycleTimes(launch=100))
    assert res.job("a").finish == pytest.approx(12.5)
    # attrs that name none of the times: the common ones (launch 100)
    other = JobSpec("b", 0, 1, 10.0, attrs={"note": "x"})
    assert simulate(cl, [other], round_len=10, lifecycle=LifecycleTimes(launch=100)).job("b").finish == 110.0
    with pytest.raises(JobError, match="launch_time"):
        simulate(cl, [JobSpec("a", 0, 1, 10.0, attrs={"launch_time": -1})], lifecycle=LifecycleTimes())
    with pytest.raises(ValueError, match="checkpoint"):
        LifecycleTimes(checkpoint=float("nan"))


def test_overhead_preset_keeps_old_behaviour() -> None:
    # no lifecycle times given: the overhead preset (launch_overhead for a first start), walked as a lifecycle
    cl = Cluster.homogeneous(1, 2)
    res = simulate(cl, [JobSpec("a", 0, 1, 10.0)], round_len=10, launch_overhead=3.0)
    assert res.job("a").finish == pytest.approx(13.0)
    assert res.job("a").phases == {"queued": 0.0, "launching": 3.0, "running": 10.0}


def test_user_model_without_scaling_factor_is_an_error() -> None:
    cl = Cluster.homogeneous(1, 2)
    sched = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky")
    with pytest.raises(SimulationError, match="scaling"):
        Simulator(cl, [_lin_spec("a", 0)], sched, ThroughputModel.default(cl))


# ---------------------------------------------------------------------------
# the thesis scenario and composition with other stages
F1 = {"resnet50": 6.524, "inception3": 4.305}
F6 = {"resnet50": (12.062 + 23.714) / 2, "inception3": (8.468 + 16.696) / 2}


def test_thesis_specs() -> None:
    specs = thesis_specs(step="gpu")
    assert [(s.arrival, s.model, s.gpus, s.iterations) for s in specs] == [
        (0, "resnet50", 1, 2000), (100, "inception3", 1, 2000), (200, "resnet50", 1, 2000), (300, "inception3", 1, 2000)
    ]
    assert specs[0].duration == pytest.approx(2000 / F1["resnet50"])


def test_thesis_global_steps_strong_scaling_by_hand() -> None:
    # ResNet-50's weak-scaling curve: f(1) = 6.524, f(2) = 6.667 mini-batches/s (batch 32 per GPU), so
    # one mini-batch computes in T(1) = 1/6.524 = 0.1533 s and a 2-GPU step synchronises for
    # T(2) - T(1) = 2/6.667 - 0.1533 = 0.1467 s.  A thesis step is 90 samples split over the GPUs:
    # g(1) = 1 / (90/32 x 0.1533) = 2.319 steps/s; g(2) = 1 / (90/64 x 0.1533 + 0.1467) = 2.762.
    specs = thesis_specs()
    g = specs[0].attrs["throughput"]
    t1 = 1 / F1["resnet50"]
    assert g[1] == pytest.approx(1 / (90 / 32 * t1), rel=1e-3) == pytest.approx(2.319, abs=1e-3)
    assert g[2] == pytest.approx(1 / (90 / 64 * t1 + 2 / 6.667 - t1), rel=2e-3)
    assert specs[0].duration == pytest.approx(2000 / g[1])
    # the hysteresis threshold (1 step/s) compares global steps/s: the model's iterations/s
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.perf.model import ThroughputModel

    m = ThroughputModel.default(Cluster.homogeneous(1, 6)).add(ScalingFactor())
    two = Allocation("0", (Part(0, (0, 1), 2, 2000),))
    assert m.iterations_per_second(Job(specs[0]), two) == pytest.approx(g[2])
    # the thesis' ranking: F-scheduling beats every static partition, n = 6 is the worst
    runs = compare_elastic_static(specs, Cluster.homogeneous(1, 6), slots=(1, 2, 3, 6))
    jct = {k: r.result.summary()["mean_jct"] for k, r in runs.items()}
    ms = {k: r.result.summary()["makespan"] for k, r in runs.items()}
    assert all(jct["elastic v<=0.5"] < v for k, v in jct.items() if k.startswith("static"))
    assert all(ms["elastic v<=0.5"] < v for k, v in ms.items() if k.startswith("static"))
    assert max(jct, key=jct.get) == "static n=6" and max(ms, key=ms.get) == "static n=6"


def test_thesis_scenario_elastic_beats_static(tmp_path) -> None:  # noqa: ANN001
    lt = LifecycleTimes(launch=10, checkpoint=5, stop=2)
    runs = compare_elastic_static(thesis_specs(step="gpu"), Cluster.homogeneous(1, 6), slots=(1, 6), lifecycle=lt,
                                  round_len=10.0)
    ms = {k: r.result.summary()["makespan"] for k, r in runs.items()}
    # static n=1: every job alone on one GPU: the last (InceptionV3 at 300) ends at 300 + 10 + 2000/f(1)
    assert ms["static n=1"] == pytest.approx(300 + 10 + 2000 / F1["inception3"], abs=1e-6)
    # static n=6: one job at a time on all 6 GPUs, serially: 4 launches + 2000/f(6) each
    serial = 4 * 10 + 2 * 2000 / F6["resnet50"] + 2 * 2000 / F6["inception3"]
    assert ms["static n=6"] == pytest.approx(serial, abs=1e-6)
    assert ms["elastic v<=0.5"] < ms["static n=6"] < ms["static n=1"]
    for run in runs.values():
        for job_id, q, lch, r in phase_breakdown(run.result):
            rec = run.result.job(job_id)
            assert q + lch + r == pytest.approx(rec.finish - rec.arrival)  # phases cover the whole JCT
            assert r * 1.0 >= 2000 / F6[rec.model] - 1e-6  # no job runs faster than on the whole machine
    u, c = utilisation_cdf(runs["static n=1"].result)
    assert u[0] > 0 and c[-1] == pytest.approx(1.0) and np.all(np.diff(c) > 0)
    ub, cb = utilisation_cdf(runs["elastic v<=0.5"].result, runs["elastic v<=0.5"].usage)
    assert cb[-1] == pytest.approx(1.0)
    p1 = plot_phase_breakdown(runs, tmp_path / "b.png")
    p2 = plot_utilisation_cdf(runs, tmp_path / "u.png")
    assert p1.stat().st_size > 1000 and p2.stat().st_size > 1000


def _check_protection_respected(sim: Simulator) -> None:
    for j in sim.jobs:
        lc = j.lifecycle
        h = lc.history
        for (t0, s0), (t1, s1) in zip(h, h[1:], strict=False):
            if s0 is S.RUNNING_PROTECTED and s1 is S.RUNNING:
                # protection ended exactly when it expired (3 x the launch that preceded it)
                launch = t0 - max(t for t, s in h if s is S.LAUNCHING and t <= t0)
                assert t1 == pytest.approx(t0 + 3 * launch)


@pytest.mark.parametrize("order", ["fifo", "srtf", "las"])
@pytest.mark.parametrize("place", ["packed-sticky", "packed-non-sticky", "random-sticky", "pal"])
def test_elastic_composes_with_orders_and_placements(order: str, place: str) -> None:
    if place not in pb.names("place"):
        pytest.skip(f"place policy {place} not available in this checkout")
    rng = np.random.default_rng(3)
    models = ["resnet50", "inception3", "googlenet", "resnet101", "vgg16"]
    specs = []
    for i in range(24):
        m = models[i % len(models)]
        f1 = builtin_curve(m)(1)  # type: ignore[misc]
        specs.append(JobSpec.from_iterations(f"j{i}", float(i * 40), int(rng.integers(1, 3)), int(rng.integers(200, 900)),
                                             1.0 / f1, model=m))
    cl = Cluster.homogeneous(2, 4)
    sched = Scheduler.from_names(order, "none", "elastic", place, params={"v_bound": 0.5})
    cfg = SimConfig(round_len=30, reschedule_on_arrival=True, reschedule_on_completion=True,
                    lifecycle=LifecycleTimes(launch=5, checkpoint=2, stop=1), check=True)
    sim = Simulator(cl, specs, sched, None, cfg)
    res = sim.run()
    assert len(res.finished) == len(specs)  # invariants were checked every round by the engine
    for rec in res.jobs:
        assert sum(rec.phases.values()) == pytest.approx(rec.finish - rec.arrival)  # type: ignore[union-attr]
        assert sim.by_id[rec.id].lifecycle.state is S.FINISHED
    _check_protection_respected(sim)
    assert math.isfinite(res.summary()["mean_jct"])


def _tiresias_specs(path) -> list[JobSpec]:  # noqa: ANN001
    import csv

    with path.open(newline="") as fh:
        return [
            JobSpec.from_iterations(f"t{r['job_id']}", float(r["submit_time"]), int(r["num_gpu"]), int(r["iterations"]),
                                    float(r["duration"]) / int(r["iterations"]), model=r["model_name"])
            for r in csv.DictReader(fh)
        ]


def test_elastic_on_the_tiresias_trace(data_dir) -> None:  # noqa: ANN001
    specs = _tiresias_specs(data_dir / "tiresias" / "60_job.csv")
    cl = Cluster.homogeneous(2, 8)
    lt = LifecycleTimes(launch=10, checkpoint=5, stop=2)
    common = dict(round_len=60, reschedule_on_arrival=True, reschedule_on_completion=True, lifecycle=lt)
    el = simulate(cl, specs, size="elastic", params={"v_bound": 0.5}, **common)
    rigid = simulate(cl, specs, **common)
    st = simulate(cl, specs, size="static", place="static", params={"slot": 2}, **common)
    for res in (el, rigid, st):
        assert len(res.finished) == 60
        for rec in res.jobs:
            assert sum(rec.phases.values()) == pytest.approx(rec.finish - rec.arrival)  # type: ignore[union-attr]
    # with proportional sizing a job runs at speed 1, or 1/1.7 when its GPUs span the two nodes
    for rec in rigid.jobs:
        ratio = rec.phases["running"] / rec.duration  # type: ignore[index]
        assert ratio == pytest.approx(1.0) or ratio == pytest.approx(1.7)
    assert sum(r.resizes for r in el.jobs) > 0


def test_utilisation_cdf_exact_for_static_single_gpu_slots() -> None:
    # static n=1 on 6 GPUs: the four jobs hold 1,2,3,4,3,2,1 GPUs over [0,100,200,300,316.6,516.6,574.6,774.6]
    runs = compare_elastic_static(thesis_specs(step="gpu"), Cluster.homogeneous(1, 6), slots=(1,), elastic={},
                                  lifecycle=LifecycleTimes(10, 5, 2))
    res = runs["static n=1"].result
    e0 = 10 + 2000 / F1["resnet50"]  # 316.6: a ResNet-50 job's launch + run on 1 GPU
    e1 = 10 + 2000 / F1["inception3"]  # 474.6
    total = 300 + e1
    u, c = utilisation_cdf(res)
    assert u.tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6])
    # one GPU: [0,100) and [100+e1, 300+e1); two: [100,200) and [200+e0, 100+e1)
    at1 = 100 + 200
    at2 = 100 + (100 + e1) - (200 + e0)
    at4 = e0 - 300
    assert c.tolist() == pytest.approx([at1 / total, (at1 + at2) / total, 1 - at4 / total, 1.0])
    # busy: the same minus the four 10-s launches (during which 1 GPU less is busy)
    ub, cb = utilisation_cdf(res, runs["static n=1"].usage)
    assert ub[0] == 0.0 and cb[0] == pytest.approx(10 / total)  # [0,10): nothing busy yet


def test_usage_recorder_hand_checked() -> None:
    from gpuloom.sim.elastic import UsageRecorder

    cl = Cluster.homogeneous(1, 2)
    sched = Scheduler.from_names("fifo", "none", "elastic", "packed-sticky")
    cfg = SimConfig(round_len=10, reschedule_on_arrival=True, reschedule_on_completion=True,
                    lifecycle=LifecycleTimes(launch=10, checkpoint=5, stop=2))
    rec = UsageRecorder()
    Simulator(cl, [_lin_spec("a", 0), _lin_spec("b", 50)], sched, None, cfg, observers=[rec]).run()
    t, held, busy = rec.series()
    # timeline of test_lifecycle_timeline_hand_checked: a busy [10,50) on 2 and [67,87) on 1;
    # b busy [60,90) on 1 and [107,142) on 2; both hold GPUs from their start to their end
    pts = dict(zip(t.tolist(), zip(held.tolist(), busy.tolist(), strict=True), strict=True))
    assert pts == {0: (2, 0), 10: (2, 2), 50: (2, 0), 60: (2, 1), 67: (2, 2), 87: (1, 1), 90: (2, 0),
                   107: (2, 2), 142: (0, 0)}
