"""Clusters of mixed GPU generations (Gavel): the per-type speed, typed placement, the policies and the
round mechanism as pure functions on tiny hand-checked inputs, and Gavel's workloads."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from gpuloom.core.cluster import ClusterError, parse_cluster
from gpuloom.core.fit import never_fits
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.parse import normalise_gpu_type
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.assembly import build_model
from gpuloom.perf.gputype import GpuTypeFactor, TypeSpeeds, TypeSpeedsError, add_gpu_types, load_type_speeds
from gpuloom.policies import base as pb
from gpuloom.policies.free import FreeState
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator

THROUGHPUTS = "gavel/throughputs/simulation_throughputs.json"


def spec(jid: str, model: str = "m", gpus: int = 1, duration: float = 1e6, arrival: float = 0.0,
         **attrs: object) -> JobSpec:
    return JobSpec(jid, arrival, gpus, duration, model=model, attrs=dict(attrs))


# --------------------------------------------------------------------------- names and clusters

@pytest.mark.parametrize("name,want", [
    ("Tesla V100-SXM2-16GB", "v100"), ("V100", "v100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("Tesla K80", "k80"), ("GeForce RTX 3090", "rtx3090"), ("TITAN V", "titanv"),
    ("generic", "generic"),
])
def test_gpu_type_names_compare_by_product(name: str, want: str) -> None:
    assert normalise_gpu_type(name) == want
    assert normalise_gpu_type(want) == want  # idempotent


def test_cluster_by_type() -> None:
    cl = parse_cluster("v100:2,p100:1x4", cpus_per_node=8)
    assert [(n.name, n.gpus, n.cpus, n.gpu_type) for n in cl.nodes] == [
        ("v100-0", 1, 8, "v100"), ("v100-1", 1, 8, "v100"), ("p100-0", 4, 8, "p100")]
    assert cl.gpu_types == ("v100", "p100")
    with pytest.raises(ClusterError, match=r"group 2 \('k80'\) is not TYPE:GPUS"):
        parse_cluster("v100:2,k80")
    with pytest.raises(ClusterError, match="GPU type 'V100' given twice"):
        parse_cluster("v100:2,V100:3")


def test_a_job_asking_for_a_type_fits_nodes_of_that_product() -> None:
    cl = parse_cluster("v100:2,k80:2")
    assert never_fits(spec("a", gpu_type="Tesla K80"), cl) is None
    assert never_fits(spec("a", gpu_type="A100"), cl) == "needs GPU type A100, the cluster has k80, v100"
    assert never_fits(spec("a", gpus=3, gpu_type="K80"), cl) == "needs 3 GPUs, the cluster has 2 of type K80"


# --------------------------------------------------------------------------- the matrix and the factor

def test_gavel_file_rows_and_relative_speeds(data_dir: Path) -> None:
    ts = load_type_speeds(data_dir / THROUGHPUTS)
    assert ts.reference == "v100" and set(ts.types) == {"v100", "p100", "k80"}  # no *_unconsolidated
    # 26 job types at 1 GPU, 19 of them at 2, 4 and 8; and per model (resnet18, resnet50, transformer, lm at
    # 1, 2, 4, 8 GPUs, recommendation at 1), the mean of its job types' speeds relative to a V100
    assert len(ts.rates) == 83 + 17
    row = ts.relative(spec("p", "resnet50", gpus=4))
    per_batch = [ts.relative(spec("q", "x", gpus=4, job_type=f"ResNet-50 (batch size {b})")) for b in (16, 32, 64, 128)]
    assert row is not None and row["k80"] == pytest.approx(statistics.fmean(r["k80"] for r in per_batch if r))
    j = spec("a", "ResNet-50", job_type="ResNet-50 (batch size 64)")
    # the file's solo throughputs (steps/s) over the V100's
    assert ts.relative(j) == {"v100": 1.0, "p100": 2.6194694075770055 / 4.394774823323071,
                              "k80": 0.6190282202246573 / 4.394774823323071}
    # a pair measured on a V100: each job's throughput while sharing, over its own V100 solo throughput
    b = spec("b", "ResNet-18", job_type="ResNet-18 (batch size 16)")
    raw = json.loads((data_dir / THROUGHPUTS).read_text())["v100"]
    both = raw["('ResNet-50 (batch size 64)', 1)"]["('ResNet-18 (batch size 16)', 1)"]
    solo_b = raw["('ResNet-18 (batch size 16)', 1)"]["null"]
    assert ts.pair(j, b, "v100") == (both[0] / 4.394774823323071, both[1] / solo_b)


def test_profile_csv_rows_by_model_and_count(tmp_path: Path) -> None:
    f = tmp_path / "speeds.csv"
    f.write_text("model,gpus,V100,K80\nresnet50,,4.0,1.0\nresnet50,4,10.0,5.0\nlm,,2.0,\nbert,2,3.0,1.5\nbert,8,3.0,1.0\n")
    ts = load_type_speeds(f)
    ts.reference = "v100"
    assert ts.relative(spec("a", "ResNet-50")) == {"v100": 1.0, "k80": 0.25}
    assert ts.relative(spec("a", "ResNet-50", gpus=4)) == {"v100": 1.0, "k80": 0.5}
    assert ts.relative(spec("a", "ResNet-50", gpus=8)) == {"v100": 1.0, "k80": 0.25}  # the row for any count
    assert ts.relative(spec("a", "BERT", gpus=4)) == {"v100": 1.0, "k80": 0.5}  # else the nearest count below
    assert ts.relative(spec("a", "BERT", gpus=1)) == {"v100": 1.0, "k80": 0.5}  # (or above)
    assert ts.relative(spec("a", "LM")) == {"v100": 1.0}
    assert ts.relative(spec("a", "gpt")) is None
    bad = tmp_path / "bad.csv"
    bad.write_text("model,V100\nresnet50,fast\n")
    with pytest.raises(TypeSpeedsError, match=r"bad.csv:2: field 'V100': expected a throughput, got 'fast'"):
        load_type_speeds(bad)
    (tmp_path / "t.toml").write_text('reference = "K80"\n[jobs]\nresnet50 = { V100 = 3.0, K80 = 1.5 }\n')
    assert load_type_speeds(tmp_path / "t.toml").relative(spec("a", "ResNet-50")) == {"v100": 2.0, "k80": 1.0}


def test_factor_speed_per_type_slowest_part_and_neutral_where_unknown() -> None:
    cl = parse_cluster("v100:1x2,k80:1x2,a100:1x2")
    ts = TypeSpeeds()
    ts.add("resnet50", None, "v100", 4.0)
    ts.add("resnet50", None, "k80", 1.0)
    ts.reference = "v100"
    f = GpuTypeFactor(ts, cl)
    job = Job(spec("a", "ResNet-50", gpus=2))
    assert f(job, Allocation("a", (Part(0, (0, 1), 0, 0),))) == 1.0
    assert f(job, Allocation("a", (Part(1, (2, 3), 0, 0),))) == 0.25
    assert f(job, Allocation("a", (Part(0, (0,), 0, 0), Part(1, (2,), 0, 0)))) == 0.25  # the slowest part
    assert f(job, Allocation("a", (Part(2, (4, 5), 0, 0),))) == 1.0  # a type the matrix does not rate
    assert f(Job(spec("b", "LM")), Allocation("b", (Part(1, (2,), 0, 0),))) == 1.0  # a job it does not know
    ts.measure("a", "K80", 0.5)  # what the service measured wins, type by type
    assert f.speeds(job) == {"v100": 1.0, "k80": 0.5, "a100": 1.0}


def test_no_type_data_means_no_factor(data_dir: Path) -> None:
    cl = parse_cluster("v100:2,k80:2")
    assert build_model(cl, {}, [spec("a")]).get("gpu_type") is None
    m = build_model(cl, {"gpu_speeds": str(data_dir / THROUGHPUTS)}, [spec("a")])
    assert isinstance(m.get("gpu_type"), GpuTypeFactor)
    inline = build_model(cl, {}, [spec("a", type_speeds={"V100": 1.0, "K80": 0.2})]).get("gpu_type")
    assert isinstance(inline, GpuTypeFactor) and inline.speeds(Job(spec("a"))) == {"v100": 1.0, "k80": 0.2}
    assert inline.speeds(Job(spec("z"))) == {"v100": 1.0, "k80": 1.0}  # a job without speeds of its own


# --------------------------------------------------------------------------- placement within types

def _view(cl, jobs, current=None, model=None):  # noqa: ANN001, ANN202
    cur = dict(current or {})
    by_id = {j.id: j for j in jobs}
    for jid, a in cur.items():
        by_id[jid].alloc = a
    m = model if model is not None else build_model(cl)
    m.bind(by_id)
    return pb.View(0.0, cl, jobs, cur, m, np.random.default_rng(0), 1, free=FreeState.of(cl, cur), by_id=by_id)


def _arrived(*specs: JobSpec) -> list[Job]:
    out = []
    for i, s in enumerate(specs):
        j = Job(s, i)
        j.arrive(0.0)
        out.append(j)
    return out


@pytest.mark.filterwarnings("ignore:place policy 'pm-first'")
@pytest.mark.parametrize("place", ["packed-sticky", "packed-non-sticky", "random-sticky", "pm-first", "topo-pack"])
def test_placement_honours_the_type_a_job_asks_for(place: str) -> None:
    # best fit alone would put a (2 GPUs) on the 2-GPU V100 node
    cl = parse_cluster("v100:1x2,k80:1x3")
    jobs = _arrived(spec("a", gpus=2, gpu_type="K80"), spec("b", gpus=1, gpu_type=["tesla k80"]), spec("c", gpus=2))
    if place == "topo-pack":
        pytest.importorskip("gpuloom.perf.topology")
    sched = Scheduler.from_names("fifo", "none", "proportional", place)
    view = _view(cl, jobs)
    if any(make is None for st in sched.stages for make in st.requires_factors.values()):
        return  # (needs node topologies)
    sched.bind(view.model)
    plan = sched.schedule(view).plan.allocations
    assert {p.node for p in plan["a"].parts} == {1} and {p.node for p in plan["b"].parts} == {1}
    assert {p.node for p in plan["c"].parts} == {0}  # the K80s are taken: c (any type) on the V100s


def test_placement_keeps_a_job_off_a_type_it_cannot_run_on() -> None:
    # Gavel measured no throughput for ResNet-50 (batch 128) on K80s at 2+ GPUs: speed 0 there.  Best fit
    # alone would take the 2-GPU K80 node; every place policy's choose runs without it
    cl = parse_cluster("k80:1x2,v100:1x3")
    ts = TypeSpeeds(reference="v100")
    ts.add("r50", None, "v100", 2.0)
    ts.add("r50", None, "k80", 0.0)
    m = add_gpu_types(build_model(cl), ts)
    jobs = _arrived(spec("a", "r50", gpus=2), spec("b", "other", gpus=2))
    sched = Scheduler.from_names("fifo", "none", "proportional", "packed-sticky")
    view = _view(cl, jobs, model=m)
    sched.bind(m)
    plan = sched.schedule(view).plan.allocations
    assert [p.node for p in plan["a"].parts] == [1] and [p.node for p in plan["b"].parts] == [0]


def test_a_job_larger_than_every_type_says_why_it_waits() -> None:
    cl = parse_cluster("v100:2,k80:2")
    jobs = _arrived(spec("a", gpus=1), spec("b", gpus=3))
    sched = Scheduler.from_names("fifo", "none", "gavel", "packed-sticky")
    view = _view(cl, jobs)
    sched.bind(view.model)
    rnd = sched.schedule(view)
    assert "a" in rnd.plan.allocations and rnd.reasons["b"] == "GpuType (one type at most has 2 GPUs)"


def test_a_typed_request_is_placed_within_its_type_and_a_running_job_moves_to_its_new_type() -> None:
    cl = parse_cluster("v100:1x2,k80:1x2")
    jobs = _arrived(spec("a"), spec("b"))
    on_v100 = Allocation("a", (Part(0, (0,), 3, 64_000),), (), (1, None, None, "a", ("v100",)))
    view = _view(cl, jobs, {"a": on_v100})
    place = pb.make("place", "packed-sticky")
    reqs = [pb.Request((jobs[0],), 1, types=("k80",)), pb.Request((jobs[1],), 1, types=())]
    plan = place.place(reqs, view)
    assert [p.node for p in plan.allocations["a"].parts] == [1]  # moved: its request's type changed
    assert "b" not in plan.allocations  # no type this round: it waits
    same = place.place([pb.Request((jobs[0],), 1, types=("v100",))], view)
    assert same.allocations["a"] == on_v100  # unchanged request, kept where it is


def test_masked_free_state_shows_only_the_types_and_restores_exactly() -> None:
    cl = parse_cluster("v100:1x4,k80:2x2")
    free = FreeState.of(cl, {"x": Allocation("x", (Part(1, (4,), 1, 1000),))})
    before = (bytes(free.gpu_free), free.node_gpus.tolist(), free.free_gpus)
    node_ok, gpu_ok = pb.type_masks(cl, ("k80",))
    with free.masked(node_ok, gpu_ok):
        assert free.node_gpus.tolist() == [0, 1, 2] and free.free_gpus == 3
        assert np.flatnonzero(free.gpu_free).tolist() == [5, 6, 7]
    assert (bytes(free.gpu_free), free.node_gpus.tolist(), free.free_gpus) == before


# --------------------------------------------------------------------------- the policies, pure

def _two_types(a: dict[str, float], b: dict[str, float], caps: str = "v100:1,k80:2") -> tuple:
    cl = parse_cluster(caps)
    ts = TypeSpeeds(reference="v100")
    for name, row in (("a", a), ("b", b)):
        for t, v in row.items():
            ts.add(name, None, t, v)
    m = add_gpu_types(build_model(cl), ts)
    return cl, m


def test_las_is_max_min_fairness_over_effective_throughput() -> None:
    # 1 V100, 2 K80s; a runs at 0.5 on a K80, b at 0.25.  Equal-split throughputs: a 2/3, b 1/2.
    # With V100 shares v_a + v_b = 1 and the rest of each row on K80s: a = 0.75 + 0.75 v_a,
    # b = 0.5 + 1.5 v_b, equal at v_b = 4/9: a gets 5/9 V100 + 4/9 K80, b 4/9 V100 + 5/9 K80, both 7/6.
    cl, m = _two_types({"v100": 1.0, "k80": 0.5}, {"v100": 1.0, "k80": 0.25})
    jobs = _arrived(spec("a", "a"), spec("b", "b"))
    view = _view(cl, jobs, model=m)
    pol = pb.make("size", "gavel")
    pol._setup(view)
    x = pol.solve(jobs, view, np.array([pol.speeds(j, view) for j in jobs]))
    assert x == pytest.approx(np.array([[5 / 9, 4 / 9], [4 / 9, 5 / 9]]), abs=1e-6)
    assert pol.last_objective == pytest.approx(7 / 6, abs=1e-6)
    # agnostic: every type alike, so each job just gets one GPU's worth
    ag = pb.make("size", "gavel", {"aware": False})
    ag._setup(view)
    xa = ag.solve(jobs, view, np.ones((2, 2)))
    assert xa.sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-6) and ag.last_objective == pytest.approx(1.0, abs=1e-6)


def test_makespan_and_throughput_lps() -> None:
    cl, m = _two_types({"v100": 1.0, "k80": 0.5}, {"v100": 1.0, "k80": 0.25}, "v100:1,k80:1")
    jobs = _arrived(spec("a", "a", duration=1000.0), spec("b", "b", duration=1000.0))
    view = _view(cl, jobs, model=m)
    mk = pb.make("size", "gavel-makespan")
    mk._setup(view)
    x = mk.solve(jobs, view, np.array([mk.speeds(j, view) for j in jobs]))
    # both finish together, every share used: each job's row fills (k = 1 - v) and the V100 is split,
    # a: 0.5 + 0.5 v_a = b: 0.25 + 0.75 v_b with v_a + v_b = 1 -> v_b = 0.6, both at 0.7 (1000 s in 1428.6 s)
    assert x == pytest.approx(np.array([[0.4, 0.6], [0.6, 0.4]]), abs=1e-6)
    assert mk.last_objective == pytest.approx(1000 / 0.7, rel=1e-6)
    tp = pb.make("size", "gavel-throughput", {"solver": "simplex"})
    tp._setup(view)
    x = tp.solve(jobs, view, np.array([tp.speeds(j, view) for j in jobs]))
    assert tp.last_objective == pytest.approx(1.5)  # a V100 (1.0) and a K80 with a on it (0.5)
    assert x == pytest.approx(np.array([[0.0, 1.0], [1.0, 0.0]]), abs=1e-9)


def _rounds(cl, m, specs, size: str, n: int, order: str = "fifo", **params):  # noqa: ANN001, ANN202
    """The GPU type each job ran on in each of the first ``n`` rounds (360 s apart)."""
    sched = Scheduler.from_names(order, "none", size, "packed-sticky", True, params)
    seen: list[dict[str, str]] = []

    def obs(sim, ev) -> None:  # noqa: ANN001
        if ev == "round":
            seen.append({jid: cl.nodes[a.parts[0].node].gpu_type for jid, a in sim.current.items()})

    sim = Simulator(cl, specs, sched, m, SimConfig(round_len=360.0, restart_overhead=0.0, max_time=360.0 * (n - 1)),
                    observers=[obs])
    sim.run()
    return seen, sched.size


def test_the_round_mechanism_alternates_types_by_received_share() -> None:
    # X as in the LAS test.  Round 1: every share received is half a round (fraction 1/2), so the
    # priority on the V100 is a 10/9 (X 5/9 over 1/2) against b 8/9: a takes the V100, b the K80s'
    # best remaining (b's 5/9 over 1/2).  Round 2: a has 540 of 720 V100-seconds (fraction 3/4,
    # priority 20/27), b 180 (1/4, priority 16/9): b takes the V100 and a a K80.
    cl, m = _two_types({"v100": 1.0, "k80": 0.5}, {"v100": 1.0, "k80": 0.25})
    seen, pol = _rounds(cl, m, [spec("a", "a"), spec("b", "b")], "gavel", 3)
    assert seen[:3] == [{"a": "v100", "b": "k80"}, {"a": "k80", "b": "v100"}, {"a": "v100", "b": "k80"}]
    assert pol.stats()["lp_solves"] == 1  # the same jobs: no new allocation


def test_greedy_gives_each_job_in_order_its_fastest_type_with_room() -> None:
    cl, m = _two_types({"v100": 1.0, "k80": 0.5}, {"v100": 1.0, "k80": 0.25}, "v100:1,k80:1")
    specs = [spec("b", "b", arrival=0.0), spec("a", "a", arrival=1.0), spec("c", "b", arrival=2.0)]
    seen, _ = _rounds(cl, m, specs, "gavel-greedy", 2)
    assert seen[1] == {"b": "v100", "a": "k80"}  # c waits; under SRTF-like orders the same walk


def test_gavel_refuses_gpu_sharing_up_front() -> None:
    with pytest.raises(pb.PolicyError, match="GPU sharing .group=muri. is Gavel's space-sharing variant"):
        Scheduler.from_names("fifo", "muri", "gavel", "packed-sticky")


# --------------------------------------------------------------------------- Gavel's workloads

def test_generated_workload_is_gavels_own_job_for_job(data_dir: Path) -> None:
    from gpuloom.sim.gavel_workload import gavel_workload

    jobs = gavel_workload(5, 2.0, seed=0, throughputs=data_dir / THROUGHPUTS)
    # the first five lines Gavel's simulator writes (output_trace_file_name) for seed 0 at 2 jobs/h
    # (lam 1800 s): job type, total steps (written as an integer), scale factor, arrival
    assert [(j.attrs["job_type"], int(j.attrs["total_steps"]), j.gpus, round(j.arrival, 6)) for j in jobs] == [
        ("ResNet-18 (batch size 64)", 1646636, 1, 0.0), ("Transformer (batch size 16)", 343170, 1, 489.172146),
        ("Recommendation (batch size 2048)", 16034, 1, 1903.549655),
        ("Recommendation (batch size 8192)", 20989, 1, 2735.085391), ("LM (batch size 5)", 748740, 1, 4402.135889)]
    assert [j.id for j in jobs] == [f"gavel-{i}" for i in range(5)]
    rate = load_type_speeds(data_dir / THROUGHPUTS).rate("ResNet-18 (batch size 64)", 1)
    assert rate is not None and jobs[0].duration == pytest.approx(jobs[0].attrs["total_steps"] / rate[0])


def test_generated_workload_follows_gavels_distributions(data_dir: Path) -> None:
    from gpuloom.sim.gavel_workload import DISTRIBUTED, GAVEL_JOB_TYPES, gavel_workload

    n = 20_000
    multi = gavel_workload(n, 6.0, seed=1, multi_gpu=True, throughputs=data_dir / THROUGHPUTS)
    share = {g: sum(j.gpus == g for j in multi) / n for g in (1, 2, 4, 8)}
    # Philly's scale factors: 0.7 / 0.1 / 0.15 / 0.05 (3 standard errors of 20,000 draws: < 0.01)
    assert share == pytest.approx({1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}, abs=0.01)
    assert all(j.attrs["job_type"] in DISTRIBUTED for j in multi if j.gpus > 1)
    long = sum(j.duration > 60 * 10**3 for j in multi) / n  # 60 * 10**U(3, 4) s with probability 0.2
    assert long == pytest.approx(0.2, abs=0.01)
    assert all(60 * 10**1.5 <= j.duration <= 60 * 10**4 for j in multi)
    gaps = [b.arrival - a.arrival for a, b in zip(multi, multi[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(600.0, rel=0.03)  # 6 jobs/h
    single = gavel_workload(2_000, 6.0, seed=1, throughputs=data_dir / THROUGHPUTS)
    assert {j.gpus for j in single} == {1}
    assert len({j.attrs["job_type"] for j in single}) == len(GAVEL_JOB_TYPES) == 26


@pytest.mark.parametrize("queue", [q for q in pb.names("queue") if q != "none"])
def test_gavel_composes_with_every_queue_stage(queue: str, make_view) -> None:  # noqa: ANN001
    # the queue stage admits, Gavel shares what it admitted; the round passes the scheduler's check
    sched = Scheduler.from_names("fifo", "none", "gavel", "packed-sticky", queue=queue)
    view = make_view()
    sched.bind(view.model)
    rnd = sched.schedule(view)
    sched.check(rnd, view)
    assert rnd.plan.allocations  # something runs on an idle cluster


def test_an_lp_without_optimum_falls_back_to_equal_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuloom.policies.gavel import GavelError, GavelLAS

    def fail(self, *a: object, **k: object) -> None:  # noqa: ANN001
        raise GavelError("max-min fairness LP: Time limit reached")

    monkeypatch.setattr(GavelLAS, "solve", fail)
    cl, m = _two_types({"v100": 1.0, "k80": 0.5}, {"v100": 1.0, "k80": 0.25})  # 1 V100, 2 K80
    seen, pol = _rounds(cl, m, [spec("a", "a"), spec("b", "b")], "gavel", 2)
    assert pol._alloc == {"a": [1 / 3, 2 / 3], "b": [1 / 3, 2 / 3]}  # each type's GPUs over all GPUs
    assert pol.last_fallback == "max-min fairness LP: Time limit reached" and seen[0]  # and the rounds go on


def test_generate_gavel_writes_a_trace_simulate_reads(data_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuloom.cli import app
    from gpuloom.sim.gavel_workload import gavel_workload
    from gpuloom.sim.traces import load_trace

    out = tmp_path / "g.jsonl"
    r = CliRunner().invoke(app, ["generate", "gavel", str(out), "--jobs", "20", "--rate", "3", "--seed", "2",
                                 "--multi-gpu", "--data", str(data_dir)])
    assert r.exit_code == 0, r.output
    assert "20 jobs of Gavel's continuous-multiple workload at 3 jobs/h (seed 2)" in r.output
    back = load_trace(out)
    want = gavel_workload(20, 3.0, 2, multi_gpu=True, throughputs=data_dir / THROUGHPUTS)
    assert [(j.id, j.gpus, j.duration, j.attrs["job_type"]) for j in back] == [
        (j.id, j.gpus, j.duration, j.attrs["job_type"]) for j in want]
    bad = CliRunner().invoke(app, ["generate", "gavel", str(tmp_path / "g.txt"), "--data", str(data_dir)])
    assert bad.exit_code != 0 and "written as .jsonl or .csv" in bad.output
