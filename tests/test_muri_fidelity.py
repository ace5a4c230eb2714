"""Muri's own accounting in gpuloom: its per-event start-up overhead, and `reproduce muri --trace`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.perf.startup import DEFAULT_STARTUP, event_overhead, muri_startup
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.reproduce import ReproduceError, run
from gpuloom.sim.reproduce.muri import trace_path
from gpuloom.sim.traces import load_trace


def finishes(specs: list[JobSpec], event: str | float, order: str = "fifo", gpus: int = 2) -> dict[str, float]:
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True,
                    restart_overhead=0.0, event_overhead=event)
    res = Simulator(Cluster.homogeneous(1, gpus), specs, Scheduler.from_names(order), None, cfg).run()
    return {j.id: j.finish for j in res.jobs}


def test_startup_table() -> None:
    assert muri_startup(JobSpec("a", 0.0, 1, 1.0, model="a2c")) == 38.0
    assert muri_startup(JobSpec("a", 0.0, 8, 1.0, model="a2c")) == 46.0
    assert muri_startup(JobSpec("a", 0.0, 1, 1.0, model="unknown")) == DEFAULT_STARTUP
    assert muri_startup(JobSpec("a", 0.0, 3, 1.0, model="dqn")) == DEFAULT_STARTUP  # no row for 3 GPUs
    assert event_overhead("none") is None and event_overhead(0) is None
    for bad in ("sometimes", -1.0, math.inf):
        with pytest.raises(ValueError, match="event_overhead"):
            SimConfig(event_overhead=bad)


def test_event_overhead_charges_every_event_a_job_runs_through_as_muri_does() -> None:
    # a (dqn, 5 s) runs from 0; b (a2c, 38 s) arrives at 50 on the other GPU.
    # Muri: at 50, a has done 50 - 5 = 45 of 100 and ends at 50 + 55 = 105 (the stretch that ends in
    # its completion is not charged); at 105, b has done 55 - 38 = 17 and ends at 105 + 83 = 188
    specs = [JobSpec("a", 0.0, 1, 100.0, model="dqn"), JobSpec("b", 50.0, 1, 100.0, model="a2c")]
    assert finishes(specs, "muri") == pytest.approx({"a": 105.0, "b": 188.0})
    assert finishes(specs, 10.0) == pytest.approx({"a": 110.0, "b": 160.0})
    assert finishes(specs, "none") == pytest.approx({"a": 100.0, "b": 150.0})
    # an event shorter than the charge takes all the progress since the last one (not more)
    specs = [JobSpec("a", 0.0, 1, 100.0, model="dqn"), JobSpec("b", 3.0, 1, 10.0, model="dqn")]
    # at 3: a loses 3 (done 0); b runs 3..13, a is charged 5 again at 13 (done 10 - 5 = 5): ends 13 + 95
    assert finishes(specs, "muri") == pytest.approx({"a": 108.0, "b": 13.0})


def test_event_overhead_of_a_group_is_the_sum_of_its_members() -> None:
    from gpuloom.perf.interleave import InterleaveFactor
    from gpuloom.perf.model import LocalityFactor, ThroughputModel

    cpu, gpu = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)

    def spec(jid: str, arrival: float, prof: tuple[float, float, float], model: str) -> JobSpec:
        return JobSpec(jid, arrival, 1, 100.0, model=model, attrs={"resource_times": prof, "iteration_time": 1.0})

    # c and g interleave perfectly on the one GPU (speed 1 each); x arrives at 40 and waits (no third
    # slot it complements).  At 40 both members lose dqn + resnet18 = 5 + 4 = 9 s: 31 done, end at 109
    specs = [spec("c", 0.0, cpu, "dqn"), spec("g", 0.0, gpu, "resnet18"), spec("x", 40.0, gpu, "bert")]
    cl = Cluster.homogeneous(1, 1)
    model = ThroughputModel(cl, [LocalityFactor(), InterleaveFactor(threshold=0.0)])
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True,
                    restart_overhead=0.0, event_overhead="muri")
    res = Simulator(cl, specs, Scheduler.from_names("fifo", "muri"), model, cfg).run()
    fin = {j.id: j.finish for j in res.jobs}
    assert fin["c"] == pytest.approx(109.0) and fin["g"] == pytest.approx(109.0)


def test_reproduce_muri_trace_choice(data_dir: Path, tmp_path: Path) -> None:
    assert trace_path(data_dir, None).name == "trace3.csv"
    assert trace_path(data_dir, "trace1") == data_dir / "muri/sim_traces/trace1.csv"
    assert trace_path(data_dir, "testbed") == data_dir / "muri/testbed_trace/cluster_trace.csv"
    with pytest.raises(ReproduceError, match="missing input"):
        trace_path(data_dir, tmp_path / "none.csv")
    with pytest.raises(ReproduceError, match="muri only"):
        run("pal", data_dir, trace="trace1")
    (res,) = run("muri", data_dir, "artifact", limit=30, trace="trace4")
    assert "trace4" in res.title and all(r.published is None for r in res.rows)
    r = CliRunner().invoke(app, ["reproduce", "muri", "--trace", "testbed", "--limit", "20", "--data",
                                 str(data_dir), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "cluster_trace on 8x8" in r.output


def test_muri_rule_matches_any_positive_efficiency_then_unpacks_groups_slower_than_turns() -> None:
    import numpy as np

    from gpuloom.core.job import Job
    from gpuloom.perf.interleave import MURI_OVERHEAD, InterleaveFactor
    from gpuloom.perf.model import LocalityFactor, ThroughputModel
    from gpuloom.policies.base import View, make
    from gpuloom.policies.muri import MuriGrouping

    def job(jid: str, rt: tuple[float, float, float]) -> Job:
        return Job(JobSpec(jid, 0.0, 1, 60.0, iter_time=sum(rt), attrs={"resource_times": rt,
                                                                         "iteration_time": sum(rt)}))

    # two GPU-bound jobs: interleaved, a cycle of 6 + 6 = 12 s x Muri's pair overhead 1.31 > 6 + 6 taking
    # turns.  gpuloom's rule gives no edge; Muri's an edge of efficiency 12 / (4 x 12 x 1.31), a merge
    # (they do not fit one GPU), then autopack splits the pair again
    jobs = [job("g1", (0.0, 6.0, 0.0)), job("g2", (0.0, 6.0, 0.0))]
    cl = Cluster.homogeneous(1, 1)
    f = InterleaveFactor(overhead=MURI_OVERHEAD)
    f.bind({j.id: j for j in jobs})
    view = View(0.0, cl, jobs, {}, ThroughputModel(cl, [LocalityFactor(), f]), np.random.default_rng(0))
    profiles = [p for j in jobs if (p := f.profile(j)) is not None]
    assert MuriGrouping().match_round(profiles, [[0], [1]], 4, f) == []
    ours = MuriGrouping(rule="muri")
    (pair,) = ours.match_round(profiles, [[0], [1]], 4, f)
    assert pair[:2] == (0, 1) and pair[2] == round(1_000_000 * 12 / (4 * 12 * f.overhead_for(2)))
    units = ours.group(jobs, view)
    assert [tuple(j.id for j in u) for u in units] == [("g1",), ("g2",)] and ours.last_rounds == 1
    # complementary jobs still share under both rules
    jobs = [job("c", (6.0, 0.0, 0.0)), job("g", (0.0, 6.0, 0.0))]
    f.bind({j.id: j for j in jobs})
    view = View(0.0, cl, jobs, {}, ThroughputModel(cl, [LocalityFactor(), f]), np.random.default_rng(0))
    for rule in ("gpuloom", "muri"):
        assert [tuple(j.id for j in u) for u in MuriGrouping(rule=rule).group(jobs, view)] == [("c", "g")]
    with pytest.raises(ValueError, match="rule must be one of gpuloom, muri"):
        make("group", "muri", {"rule": "tiresias"})


def test_las_gpu_events_reorders_only_when_jobs_arrive_or_end(data_dir: Path) -> None:
    # one GPU; b arrives at 100 with less attained GPU-time than a (0 < 100): b runs.  las-gpu swaps
    # them back at the next 300 s round (a: 100 < b: 200) and so on; Muri's order keeps b until it ends
    specs = [JobSpec("a", 0.0, 1, 1000.0), JobSpec("b", 100.0, 1, 1000.0)]
    cfg = SimConfig(round_len=300.0, reschedule_on_arrival=True, reschedule_on_completion=True,
                    restart_overhead=0.0)
    runs = {}
    for order in ("las-gpu", "las-gpu-events"):
        res = Simulator(Cluster.homogeneous(1, 1), specs, Scheduler.from_names(order), None, cfg).run()
        runs[order] = ({j.id: j.finish for j in res.jobs}, res.rounds_computed)
    assert runs["las-gpu-events"][0] == pytest.approx({"a": 2000.0, "b": 1100.0})
    assert runs["las-gpu"][0]["a"] != pytest.approx(2000.0)  # time-sliced
    assert runs["las-gpu-events"][1] < runs["las-gpu"][1]
    # with rounds on arrivals and completions only, both are Muri's order: the same run
    specs = load_trace(data_dir / "muri/sim_traces/trace3.csv", "muri")[:150]
    cl = Cluster.homogeneous(4, 8, 92, 520_000)
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True)
    fins = [{j.id: j.finish for j in Simulator(cl, specs, Scheduler.from_names(o, "muri"), None, cfg).run().jobs}
            for o in ("las-gpu", "las-gpu-events")]
    assert fins[0] == fins[1]


def _arrived(jid: str, index: int, attained: float, gpus: int):  # noqa: ANN202
    """A job of ``gpus`` GPUs arrived at 0 with ``attained`` GPU-seconds."""
    from gpuloom.core.job import Job

    j = Job(JobSpec(jid, 0.0, gpus, 1e5), index)
    j.arrive(0.0)
    j.attained_gpu_time, j.last_update = attained, 0.0
    return j


def test_las_gpu_events_order_is_the_key_order_and_reuses_it_between_events(make_view) -> None:  # noqa: ANN001
    # attained GPU-time: a 300, b 100, c 100 (ties by arrival); a runs on 2 GPUs
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.policies import make
    from gpuloom.policies.order import KeyOrder

    def made(jid: str, index: int, attained: float) -> Job:
        return _arrived(jid, index, attained, 2)

    a, b, c = made("a", 0, 300.0), made("b", 1, 100.0), made("c", 2, 100.0)
    a.alloc = Allocation("a", (Part(0, (0, 1), 2, 1000),))
    pol = make("order", "las-gpu-events")

    def order_at(jobs: list[Job], now: float, rnd: int) -> list[str]:
        view = make_view(jobs=jobs, now=now)
        view.round_index = rnd
        out = list(pol.order(view.jobs, view))
        assert out == list(KeyOrder.order(pol, view.jobs, view))  # the generic path, key by key
        out_ids = [j.id for j in out]
        pol.order(view.jobs, view).reverse()  # (the caller's copy: the kept order stays)
        return out_ids

    assert order_at([a, b, c], 0.0, 1) == ["b", "c", "a"]
    # the same jobs later: a's attained time grew, b's jumped, but the keys stay those of the last event
    b.attained_gpu_time = 1e6
    assert order_at([a, b, c], 1000.0, 2) == ["b", "c", "a"]
    # d arrives: every key is read again (a: 300 + 2 x 1000, b: 1e6, c: 100, d: 0)
    d = made("d", 3, 0.0)
    assert order_at([a, b, c, d], 1000.0, 3) == ["d", "c", "a", "b"]
    # the same ids, another object for c: the order holds the object given, not the one kept
    c2 = made("c", 2, 100.0)
    view = make_view(jobs=[a, b, c2, d], now=1000.0)
    view.round_index = 4
    assert [id(j) for j in pol.order(view.jobs, view)] == [id(d), id(c2), id(a), id(b)]
    # e arrives (100 GPU-s, c's key): ties go by index whether the jobs come in arrival order or not
    e = made("e", 4, 100.0)
    assert order_at([a, b, c2, d, e], 1000.0, 5) == ["d", "c", "e", "a", "b"]
    f = made("f", 5, 100.0)
    assert order_at([f, e, d, c2, b, a], 1000.0, 6) == ["d", "c", "e", "f", "a", "b"]


def test_las_gpu_events_finds_the_same_jobs_by_the_ids_of_a_drivers_view(make_view) -> None:  # noqa: ANN001
    # a driver's view (ActiveJobs over its jobs by id): the same ids keep the keys of the last event;
    # as many jobs with one id another (one ended, one arrived) take them again, whether the ids are
    # read from the dict's keys or, once the view's jobs are frozen into a list, from its jobs
    from gpuloom.core.job import ActiveJobs
    from gpuloom.policies import make

    a, b, c = (_arrived(x, i, k, 1) for i, (x, k) in enumerate((("a", 300.0), ("b", 100.0), ("c", 200.0))))
    pol = make("order", "las-gpu-events")

    def order_at(by_id: dict, now: float, rnd: int, frozen: bool = False) -> list[str]:
        view = make_view(jobs=list(by_id.values()), now=now)
        view.jobs = ActiveJobs(by_id)
        if frozen:
            view.jobs.freeze()
        view.round_index = rnd
        return [j.id for j in pol.order(view.jobs, view)]

    assert order_at({"a": a, "b": b, "c": c}, 0.0, 1) == ["b", "c", "a"]
    b.attained_gpu_time = 1e6  # (between events: the keys stay those of the last one)
    assert order_at({"a": a, "b": b, "c": c}, 10.0, 2) == ["b", "c", "a"]
    assert order_at({"a": a, "b": b, "c": c}, 10.0, 3, frozen=True) == ["b", "c", "a"]
    d = _arrived("d", 3, 250.0, 1)  # c ended, d arrived: every key read again (b's too)
    assert order_at({"a": a, "b": b, "d": d}, 20.0, 4) == ["d", "a", "b"]
    e = _arrived("e", 4, 0.0, 1)
    assert order_at({"a": a, "b": b, "e": e}, 30.0, 5, frozen=True) == ["e", "a", "b"]


def test_las_gpu_events_sorts_the_keys_it_just_took_as_key_by_key(make_view) -> None:  # noqa: ANN001
    # a driver's view (its tally: jobs in index order): the keys taken at an event are sorted as the
    # values of the table, in the jobs' order; a keys_at of another order falls back to key by key
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.policies import make
    from gpuloom.policies.incremental import Tally
    from gpuloom.policies.order import KeyOrder, LASGPUEvents

    def made(jid: str, index: int, attained: float) -> Job:
        return _arrived(jid, index, attained, 1)

    class Reversed(LASGPUEvents):  # its table built in reverse
        def keys_at(self, jobs, now):  # noqa: ANN001, ANN202
            return dict(reversed(list(super().keys_at(jobs, now).items())))

        @staticmethod
        def key_at(job: Job, now: float) -> float:
            return job.attained_gpu_at(now)

    # attained GPU-s: a 50, b 0, c 50 (a tie with a: by index), d 20 on 2 GPUs from 0 (20 + 2 x now)
    a, b, c, d = made("a", 0, 50.0), made("b", 1, 0.0), made("c", 2, 50.0), made("d", 3, 20.0)
    d.alloc = Allocation("d", (Part(0, (0, 1), 2, 1000),))
    for pol, expect in ((make("order", "las-gpu-events"), (["b", "d", "a", "c"], ["b", "a", "c", "e", "d"])),
                        (Reversed(), (["b", "d", "a", "c"], ["b", "a", "c", "e", "d"]))):
        got = []
        for rnd, (jobs, now) in enumerate((([a, b, c, d], 10.0), ([a, b, c, d, made("e", 4, 50.0)], 20.0)), 1):
            tally = Tally()
            for j in jobs:
                tally.admitted(j)
            assert tally.index_order
            view = make_view(jobs=jobs, now=now)
            view.round_index, view.tally = rnd, tally
            out = [j.id for j in pol.order(view.jobs, view)]
            assert out == [j.id for j in KeyOrder.order(pol, view.jobs, view)]
            got.append(out)
        assert tuple(got) == expect


def test_srsf_events_keeps_the_keys_of_the_last_event(make_view, data_dir: Path) -> None:  # noqa: ANN001
    # remaining work x GPUs: a runs on 2 GPUs at speed 1 with 1000 s left (2000), b and c wait with 1500
    # and 1800 s on 1 GPU each
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.policies import make

    def made(jid: str, index: int, gpus: int, remaining: float) -> Job:
        j = Job(JobSpec(jid, 0.0, gpus, 2000.0), index)
        j.arrive(0.0)
        j.remaining, j.last_update = remaining, 0.0
        return j

    a, b, c = made("a", 0, 2, 1000.0), made("b", 1, 1, 1500.0), made("c", 2, 1, 1800.0)
    a.alloc, a.speed = Allocation("a", (Part(0, (0, 1), 2, 1000),)), 1.0
    ev, plain = make("order", "srsf-events"), make("order", "srsf")

    def order_at(pol, jobs: list[Job], now: float, rnd: int) -> list[str]:  # noqa: ANN001
        view = make_view(jobs=jobs, now=now)
        view.round_index = rnd
        return [j.id for j in pol.order(view.jobs, view)]

    assert order_at(ev, [a, b, c], 0.0, 1) == order_at(plain, [a, b, c], 0.0, 1) == ["b", "c", "a"]
    # at 300 s a's key is 2 x 700 = 1400: srsf puts it first, Muri-S keeps the order of the last event
    assert order_at(plain, [a, b, c], 300.0, 2) == ["a", "b", "c"]
    assert order_at(ev, [a, b, c], 300.0, 2) == ["b", "c", "a"]
    assert ev.next_change(make_view(jobs=[a, b, c], now=300.0)) == math.inf
    # d arrives (600 s on 1 GPU): every key is read again (a: 1400, b 1500, c 1800, d 600)
    d = made("d", 3, 1, 600.0)
    assert order_at(ev, [a, b, c, d], 300.0, 3) == ["d", "a", "b", "c"]
    # a whole run: with rounds on arrivals and completions only it is srsf (Muri's simulator's rounds)
    specs = load_trace(data_dir / "muri/sim_traces/trace3.csv", "muri")[:150]
    cl = Cluster.homogeneous(4, 8, 92, 520_000)
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True)
    fins = [{j.id: j.finish for j in Simulator(cl, specs, Scheduler.from_names(o, "muri"), None, cfg).run().jobs}
            for o in ("srsf", "srsf-events")]
    assert fins[0] == fins[1]


def test_artifact_preset_places_every_job_afresh_as_muri_does() -> None:
    # the SRTF drift: Muri re-places every job at every event in priority order, so a running job
    # moves to let a higher-priority gang start.  2 nodes x 2 GPUs: a (node 0) and c (node 1) leave
    # one GPU free on each node when d (2 GPUs, the shortest) arrives at 70: placed afresh, d takes a
    # whole node at once and ends at 170; kept in place (gpuloom's default) it waits for a (1000)
    from gpuloom.sim.reproduce.muri import scheduler

    specs = [JobSpec("a", 0.0, 1, 1000.0), JobSpec("b", 10.0, 1, 50.0), JobSpec("c", 20.0, 1, 2000.0),
             JobSpec("d", 70.0, 2, 100.0)]
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True,
                    restart_overhead=0.0)
    fin = {}
    for preset in ("artifact", "paper"):
        res = Simulator(Cluster.homogeneous(2, 2), specs, scheduler(preset, "srtf", "none"), None, cfg).run()
        fin[preset] = {j.id: j.finish for j in res.jobs}
    assert fin["artifact"] == pytest.approx({"a": 1000.0, "b": 60.0, "c": 2020.0, "d": 170.0})
    assert fin["paper"]["d"] == pytest.approx(1100.0)


def _raw_jobs() -> list[JobSpec]:
    # a: stages 3 + 1 + 1 s in a 10 s iteration (5 s unattributed); b: 1 + 2 + 1 s in 4 s
    return [JobSpec("a", 0.0, 1, 100.0, attrs={"resource_times": (3.0, 1.0, 1.0), "iteration_time": 10.0}),
            JobSpec("b", 0.0, 1, 100.0, attrs={"resource_times": (1.0, 2.0, 1.0), "iteration_time": 4.0})]


def test_raw_profiles_interleave_the_trace_stage_times_against_the_iteration_time() -> None:
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation
    from gpuloom.perf.interleave import InterleaveFactor

    a, b = (Job(s) for s in _raw_jobs())
    raw, norm = InterleaveFactor(profiles="raw"), InterleaveFactor()
    for f in (raw, norm):
        f.bind({"a": a, "b": b})
    # raw: the best pair cycle (loading over two phases) is max(3, 2 + 1) + max(1, 1 + 1) = 5 s, so a
    # (10 s alone) runs at 10 / 5 = 2x, b at 4 / 5
    assert raw.profile(a) == (3.0, 1.0, 1.0) and raw.solo_time(a) == 10.0 and raw.solo_time(b) == 4.0
    assert raw(a, Allocation("a", (), ("b",))) == pytest.approx(2.0)
    assert raw(b, Allocation("b", (), ("a",))) == pytest.approx(0.8)
    # normalised: a's 5 unattributed seconds go to its loading stage (8, 1, 1): a cycle of
    # max(8, 3) + max(1, 2) = 10 s, a at 1x, b at 0.4x
    assert norm.profile(a) == (8.0, 1.0, 1.0) and norm.solo_time(a) == 10.0
    assert norm(a, Allocation("a", (), ("b",))) == pytest.approx(1.0)
    assert norm(b, Allocation("b", (), ("a",))) == pytest.approx(0.4)
    # raw keeps a stage under the threshold and stages overlapping the iteration time; normalised drops
    # the 1 ms of loading (overlapped time comes off the other stages first)
    c = Job(JobSpec("c", 0.0, 1, 1.0, attrs={"resource_times": (0.001, 1.0, 0.0), "iteration_time": 1.0}))
    assert raw.profile(c) == (0.001, 1.0, 0.0) and norm.profile(c) == pytest.approx((0.0, 1.0, 0.0))
    with pytest.raises(ValueError, match="interleave profiles must be one of normalised, raw"):
        InterleaveFactor(profiles="cooked")
    from gpuloom.perf.interleave import ProfileError

    for bad in ((0.0, 0.0, 0.0), (1.0, -1.0, 0.0), (math.nan, 1.0, 0.0)):
        with pytest.raises(ProfileError, match="job z: raw stage times must be finite"):
            raw.profile(JobSpec("z", 0.0, 1, 1.0, attrs={"resource_times": bad, "iteration_time": 1.0}))


def test_raw_profiles_in_a_simulation_and_as_a_model_option() -> None:
    from gpuloom.perf.assembly import build_model

    cl = Cluster.homogeneous(1, 1)
    cfg = SimConfig(round_len=math.inf, reschedule_on_arrival=True, reschedule_on_completion=True,
                    restart_overhead=0.0)
    fin = {}
    for kind in ("raw", "normalised"):
        model = build_model(cl, specs=_raw_jobs(), options={"interleave_overhead": "none",
                                                             "interleave_profiles": kind})
        res = Simulator(cl, _raw_jobs(), Scheduler.from_names("fifo", "muri"), model, cfg).run()
        fin[kind] = {j.id: j.finish for j in res.jobs}
    # raw: a at 2x ends at 50 (b has done 40 of 100), b alone for the other 60: 110.
    # normalised: a at 1x ends at 100 (b: 40 done), b at 160
    assert fin["raw"] == pytest.approx({"a": 50.0, "b": 110.0})
    assert fin["normalised"] == pytest.approx({"a": 100.0, "b": 160.0})
    with pytest.raises(ValueError, match="interleave_profiles=raw"):
        build_model(cl, options={"interleave_profiles": "raw", "interleave_model": "shared"})
    with pytest.raises(ValueError, match="expected normalised"):
        build_model(cl, options={"interleave_profiles": "cooked"})


def test_autopack_with_raw_profiles_compares_the_group_with_its_members_iteration_times() -> None:
    import numpy as np

    from gpuloom.core.job import Job
    from gpuloom.perf.interleave import MURI_OVERHEAD, InterleaveFactor
    from gpuloom.perf.model import LocalityFactor, ThroughputModel
    from gpuloom.policies.base import View
    from gpuloom.policies.muri import MuriGrouping

    # two GPU-bound jobs listing 6 s of GPU stage in a 20 s iteration.  Raw: the pair's cycle is
    # 12 s x 1.31 = 15.7 s, below 20 + 20 taking turns: kept.  Normalised: (0, 20, 0) each, a
    # cycle of 40 s x 1.31 > 40 s: autopack splits it
    jobs = [Job(JobSpec(g, 0.0, 1, 60.0, attrs={"resource_times": (0.0, 6.0, 0.0), "iteration_time": 20.0}))
            for g in ("g1", "g2")]
    cl = Cluster.homogeneous(1, 1)
    units = {}
    for kind in ("raw", "normalised"):
        f = InterleaveFactor(overhead=MURI_OVERHEAD, profiles=kind)
        f.bind({j.id: j for j in jobs})
        view = View(0.0, cl, jobs, {}, ThroughputModel(cl, [LocalityFactor(), f]), np.random.default_rng(0))
        units[kind] = [tuple(j.id for j in u) for u in MuriGrouping(rule="muri").group(jobs, view)]
    assert units == {"raw": [("g1", "g2")], "normalised": [("g1",), ("g2",)]}


def test_artifact_preset_interleaves_raw_stage_times() -> None:
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation
    from gpuloom.perf.assembly import build_model
    from gpuloom.sim.reproduce.muri import model_options

    a, b = (Job(s) for s in _raw_jobs())
    speeds = {}
    for preset in ("artifact", "paper"):
        f = build_model(Cluster.homogeneous(1, 1), options=model_options(preset)).get("interleave")
        f.bind({"a": a, "b": b})
        speeds[preset] = f(a, Allocation("a", (), ("b",)))
    # artifact: the raw pair cycle 5 s x Muri's 1.33 over 1.015 twice (the work carries the first
    # 1.015); paper: the normalised cycle 10 s x 1.33 / 1.015, capped at 1
    assert speeds["artifact"] == pytest.approx(10.0 / (5.0 * 1.33 / 1.015 ** 2))
    assert speeds["paper"] == pytest.approx(10.0 / (10.0 * 1.33 / 1.015))


def test_srsf_events_keys_read_in_one_loop_equal_remaining_at() -> None:
    """``SRSFEvents.keys_at`` writes ``Job.remaining_at`` out for speed: to the bit the same as ``key_at`` for a
    job not running, one running, one whose start-up runs past now, one before its last update and one whose
    work ran out (0, not below)."""
    from gpuloom.core.job import Job
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.policies.order import SRSFEvents

    def made(jid: str, gpus: int, remaining: float, speed: float, last: float, busy: float, run: bool) -> Job:
        j = Job(JobSpec(jid, 0.0, gpus, 2000.0), 0)
        j.arrive(0.0)
        j.remaining, j.last_update, j.busy_until, j.speed = remaining, last, busy, speed
        if run:
            j.alloc = Allocation(jid, (Part(0, tuple(range(gpus)), gpus, 1000),))
        return j

    jobs = [made("idle", 2, 900.0, 1.0, 0.0, 0.0, False), made("run", 2, 1000.0, 0.7, 10.0, 0.0, True),
            made("startup", 1, 500.0, 1.3, 10.0, 400.0, True), made("before", 4, 300.0, 1.0, 500.0, 0.0, True),
            made("spent", 1, 0.1, 3.0, 0.0, 20.0, True), made("fraction", 1, 123.456, 0.1, 1.5, 2.25, True)]
    for now in (0.0, 10.0, 250.0, 333.3, 1e6):
        want = {j.id: SRSFEvents.key_at(j, now) for j in jobs}
        assert SRSFEvents().keys_at(jobs, now) == want, now
    assert SRSFEvents().keys_at(jobs, 250.0) == {"idle": 1800.0, "run": 2 * (1000.0 - 240.0 * 0.7), "startup": 500.0,
                                                "before": 1200.0, "spent": 0.0, "fraction": 123.456 - 247.75 * 0.1}
