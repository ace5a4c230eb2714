"""Interleaving efficiency (Muri): hand-checked groups, orderings, profiles, the throughput factor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.assembly import build_model
from gpuloom.perf.interleave import (
    MURI_LAYOUT,
    MURI_OVERHEAD,
    InterleaveFactor,
    ProfileError,
    best_ordering,
    cycle_time_of,
    cycle_times,
    efficiency,
    group_cycle,
    group_iteration_times,
    layout_for,
    orderings,
    parse_overhead,
    spec_profile,
    stage_profile,
)

A = (4.0, 2.0, 0.0)  # CPU-heavy
B = (1.0, 4.0, 1.0)  # GPU-heavy
C = (0.0, 1.0, 5.0)  # network-heavy


# -- stage profiles -------------------------------------------------------------
def test_profile_unattributed_time_goes_to_dominant_and_small_stages_vanish() -> None:
    # dqn on 1 GPU (Muri trace, ms): 446 CPU + 8 GPU + 0 network in a 490 ms iteration
    assert stage_profile([446, 8, 0], 490) == (490.0, 0.0, 0.0)
    # without the threshold the 8 ms GPU stage stays
    assert stage_profile([446, 8, 0], 490, threshold=0.0) == (482.0, 8.0, 0.0)
    # bert: 0.5 ms of CPU is below 2 % of 178 ms
    assert stage_profile([0.5, 160, 0], 178) == (0.0, 178.0, 0.0)


def test_profile_overlap_belongs_to_the_dominant_resource() -> None:
    # resnet18 on 1 GPU: 711 + 110 = 821 ms listed in a 779 ms iteration -> 42 ms overlap off the GPU stage
    assert stage_profile([711, 110, 0], 779) == pytest.approx((711.0, 68.0, 0.0))
    # vgg16 on 8 GPUs: 223 listed in 214 -> 9 ms off GPU and network in proportion (75:66)
    p = stage_profile([82, 75, 66], 214)
    assert p == pytest.approx((82.0, 75 * 132 / 141, 66 * 132 / 141))
    # vgg19 on 1 GPU: overlap (85) larger than the non-dominant stages (80): the dominant one gives the rest
    assert stage_profile([114, 80, 0], 109) == pytest.approx((109.0, 0.0, 0.0))
    for rt, it in [([711, 110, 0], 779), ([82, 75, 66], 214), ([0.6, 410, 0], 426), ([3, 3, 3], 5)]:
        assert math.isclose(sum(stage_profile(rt, it)), it)


def test_profile_bad_input_is_named() -> None:
    with pytest.raises(ProfileError, match="finite"):
        stage_profile([1.0, -2.0, 0.0], 3.0)
    with pytest.raises(ProfileError, match="iteration time"):
        stage_profile([1.0, 2.0], 0.0)
    spec = JobSpec("j7", 0.0, 1, 10.0, attrs={"resource_times": ("x", 1.0, 0.0)})
    with pytest.raises(ProfileError, match="j7"):
        spec_profile(spec)


def test_spec_profile_reads_attrs_in_seconds() -> None:
    spec = JobSpec("a", 0.0, 1, 100.0, iter_time=0.49, attrs={"resource_times": (0.446, 0.008, 0.0), "iteration_time": 0.49})
    assert spec_profile(spec) == pytest.approx((0.49, 0.0, 0.0))
    assert spec_profile(JobSpec("b", 0.0, 1, 100.0)) is None


# -- orderings by hand ----------------------------------------------------------------
def test_two_jobs_by_hand() -> None:
    # ordering (0,1): phases max(4,1)+max(2,1)+max(0,4) = 4+2+4 = 10
    assert cycle_time_of([A, B], [0, 1]) == 10.0
    # ordering (0,2): B one stage "behind": max(4,4)+max(2,1)+max(0,1) = 4+2+1 = 7
    assert cycle_time_of([A, B], [0, 2]) == 7.0
    assert best_ordering([A, B]) == (7.0, (0, 2))
    assert group_cycle([A, B]) == group_cycle([B, A]) == 7.0
    assert efficiency([A, B]) == pytest.approx(12 / 21)  # 12 busy resource-seconds in 3 x 7
    assert group_iteration_times([A, B]) == [7.0, 7.0]  # each member: 6 s alone -> 7 s together


def test_three_jobs_by_hand() -> None:
    # (0,1,2): max(4,1,1)+max(2,1,5)+max(0,4,0) = 4+5+4 = 13
    assert cycle_time_of([A, B, C], [0, 1, 2]) == 13.0
    # (0,2,1): max(4,4,5)+max(2,1,0)+max(0,1,1) = 5+2+1 = 8
    assert cycle_time_of([A, B, C], [0, 2, 1]) == 8.0
    assert best_ordering([A, B, C]) == (8.0, (0, 2, 1))
    assert efficiency([A, B, C]) == pytest.approx(18 / 24)
    assert group_iteration_times([A, B, C], MURI_OVERHEAD) == pytest.approx([8 * 1.5 / 1.015] * 3)


def test_a_gap_in_the_cycle_can_be_best() -> None:
    # 4 resources, two jobs alternating 3 s on resources 0 and 2: offsets 1 and 3 collide, offset 2 is perfect
    X = (3.0, 0.0, 3.0, 0.0)
    assert cycle_time_of([X, X], [0, 1]) == 12.0
    assert cycle_time_of([X, X], [0, 3]) == 12.0
    assert best_ordering([X, X]) == (6.0, (0, 2))
    assert efficiency([X, X]) == pytest.approx(0.5)


def test_complementary_jobs_interleave_perfectly() -> None:
    dqn = stage_profile([446, 8, 0], 490)  # pure CPU after the rules
    gpt2 = stage_profile([0.6, 410, 0], 426)  # pure GPU
    T, offs = best_ordering([dqn, gpt2])
    assert (T, offs) == (490.0, (0, 2))
    assert efficiency([dqn, gpt2]) == pytest.approx((490 + 426) / (3 * 490))


def test_ordering_counts() -> None:
    assert orderings(2, 3).tolist() == [[0, 1], [0, 2]]
    assert orderings(3, 3).tolist() == [[0, 1, 2], [0, 2, 1]]
    assert orderings(2, 4).shape == (3, 2)
    assert orderings(4, 4).shape == (6, 4)
    with pytest.raises(ValueError):
        orderings(4, 3)
    with pytest.raises(ProfileError):
        group_cycle([A, B, C, A])


profile_st = st.tuples(*[st.integers(0, 20)] * 3).map(lambda t: tuple(float(x) for x in t))


@settings(max_examples=200, deadline=None)
@given(st.lists(profile_st, min_size=1, max_size=3))
def test_best_ordering_equals_brute_force_and_bounds(profiles: list[tuple[float, ...]]) -> None:
    profiles = [p if sum(p) > 0 else (1.0, 0.0, 0.0) for p in profiles]
    k = 3
    brute = min(
        cycle_time_of(profiles, offs) for offs in itertools.permutations(range(k), len(profiles))
    )
    T = group_cycle(profiles)
    assert T == pytest.approx(brute)
    solos = [sum(p) for p in profiles]
    assert max(solos) - 1e-9 <= T <= sum(solos) + 1e-9  # never faster than alone, never worse than turns
    assert 0 < efficiency(profiles) <= 1 + 1e-12


def test_cycle_times_batch_matches_single() -> None:
    rng = np.random.default_rng(3)
    P = rng.uniform(0, 10, size=(50, 3, 4))
    T, best = cycle_times(P)
    offs = orderings(3, 4)
    for e in range(50):
        profs = [tuple(r) for r in P[e]]
        assert T[e] == pytest.approx(cycle_time_of(profs, offs[best[e]]))
        assert T[e] == pytest.approx(group_cycle(profs))


# -- the throughput factor ----------------------------------------------------------
def _spec(jid: str, rt: tuple[float, ...], gpus: int = 1, duration: float = 60.0) -> JobSpec:
    return JobSpec(jid, 0.0, gpus, duration, iter_time=sum(rt), attrs={"resource_times": rt, "iteration_time": sum(rt)})


def test_factor_speed_is_solo_over_group_time() -> None:
    specs = {s.id: s for s in [_spec("a", A), _spec("b", B), _spec("c", C), _spec("plain", (0.0, 1.0, 0.0))]}
    f = InterleaveFactor(specs, threshold=0.0, resources=3)  # storage and CPU as one resource: k = 3
    part = (Part(0, (0,), 1, 100),)
    ja, jb = Job(specs["a"]), Job(specs["b"])
    assert f(ja, Allocation("a", part)) == 1.0
    assert f(ja, Allocation("a", part, ("b",))) == pytest.approx(6 / 7)
    assert f(jb, Allocation("b", part, ("a", "c"))) == pytest.approx(6 / 8)
    g = InterleaveFactor(specs, threshold=0.0, overhead={2: 1.25}, resources=3)
    assert g(ja, Allocation("a", part, ("b",))) == pytest.approx(6 / (7 * 1.25))
    # build_model (CLI, compare, service) switches the factor on; the simulator binds it.  By
    # default 4 resources (A and B pair at 7 s there too, see test_four_resources_*) and Muri's
    # measured sharing overhead (x 1.33 / 1.015 for a pair)
    model = build_model(Cluster.homogeneous(1, 1), options={"interleave_threshold": 0.0, "interleave_overhead": "none"})
    assert model.get("interleave") is not None
    model.bind({k: Job(v) for k, v in specs.items()})
    assert model.speed(ja, Allocation("a", part, ("b",))) == pytest.approx(6 / 7)
    model = build_model(Cluster.homogeneous(1, 1), options={"interleave_threshold": 0.0})
    model.bind({k: Job(v) for k, v in specs.items()})
    assert model.speed(ja, Allocation("a", part, ("b",))) == pytest.approx(6 / (7 * 1.33 / 1.015))


def test_factor_speed_kept_by_group_is_the_speed_computed_afresh() -> None:
    # the factor keeps each group's time by its members' profiles (a job's first): asked again, in
    # another member order, or with raw profiles, it answers what group_time gives
    specs = {s.id: s for s in [_spec("a", A), _spec("b", B), _spec("c", C)]}
    f = InterleaveFactor(specs, threshold=0.0, overhead={2: 1.25, 3: 1.5}, resources=3)
    part = (Part(0, (0,), 1, 100),)
    ja, jb = Job(specs["a"]), Job(specs["b"])
    for _ in range(2):
        assert f(ja, Allocation("a", part, ("b",))) == 6 / (7 * 1.25)
        assert f(jb, Allocation("b", part, ("a",))) == 6 / (7 * 1.25)
        for group in (("b", "c"), ("c", "b")):
            assert f(ja, Allocation("a", part, group)) == min(1.0, 6 / f.group_time([A, B, C]))
    assert len(f._times) == 4  # noqa: SLF001  (a+b, b+a, a+b+c, a+c+b)
    raw = InterleaveFactor(specs, resources=3, profiles="raw")
    for _ in range(2):
        assert raw(ja, Allocation("a", part, ("b",))) == raw.solo_time(ja) / raw.group_time([A, B])


# -- four resources (storage, CPU, GPU, network): Muri's layout -----------------------------
def _brute_cycle(profiles: list[tuple[float, ...]], spans: tuple[int, ...] = (2, 1, 1)) -> float:
    """Least Σ d over integer phase lengths 0..8 and every ordering meeting every stage's need."""
    best = math.inf
    for offs in orderings(len(profiles), 4).tolist():
        for d in itertools.product(range(9), repeat=4):
            if sum(d) >= best:
                continue
            ok = True
            for p, s0 in zip(profiles, offs, strict=True):
                q = s0
                for t, w in zip(p, spans, strict=True):
                    if sum(d[(q + i) % 4] for i in range(w)) < t:
                        ok = False
                    q += w
            if ok:
                best = sum(d)
    return float(best)



def test_four_resources_pair_by_hand() -> None:
    # Muri's trace stages on its 4-resource cycle: data loading spans storage + CPU (2 phases),
    # then GPU, then network.  A = (4, 2, 0) at offset 0: loading in phases 0-1, GPU in 2, network
    # in 3; B = (1, 4, 1) at offset 2: loading in 2-3, GPU in 0, network in 1.  Single-phase
    # maxima a = (4, 1, 2, 0); loading needs d0 + d1 >= 4 (met: 5) and d2 + d3 >= 1 (met: 2);
    # so the cycle is 4 + 1 + 2 + 0 = 7 s, both members at 6/7 of their solo speed.
    assert MURI_LAYOUT == (2, 1, 1) and layout_for(3) == MURI_LAYOUT and layout_for(4) == (1, 1, 1, 1)
    assert best_ordering([A, B], MURI_LAYOUT) == (7.0, (0, 2))
    assert efficiency([A, B], MURI_LAYOUT) == pytest.approx(12 / 28)


def test_four_resources_group_of_four_by_hand() -> None:
    # Two pure loaders L = (4, 0, 0), a GPU job G = (0, 4, 0), a network job N = (0, 0, 4).
    # Offsets N 0, G 1, L 2, L 3 put N's network stage in phase 0 + 3 = 3, G's GPU stage in
    # 1 + 2 = 3, and the loaders' two-phase loading over phases 2-3 and 3-0: in phase 3 the four
    # jobs use the four resources at once (network, GPU, CPU, storage).  Phase lengths
    # d = (0, 0, 0, 4) meet every stage, so the cycle is 4 s = every member's solo time:
    # a perfect group, efficiency 16 / (4 x 4) = 1.
    L, G, N = (4.0, 0.0, 0.0), (0.0, 4.0, 0.0), (0.0, 0.0, 4.0)
    assert group_cycle([L, L, G, N], MURI_LAYOUT) == pytest.approx(4.0)
    assert efficiency([L, L, G, N], MURI_LAYOUT) == pytest.approx(1.0)
    # with storage and CPU as one resource (k = 3) the two loaders collide: no group of 4 at all
    with pytest.raises(ProfileError):
        group_cycle([L, L, G, N])
    # the closed form is the LP optimum over all orderings (brute force over integer phase lengths)
    assert _brute_cycle([L, L, G, N]) == 4.0
    assert _brute_cycle([A, B]) == 7.0
    assert group_cycle([A, B, C, L], MURI_LAYOUT) == _brute_cycle([A, B, C, L])
    # the factor (4 resources by default; no overhead given) runs every member at full speed;
    # a fifth job is an error
    specs = {x: _spec(x, p) for x, p in (("l1", L), ("l2", L), ("g", G), ("n", N), ("x", G))}
    f = InterleaveFactor(specs, threshold=0.0)
    part = (Part(0, (0,), 1, 100),)
    assert f(Job(specs["g"]), Allocation("g", part, ("l1", "l2", "n"))) == pytest.approx(1.0)
    with pytest.raises(ProfileError):
        f(Job(specs["g"]), Allocation("g", part, ("l1", "l2", "n", "x")))



def test_overhead_option() -> None:
    assert parse_overhead(None) is None and parse_overhead("none") is None
    assert parse_overhead("muri") == dict(MURI_OVERHEAD)
    assert parse_overhead([1.2, 1.4]) == {2: 1.2, 3: 1.4}
    assert parse_overhead(1.1)[4] == 1.1
    assert parse_overhead({"2": "1.5"}) == {2: 1.5}
    with pytest.raises(ValueError, match="interleave overhead"):
        parse_overhead("fast")


def test_factor_errors_name_the_job() -> None:
    specs = {"a": _spec("a", A), "n": JobSpec("n", 0.0, 1, 5.0)}
    part = (Part(0, (0,), 1, 100),)
    with pytest.raises(ProfileError, match="no job lookup"):
        InterleaveFactor()(Job(specs["a"]), Allocation("a", part, ("n",)))
    f = InterleaveFactor(specs)
    with pytest.raises(ProfileError, match="'zz' is unknown"):
        f(Job(specs["a"]), Allocation("a", part, ("zz",)))
    with pytest.raises(ProfileError, match="job n: shares GPUs but has no stage profile"):
        f(Job(specs["a"]), Allocation("a", part, ("n",)))
    with pytest.raises(ValueError, match="overhead"):
        InterleaveFactor(overhead={2: 0.5})
