"""Muri grouping: matching against brute force and networkx, hand-checked groups and runs, real traces."""

from __future__ import annotations

import random
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec, JobStatus
from gpuloom.core.plan import check_plan
from gpuloom.perf.assembly import build_model
from gpuloom.perf.interleave import InterleaveFactor, group_cycle
from gpuloom.perf.model import LocalityFactor, ThroughputModel
from gpuloom.policies.base import FreeState, PolicyError, View, make
from gpuloom.policies.bmatch import BLOSSOM_NODES, class_pairs, lp_class_pairs
from gpuloom.policies.muri import VARIANTS, MuriGrouping, class_matching, max_weight_pairs, max_weight_pairs_dense
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.traces import load_trace

CPU = (6.0, 0.0, 0.0)
GPU = (0.0, 6.0, 0.0)
NET = (0.0, 0.0, 6.0)


def brute_force_matching(n: int, edges: dict[tuple[int, int], int]) -> int:
    """Best total weight by trying every matching (small n)."""
    best = 0

    def rec(free: tuple[int, ...], total: int) -> None:
        nonlocal best
        best = max(best, total)
        if len(free) < 2:
            return
        u, rest = free[0], free[1:]
        rec(rest, total)  # u stays unmatched
        for i, v in enumerate(rest):
            w = edges.get((u, v))
            if w:
                rec(rest[:i] + rest[i + 1 :], total + w)

    rec(tuple(range(n)), 0)
    return best


def total(pairs: list[tuple[int, int]], edges: dict[tuple[int, int], int]) -> int:
    seen: set[int] = set()
    for a, b in pairs:
        assert a not in seen and b not in seen, "not a matching"
        seen |= {a, b}
    return sum(edges[(a, b)] for a, b in pairs)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.dictionaries(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), st.integers(1, 50), max_size=20)
)))
def test_matching_equals_brute_force(case: tuple[int, dict[tuple[int, int], int]]) -> None:
    n, raw = case
    edges = {(min(a, b), max(a, b)): w for (a, b), w in raw.items() if a != b}
    pairs = max_weight_pairs(n, [(a, b, w) for (a, b), w in edges.items()])
    assert total(pairs, edges) == brute_force_matching(n, edges)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 9)] * 3), min_size=2, max_size=7))
def test_muri_pairing_is_optimal_against_brute_force(raw: list[tuple[int, int, int]]) -> None:
    # with pairs only, Muri's grouping must reach the best total pair efficiency over all pairings
    profs = [tuple(float(x) for x in p) if sum(p) else (1.0, 0.0, 0.0) for p in raw]
    jobs = [Job(spec(f"j{i}", p)) for i, p in enumerate(profs)]
    pol = MuriGrouping(max_group=2, pack_all=True)  # every matched pair, whatever the demand
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, len(jobs))))
    f = InterleaveFactor(threshold=0.0)
    keys = [(f.profile(j),) for j in jobs]
    W = pol._weight_rows(keys, 2, f)  # noqa: SLF001
    edges = {(a, b): W[a][b] for a in range(len(jobs)) for b in range(a + 1, len(jobs)) if W[a][b] > 0}
    index = {j.id: i for i, j in enumerate(jobs)}
    got = [tuple(sorted(index[j.id] for j in u)) for u in units if len(u) == 2]
    assert all(len(u) <= 2 for u in units)
    assert sorted(index[j.id] for u in units for j in u) == list(range(len(jobs)))
    assert total(got, edges) == brute_force_matching(len(jobs), edges)


@pytest.mark.parametrize("n,seed", [(40, 0), (80, 1), (150, 2)])
def test_matching_equals_networkx_on_larger_graphs(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    edges: dict[tuple[int, int], int] = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < 0.3:
                edges[(a, b)] = int(rng.integers(1, 1_000_000))
    pairs = max_weight_pairs(n, [(a, b, w) for (a, b), w in edges.items()])
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_weighted_edges_from((a, b, w) for (a, b), w in edges.items())
    ref = nx.max_weight_matching(g, maxcardinality=False)
    assert total(pairs, edges) == sum(edges[(min(a, b), max(a, b))] for a, b in ref)


@pytest.mark.parametrize("seed", range(4))
def test_dense_matching_is_the_edge_list_matching_pair_for_pair(seed: int) -> None:
    # node-level rounds (Muri's rule) past _NUMPY_NODES build the graph from a weight matrix: the same
    # edges in the same order, so Blossom must pick the very same pairs, ties included (few distinct weights, as
    # when many jobs share a profile; some edges carry the +1 of partners already together)
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n, nk = int(rng.integers(2, 90)), int(rng.integers(1, 8))
        classes = rng.choice([0, 500_000, 500_001, 730_000], size=(nk, nk))
        classes = np.triu(classes) + np.triu(classes, 1).T
        kid = rng.integers(0, nk, n)
        label = rng.integers(-1, 3, n)
        w = classes[kid[:, None], kid[None, :]]
        w = w + ((label[:, None] == label[None, :]) & (label[:, None] >= 0) & (w > 0))
        edges = [(a, c, int(w[a, c])) for a in range(n) for c in range(a + 1, n) if w[a, c] > 0]
        assert max_weight_pairs_dense(w) == max_weight_pairs(n, edges)
    # the diagonal is no edge; no edge at all, no pairs
    assert max_weight_pairs_dense(np.array([[5, 0], [0, 5]])) == []
    assert max_weight_pairs_dense(np.array([[0, 3], [3, 0]])) == [(0, 1)]


@pytest.mark.parametrize("seed", range(8))
def test_class_matching_weighs_as_much_as_blossom_on_the_nodes(seed: int) -> None:
    # the matching of classes with multiplicities must weigh exactly what rustworkx's Blossom finds
    # on the nodes themselves, listed in any order; few distinct weights make ties common, and the
    # counts reach the buckets' sizes (up to 80 nodes a class)
    import rustworkx as rx

    rng = np.random.default_rng(seed)
    tie_sets = [[0, 0, 400_000, 400_001, 600_000, 800_000], [0, 1, 2, 3], [0, 5, 5, 5, 9]]
    sizes = []
    for _ in range(40):
        nk = int(rng.integers(1, 9))
        counts = [int(x) for x in rng.integers(0, int(rng.choice([4, 13, 30, 80])), nk)]
        w = np.triu(rng.choice(tie_sets[int(rng.integers(0, len(tie_sets)))], size=(nk, nk)))
        weights = (w + np.triu(w, 1).T).tolist()
        got = class_matching(counts, weights)
        used = [0] * nk
        for c, d, m, wt in got:
            assert c <= d and m > 0 and wt == weights[c][d] > 0
            used[c] += m
            used[d] += m
        assert all(u <= n for u, n in zip(used, counts, strict=True))  # no class gives more nodes than it has
        kid = rng.permutation([c for c, m in enumerate(counts) for _ in range(m)])
        g = rx.PyGraph()
        g.add_nodes_from(range(len(kid)))
        g.add_edges_from([(a, b, weights[kid[a]][kid[b]]) for a in range(len(kid)) for b in range(a + 1, len(kid))
                          if weights[kid[a]][kid[b]] > 0])
        ref = rx.max_weight_matching(g, max_cardinality=False, weight_fn=int)
        best = sum(weights[kid[a]][kid[b]] for a, b in ref)
        assert sum(m * wt for _, _, m, wt in got) == best
        # the LP on the classes, whatever the size (class_pairs takes Blossom up to BLOSSOM_NODES)
        lp = lp_class_pairs(counts, weights)
        assert sum(m * weights[c][d] for (c, d), m in lp.items()) == best
        assert all(sum(m * ((c == v) + (d == v)) for (c, d), m in lp.items()) <= n for v, n in enumerate(counts))
        sizes.append(sum(counts))
    assert min(sizes) <= BLOSSOM_NODES < max(sizes)
    # hand-checked: two A (self-weight 5), one B (A-B 4): AA beats AB; three A: AA and A-B
    assert class_matching([2, 1], [[5, 4], [4, 0]]) == [(0, 0, 1, 5)]
    assert class_matching([3, 1], [[5, 4], [4, 0]]) == [(0, 0, 1, 5), (0, 1, 1, 4)]
    assert class_matching([1, 1], [[0, 0], [0, 0]]) == []


def test_class_matching_leaves_the_rounded_lp_where_it_must() -> None:
    # classes u, v (2 nodes each), a1, a2 next to u and b1, b2 next to v (3 nodes each, pairs inside
    # weigh 10); u-v weighs 10, a-u and v-b 6.  The LP takes u-v twice and 1.5 pairs inside each a and
    # b (80); whole pairs, u-v twice gives 20 + 4 x 10 = 60, but a-u, v-b and one pair inside each of
    # a and b give 4 x 6 + 4 x 10 = 64: the best matching has no u-v pair, two below the LP's
    u, v, a1, a2, b1, b2 = range(6)
    w = [[0] * 6 for _ in range(6)]
    for x, y, wt in ((u, v, 10), (a1, u, 6), (a2, u, 6), (v, b1, 6), (v, b2, 6),
                     (a1, a1, 10), (a2, a2, 10), (b1, b1, 10), (b2, b2, 10)):
        w[x][y] = w[y][x] = wt
    counts = [2, 2, 3, 3, 3, 3]
    assert lp_class_pairs(counts, w) == class_pairs(counts, w) == {(0, 2): 1, (0, 3): 1, (1, 4): 1, (1, 5): 1,
                                      (2, 2): 1, (3, 3): 1, (4, 4): 1, (5, 5): 1}
    # with u-v at 13, u-v twice wins (26 + 4 x 10 = 66 > 64)
    w[u][v] = w[v][u] = 13
    assert lp_class_pairs(counts, w) == {(0, 1): 2, (2, 2): 1, (3, 3): 1, (4, 4): 1, (5, 5): 1}
    with pytest.raises(ValueError, match="2 x 2"):
        class_pairs([1, 1], [[0, 1]])
    with pytest.raises(ValueError, match="counts must be >= 0"):
        class_pairs([1, -1], [[0, 1], [1, 0]])


def test_transport_takes_the_first_of_equally_good_paths_in_class_order() -> None:
    from gpuloom.policies.bmatch import _transport  # noqa: PLC0415

    # one node each of classes 0, 1, 2; 0-1 and 0-2 weigh 4 (nothing else).  On the double cover row 0
    # can go to column 1 or 2 and column 0 take row 1 or 2 (8 either way): the paths are searched class
    # by class, so column 1 and row 1 win; the transport is symmetric, one pair 0-1
    w = [[0, 4, 4], [4, 0, 0], [4, 0, 0]]
    assert _transport([1, 1, 1], w) == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
    # a class without nodes adds no arc and changes no choice; two nodes of class 0 take both
    w0 = [[0, 0, 0, 0]] + [[0, *row] for row in w]
    assert _transport([0, 1, 1, 1], w0) == [[0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert _transport([2, 1, 1], w) == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]


def _transport_scanning_all_arcs(counts: list[int], weights: list[list[int]]) -> list[list[int]]:
    """The transport as successive shortest paths over every arc, full ones skipped as they are met (the
    reference: bmatch's keeps each node's arcs with room in a list of its own)."""
    from collections import deque  # noqa: PLC0415

    k = len(counts)
    s, t, n = 2 * k, 2 * k + 1, 2 * k + 2
    head: list[int] = []
    cap: list[int] = []
    cost: list[int] = []
    adj: list[list[int]] = [[] for _ in range(n)]
    present = [c for c in range(k) if counts[c] > 0]
    for c in present:
        a = len(head)
        head += (c, s, t, k + c)
        cap += (counts[c], 0, counts[c], 0)
        cost += (0, 0, 0, 0)
        adj[s].append(a)
        adj[c].append(a + 1)
        adj[k + c].append(a + 2)
        adj[t].append(a + 3)
    mid = []
    for c in present:
        for d in present:
            if weights[c][d] > 0:
                a = len(head)
                head += (k + d, c)
                cap += (min(counts[c], counts[d]), 0)
                cost += (-weights[c][d], weights[c][d])
                adj[c].append(a)
                adj[k + d].append(a + 1)
                mid.append((c, d, a))
    while True:
        dist, via, inq = [1 << 62] * n, [-1] * n, [False] * n
        dist[s] = 0
        dq = deque([s])
        while dq:
            u = dq.popleft()
            inq[u] = False
            for a in adj[u]:
                if cap[a] > 0 and dist[u] + cost[a] < dist[head[a]]:
                    dist[head[a]] = dist[u] + cost[a]
                    via[head[a]] = a
                    if not inq[head[a]]:
                        inq[head[a]] = True
                        dq.append(head[a])
        if dist[t] >= 0:
            break
        path = []
        v = t
        while v != s:
            path.append(via[v])
            v = head[via[v] ^ 1]
        push = min(cap[a] for a in path)
        for a in path:
            cap[a] -= push
            cap[a ^ 1] += push
    y = [[0] * k for _ in range(k)]
    for c, d, a in mid:
        y[c][d] = cap[a ^ 1]
    return y


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9).flatmap(lambda k: st.tuples(
    st.lists(st.integers(0, 12), min_size=k, max_size=k),
    st.lists(st.lists(st.sampled_from([0, 0, 3, 5, 5, 8, 13]), min_size=k, max_size=k), min_size=k, max_size=k))))
def test_transport_is_the_scan_of_every_arc(case: tuple[list[int], list[list[int]]]) -> None:
    from gpuloom.policies.bmatch import _transport  # noqa: PLC0415

    counts, w = case
    weights = [[max(w[c][d], w[d][c]) for d in range(len(counts))] for c in range(len(counts))]  # symmetric
    assert _transport(counts, weights) == _transport_scanning_all_arcs(counts, weights)


def test_class_pairs_ignore_empty_classes_and_repeat() -> None:
    # classes without nodes take no part, however heavy their edges: two A (self-weight 5) and one B
    # (A-B 4) pair AA, wherever the empty classes sit; the same input again gives the same pairs,
    # even after the caller changed the dict it got
    heavy = 9
    w = [[heavy, heavy, heavy, heavy], [heavy, 5, heavy, 4], [heavy, heavy, heavy, heavy], [heavy, 4, heavy, 0]]
    first = class_pairs([0, 2, 0, 1], w)
    assert first == {(1, 1): 1}
    first[(1, 1)] = 7
    first[(0, 0)] = 1
    assert class_pairs([0, 2, 0, 1], w) == {(1, 1): 1}
    assert class_pairs([2, 1], [[5, 4], [4, 0]]) == {(0, 0): 1}
    assert class_pairs([0, 3, 0, 1], w) == {(1, 1): 1, (1, 3): 1}


@pytest.mark.parametrize("seed", range(3))
def test_matching_rounds_are_independent_of_the_order_of_their_nodes(seed: int) -> None:
    # jobs with equal profiles tie; whatever order the nodes come in, the same jobs pair up
    rng = np.random.default_rng(seed)
    kinds = [CPU, GPU, NET, (3.0, 3.0, 0.0)]
    profiles = [kinds[int(k)] for k in rng.integers(0, len(kinds), 24)]
    f = InterleaveFactor(threshold=0.0)
    nodes = [[i] for i in range(len(profiles))]
    want = MuriGrouping().match_round(profiles, nodes, 2, f)
    assert want and sum(w for *_, w in want) > 0
    by_ids = sorted((nodes[a][0], nodes[b][0]) for a, b, _ in want)
    for _ in range(5):
        perm = [int(x) for x in rng.permutation(len(nodes))]
        shuffled = [nodes[i] for i in perm]
        got = MuriGrouping().match_round(profiles, shuffled, 2, f)
        assert sorted(tuple(sorted((shuffled[a][0], shuffled[b][0]))) for a, b, _ in got) == by_ids
    # two CPU and two GPU jobs, listed forwards or backwards: the first of each pair up; in Muri's
    # rule they take Blossom's places in rank order instead
    for rule, want in (("gpuloom", [(0, 1), (2, 3)]), ("muri", [(0, 2), (1, 3)])):
        for nodes in ([[0], [1], [2], [3]], [[3], [2], [1], [0]]):
            two = MuriGrouping(rule=rule).match_round([GPU, CPU, CPU, GPU], nodes, 2, f)
            assert sorted(tuple(sorted(nodes[a] + nodes[b])) for a, b, _ in two) == want


@pytest.mark.parametrize("seed", range(3))
def test_classes_kept_in_key_order_across_matchings(seed: int) -> None:
    # one policy over many matchings (its classes' order kept by their sets of key ids) pairs the
    # nodes as a new policy does each time, in whatever order the classes first appear; every order
    # it kept is the classes' keys in sorted order
    rng = np.random.default_rng(seed)
    kinds = [CPU, GPU, NET, (3.0, 3.0, 0.0), (1.0, 2.0, 3.0)]
    f = InterleaveFactor(threshold=0.0)
    kept = MuriGrouping()
    for _ in range(30):
        n = int(rng.integers(2, 30))
        profiles = [kinds[int(k)] for k in rng.integers(0, len(kinds), n)]
        labels = [int(x) for x in rng.integers(-1, n // 3 + 1, n)]
        nodes = [[int(i)] for i in rng.permutation(n)]
        assert kept.match_round(profiles, nodes, 2, f, labels) == MuriGrouping().match_round(profiles, nodes, 2, f,
                                                                                           labels)
    keys = {g: k for k, g in kept._key_ids.items()}
    assert len(kept._class_order) > 1
    for ids, order in kept._class_order.items():
        assert sorted(order) == list(ids) and order == sorted(ids, key=keys.__getitem__)


@pytest.mark.parametrize("seed", range(3))
def test_keeping_running_partners_changes_no_weight(seed: int) -> None:
    # partners that run together now only take class pairs the matching has anyway: it weighs what
    # it weighs without labels, and (over these instances) keeps more running pairs
    rng = np.random.default_rng(seed)
    totals = [0, 0]
    kinds = [CPU, GPU, NET, (3.0, 3.0, 0.0)]
    f = InterleaveFactor(threshold=0.0)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        profiles = [kinds[int(k)] for k in rng.integers(0, len(kinds), n)]
        labels = [int(x) for x in rng.integers(-1, n // 3 + 1, n)]
        nodes = [[i] for i in range(n)]
        plain = MuriGrouping().match_round(profiles, nodes, 2, f)
        kept = MuriGrouping().match_round(profiles, nodes, 2, f, labels)
        assert sum(w for *_, w in kept) == sum(w for *_, w in plain)
        for t, m in enumerate((plain, kept)):
            totals[t] += sum(labels[a] >= 0 and labels[a] == labels[b] for a, b, _ in m)
        assert len({x for a, b, _ in kept for x in (a, b)}) == 2 * len(kept)  # still a matching
    assert totals[1] > totals[0]


def test_grouping_weights_match_networkx_on_real_profiles(data_dir: Path) -> None:
    # the same integer-weighted pair graph Muri builds for 60 trace jobs: equal optimum in both libraries
    specs = load_muri(data_dir / "muri/sim_traces/trace1.csv", limit=400)
    singles = [s for s in specs if s.gpus == 1][:60]
    f = InterleaveFactor()
    profs = [f.profile(s) for s in singles]
    pol = MuriGrouping()
    W = pol._weight_rows([(p,) for p in profs], 2, f)  # noqa: SLF001
    edges = {(a, b): W[a][b] for a in range(len(profs)) for b in range(a + 1, len(profs)) if W[a][b] > 0}
    assert edges
    pairs = max_weight_pairs(len(profs), [(a, b, w) for (a, b), w in edges.items()])
    g = nx.Graph()
    g.add_weighted_edges_from((a, b, w) for (a, b), w in edges.items())
    ref = nx.max_weight_matching(g)
    assert total(pairs, edges) == sum(edges[(min(a, b), max(a, b))] for a, b in ref)


# -- grouping by hand ------------------------------------------------------------------
def spec(jid: str, rt: tuple[float, ...], gpus: int = 1, duration: float = 60.0, arrival: float = 0.0) -> JobSpec:
    it = sum(rt)
    return JobSpec(jid, arrival, gpus, duration, iter_time=it, attrs={"resource_times": rt, "iteration_time": it})


def view_for(jobs: list[Job], cluster: Cluster, factor: InterleaveFactor | None = None) -> View:
    f = factor or InterleaveFactor(threshold=0.0)
    f.bind({j.id: j for j in jobs})
    model = ThroughputModel(cluster, [LocalityFactor(), f])
    return View(0.0, cluster, jobs, {}, model, np.random.default_rng(0))


def ids(units: list[tuple[Job, ...]]) -> list[tuple[str, ...]]:
    return [tuple(j.id for j in u) for u in units]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([CPU, GPU, NET, None])), min_size=1,
                max_size=40), st.integers(2, 8))
def test_units_partition_the_queue_in_order_of_their_first_member(raw: list, gpus: int) -> None:
    # admitted jobs form units, every other job runs alone, and the units come in the order of
    # their highest-priority member (members in order too): the queue, each job exactly once
    jobs = [Job(spec(f"j{i}", p, gpus=g) if p is not None else JobSpec(f"j{i}", 0.0, g, 60.0))
            for i, (g, p) in enumerate(raw)]
    units = MuriGrouping().group(jobs, view_for(jobs, Cluster.homogeneous(1, gpus)))
    pos = {j.id: i for i, j in enumerate(jobs)}
    flat = [pos[j.id] for u in units for j in u]
    assert sorted(flat) == list(range(len(jobs)))
    firsts = [pos[u[0].id] for u in units]
    assert firsts == sorted(firsts)
    assert all([pos[j.id] for j in u] == sorted(pos[j.id] for j in u) for u in units)


def test_pairs_complementary_jobs() -> None:
    jobs = [Job(spec("c1", CPU)), Job(spec("c2", CPU)), Job(spec("g1", GPU)), Job(spec("g2", GPU))]
    pol = MuriGrouping(max_group=2)
    assert ids(pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 4)))) == [("c1",), ("c2",), ("g1",), ("g2",)]
    assert pol.last_rounds == 0  # they all fit: nobody shares
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    # two CPU jobs gain nothing together; each pairs with a GPU job; units ranked by best member
    assert ids(units) == [("c1", "g1"), ("c2", "g2")] or ids(units) == [("c1", "g2"), ("c2", "g1")]
    assert pol.last_rounds == 1


@pytest.mark.parametrize("pairs", [[("c1", "g1"), ("c2", "g2")], [("c1", "g2"), ("c2", "g1")]])
def test_running_groups_are_kept_among_equal_matchings(pairs: list[tuple[str, str]]) -> None:
    from gpuloom.core.plan import Allocation, Part

    jobs = [Job(spec("c1", CPU)), Job(spec("c2", CPU)), Job(spec("g1", GPU)), Job(spec("g2", GPU))]
    cl = Cluster.homogeneous(1, 2)
    view = view_for(jobs, cl)
    cur = {}
    for gpu, (a, b) in enumerate(pairs):
        part = (Part(0, (gpu,), 1, 100),)
        cur[a] = Allocation(a, part, (b,))
        cur[b] = Allocation(b, part, (a,))
    view.current = cur
    units = MuriGrouping().group(jobs, view)
    assert {frozenset(u) for u in ids(units)} == {frozenset(p) for p in pairs}


def test_three_resource_types_form_triples_in_two_rounds() -> None:
    jobs = [Job(spec(n, p)) for n, p in [("c", CPU), ("g", GPU), ("n", NET)]]
    pol = MuriGrouping()
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    assert sorted(len(u) for u in units) == [1, 2] and pol.last_rounds == 1  # one pair makes it fit 2 GPUs
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))
    assert ids(units) == [("c", "g", "n")]  # round 1 pairs two of them, round 2 adds the third
    assert pol.last_rounds == 2
    assert group_cycle([CPU, GPU, NET]) == 6.0  # a perfect triple
    # with a fourth job round 1 makes two pairs, which already fit 2 GPUs
    jobs = [Job(spec(n, p)) for n, p in [("c", CPU), ("g", GPU), ("n", NET), ("c2", CPU)]]
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    assert sorted(len(u) for u in units) == [2, 2]


def test_four_resource_types_merge_pairs_of_pairs() -> None:
    prof = [tuple(5.0 if r == i else 0.0 for r in range(4)) for i in range(4)]
    jobs = [Job(spec(f"r{i}", prof[i])) for i in range(4)]
    pol = MuriGrouping()
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))
    assert pol.last_rounds == 2  # pairs, then a pair of pairs
    assert ids(units) == [("r0", "r1", "r2", "r3")]
    assert group_cycle(prof) == 5.0
    # a fifth job on resource 0: the pair holding the other resource-0 job cannot join a second one
    jobs.append(Job(spec("r0b", prof[0])))
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    assert sorted(len(u) for u in units) == [2, 3]


def test_groups_of_four_on_muri_trace_profiles_and_max_group_errors() -> None:
    # 3-stage (Muri trace) profiles interleave on 4 resources: data loading spans storage + CPU,
    # so two loaders, a GPU job and a network job make one perfect group of 4 on one GPU
    jobs = [Job(spec(n, p)) for n, p in [("c", CPU), ("g", GPU), ("n", NET), ("c2", CPU)]]
    pol = MuriGrouping(max_group=4)
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))
    assert ids(units) == [("c", "g", "n", "c2")]
    assert group_cycle([CPU, GPU, NET, CPU], (2, 1, 1)) == 6.0
    # with storage and CPU as one resource (k = 3) no group holds 4 jobs
    units = MuriGrouping().group(jobs, view_for(jobs, Cluster.homogeneous(1, 1), InterleaveFactor(threshold=0.0, resources=3)))
    assert max(len(u) for u in units) == 3
    with pytest.raises(PolicyError, match="at most 4"):
        MuriGrouping(max_group=5).group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))


def test_a_grouping_reused_under_another_interleaving_model_forgets_its_weights() -> None:
    # the weights cached for a 4-resource cycle (storage and CPU apart: two loaders and a GPU job
    # make one group) must not serve a 3-resource one, where the loaders collide; nor the overheads
    # of one model another's: each call groups as a fresh policy does
    jobs = [Job(spec(n, p)) for n, p in [("g", GPU), ("c1", CPU), ("c2", CPU)]]
    pol = MuriGrouping()
    assert ids(pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))) == [("g", "c1", "c2")]
    three = InterleaveFactor(threshold=0.0, resources=3)
    # (c1 and c2 tie: the higher-ranked c1 takes the place)
    assert ids(pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1), three))) == [("g", "c1"), ("c2",)]
    for f in (InterleaveFactor(threshold=0.0, resources=2), InterleaveFactor(threshold=0.0, overhead={2: 1.5, 3: 2.0})):
        fresh = MuriGrouping().group(jobs, view_for(jobs, Cluster.homogeneous(1, 1), f))
        assert ids(pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1), f))) == ids(fresh)
    assert ids(pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))) == [("g", "c1", "c2")]


def test_partial_benefit_and_no_benefit() -> None:
    A, B = (4.0, 2.0, 0.0), (1.0, 4.0, 1.0)
    jobs = [Job(spec("a", A)), Job(spec("b", B)), Job(spec("x", GPU)), Job(spec("y", GPU))]
    units = MuriGrouping(max_group=2).group(jobs, view_for(jobs, Cluster.homogeneous(1, 1)))
    # weights: a+x and b+? ... every grouping is checked against taking turns; two GPU-only jobs never pair
    assert all(set(u) != {"x", "y"} for u in ids(units))
    # a grouping whose interleaved time equals taking turns is not made
    jobs2 = [Job(spec("g1", GPU)), Job(spec("g2", GPU))]
    assert ids(MuriGrouping().group(jobs2, view_for(jobs2, Cluster.homogeneous(1, 1)))) == [("g1",), ("g2",)]


def test_buckets_keep_gpu_counts_apart() -> None:
    jobs = [Job(spec("c1", CPU, gpus=1)), Job(spec("g2", GPU, gpus=2)), Job(spec("c2", CPU, gpus=2)),
            Job(spec("g1", GPU, gpus=1))]
    pol = MuriGrouping()
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 3)))  # 6 GPUs wanted, 3 there
    assert sorted(ids(units)) == [("c1", "g1"), ("g2", "c2")]
    # 6 wanted, 5 there: one merge is enough, and the 1-GPU pair goes first ((1 - eff) x GPUs)
    units = pol.group(jobs, view_for(jobs, Cluster.homogeneous(1, 5)))
    assert ids(units) == [("c1", "g1"), ("g2",), ("c2",)]
    for u in units:
        assert len({j.spec.gpus for j in u}) == 1


def test_admission_takes_k_fold_the_cluster_in_priority_order() -> None:
    # 2 GPUs, pairs only: the top job brings the next job of its size; 4 jobs enter, the rest stay single
    names = ["c1", "g1", "c2", "g2", "c3", "g3"]
    jobs = [Job(spec(n, CPU if n[0] == "c" else GPU)) for n in names]
    units = MuriGrouping(max_group=2).group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    got = ids(units)
    assert got[2:] == [("c3",), ("g3",)]
    assert {frozenset(u) for u in got[:2]} in (
        {frozenset({"c1", "g1"}), frozenset({"c2", "g2"})}, {frozenset({"c1", "g2"}), frozenset({"c2", "g1"})}
    )
    assert got[0][0] == "c1"  # units ranked by their best member
    adm = MuriGrouping._admit(jobs, [(1.0,)] * 6, capacity=2, max_group=3)  # noqa: SLF001
    assert adm == [0, 1, 2, 3, 4, 5]
    # a job too big for what is left is skipped; a later smaller one still enters
    jobs2 = [Job(spec("a", CPU, gpus=2)), Job(spec("b", GPU, gpus=4)), Job(spec("c", GPU, gpus=1))]
    assert MuriGrouping._admit(jobs2, [(1.0,)] * 3, capacity=3, max_group=2) == [0, 2]  # noqa: SLF001
    # candidates of a job's GPU count come from anywhere in the queue, unprofiled jobs (c) never as
    # candidates; a later job of the same count takes its candidates after the ones already brought
    g = {"a": 1, "b": 2, "c": 1, "d": 1, "e": 2, "f": 1, "g": 2}
    jobs3 = [Job(spec(n, CPU, gpus=k)) for n, k in g.items()]
    profs: list[tuple[float] | None] = [(1.0,), (1.0,), None, (1.0,), (1.0,), (1.0,), (1.0,)]
    assert MuriGrouping._admit(jobs3, profs, capacity=5, max_group=2) == [0, 3, 1, 4, 2, 5]  # noqa: SLF001
    assert MuriGrouping._admit(jobs3, profs, capacity=3, max_group=2) == [0, 3, 1, 4]  # noqa: SLF001


def test_jobs_without_profiles_stay_alone_and_config_errors() -> None:
    jobs = [Job(spec("c", CPU)), Job(JobSpec("plain", 0.0, 1, 10.0)), Job(spec("g", GPU))]
    units = MuriGrouping().group(jobs, view_for(jobs, Cluster.homogeneous(1, 2)))
    assert ids(units) == [("c", "g"), ("plain",)]
    cl = Cluster.homogeneous(1, 4)
    bare = View(0.0, cl, jobs, {}, ThroughputModel(cl, [LocalityFactor()]), np.random.default_rng(0))
    with pytest.raises(PolicyError, match="interleave"):
        MuriGrouping().group(jobs, bare)
    with pytest.raises(PolicyError, match="max_group"):
        make("group", "muri", {"max_group": 0})
    assert VARIANTS["muri-s"] == ("srsf-events", "muri") and VARIANTS["muri-l"] == ("las-gpu-events", "muri")


# -- simulation by hand ------------------------------------------------------------------
def run(specs: list[JobSpec], order: str, group: str, cluster: Cluster, **cfg: float) -> dict[str, float]:
    model = ThroughputModel(cluster, [LocalityFactor(), InterleaveFactor(threshold=0.0)])
    sim = Simulator(cluster, specs, Scheduler.from_names(order, group), model,
                    SimConfig(round_len=cfg.get("round_len", 1000.0), restart_overhead=0.0,
                              reschedule_on_completion=True))
    res = sim.run()
    return {j.id: j.finish for j in res.jobs}


def test_group_members_progress_at_interleaved_rate_and_speed_up_when_alone() -> None:
    cl = Cluster.homogeneous(1, 1, 8, 8000)
    A, B = (4.0, 2.0, 0.0), (1.0, 4.0, 1.0)
    # each runs at 6/7: a (60 s of work) finishes at 70; b has done 60 of 120, then alone at speed 1 -> 130
    fin = run([spec("a", A, duration=60.0), spec("b", B, duration=120.0)], "srsf", "muri", cl)
    assert fin["a"] == pytest.approx(70.0)
    assert fin["b"] == pytest.approx(130.0)
    # without grouping: one after the other
    fin = run([spec("a", A, duration=60.0), spec("b", B, duration=120.0)], "srsf", "none", cl)
    assert fin == pytest.approx({"a": 60.0, "b": 180.0})
    # perfectly complementary jobs share at full speed
    fin = run([spec("c", CPU, duration=100.0), spec("g", GPU, duration=100.0)], "2d-las", "muri", cl)
    assert fin == pytest.approx({"c": 100.0, "g": 100.0})


def test_group_shares_node_cpu_and_memory() -> None:
    cl = Cluster.homogeneous(1, 1, 92, 520_000)
    specs = [spec("c", CPU, duration=100.0), spec("g", GPU, duration=100.0)]
    seen: list[dict] = []

    def obs(sim: Simulator, what: str) -> None:
        if what == "round" and sim.current:
            seen.append(dict(sim.current))

    model = ThroughputModel(cl, [LocalityFactor(), InterleaveFactor()])
    Simulator(cl, specs, Scheduler.from_names("srsf", "muri"), model, SimConfig(round_len=50.0),
              observers=[obs]).run()
    a, b = seen[0]["c"], seen[0]["g"]
    assert a.gpu_ids == b.gpu_ids and a.group == ("g",) and b.group == ("c",)
    assert (a.cpus, a.mem_mb) == (46, 260_000)  # half of the GPU's proportional share each


# -- real traces ----------------------------------------------------------------------------
def load_muri(path: Path, limit: int | None = None) -> list[JobSpec]:
    return load_trace(path, "muri")[:limit]


def test_muri_on_real_trace_keeps_invariants(data_dir: Path) -> None:
    specs = load_muri(data_dir / "muri/sim_traces/trace3.csv", limit=120)
    cl = Cluster.homogeneous(4, 8, 92, 520_000)
    grouped = 0

    def obs(sim: Simulator, what: str) -> None:
        nonlocal grouped
        check_plan(sim.current, cl)
        # utilisation bookkeeping: a shared GPU counts once
        assert sim.used[0] == len({g for a in sim.current.values() for g in a.gpu_ids})  # noqa: SLF001
        assert sim.used[1] == sum(a.cpus for a in sim.current.values())  # noqa: SLF001
        ref = FreeState.of(cl, sim.current)  # the incrementally kept free state is exact
        assert (sim.free.gpu_free == ref.gpu_free).all() and (sim.free.node_gpus == ref.node_gpus).all()
        assert (sim.free.node_cpus == ref.node_cpus).all() and (sim.free.node_mem == ref.node_mem).all()
        for jid, a in sim.current.items():
            job = sim.by_id[jid]
            assert job.status is JobStatus.RUNNING
            assert len(a.group) + 1 <= 4  # Muri's four resources: at most 4 jobs share GPUs
            for o in a.group:
                oa = sim.current[o]
                assert oa.gpu_ids == a.gpu_ids and jid in oa.group
                assert sim.by_id[o].spec.gpus == job.spec.gpus
            expected = sim.model.speed(job, a)
            assert job.speed == pytest.approx(expected)
            assert 0 < job.speed <= 1.0
            grouped += bool(a.group)

    sched = Scheduler.from_names(*VARIANTS["muri-s"])
    res = Simulator(cl, specs, sched, build_model(cl), SimConfig(round_len=600.0), observers=[obs]).run()
    summary = res.summary()
    assert summary["completed"] == len(specs)
    assert 0 < summary["gpu_util"] <= 1 and 0 < summary["cpu_util"] <= 1
    assert grouped > 0
    for r in res.jobs:  # nobody beats running alone
        assert r.finish - r.first_start >= r.duration * (1 - 1e-9)


@pytest.mark.parametrize("variant", ["muri-s", "muri-l"])
def test_matchings_kept_or_solved_afresh_give_the_same_run(data_dir: Path, variant: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a class matching (and a bucket's nodes) met lately gets its pairs again, and buckets keep their nodes' keys through
    # merges (or rebuild them every round): each way must give the same classes, counts and
    # weights, so the same groups and the same run
    import gpuloom.policies.muri as muri

    specs = load_muri(data_dir / "muri/sim_traces/trace3.csv", limit=150)
    cl = Cluster.homogeneous(4, 8, 92, 520_000)  # a small cluster: long queues, large buckets
    specs = [s for s in specs if s.gpus <= 16]
    runs = []
    sizes: list[int] = []
    real = muri.class_pairs
    monkeypatch.setattr(muri, "class_pairs", lambda c, w: (sizes.append(sum(c)), real(c, w))[1])
    solved = []
    kept_keys = muri.MuriGrouping._match_bucket  # noqa: SLF001
    for kept, from_scratch in ((0, False), (64, False), (0, True)):
        monkeypatch.setattr(muri, "_MATCHINGS_KEPT", kept)
        monkeypatch.setattr(muri, "_BUCKETS_KEPT", kept)  # (a bucket's node pairs, kept or not)
        monkeypatch.setattr(muri, "_ROWS_KEPT", kept)  # (the weight rows of a list of classes, kept or not)
        # the node keys each bucket keeps through its merges, or rebuilt from the nodes every round
        monkeypatch.setattr(muri.MuriGrouping, "_match_bucket", kept_keys if not from_scratch else (
            lambda self, bs, m, f: self.match_round(bs.profiles, bs.nodes, m, f, bs.labels)))
        sizes.clear()
        res = Simulator(cl, specs, Scheduler.from_names(*VARIANTS[variant]), build_model(cl),
                        SimConfig(round_len=600.0)).run()
        runs.append([(r.id, r.first_start, r.finish, r.preemptions, r.migrations) for r in res.jobs])
        solved.append(len(sizes))
        if kept == 0:
            assert max(sizes) > 8 and any(s < 8 for s in sizes)  # matchings both small and larger
    assert runs[0] == runs[1] == runs[2]
    assert solved[0] == solved[2] > solved[1]  # matchings met again were not solved again


@pytest.mark.parametrize("variant", ["muri-s", "muri-l"])
def test_group_speeds_kept_or_computed_afresh_give_the_same_run(data_dir: Path, variant: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # the interleave factor keeps each group's time across calls (the driver asks for it at every
    # start, move and regroup): forgotten before every call, the run must be the same
    specs = [s for s in load_muri(data_dir / "muri/sim_traces/trace3.csv", limit=150) if s.gpus <= 16]
    cl = Cluster.homogeneous(4, 8, 92, 520_000)
    kept = InterleaveFactor.__call__
    runs = []
    asked = []
    for forget in (False, True):
        if forget:
            monkeypatch.setattr(InterleaveFactor, "__call__",
                                lambda self, j, a: (self._times.clear(), kept(self, j, a))[1])  # noqa: SLF001
        model = build_model(cl)
        res = Simulator(cl, specs, Scheduler.from_names(*VARIANTS[variant]), model, SimConfig(round_len=600.0)).run()
        runs.append([(r.id, r.first_start, r.finish, r.preemptions, r.migrations) for r in res.jobs])
        f = model.get("interleave")
        assert isinstance(f, InterleaveFactor)
        asked.append(len(f._times))  # noqa: SLF001
    assert runs[0] == runs[1]
    assert asked[0] > 1 and asked[1] <= 1  # groups were kept, and forgotten


def test_weight_rows_of_classes_met_again_are_the_rows_made_afresh() -> None:
    # the rows of the same classes in the same order are kept and handed out again; other classes, or
    # the same in another order, get rows of their own, equal to those a new policy makes
    f = InterleaveFactor(threshold=0.0)
    profs = [(4.0, 1.0, 1.0), (1.0, 4.0, 1.0), (1.0, 1.0, 4.0), (2.0, 2.0, 2.0)]
    keys = [(p,) for p in profs]
    pol = MuriGrouping(max_group=4)
    ids = [pol._key_ids.setdefault(k, len(pol._key_ids)) for k in keys]  # noqa: SLF001
    W = pol._weight_rows(keys, 4, f, ids)  # noqa: SLF001
    assert pol._weight_rows(keys, 4, f, list(ids)) is W  # noqa: SLF001
    assert W == MuriGrouping(max_group=4)._weight_rows(keys, 4, f)  # noqa: SLF001
    assert W[0][1] > 0 and W[0][0] > 0 and W == [list(r) for r in zip(*W, strict=True)]
    back = pol._weight_rows(keys[::-1], 4, f, ids[::-1])  # noqa: SLF001
    assert back is not W and back == [row[::-1] for row in W[::-1]]
    # pairs only: no class pairs with a pair of jobs, which the rows of groups up to four allow
    two = pol._weight_rows([keys[0], keys[1] + keys[2]], 2, f, [ids[0], 99])  # noqa: SLF001
    assert two[0][1] == 0 and pol._weight_rows([keys[0], keys[1] + keys[2]], 4, f, [ids[0], 99])[0][1] > 0  # noqa: SLF001


def test_pair_counts_and_assign_with_them() -> None:
    from gpuloom.policies.muri import _assign, _pair_counts  # noqa: PLC0415

    # class 0 pairs with itself once (weight 5) and twice with class 1 (weight 7)
    slots = [(0, 0, 0, 1, 5), (0, 2, 1, 0, 7), (0, 3, 1, 1, 7)]
    counts = _pair_counts(slots)
    assert counts == ((0, 0, 1, 5), (0, 1, 2, 7))
    # nodes 0-3 of class 0, 4-5 of class 1; nodes 3 and 5 run together now: that class pair is theirs,
    # the rest goes to the highest-ranked nodes left, class pairs in order: (0, 0) takes 0 and 1, (0, 1) 2 and 4
    members = [[0, 1, 2, 3], [4, 5]]
    labels = [-1, -1, -1, 0, -1, 0]
    want = [(0, 1, 5), (2, 4, 7), (3, 5, 7)]
    assert _assign(slots, members, labels, None, False) == want
    assert _assign(slots, members, labels, None, False, counts) == want
    # the same handed out without slots: the counts alone (as the policy does outside Muri's rule)
    assert _assign((), members, labels, None, False, counts) == want


def test_class_counts_are_the_pair_counts_of_the_slots_class_pairs_lay_out() -> None:
    from gpuloom.policies.bmatch import class_pairs  # noqa: PLC0415
    from gpuloom.policies.muri import _class_counts, _pair_counts, class_slots  # noqa: PLC0415

    # by hand: 2 pairs of classes 0-1 (weight 7) and one of 2 with itself (weight 3); (1, 2) has none
    W = [[0, 7, 0], [7, 0, 2], [0, 2, 3]]
    assert _class_counts({(0, 1): 2, (2, 2): 1, (1, 2): 0}, W) == ((0, 1, 2, 7), (2, 2, 1, 3))
    rng = random.Random(3)
    for _ in range(200):
        k = rng.randint(1, 6)
        W = [[0] * k for _ in range(k)]
        for c in range(k):
            for d in range(c, k):
                W[c][d] = W[d][c] = rng.choice([0, rng.randint(1, 9)])
        counts = [rng.randint(0, 12) for _ in range(k)]
        assert _class_counts(class_pairs(counts, W), W) == _pair_counts(class_slots(counts, W))


def test_merged_nodes_keep_members_and_profiles_sorted() -> None:
    from gpuloom.policies.muri import _BucketState  # noqa: PLC0415

    a, b, c, d = (1.0, 0.0), (2.0, 0.0), (3.0, 0.0), (4.0, 0.0)
    bs = _BucketState(1, [10, 11, 12, 13], [c, a, d, b], [None, None, None, None])
    bs.merge([(0, 1), (2, 3)])  # profiles c + a (out of order), d + b
    assert bs.nodes == [[0, 1], [2, 3]]
    assert bs.keys == [(a, c), (b, d)]
    bs.merge([(0, 1)])  # interleaved: (a, c) + (b, d)
    assert bs.nodes == [[0, 1, 2, 3]] and bs.keys == [(a, b, c, d)]
