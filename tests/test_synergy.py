"""Synergy: sensitivity profiles, the sensitivity factor, GREEDY / TUNE / OPT, the workload generator."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part, Plan, PlanError, check_plan
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.sensitivity import (
    CPU_AXIS,
    MEM_AXIS_4,
    MEM_AXIS_5,
    Catalogue,
    DataPipelineModel,
    SensitivityError,
    SensitivityFactor,
    SensitivityProfile,
    add_sensitivity,
    default_grid,
    demand_vector,
    load_catalogue,
    safe_number,
)
from gpuloom.policies.base import PolicyError, View
from gpuloom.policies.synergy import check_tune_invariants, plan_throughput, tune_invariant_observer
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, SimulationError, Simulator
from gpuloom.sim.synergy_workload import WorkloadError, synergy_workload
from gpuloom.sim.traces import load_trace

# A small hand-made catalogue with the real alexnet_1 and gnmt_1 rows, so the
# allocator tests run without the data directory.
ALEXNET_1 = [
    [0.1, 0.3, 0.3, 0.3, 0.3],
    [0.1, 0.66, 0.66, 0.66, 0.66],
    [0.1, 1, 1, 1, 1],
    [0.1, 1.25, 1.25, 1.25, 1.25],
    [0.1, 1.53, 1.53, 1.53, 1.53],
    [0.1, 1.75, 1.75, 1.75, 1.75],
    [0.1, 2, 2, 2, 2],
    [0.1, 2, 2.94, 2.94, 2.94],
    [0.1, 2, 2.94, 2.94, 2.94],
]
FLAT = [[1.0] * 5 for _ in CPU_AXIS]


def small_catalogue() -> Catalogue:
    return Catalogue(
        [
            SensitivityProfile("alexnet", 1, CPU_AXIS, MEM_AXIS_5, np.array(ALEXNET_1)),
            SensitivityProfile("gnmt", 1, CPU_AXIS, MEM_AXIS_5, np.array(FLAT)),
        ]
    )


def make_view(cluster: Cluster, specs: list[JobSpec], cat: Catalogue) -> View:
    model = add_sensitivity(ThroughputModel.default(cluster), cat)
    jobs = [Job(s, i) for i, s in enumerate(specs)]
    for j in jobs:
        j.arrive(j.arrival)
    return View(0.0, cluster, jobs, {}, model, np.random.default_rng(0))


def scenario() -> tuple[Cluster, list[JobSpec]]:
    """One Synergy server (8 GPUs, 24 cores, 500 GB): two alexnets then six gnmts, FIFO."""
    cl = Cluster.homogeneous(1, 8, 24, 500_000)
    specs = [JobSpec("a1", 0, 1, 100, model="alexnet"), JobSpec("a2", 1, 1, 100, model="alexnet")]
    specs += [JobSpec(f"g{i}", 2 + i, 1, 100, model="gnmt") for i in range(6)]
    return cl, specs


def run_size(size: str, view: View, **params: object) -> tuple[Plan, Scheduler]:
    sched = Scheduler.from_names("fifo", "none", size, "packed-sticky", params=params)
    plan = sched.schedule(view).plan
    check_plan(plan, view.cluster)
    return plan, sched


# -- parsing -------------------------------------------------------------------
def test_safe_number_evaluates_arithmetic_only() -> None:
    assert safe_number("62.5*2") == 125.0
    assert safe_number("int(62.5/3)") == 20.0
    assert safe_number(" -3 + 4 // 3 ") == -2.0
    assert safe_number("1.53") == 1.53
    for bad in ("__import__('os')", "x", "2**3", "(1).real", "open('f')", "int(1, 2)", "1/0", ""):
        with pytest.raises(ValueError):
            safe_number(bad)


def test_catalogue_from_real_file(data_dir: Path) -> None:
    cat = load_catalogue(data_dir / "synergy/model_sensitivity_profiles.csv")
    assert len(cat) == 33
    a1 = cat.get("alexnet", 1)
    assert a1.mem_axis == MEM_AXIS_5 and a1.cpu_axis == CPU_AXIS
    assert a1.best_cpus == 12 and a1.best_mem_mb == 125_000 and a1.speedup == 2.94
    assert a1.throughput_at(12, 125_000, 1) == 2.94
    assert a1.throughput_at(3, 62_500, 1) == 1.0  # GPU-proportional point
    # bert_1's mem cell is int(62.5/3)
    assert cat.get("bert", 1).best_mem_mb == 20_000
    # multi-GPU matrices: 4 memory columns, per-GPU axes, unmeasured cells inherit
    a2 = cat.get("alexnet", 2)
    assert a2.mem_axis == MEM_AXIS_4
    assert a2.raw[7, 0] == 0 and a2.tput[7, 0] == 2.33
    assert a2.throughput_at(18, 125_000, 2) == 2.33
    assert cat.get("m5", 2).throughput_at(12, 375_000, 2) == 2.5  # best point 6 cores, 187.5 GB per GPU
    # counts without a matrix use the largest profiled count below
    assert cat.get("alexnet", 8) is cat.get("alexnet", 4)
    assert cat.get("shufflenet", 12).gpus == 12
    assert cat.get("unknown", 1) is None
    # the file's best points are the demand vectors (within 10 %) of every 1-GPU profile
    for p in cat:
        if p.gpus != 1:
            continue
        cps, mps = default_grid(p, 1, 24, 500_000)
        d = demand_vector(p, 1, cps, mps, 0.10, floor=(3, 62_500))
        at_file = p.throughput_at(p.best_cpus, p.best_mem_mb, 1)
        assert p.throughput_at(d.cpus, d.mem_mb, 1) * 1.10 >= at_file
        assert d.cpus <= p.best_cpus


def test_catalogue_bad_files(tmp_path: Path) -> None:
    head = "model_file,cpus,mem,speed,batch,placement_penalty,speedup,iter_time,iter_time_base,tput_rows(cpu_idx x mem_idx)\n"
    rows = " | ".join(["1,1,1,1,1"] * 9)
    cases = {
        "no_gpus": (f'alexnet,1,1,1,1,1,1,1,1,"{rows}"\n', "not MODEL_GPUS"),
        "bad_cell": (f'alexnet_1,os.system(1),1,1,1,1,1,1,1,"{rows}"\n', ":2: field 'cpus'"),
        "bad_tput": ('alexnet_1,1,1,1,1,1,1,1,1,"1,1,x,1,1"\n', "tput row 0"),
        "ragged": ('alexnet_1,1,1,1,1,1,1,1,1,"1,1,1,1,1 | 1,1"\n', "different lengths"),
        "rows": ('alexnet_1,1,1,1,1,1,1,1,1,"1,1,1,1,1 | 1,1,1,1,1"\n', "2 CPU rows"),
        "fields": ("alexnet_1,1,1\n", "3 fields"),
        "dup": (f'a_1,1,1,1,1,1,1,1,1,"{rows}"\na_1,1,1,1,1,1,1,1,1,"{rows}"\n', "given twice"),
    }
    for name, (body, msg) in cases.items():
        f = tmp_path / f"{name}.csv"
        f.write_text(head + body)
        with pytest.raises(SensitivityError, match=msg):
            load_catalogue(f)
    with pytest.raises(SensitivityError, match="missing column"):
        (tmp_path / "h.csv").write_text("model_file,cpus\n")
        load_catalogue(tmp_path / "h.csv")
    with pytest.raises(SensitivityError, match="No such file"):
        load_catalogue(tmp_path / "absent.csv")


# -- the factor ----------------------------------------------------------------
def test_sensitivity_factor_speeds() -> None:
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    f = SensitivityFactor(small_catalogue(), cl)

    def speed(model: str, gpus: int, cpus: int, mem: int, node: int = 0) -> float:
        job = Job(JobSpec("j", 0, gpus, 10, model=model))
        ids = tuple(cl.node_gpus(node))[:gpus]
        return f(job, Allocation("j", (Part(node, ids, cpus, mem),)))

    assert speed("alexnet", 1, 12, 125_000) == pytest.approx(2.94)
    assert speed("alexnet", 1, 3, 62_500) == 1.0
    assert speed("alexnet", 1, 7, 124_999) == pytest.approx(1.75)  # floored to 6 cores, 62.5 GB
    assert speed("alexnet", 1, 12, 20_830) == pytest.approx(0.1)  # dataset does not fit: thrashing
    assert speed("alexnet", 2, 24, 250_000) == pytest.approx(2.94)  # 1-GPU matrix per GPU
    assert speed("gnmt", 1, 1, 20_830) == 1.0
    assert speed("resnet-unknown", 1, 1, 1) == 1.0
    # a spec's own profile wins over the catalogue
    pipe = DataPipelineModel(gpu_rate=100, cpu_rate=25, dataset_mb=200_000, sample_mb=0.1, storage_mb_s=5)
    job = Job(JobSpec("p", 0, 1, 10, model="alexnet", profile=pipe))
    a = Allocation("p", (Part(0, (0,), 4, 200_000),))
    ref = Allocation("p", (Part(0, (0,), 3, 62_500),))
    # at (3, 62.5 GB): min(100, 75, 5 / (0.6875 * 0.1)) = 72.727...; at (4, 200 GB): min(100, 100, inf)
    assert f(job, ref) == 1.0
    assert f(job, a) == pytest.approx(100 / (5 / (0.6875 * 0.1)))
    # add_sensitivity replaces an existing factor
    m = add_sensitivity(add_sensitivity(ThroughputModel.default(cl), small_catalogue()), small_catalogue())
    assert [x.name for x in m.factors] == ["locality", "sensitivity"]


def test_data_pipeline_model() -> None:
    p = DataPipelineModel(gpu_rate=100, cpu_rate=20, dataset_mb=100_000, sample_mb=0.5, storage_mb_s=25)
    assert p.cache_hit(25_000) == 0.25
    assert p.io_rate(25_000) == pytest.approx(25 / (0.75 * 0.5))
    assert p.throughput_at(10, 100_000, 1) == 100  # all cached, 10 cores feed the GPU
    assert p.throughput_at(2, 100_000, 1) == 40  # CPU bound
    assert p.throughput_at(10, 50_000, 1) == pytest.approx(100)  # 25 / (0.5 * 0.5) = 100
    assert p.throughput_at(10, 0, 1) == 50
    assert p.memory_for(100, [0, 25_000, 50_000, 100_000]) == 50_000
    with pytest.raises(SensitivityError, match="dataset_mb"):
        DataPipelineModel(1, 1, 0, 1, 1)


# -- allocators on a hand-built server -----------------------------------------
def test_tune_beats_proportional_greedy_strands_opt_at_least_tune() -> None:
    cl, specs = scenario()
    cat = small_catalogue()

    view = make_view(cl, specs, cat)
    prop, _ = run_size("proportional", view)
    assert len(prop) == 8 and plan_throughput(prop, view) == pytest.approx(8.0)

    greedy, gs = run_size("greedy", view)
    # both alexnets take 12 cores and 125 GB: the six gnmts find no core, 6 GPUs idle
    assert set(greedy.allocations) == {"a1", "a2"}
    assert [(a.cpus, a.mem_mb) for a in greedy.allocations.values()] == [(12, 125_000)] * 2
    assert plan_throughput(greedy, view) == pytest.approx(5.88)
    with pytest.raises(PlanError, match="job g0 waits although the jobs ahead of it leave 6 GPUs"):
        check_tune_invariants(greedy, view, gs.size.last_order)
    with pytest.raises(PlanError, match="job g0 waits for 1 GPUs while 6 GPUs are idle"):
        check_tune_invariants(greedy, view)

    tune, ts = run_size("tune", view)
    got = {j: (a.cpus, a.mem_mb) for j, a in tune.allocations.items()}
    # a2 is demoted to proportional so the first gnmt fits; gnmts take 1 core, 20.83 GB each
    assert got == {"a1": (12, 125_000), "a2": (3, 62_500), **{f"g{i}": (1, 20_830) for i in range(6)}}
    assert plan_throughput(tune, view) == pytest.approx(9.94)
    assert ts.size.last_stats["demoted"] == 1 and ts.size.last_stats["reclaimed"] == 1
    check_tune_invariants(tune, view, ts.size.last_order)

    opt, os_ = run_size("opt", view)
    # the LP splits the 18 cores left by the gnmts 12 / 6: 2.94 + 1.75 + 6
    assert os_.size.last_objective == pytest.approx(10.69)
    assert plan_throughput(opt, view) == pytest.approx(10.69)
    assert plan_throughput(opt, view) >= plan_throughput(tune, view)
    assert sorted(a.cpus for a in opt.allocations.values()) == [1] * 6 + [6, 12]
    assert os_.size.last_fallback is None
    assert os_.size.unbound_lps == 0  # (the fastest points, 2 x 12 + 6 cores, do not fit 24: solved)


def test_opt_takes_every_fastest_point_that_fits_without_the_allocation_lp(monkeypatch: pytest.MonkeyPatch) -> None:
    # one alexnet and six gnmts: 12 + 6 x 1 cores and 125 + 6 x 20.83 GB fit the server's 24 cores
    # and 500 GB, so each job's fastest point is the allocation LP's one optimum
    cl, specs = scenario()
    view = make_view(cl, specs[1:], small_catalogue())
    plan, sched = run_size("opt", view)
    got = {j: (a.cpus, a.mem_mb) for j, a in plan.allocations.items()}
    assert got == {"a2": (12, 125_000), **{f"g{i}": (1, 20_830) for i in range(6)}}
    assert sched.size.unbound_lps == 1 and sched.size.last_objective == pytest.approx(2.94 + 6)
    # the LP itself gives the same plan
    from gpuloom.policies.synergy_opt import Opt

    monkeypatch.setattr(Opt, "_fastest_fit", staticmethod(lambda *a: None))
    solved, sched2 = run_size("opt", view)
    assert solved.allocations == plan.allocations and sched2.size.unbound_lps == 0
    assert sched2.size.last_objective == pytest.approx(sched.size.last_objective)


def test_opt_fastest_points_need_a_clear_winner_and_room() -> None:
    from gpuloom.policies.synergy_opt import Opt

    one = ([(4, 100), (8, 200)], [1.0, 1.5])
    assert Opt._fastest_fit([one, one], 16, 400) == [(8, 200, 1.5)] * 2
    assert Opt._fastest_fit([one, one], 15, 400) is None  # 16 cores asked
    assert Opt._fastest_fit([one, one], 16, 399) is None
    for gap in (0.0, 1e-7, 1e-4):  # within the margin: the LP decides
        tie = ([(4, 100), (8, 50)], [1.2, 1.2 - gap])
        assert Opt._fastest_fit([one, tie], 100, 1000) is None
    apart = ([(4, 100), (8, 50)], [1.2, 1.2 - 1e-2])
    assert Opt._fastest_fit([one, apart], 100, 1000) == [(8, 200, 1.5), (4, 100, 1.2)]


def test_tune_invariant_violations_are_caught() -> None:
    cl, specs = scenario()
    view = make_view(cl, specs, small_catalogue())
    # alexnet at 2 cores is below its proportional throughput (0.66 < 1)
    bad = Plan({"a1": Allocation("a1", (Part(0, (0,), 2, 62_500),))})
    with pytest.raises(PlanError, match="below its GPU-proportional"):
        check_tune_invariants(bad, view)
    # order: a2 waits while a later job runs and 7 GPUs are left ahead of it
    plan = Plan({"a1": Allocation("a1", (Part(0, (0,), 3, 62_500),)), "g0": Allocation("g0", (Part(0, (1,), 1, 20_830),))})
    with pytest.raises(PlanError, match="job a2 waits although"):
        check_tune_invariants(plan, view, ["a1", "a2", "g0"])


def test_tune_reclaims_across_nodes_for_a_spanning_job() -> None:
    # two servers; each holds a CPU-hungry alexnet; a 12-GPU job must span both
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    cat = small_catalogue()
    specs = [JobSpec(f"a{i}", i, 1, 100, model="alexnet") for i in range(4)]
    specs += [JobSpec("big", 10, 12, 100, model="gnmt")]
    view = make_view(cl, specs, cat)
    plan, s = run_size("tune", view)
    assert set(plan.allocations) == {"a0", "a1", "a2", "a3", "big"}
    big = plan.allocations["big"]
    assert big.num_gpus == 12 and len(big.parts) == 2
    check_tune_invariants(plan, view, s.size.last_order)
    # a 12-GPU job is beyond one node: it asks for the proportional share
    assert big.cpus == 36


def test_tune_spreads_a_job_only_where_the_place_policy_would() -> None:
    # two servers, seven 1-GPU gnmts on each: one GPU free per node.  A 2-GPU gnmt fits on a node,
    # so packed-sticky (consolidating) makes it wait under proportional sizing, and TUNE must not
    # spread it over the two nodes either (it would run 1.7x slower: the locality penalty)
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    specs = [JobSpec(f"g{i}", i, 1, 100, model="gnmt") for i in range(14)] + [JobSpec("two", 20, 2, 100, model="gnmt")]

    def running_view() -> View:
        view = make_view(cl, specs, small_catalogue())
        current = {}
        for i, j in enumerate(view.jobs[:14]):  # GPUs 0-6 and 8-14
            j.alloc = current[j.id] = Allocation(j.id, (Part(i // 7, (i // 7 * 8 + i % 7,), 3, 62_500),))
        return View(0.0, cl, view.jobs, current, view.model, view.rng)

    for size in ("proportional", "tune"):
        view = running_view()
        plan, s = run_size(size, view)
        assert set(plan.allocations) == {f"g{i}" for i in range(14)}, size
        if size == "tune":
            check_tune_invariants(plan, view, s.size.last_order, s.place)
            with pytest.raises(PlanError, match="job two waits although the jobs ahead of it leave 2 GPUs"):
                check_tune_invariants(plan, view, s.size.last_order)  # (any two free GPUs would do)
    # a place policy that spreads jobs: TUNE spreads it too, over the two free GPUs
    view = running_view()
    plan, s = run_size("tune", view, consolidate=False)
    two = plan.allocations["two"]
    assert [(p.node, len(p.gpus), p.cpus) for p in two.parts] == [(0, 1, 1), (1, 1, 1)]  # (gnmt: 1 core a GPU)
    check_tune_invariants(plan, view, s.size.last_order, s.place)
    check_tune_invariants(plan, view, s.size.last_order)


def test_opt_falls_back_to_tune_when_the_solver_fails(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import scipy.optimize

    cl, specs = scenario()
    view = make_view(cl, specs, small_catalogue())
    tune, _ = run_size("tune", view)

    def broken(*a: object, **k: object) -> None:
        raise ValueError("solver exploded")

    import gpuloom.policies.synergy_opt as so

    # HiGHS through highspy, and scipy's linprog where highspy is missing
    monkeypatch.setattr(so, "_highs_solve", broken)
    monkeypatch.setattr(scipy.optimize, "linprog", broken)
    for highspy_missing in (False, True):
        if highspy_missing:
            monkeypatch.setattr(so.Opt, "_solver", lambda self: None)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            plan, s = run_size("opt", view)
        assert "falls back to TUNE" in caplog.text and "solver exploded" in caplog.text
        assert s.size.last_fallback.startswith("allocation LP raised ValueError")
        assert plan.allocations == tune.allocations


def test_sizer_parameters_and_groups() -> None:
    with pytest.raises(PolicyError, match="threshold"):
        Scheduler.from_names("fifo", "none", "tune", "packed-sticky", params={"threshold": -1})
    with pytest.raises(PolicyError, match="time_limit"):
        Scheduler.from_names("fifo", "none", "opt", "packed-sticky", params={"time_limit": 0})
    cl, specs = scenario()
    view = make_view(cl, specs, small_catalogue())
    s = Scheduler.from_names("fifo", "none", "tune", "packed-sticky")
    with pytest.raises(PolicyError, match="group 'none'"):
        s.size.size([tuple(view.jobs[:2])], view)
    # a higher threshold asks for less: within 50 % of 2.94 is 9 cores and 62.5 GB (2.0)
    s = Scheduler.from_names("fifo", "none", "tune", "packed-sticky", params={"threshold": 0.5})
    r = s.size.size([(view.jobs[0],)], view)[0]
    assert (r.cpus, r.mem_mb) == (9, 62_500)


def test_without_sensitivity_factor_sizers_error() -> None:
    # a profile-driven sizer with no profiles in the model would silently size like 'proportional'
    cl, specs = scenario()
    view = make_view(cl, specs, small_catalogue())
    view.model = ThroughputModel.default(cl)
    for size in ("greedy", "tune", "opt"):
        with pytest.raises(PolicyError, match="needs CPU/memory profiles"):
            run_size(size, view)
    # an empty factor (profiles may come with jobs, as in the service): jobs without one are proportional
    view.model = add_sensitivity(ThroughputModel.default(cl))
    for size in ("greedy", "tune", "opt"):
        plan, _ = run_size(size, view)
        assert len(plan) == 8 and all((a.cpus, a.mem_mb) == (3, 62_500) for a in plan.allocations.values())


def test_tune_without_profiles_option_uses_the_trace_profiles(data_dir: Path) -> None:
    # the Synergy trace reader finds model_sensitivity_profiles.csv; build_model loads it for the sizers
    from gpuloom.perf.assembly import build_model
    from gpuloom.sim.traces import load_trace

    specs = load_trace(data_dir / "synergy/traces/dynamic_100job.csv", "synergy")[:20]
    cl = Cluster.homogeneous(1, 8, 24, 500_000)
    model = build_model(cl, specs=specs)
    assert model.get("sensitivity") is not None and len(model.get("sensitivity").catalogue) == 33
    sched = Scheduler.from_names("srtf", "none", "tune", "packed-sticky")
    res = Simulator(cl, specs, sched, model, SimConfig(), observers=[tune_invariant_observer]).run()
    assert res.summary()["completed"] == 20
    # the profiles were used: some job ran with other than the proportional 3 cores per GPU
    seen: list[int] = []
    Simulator(cl, specs, Scheduler.from_names("srtf", "none", "tune", "packed-sticky"), build_model(cl, specs=specs),
              SimConfig(), observers=[lambda sim, ev: seen.extend(a.cpus for a in sim.current.values())]).run()
    assert any(c != 3 for c in seen)
    from gpuloom.sim.synergy_workload import synergy_workload

    gen = synergy_workload(5, seed=0)  # carries no profile file: tune errors instead of running proportional
    with pytest.raises(SimulationError, match="needs the 'sensitivity' factor.*--profiles"):
        Simulator(cl, gen, Scheduler.from_names("fifo", "none", "tune", "packed-sticky"), build_model(cl, specs=gen)).run()


# -- simulations ----------------------------------------------------------------
@pytest.mark.parametrize("order", ["fifo", "srtf", "las"])
def test_tune_invariants_hold_every_round(order: str) -> None:
    cl = Cluster.homogeneous(4, 8, 24, 500_000)  # Synergy's deployment cluster
    specs = synergy_workload(80, jobs_per_hour=40, split=(50, 30, 20), seed=3)
    model = add_sensitivity(ThroughputModel.default(cl), small_full_catalogue())
    sched = Scheduler.from_names(order, "none", "tune", "packed-sticky")
    rounds = []
    steps = {"reclaimed": 0, "demoted": 0, "proportional": 0}

    def count(sim: Simulator, event: str) -> None:
        if event == "round":
            rounds.append(len(sim.current))
            for k in steps:
                steps[k] += sim.scheduler.size.last_stats[k]

    sim = Simulator(cl, specs, sched, model, SimConfig(round_len=300), observers=[tune_invariant_observer, count])
    res = sim.run()
    assert res.summary()["completed"] == 80
    assert len(rounds) > 50 and max(rounds) > 8
    # the load is high enough that every TUNE step is exercised
    assert all(v > 0 for v in steps.values()), steps


def small_full_catalogue() -> Catalogue:
    """Every Synergy model: image models use alexnet's matrix, speech models the half-way one."""
    half = [[min(v, 1.75) for v in row] for row in ALEXNET_1]
    profs = []
    for name in ("alexnet", "res18", "res50", "mobilenet", "shufflenet"):
        profs.append(SensitivityProfile(name, 1, CPU_AXIS, MEM_AXIS_5, np.array(ALEXNET_1)))
    for name in ("m5", "deepspeech"):
        profs.append(SensitivityProfile(name, 1, CPU_AXIS, MEM_AXIS_5, np.array(half)))
    for name in ("gnmt", "transformer", "lstm"):
        profs.append(SensitivityProfile(name, 1, CPU_AXIS, MEM_AXIS_5, np.array(FLAT)))
    return Catalogue(profs)


def test_synergy_deployment_trace_tune_beats_proportional(data_dir: Path) -> None:
    cat = load_catalogue(data_dir / "synergy/model_sensitivity_profiles.csv")
    specs = load_trace(data_dir / "synergy/traces/dynamic_100job.csv")
    assert len(specs) == 100 and specs[0].model == "alexnet"
    assert specs[0].duration == pytest.approx(23349 * 0.6)
    cl = Cluster.homogeneous(4, 8, 24, 500_000)
    jct = {}
    for size in ("proportional", "tune", "opt", "greedy"):
        model = add_sensitivity(ThroughputModel.default(cl), cat)
        sched = Scheduler.from_names("srtf", "none", size, "packed-sticky")
        obs = [tune_invariant_observer] if size == "tune" else []
        res = Simulator(cl, specs, sched, model, SimConfig(round_len=300), observers=obs).run()
        s = res.summary()
        assert s["completed"] == 100
        jct[size] = s["mean_jct"]
    assert jct["tune"] < jct["proportional"]
    assert jct["opt"] < jct["proportional"]


# -- workload -------------------------------------------------------------------
def test_synergy_workload_generator() -> None:
    a = synergy_workload(3000, jobs_per_hour=9, split=(20, 70, 10), seed=7)
    assert a == synergy_workload(3000, jobs_per_hour=9, split=(20, 70, 10), seed=7)
    fam = [s.attrs["family"] for s in a]
    assert abs(fam.count("language") / 3000 - 0.7) < 0.03 and abs(fam.count("image") / 3000 - 0.2) < 0.03
    arr = [s.arrival for s in a]
    assert arr == sorted(arr) and abs(np.mean(np.diff(arr)) - 400) < 25
    gpus = [s.gpus for s in a]
    assert set(gpus) == {1, 2, 4, 8} and abs(gpus.count(1) / 3000 - 0.7) < 0.03
    assert min(s.duration for s in a) >= 60 * 10**1.5 - 1e-6 and max(s.duration for s in a) <= 60 * 10**4 + 1e-6
    b = synergy_workload(500, split=(50, 0, 50), seed=1)
    assert {s.attrs["family"] for s in b} == {"image", "speech"}
    for bad in ((1, 2), (-1, 1, 1), (0, 0, 0)):
        with pytest.raises(WorkloadError, match="split"):
            synergy_workload(5, split=bad)
    with pytest.raises(WorkloadError, match="jobs_per_hour"):
        synergy_workload(5, jobs_per_hour=0)
    with pytest.raises(WorkloadError, match="philly="):
        synergy_workload(5, durations="philly")
    c = synergy_workload(50, durations="philly", philly=[(100.0, 2), (50.0, 1)], min_duration=60)
    assert {(s.duration, s.gpus) for s in c} <= {(100.0, 2), (60.0, 1)}


def test_synergy_workload_from_philly(data_dir: Path, tmp_path: Path) -> None:
    specs = synergy_workload(400, durations="philly", philly=data_dir / "sia/philly_jobs.csv", seed=2)
    assert all(1 <= s.gpus <= 8 and s.duration >= 60 for s in specs)
    assert len({s.duration for s in specs}) > 300
    bad = tmp_path / "p.csv"
    bad.write_text("duration,num_gpus\n10,1\nabc,1\n")
    with pytest.raises(WorkloadError, match=r"p.csv:3"):
        synergy_workload(5, durations="philly", philly=bad)


def test_profiles_parameter_builds_the_model(data_dir: Path) -> None:
    from gpuloom.perf.assembly import build_model

    path = str(data_dir / "synergy/model_sensitivity_profiles.csv")
    cl, specs = scenario()
    sched = Scheduler.from_names("fifo", "none", "tune", "packed-sticky", params={"profiles": path})
    model = build_model(cl, options={"profiles": path})
    assert model.get("sensitivity") is not None and len(model.get("sensitivity").catalogue) == 33
    res = Simulator(cl, specs, sched, model, SimConfig(), observers=[tune_invariant_observer]).run()
    assert res.summary()["completed"] == 8
    # a sizer refuses a given model without the sensitivity factor it declares it needs
    bare = Scheduler.from_names("fifo", "none", "opt", "packed-sticky", params={"profiles": path})
    with pytest.raises(SimulationError, match="needs the 'sensitivity' factor"):
        Simulator(cl, specs, bare, build_model(cl), SimConfig()).run()
    with pytest.raises(SensitivityError, match="No such file"):
        build_model(cl, options={"profiles": str(data_dir / "absent.csv")})


@pytest.mark.parametrize(("size", "preemptive"), [("tune", False), ("opt", True), ("opt", False)])
def test_invariants_hold_for_opt_and_non_preemptive_runs(size: str, preemptive: bool) -> None:
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    specs = synergy_workload(40, jobs_per_hour=30, split=(60, 20, 20), seed=11)
    model = add_sensitivity(ThroughputModel.default(cl), small_full_catalogue())
    sched = Scheduler.from_names("srtf", "none", size, "packed-sticky", preemptive)
    res = Simulator(cl, specs, sched, model, SimConfig(round_len=300), observers=[tune_invariant_observer]).run()
    assert res.summary()["completed"] == 40
    if size == "opt":
        assert sched.size.lp_rounds > 0 and sched.size.last_fallback is None
    if not preemptive:
        assert res.summary()["preemptions"] == 0


@pytest.mark.parametrize("size", ["tune", "opt"])
def test_planning_the_whole_queue_first_changes_no_result(size: str) -> None:
    # multi-GPU jobs on two nodes fragment them: rounds whose prefix leaves GPUs free, after which the
    # scheduler plans the whole queue straight away; the run must be the one that plans the prefix first
    cl = Cluster.homogeneous(2, 8, 24, 500_000)
    specs = synergy_workload(80, jobs_per_hour=200, split=(20, 70, 10), seed=2)
    runs, whole = [], []
    for guess in (True, False):
        sched = Scheduler.from_names("fifo", "none", size, "packed-sticky")
        sched.guess_whole = guess
        model = add_sensitivity(ThroughputModel.default(cl), small_full_catalogue())
        seen = [0]

        def count(sim: Simulator, event: str, seen: list[int] = seen) -> None:
            seen[0] += event == "round" and sim.scheduler._whole and sim.scheduler.guess_whole

        runs.append(Simulator(cl, specs, sched, model, SimConfig(round_len=300), observers=[count]).run())
        whole.append(seen[0])
    assert runs[0].jobs == runs[1].jobs and runs[0].series == runs[1].series
    assert runs[0].summary()["completed"] == 80
    assert whole[0] > 50 and whole[1] == 0  # (the guess was taken in many rounds)


def test_opt_answers_a_repeated_lp_from_the_last_one() -> None:
    # the same round twice: both LPs are the last ones again, answered without solving; the plan is the same
    cl, specs = scenario()
    view = make_view(cl, specs, small_catalogue())
    sched = Scheduler.from_names("fifo", "none", "opt", "packed-sticky")
    first = sched.schedule(view).plan
    assert sched.size.repeated_lps == 0 and sched.size.lp_rounds == 1
    again = sched.schedule(view).plan
    assert sched.size.repeated_lps == 2 and sched.size.lp_rounds == 2
    assert again.allocations == first.allocations
    # one job fewer: a new allocation LP (the window changed), solved
    view2 = make_view(cl, specs[:-1], small_catalogue())
    sched.schedule(view2)
    assert sched.size.repeated_lps == 2


def test_storage_bandwidth_column_bounds_speed(data_dir: Path) -> None:
    # Synergy's profiles give each model's storage demand per GPU (column "speed", MB/s):
    # alexnet 62.5*2 = 125, bert int(62.5/3) = 20.  On a 500 MB/s, 8-GPU server a GPU's share is
    # 62.5 MB/s: alexnet runs at 62.5 / 125 = 0.5 of its speed, bert is not bound.
    from gpuloom.perf.assembly import build_model
    from gpuloom.perf.storage import load_storage_demands

    path = data_dir / "synergy/model_sensitivity_profiles.csv"
    d = load_storage_demands(path)
    assert d[("alexnet", 1)] == 125.0 and d[("bert", 1)] == 20.0
    cl = Cluster.homogeneous(1, 8, 24, 500_000)
    model = build_model(cl, options={"storage_mbps": 500, "profiles": str(path)})
    part = (Part(0, (0,), 3, 62_500),)
    assert model.get("storage")(Job(JobSpec("a", 0, 1, 10, model="alexnet")), Allocation("a", part)) == 0.5
    assert model.get("storage")(Job(JobSpec("b", 0, 1, 10, model="bert")), Allocation("b", part)) == 1.0
    assert build_model(cl, options={"profiles": str(path)}).get("storage") is None  # off unless given


def test_highs_solve_gives_the_same_answer_through_either_form_of_pass_model() -> None:
    # min -x0 - 2 x1 - 3 x2  s.t.  x0 + x1 + x2 <= 2,  x0 + x2 = 1,  0 <= x <= 1:  x = (0, 1, 1), -5
    highspy = pytest.importorskip("highspy")
    from gpuloom.policies.synergy_opt import Opt, _highs_solve, _linprog, _SolverFailure, _Sparse

    c = np.array([-1.0, -2.0, -3.0])
    ub = _Sparse.of([0, 0, 0], [0, 1, 2], [1, 1, 1], 1, 3)
    eq = _Sparse.of([0, 0], [0, 2], [1, 1], 1, 3)
    lo, hi = np.zeros(3), np.ones(3)
    args = (c, lo, hi, ub.stack(eq), np.array([-np.inf, 1.0]), np.array([2.0, 1.0]))

    class LpOnly:  # a highspy without passModel's array form (or one refusing it): only a HighsLp goes in
        def __init__(self, h: object, refuse: bool) -> None:
            self.h, self.refuse, self.lps = h, refuse, 0

        def passModel(self, *a: object) -> object:
            if len(a) != 1:
                if self.refuse:
                    return highspy.HighsStatus.kError
                raise TypeError("incompatible function arguments")
            self.lps += 1
            return self.h.passModel(*a)

        def __getattr__(self, name: str) -> object:
            return getattr(self.h, name)

    h = Opt()._solver()
    assert isinstance(h, highspy.Highs)
    res = _highs_solve(h, "test", *args)
    assert res.x.tolist() == [0.0, 1.0, 1.0] and res.fun == -5.0
    for refuse in (False, True):
        lp_only = LpOnly(h, refuse)
        res = _highs_solve(lp_only, "test", *args)
        assert res.x.tolist() == [0.0, 1.0, 1.0] and res.fun == -5.0 and lp_only.lps == 1
    # a row index past the matrix's rows: refused both ways
    start, index, value, nrows = ub.stack(eq)
    bad = (start, index + 5, value, nrows)
    with pytest.raises(_SolverFailure, match="test LP: HiGHS refused the model"):
        _highs_solve(h, "test", c, lo, hi, bad, args[4], args[5])
    ref = _linprog("test", 10.0, c, ub, np.array([2.0]), eq, np.array([1.0]), np.c_[lo, hi])
    assert ref.x.tolist() == [0.0, 1.0, 1.0] and ref.fun == -5.0
    # x0 + x2 = 3 with both at most 1: no solution, a failure the round falls back from
    with pytest.raises(_SolverFailure, match="test LP: Infeasible"):
        _highs_solve(h, "test", c, lo, hi, ub.stack(eq), np.array([-np.inf, 3.0]), np.array([2.0, 3.0]))
    assert _highs_solve(h, "test", *args).x.tolist() == [0.0, 1.0, 1.0]  # (the solver object is reused)


def test_opt_presolves_the_allocation_lp_but_not_the_placement_lp(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Synergy's deployment trace solves both LPs.  The allocation LP's optimum is often not one point:
    # without presolve HiGHS stops on other optima and the run's mean JCT moves (to 12,707 s under
    # FIFO, 10,968 s under SRTF); the placement LP's costs break its ties, and it runs without presolve
    import gpuloom.policies.synergy_opt as so
    from gpuloom.perf.assembly import build_model

    seen: dict[str, set[str]] = {}
    solve = so._highs_solve

    def spy(h: object, what: str, *a: object) -> object:
        seen.setdefault(what, set()).add(h.getOptionValue("presolve")[1])  # type: ignore[attr-defined]
        return solve(h, what, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(so, "_highs_solve", spy)
    specs = load_trace(data_dir / "synergy/traces/dynamic_100job.csv")
    cl = Cluster.homogeneous(4, 8, 24, 500_000)
    for order, jct, lps, unbound in (("fifo", 12713.401901672396, 82, 36), ("srtf", 11037.457919884964, 79, 39)):
        model = build_model(cl, options={"profiles": data_dir / "synergy/model_sensitivity_profiles.csv"})
        sched = Scheduler.from_names(order, "none", "opt", "packed-sticky")
        res = Simulator(cl, specs, sched, model, SimConfig(round_len=300)).run()
        assert res.summary()["mean_jct"] == pytest.approx(jct, rel=1e-12)
        assert (sched.size.lp_rounds, sched.size.unbound_lps) == (lps, unbound)
    assert seen == {"allocation": {"on"}, "placement": {"off"}}
