"""Muri-L's carried-over class matching (``group`` policy ``muri``, ``match=repair``): hand-checked repairs,
the invariants of a matching, and which stacks use it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job
from gpuloom.core.plan import Allocation, Part
from gpuloom.policies.base import View
from gpuloom.policies.bmatch import BLOSSOM_NODES, class_pairs
from gpuloom.policies.muri import MuriGrouping
from gpuloom.policies.repair import repair_pairs
from gpuloom.scheduler import Scheduler
from gpuloom.sim.traces import load_trace
from test_muri import CPU, GPU, NET, spec, view_for

W2 = [[0, 5], [5, 0]]


def test_a_class_that_lost_a_node_gives_up_a_pair() -> None:
    # classes 10 and 20, two nodes each, paired twice; one node of 20 leaves: one pair is left
    assert repair_pairs({10: 2, 20: 2}, {(10, 20): 2}, [10, 20], [2, 1], W2, 4) == {(0, 1): 1}


def test_a_class_that_lost_nodes_gives_up_its_lightest_pairs_first() -> None:
    # class 0 pairs once with 1 (weight 9) and once with 2 (weight 3); it loses a node: the pair with 2 goes
    w = [[0, 9, 3], [9, 0, 0], [3, 0, 0]]
    assert repair_pairs({1: 2, 2: 1, 3: 1}, {(1, 2): 1, (1, 3): 1}, [1, 2, 3], [1, 1, 1], w, 4) == {(0, 1): 1}


def test_pairs_kept_where_the_counts_still_hold_them_and_a_class_gone() -> None:
    # class 30 left (its inner pair goes), a node of 30's kind can no longer pair: the rest is kept
    prev = {(10, 20): 2, (30, 30): 1}
    assert repair_pairs({10: 2, 20: 2, 30: 2}, prev, [10, 20], [2, 2], W2, 4) == {(0, 1): 2}
    # (ids in either order)
    assert repair_pairs({10: 2, 20: 2, 30: 2}, {(20, 10): 2}, [10, 20], [2, 2], W2, 4) == {(0, 1): 2}


def test_free_nodes_pair_heaviest_classes_first_and_running_pairs_stay() -> None:
    # classes 1, 2, 3 arrive with one node each: the heaviest pair (1, 3) = 5 is taken, 2 stays alone
    w = [[0, 3, 5], [3, 0, 4], [5, 4, 0]]
    assert repair_pairs({}, {}, [1, 2, 3], [1, 1, 1], w, 4) == {(0, 2): 1}
    # one node of class 3 joins a bucket where 1 and 2 run together: greedy does not break their pair
    assert repair_pairs({1: 1, 2: 1}, {(1, 2): 1}, [1, 2, 3], [1, 1, 1], w, 4) == {(0, 1): 1}
    # two free nodes of one class pair with each other (an edge inside the class)
    w1 = [[0, 0], [0, 7]]
    assert repair_pairs({1: 1}, {}, [1, 2], [1, 2], w1, 4) == {(1, 1): 1}


def test_nothing_changed_or_too_much_changed_is_left_to_the_exact_matching() -> None:
    assert repair_pairs({10: 2, 20: 2}, {(10, 20): 2}, [10, 20], [2, 2], W2, 4) is None
    assert repair_pairs({10: 2, 20: 2}, {(10, 20): 2}, [10, 20], [2, 7], W2, 4) is None  # 5 > 4 changed
    assert repair_pairs({10: 2, 20: 2}, {(10, 20): 2}, [10, 20], [2, 6], W2, 4) == {(0, 1): 2}  # 4: repaired


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.integers(0, 9), min_size=k, max_size=k), min_size=k, max_size=k),
    st.lists(st.integers(0, 6), min_size=k, max_size=k),
    st.lists(st.integers(0, 6), min_size=k, max_size=k))))
def test_a_repaired_matching_is_a_matching_and_keeps_what_it_can(case: tuple) -> None:
    raw, before, after = case
    k = len(before)
    w = [[0] * k for _ in range(k)]
    for c in range(k):
        for d in range(c, k):
            w[c][d] = w[d][c] = raw[c][d]
    ids = [100 + c for c in range(k)]
    prev = {(ids[c], ids[d]): m for (c, d), m in class_pairs(before, w).items()}
    got = repair_pairs(dict(zip(ids, before, strict=True)), prev, ids, after, w, 10_000)
    if before == after:
        assert got is None
        return
    assert got is not None
    deg = [0] * k
    for (c, d), m in got.items():
        assert c <= d and m > 0 and w[c][d] > 0
        deg[c] += m
        deg[d] += m
    assert all(dg <= n for dg, n in zip(deg, after, strict=True))
    # no two free nodes could still pair (the greedy pass leaves no positive edge between them)
    free = [n - dg for n, dg in zip(after, deg, strict=True)]
    assert not any(w[c][d] > 0 and (free[c] >= 2 if c == d else free[c] and free[d])
                   for c in range(k) for d in range(c, k))
    # where no class shrank, every earlier pair is still there
    if all(a >= b for a, b in zip(after, before, strict=True)):
        for (ga, gb), m in prev.items():
            assert got.get((ids.index(ga), ids.index(gb)), 0) >= m


def test_auto_repairs_under_muri_l_only() -> None:
    def repairs(order: str, **params: str) -> bool:
        sch = Scheduler.from_names(order, "muri", params=params or None)
        assert isinstance(sch.group, MuriGrouping)
        return sch.group._repair  # noqa: SLF001

    assert repairs("las-gpu-events")
    assert not repairs("2d-las") and not repairs("srsf") and not repairs("las-gpu")
    assert not repairs("las-gpu-events", match="exact")
    assert not repairs("las-gpu-events", rule="muri")  # (Muri's simulator matches from scratch)
    assert repairs("srsf", match="repair")
    with pytest.raises(ValueError, match="match must be one of"):
        MuriGrouping(match="greedy")


def _bucket(n: int) -> list[Job]:
    profs = [CPU, GPU, NET]
    return [Job(spec(f"j{i:03d}", profs[i % 3])) for i in range(n)]


def test_a_large_bucket_keeps_its_pairs_when_a_job_leaves() -> None:
    # 60 one-GPU jobs on 30 GPUs: they must pair up.  One leaves; exact, the bucket is matched afresh;
    # repaired, every pair without the job that left is kept
    jobs = _bucket(60)
    assert len(jobs) > BLOSSOM_NODES
    cl = Cluster.homogeneous(1, 30)
    pol = MuriGrouping(max_group=2, match="repair")
    pol._repair = True  # noqa: SLF001  (as refuse() sets it under las-gpu-events)
    first = {frozenset(j.id for j in u) for u in pol.group(jobs, view_for(jobs, cl)) if len(u) > 1}
    assert len(first) == 30
    gone = jobs[7].id
    rest = [j for j in jobs if j.id != gone]

    def running(pairs: set[frozenset[str]], jobs: list[Job]) -> View:
        view = view_for(jobs, cl)
        cur = {}
        for gpu, pair in enumerate(sorted(sorted(p) for p in pairs)):
            part = (Part(0, (gpu,), 1, 100),)
            a, b = pair
            cur[a] = Allocation(a, part, (b,))
            cur[b] = Allocation(b, part, (a,))
        view.current = cur
        return view

    second = {frozenset(j.id for j in u) for u in pol.group(rest, running(first, rest)) if len(u) > 1}
    assert {p for p in first if gone not in p} <= second
    assert all(gone not in p for p in second) and all(len(p) == 2 for p in second)
    # met again with the same classes and counts: the same pairs
    again = {frozenset(j.id for j in u) for u in pol.group(rest, running(second, rest)) if len(u) > 1}
    assert again == second
    # matched exactly instead, the bucket is matched afresh: its weight is as high or higher
    exact = MuriGrouping(max_group=2, match="exact")
    fresh = {frozenset(j.id for j in u) for u in exact.group(rest, running(first, rest)) if len(u) > 1}
    assert len(fresh) >= len(second)


def test_carried_over_matchings_skip_rounds_as_exactly_as_computed_ones(data_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # a carried-over matching depends on the last one, so a run that skips the rounds that change nothing
    # must still be the run that computes them all, bit for bit: Muri-L on trace3's 1-GPU jobs on 16 GPUs,
    # where admission brings up to 64 jobs into one bucket
    import gpuloom.policies.muri as muri
    from test_round_skip import assert_same_run, both_ways

    specs = sorted(load_trace(data_dir / "muri" / "sim_traces" / "trace3.csv", "muri"), key=lambda s: s.arrival)
    # (arrivals 30 s apart: a queue long enough to fill the bucket)
    specs = [replace(s, arrival=30.0 * i) for i, s in enumerate([s for s in specs if s.gpus == 1][:300])]
    cl = Cluster.homogeneous(2, 8, 92, 520_000)
    carried = []
    real = muri.repair_pairs
    monkeypatch.setattr(muri, "repair_pairs", lambda *a: (r := real(*a), carried.append(r is not None))[0])
    skipped, every = both_ways(cl, specs, {"order": "las-gpu-events", "group": "muri"},
                               reschedule_on_arrival=True, reschedule_on_completion=True, round_len=300.0)
    assert_same_run(skipped, every)
    assert skipped.rounds_computed < skipped.rounds
    assert sum(carried) > 100  # matchings were carried over (334 here)
