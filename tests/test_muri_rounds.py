"""The per-round paths around Muri's matching: bucket merges, group requests, bulk order keys."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.perf.model import ThroughputModel
from gpuloom.policies.base import View
from gpuloom.policies.muri import _BucketState
from gpuloom.policies.order import SRSF, SRTF
from gpuloom.policies.size import Proportional

A, B, C = (6.0, 0.0, 0.0), (0.0, 6.0, 0.0), (0.0, 0.0, 6.0)


def test_merge_keeps_nodes_in_order_of_their_first_member() -> None:
    bs = _BucketState(1, [10, 11, 12, 13, 14], [A, B, C, A, B], ["x", None, None, "x", "y"])
    assert bs.labels == [0, -1, -1, 0, 1]
    bs.merge([(0, 3), (1, 2)])
    assert bs.nodes == [[0, 3], [1, 2], [4]]
    assert bs.keys == [(A, A), (C, B), (B,)]  # (sorted profiles: C < B)
    assert bs.common == [0, -1, 1]  # 0 and 3 ran together; 1 and 2 had no group
    bs.merge([(2, 0)])  # (either order of a pair)
    assert bs.nodes == [[0, 3, 4], [1, 2]]
    assert bs.keys == [(B, A, A), (C, B)]
    assert bs.common == [-1, -1]


def test_merge_with_the_key_table_gives_merged_nodes_the_ids_of_their_keys() -> None:
    key_ids: dict[tuple, int] = {(A,): 0, (B,): 1, (C,): 2}
    unions: dict[tuple[int, int], int] = {}
    bs = _BucketState.built(1, [10, 11, 12, 13], [A, B, A, B], [-1] * 4,
                            [(A,), (B,), (A,), (B,)], [0, 1, 0, 1], 0)
    bs.merge([(0, 1), (2, 3)], (key_ids, unions))
    # (both nodes are A + B, sorted B first: one new key, its id given once and read from the unions the
    # second time)
    assert bs.keys == [(B, A), (B, A)]
    assert bs.gids == [3, 3]
    assert key_ids[(B, A)] == 3 and unions == {(0, 1): 3}
    bs.merge([(0, 1)], (key_ids, unions))
    assert bs.keys == [(B, B, A, A)] and bs.gids == [4] and unions == {(0, 1): 3, (3, 3): 4}
    assert key_ids[(B, B, A, A)] == 4
    # without the table a merged node's id is left to be looked up (-1)
    bs = _BucketState.built(1, [10, 11], [A, C], [-1, -1], [(A,), (C,)], [0, 2], 0)
    bs.merge([(0, 1)])
    assert bs.gids == [-1]


def _merged_by_sort(nodes: list[list[int]], pairs: list[tuple[int, int]]) -> list[list[int]]:
    """The merge as a sort of the merged and the untouched nodes (by first member)."""
    used = {x for p in pairs for x in p}
    out = [sorted(nodes[a] + nodes[c]) for a, c in pairs] + [nd for i, nd in enumerate(nodes) if i not in used]
    return sorted(out)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)),
                                                      st.lists(st.integers(0, 5), min_size=2, max_size=4))))
def test_merge_equals_the_sorted_rebuild(case: tuple[int, list[int], list[int]]) -> None:
    n, perm, cuts = case
    bs = _BucketState(1, list(range(n)), [A] * n, [None] * n)
    for c in cuts:  # merge rounds: disjoint pairs of the current nodes, taken from a permutation
        m = len(bs.nodes)
        live = [x for x in perm if x < m][: 2 * min(c, m // 2)]
        pairs = [(live[i], live[i + 1]) for i in range(0, len(live) - 1, 2)]
        expect = _merged_by_sort(bs.nodes, pairs)
        bs.merge(pairs)
        assert bs.nodes == expect
        assert [len(k) for k in bs.keys] == [len(nd) for nd in bs.nodes]


def _spec(jid: str, gpus: int) -> JobSpec:
    return JobSpec(jid, 0.0, gpus, 100.0)


def _view(jobs: list[Job], now: float = 0.0) -> View:
    cl = Cluster.homogeneous(1, 8)
    return View(now, cl, jobs, {}, ThroughputModel(cl, []), np.random.default_rng(0))


def test_a_group_request_is_built_once_and_is_the_fresh_one() -> None:
    a, b = Job(_spec("a", 2)), Job(_spec("b", 2))
    pol = Proportional()
    first = pol.size([(a, b), (a,)], _view([a, b]))
    again = pol.size([(a, b)], _view([a, b]))
    assert again[0] is first[0]
    assert (first[0].jobs, first[0].gpus, first[0].key) == ((a, b), 2, (2, None, None, ("a", "b")))
    other = pol.size([(b, a)], _view([a, b]))[0]  # another order of its jobs: another request
    assert other is not first[0] and other.key == (2, None, None, ("b", "a"))


class _Doubled(SRSF):
    def key(self, job: Job, view: View) -> float:
        return 2.0 * job.remaining_at(view.now)


def test_bulk_keys_are_the_keys_one_by_one() -> None:
    jobs = [Job(_spec(f"j{i}", g)) for i, g in enumerate([1, 4, 2])]
    jobs[1].remaining = 30.0
    view = _view(jobs, 5.0)
    assert SRSF().keys(jobs, view) == [100.0, 120.0, 200.0]
    assert SRTF().keys(jobs, view) == [100.0, 30.0, 100.0]
    assert _Doubled().keys(jobs, view) == [200.0, 60.0, 200.0]  # a subclass's own key is honoured
    assert [j.id for j in SRSF().order(jobs, view)] == ["j0", "j1", "j2"]
