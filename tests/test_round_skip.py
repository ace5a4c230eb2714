"""Skipping rounds that provably change nothing (``Stage.next_change``).

The simulator skips a periodic round when the last computed round planned no
action, no job arrived or finished since, and the stages say their output
cannot have changed yet.  A run must be the same, to the last bit, as one that
computes every round (``SimConfig.skip_rounds=False``): every job record, the
time series, the number of rounds.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core import Cluster, JobSpec
from gpuloom.core.job import Job
from gpuloom.core.plan import Allocation, Part
from gpuloom.policies import make
from gpuloom.policies.elastic import is_protected
from gpuloom.policies.order import first_meeting
from gpuloom.scheduler import Scheduler
from gpuloom.sim import SimConfig, Simulator
from gpuloom.sim.generator import PHILLY_DURATIONS, generate
from gpuloom.sim.traces import load_trace

CLUSTER = Cluster.homogeneous(4, 4)
WORKLOAD = generate(80, 12.0, 3, duration_dist=PHILLY_DURATIONS.clipped(60.0, 6 * 3600.0))


def both_ways(cluster, specs, stack: dict, **cfg):  # noqa: ANN001, ANN201
    out = []
    for skip in (True, False):
        sched = Scheduler.from_names(**stack)
        out.append(Simulator(cluster, specs, sched, config=SimConfig(skip_rounds=skip, **cfg)).run())
    return out


def assert_same_run(skipped, every) -> None:  # noqa: ANN001
    assert skipped.jobs == every.jobs  # every field of every job, bit for bit
    assert skipped.series == every.series
    assert (skipped.rounds, skipped.end_time) == (every.rounds, every.end_time)
    assert every.rounds_computed == every.rounds


STACKS = [
    {"order": o} for o in ("fifo", "sjf", "srtf", "srsf", "las", "las-gpu", "las-gpu-events", "srsf-events", "2d-las", "ftf")
] + [
    {"order": "srtf", "place": "packed-non-sticky"},
    {"order": "srsf", "place": "random-sticky"},
    {"order": "las", "place": "packed-sticky", "params": {"consolidate": False}},
    {"order": "2d-las", "params": {"thresholds": (600.0, 3600.0)}},
    {"order": "fifo", "preemptive": False},
    {"order": "srtf", "size": "elastic"},
    {"order": "fifo", "size": "elastic"},
    {"order": "las", "size": "elastic", "params": {"hysteresis": None}},
    {"order": "fifo", "size": "elastic", "params": {"respect_protection": False, "span_nodes": True}},
    {"order": "srsf", "size": "elastic", "place": "random-sticky", "params": {"v_bound": 0.01, "slowdown": "factor"}},
]


@pytest.mark.parametrize("resched", ["none", "both"])
@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_skipping_rounds_changes_nothing(stack: dict, resched: str) -> None:
    on = resched == "both"
    skipped, every = both_ways(CLUSTER, WORKLOAD, stack, reschedule_on_arrival=on, reschedule_on_completion=on,
                               restart_overhead=30.0)
    assert_same_run(skipped, every)
    assert skipped.rounds_computed < skipped.rounds


def test_muri_both_ways_on_real_profiles(data_dir) -> None:  # noqa: ANN001
    # Muri-S and Muri-L on the first 200 jobs of up to 8 GPUs of Muri's trace 3, 2 x 8 GPUs: groups form and split
    specs = sorted(load_trace(data_dir / "muri" / "sim_traces" / "trace3.csv", "muri"), key=lambda s: s.arrival)
    specs = [s for s in specs if s.gpus <= 8][:200]
    cl = Cluster.homogeneous(2, 8, 92, 520_000)
    for order in ("srsf", "2d-las", "las-gpu-events"):
        skipped, every = both_ways(cl, specs, {"order": order, "group": "muri"},
                                   reschedule_on_arrival=True, reschedule_on_completion=True)
        assert_same_run(skipped, every)
        assert skipped.rounds_computed < skipped.rounds / 2
        assert sum(j.preemptions for j in every.jobs) > 0  # something changes between events


def test_fifo_skips_every_round_without_events() -> None:
    # one long job: after the first round nothing can change until it ends
    r = Simulator(Cluster.homogeneous(1, 1), [JobSpec("a", 0, 1, 3000)], Scheduler.from_names("fifo"),
                  config=SimConfig(round_len=100, restart_overhead=0)).run()
    assert r.rounds == 30 and r.rounds_computed == 2  # the round that starts it, the one that finds it settled


# -- when an order can change ---------------------------------------------------------------------
def test_first_meeting_by_hand() -> None:
    # b (key 20) falls at 2/s onto a (key 10): they meet 5 s later (the margin is far below 1e-3)
    assert first_meeting(10.0, None, 20.0, (-2.0, -2.0, 0.0), 100.0) == pytest.approx(105.0, abs=1e-3)
    assert first_meeting(10.0, None, 20.0, (-2.0, -2.0, 0.0), 100.0) < 105.0
    # b still launching until 103: it starts falling then, meets at 108
    assert first_meeting(10.0, None, 20.0, (0.0, -2.0, 103.0), 100.0) == pytest.approx(108.0, abs=1e-3)
    # both fall at the same rate: never
    assert first_meeting(10.0, (0.0, -1.0, 0.0), 20.0, (0.0, -1.0, 0.0), 0.0) == math.inf
    # a (attained 5) grows at 1/s past b (8, waiting): 3 s
    assert first_meeting(5.0, (1.0, 1.0, 0.0), 8.0, None, 0.0) == pytest.approx(3.0, abs=1e-3)
    # a still launching grows, then b starts falling faster: a +1/s until 2 (gap 4 -> 2), then gap closes at 3/s
    assert first_meeting(0.0, (1.0, 1.0, 0.0), 4.0, (0.0, -2.0, 2.0), 0.0) == pytest.approx(2.0 + 2.0 / 3.0, abs=1e-3)
    # equal keys and b pulling ahead of a: now
    assert first_meeting(7.0, None, 7.0, (-1.0, -1.0, 0.0), 50.0) == 50.0


def _meeting_by_definition(ka: float, sa: tuple | None, kb: float, sb: tuple | None, now: float) -> float:
    """first_meeting as its docstring defines it, spelled out: walk the breakpoints after ``now`` in
    time order, the gap closing at the slope of each stretch, less the margin at the meeting."""
    ra1, ra2, ba = sa if sa is not None else (0.0, 0.0, now)
    rb1, rb2, bb = sb if sb is not None else (0.0, 0.0, now)
    ba, bb = max(ba, now), max(bb, now)
    gap, t0 = kb - ka, now
    for t1 in (*sorted({ba, bb} - {now}), math.inf):
        slope = (rb1 if t0 < bb else rb2) - (ra1 if t0 < ba else ra2)
        if slope < 0 and t0 + gap / -slope <= t1:
            return max(now, t0 + gap / -slope - 1e-7 * (abs(ka) + abs(kb) + 1.0) / -slope)
        if t1 == math.inf:
            return math.inf
        gap += slope * (t1 - t0)
        t0 = t1
    return math.inf


_RATES = st.sampled_from([0.0, 1.0, -1.0, -2.5, 0.25, -0.125])
_SLOPES = st.none() | st.tuples(_RATES, _RATES, st.sampled_from([0.0, 50.0, 100.0, 103.0, 140.0]))


@settings(max_examples=1000, deadline=None)  # (1,000 find each of 8 hand-made faults in 5 seeds of 5; 300 not)
@given(st.sampled_from([0.0, 100.0]), st.floats(0.0, 100.0), st.sampled_from([0.0, 1e-9, 3.0, 40.0]), _SLOPES, _SLOPES)
def test_first_meeting_is_its_definition_to_the_last_bit(now: float, ka: float, dk: float, sa: tuple | None,
                                                         sb: tuple | None) -> None:
    # breakpoints before, at and after now, equal or not, in either order; equal slopes
    assert first_meeting(ka, sa, ka + dk, sb, now) == _meeting_by_definition(ka, sa, ka + dk, sb, now)
    assert first_meeting(ka, sa, ka + dk, sa, now) == _meeting_by_definition(ka, sa, ka + dk, sa, now)


def _running(job: Job, speed: float, busy_until: float = 0.0) -> None:
    job.alloc = Allocation(job.id, (Part(0, (0,), 1, 1000),))
    job.speed = speed
    job.busy_until = busy_until


def test_srtf_changes_when_a_running_job_passes_a_waiting_one(make_view) -> None:  # noqa: ANN001
    a, b = Job(JobSpec("a", 0, 1, 100.0), 0), Job(JobSpec("b", 0, 1, 60.0), 1)
    for j in (a, b):
        j.arrive(0.0)
    _running(a, 0.5)  # 100 s of work left at half speed: reaches b's 60 at t = 80
    view = make_view(jobs=[a, b], now=0.0)
    pol = make("order", "srtf")
    assert [j.id for j in pol.order(view.jobs, view)] == ["b", "a"]
    assert pol.next_change(view) == pytest.approx(80.0, abs=1e-3)
    assert make("order", "srsf").next_change(view) == pytest.approx(80.0, abs=1e-3)
    assert make("order", "fifo").next_change(view) == math.inf
    # LAS: a's attained time grows past b's 0 at once
    assert make("order", "las").next_change(view) == 0.0


def test_2d_las_changes_at_the_next_demotion(make_view) -> None:  # noqa: ANN001
    a, b = Job(JobSpec("a", 0, 2, 1e5), 0), Job(JobSpec("b", 0, 1, 1e5), 1)
    for j in (a, b):
        j.arrive(0.0)
    a.alloc = Allocation("a", (Part(0, (0, 1), 2, 1000),))
    a.attained_gpu_time, a.last_update = 3000.0, 10.0  # 250 GPU-s below the first limit, at 2 GPUs: 125 s
    view = make_view(jobs=[a, b], now=10.0)
    assert make("order", "2d-las").next_change(view) == pytest.approx(135.0, abs=1e-3)


def test_elastic_sizing_changes_when_a_protection_ends(make_view) -> None:  # noqa: ANN001
    from gpuloom.core.lifecycle import JobState as S

    a, b = Job(JobSpec("a", 0, 1, 1e4), 0), Job(JobSpec("b", 0, 1, 1e4), 1)
    for j in (a, b):
        j.arrive(0.0)
    _running(a, 1.0)
    a.lifecycle.walk([S.STANDBY, S.LAUNCHING], 0.0)
    a.lifecycle.to(S.RUNNING_PROTECTED, 20.0)  # launched in 20 s: protected for 3 x 20 s, until 80
    pol = make("size", "elastic")
    view = make_view(jobs=[a, b], current={"a": a.alloc}, now=30.0)
    assert a.alloc is not None and is_protected(a, 30.0)
    assert pol.next_change(view) == 80.0
    a.busy_until = 50.0  # an overhead ends first
    assert pol.next_change(view) == 50.0
    a.busy_until = 0.0
    a.lifecycle.planned.append((70.0, S.CHECKPOINTING))  # a planned step comes first
    assert pol.next_change(view) == 70.0
    a.lifecycle.planned.clear()
    a.lifecycle.to(S.RUNNING, 80.0)  # unprotected, nothing planned: no time can change the sizing
    assert pol.next_change(make_view(jobs=[a, b], current={"a": a.alloc}, now=90.0)) == math.inf
    assert pol.next_change(make_view(jobs=[b], current={}, now=90.0)) == math.inf  # b waits: no protection
    b.busy_until = 120.0  # a waiting job still in an overhead (a co-runner asks about it too)
    assert pol.next_change(make_view(jobs=[b], current={}, now=90.0)) == 120.0
    b.busy_until = 0.0
    a.lifecycle.to(S.CHECKPOINTING, 90.0)  # a service job stopping: its process reports the end, any time
    assert pol.next_change(make_view(jobs=[a, b], current={"a": a.alloc}, now=90.0)) == 90.0
    # the scheduler sees the sizer's own hysteresis hook, counters and all, as its own (not a foreign hook)
    sched = Scheduler.from_names(size="elastic")
    sched.hooks[0].rejected += 3
    assert sched.next_change(make_view(jobs=[b], current={}, now=90.0)) == math.inf


def test_random_placement_changes_after_a_round_that_drew(make_view) -> None:  # noqa: ANN001
    from gpuloom.policies.base import Request

    pol = make("place", "random-sticky")
    view = make_view(now=10.0)
    assert pol.next_change(view) == math.inf  # no draw yet
    pol.choose(Request((view.jobs[0],), 1), view.free.copy(), view)  # the generator moved
    assert pol.next_change(view) == 10.0
    later = make_view(now=20.0)
    assert pol.next_change(later) == math.inf  # a round at 20 that drew nothing repeats itself
    assert make("place", "random-non-sticky").next_change(later) == 20.0
