"""Maximum-weight matching of nodes in classes of interchangeable nodes, solved on the classes.

``counts[c]`` nodes of class ``c``; pairing a node of ``c`` with one of ``d`` weighs ``weights[c][d]``
(an integer, 0: no edge; ``c == d`` pairs two nodes of one class).  A matching of the nodes is a
b-matching of the classes: ``x[c][d]`` pairs, each class using at most ``counts[c]`` nodes (a pair
inside a class uses two).  :func:`lp_class_pairs` solves it exactly without laying out every node
(:func:`class_pairs` takes it past ``BLOSSOM_NODES`` nodes, Blossom on the nodes up to there):

1. The LP relaxation, on the bipartite double cover (each class a row and a column, a pair
   ``c``-``d`` a transport from row ``c`` to column ``d`` and back), is a transportation problem,
   solved in integers by successive shortest paths: ``y``; ``x = (y + y^T) / 2`` is an optimal
   fractional b-matching, half-integral.
2. Rounding down, ``r = floor(x)``.  Among the optimal integral matchings, take ``z`` nearest to
   ``r``.  ``z - r`` splits into alternating walks (edges of ``z`` above ``r`` and of ``r`` above
   ``z`` in turn).  A walk that can be flipped both in ``z`` (stays a matching) and in ``x`` (stays
   fractionally feasible) weighs 0 by the optimality of both, so ``z`` nearest has none: every walk
   ends, with an edge of ``z``, at a class ``v`` whose LP slack is under one node; there are at most
   ``q = sum over those v of counts[v] - deg_r(v)`` such ends, so at most ``q`` walks, and as a walk
   repeating a class with the same sign would hold a flippable closed walk, each lowers an edge at
   most twice and raises a class's degree at most twice.  Hence ``z >= r - 2q`` and
   ``deg_z <= deg_r + 2q``.
3. So the pairs ``l = max(0, r - 2q)`` are fixed, and Blossom (``rustworkx.max_weight_matching``)
   matches the rest, at most ``deg_r - deg_l + 2q`` nodes per class, laid out class by class.  When
   ``q == 0`` the rounded LP solution is the matching and Blossom is not called.

The result is a function of ``counts`` and ``weights`` only (the flow's paths and the residual's
layout follow the class order), so among equally good matchings the same one is picked whatever
order the nodes came in.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import rustworkx as rx

#: nodes up to which Blossom on the nodes is the faster (docs/muri.md, "Matching the classes")
BLOSSOM_NODES = 32


def _transport(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> list[list[int]]:
    """Integral maximum-weight transport ``y[c][d] >= 0`` (``w > 0`` only) with row and column sums at most
    ``counts``: min-cost flow by successive shortest paths (Bellman-Ford; costs ``-w``), while a path gains."""
    k = len(counts)
    s, t = 2 * k, 2 * k + 1
    n = 2 * k + 2
    # arcs as parallel lists; arc a and a ^ 1 are each other's reverse
    head: list[int] = []
    cap: list[int] = []
    cost: list[int] = []
    # each node's arcs with room (cap > 0), in the order they were added (by arc number): the paths
    # scan only these, the same arcs in the same order as a scan of all that skips the full ones
    adj: list[list[int]] = [[] for _ in range(n)]

    # (arcs added in place, in this order: source and sink arcs class by class, then the middle arcs
    # row by row; the order of each node's arcs decides which of equally short paths is found)
    adj_s = adj[s]
    present = [c for c in range(k) if counts[c] > 0]
    for c in present:
        m = counts[c]
        a = len(head)
        head += (c, s, t, k + c)
        cap += (m, 0, m, 0)
        cost += (0, 0, 0, 0)
        # (a + 3, t -> k + c, gets room with the first flow on a + 2; the source's reverse arc a + 1 is never
        # listed: it never shortens a path, as dist[c] < 0 with flow on s -> c would close a negative
        # cycle, which successive shortest paths never leave)
        adj_s.append(a)
        adj[k + c].append(a + 2)
    mid: list[tuple[int, int, int]] = []
    for c in present:
        row, mc, adj_c = weights[c], counts[c], adj[c]
        for d in present:
            w = row[d]
            if w > 0:
                a = len(head)
                md = counts[d]
                w = int(w)
                head += (k + d, c)
                cap += (mc if mc < md else md, 0)
                cost += (-w, w)
                adj_c.append(a)  # (a + 1 gets room with the first flow on a)
                mid.append((c, d, a))
    inf = 1 << 62
    while True:
        dist = [inf] * n
        via = [-1] * n
        dist[s] = 0
        inq = [False] * n
        dq = deque([s])
        while dq:
            u = dq.popleft()
            inq[u] = False
            du = dist[u]
            for a in adj[u]:
                v = head[a]
                nd = du + cost[a]
                if nd < dist[v]:
                    dist[v] = nd
                    via[v] = a
                    if not inq[v]:
                        inq[v] = True
                        dq.append(v)
        if dist[t] >= 0:
            break
        push = inf
        v = t
        while v != s:
            a = via[v]
            push = min(push, cap[a])
            v = head[a ^ 1]
        v = t
        while v != s:
            a = via[v]
            r = a ^ 1
            u = head[r]
            cap[a] -= push
            if not cap[a]:  # (full: off its tail's list)
                adj[u].remove(a)
            if not cap[r] and u != s:  # (room again: into its tail's list, in order; never s's reverse arcs)
                insort(adj[v], r)
            cap[r] += push
            v = u
    y = [[0] * k for _ in range(k)]
    for c, d, a in mid:
        y[c][d] = cap[a ^ 1]
    return y


def _blossom(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    """Blossom on the nodes laid out class by class: pairs per class pair ``(c, d)``, ``c <= d``."""
    # classes without nodes add nothing to the graph: it is that of the present classes alone, whose
    # matchings recur (residuals of different buckets) and are kept
    idx = [c for c, m in enumerate(counts) if m > 0]
    sub = _present_blossom(tuple([counts[c] for c in idx]),
                           tuple([tuple([weights[c][d] for d in idx]) for c in idx]))
    return {(idx[i], idx[j]): m for (i, j), m in sub}


@lru_cache(maxsize=4096)
def _present_blossom(counts: tuple[int, ...], weights: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, int], int], ...]:
    got = _layout_blossom(counts, weights)
    return tuple(got.items())


def _layout_blossom(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    got: dict[tuple[int, int], int] = {}
    if sum(counts) < 2:
        return got
    # each node's class, nodes laid out class by class; the weights between the nodes taken row by
    # row, then column by column (two takes cost less than one index of both axes)
    ka = np.repeat(np.arange(len(counts)), counts)
    kid = ka.tolist()
    w = np.array(weights, dtype=np.float64).take(ka, 0).take(ka, 1)
    w.flat[:: len(kid) + 1] = 0.0
    g = rx.PyGraph.from_adjacency_matrix(w, 0.0)
    if g.num_edges() == 0:
        return got
    for a, b in rx.max_weight_matching(g, max_cardinality=False, weight_fn=int):
        c, d = kid[a], kid[b]
        key = (c, d) if c <= d else (d, c)
        got[key] = got.get(key, 0) + 1
    return got


def class_pairs(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    """Maximum-weight matching of ``counts[c]`` interchangeable nodes per class ``c``: pairs per class pair
    ``(c, d)``, ``c <= d``, ``weights[c][d] > 0``.  Up to ``BLOSSOM_NODES`` nodes Blossom on the nodes laid
    out class by class, past it :func:`lp_class_pairs`."""
    _check(counts, weights)
    if sum(counts) <= BLOSSOM_NODES:
        return _blossom(counts, weights)
    return lp_class_pairs(counts, weights)


def _check(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> None:
    k = len(counts)
    if len(weights) != k or any(len(row) != k for row in weights):
        raise ValueError(f"class matching: weights must be {k} x {k} for {k} classes")
    if any(m < 0 for m in counts):
        raise ValueError(f"class matching: counts must be >= 0, got {list(counts)}")


def lp_class_pairs(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    """:func:`class_pairs` by the LP on the classes, rounded, and Blossom on a residual (module notes)."""
    _check(counts, weights)
    k = len(counts)
    y = _transport(counts, weights)
    # r = floor of x = (y + y^T) / 2, and 2 x's degree per class
    r: dict[tuple[int, int], int] = {}
    deg_r = [0] * k
    deg2_x = [0] * k
    for c in range(k):
        row = y[c]
        for d in range(c, k):
            both = row[d] if c == d else row[d] + y[d][c]
            if both == 0:
                continue
            m = both // 2
            if c == d:
                deg2_x[c] += 2 * both
                if m:
                    r[(c, c)] = m
                    deg_r[c] += 2 * m
            else:
                deg2_x[c] += both
                deg2_x[d] += both
                if m:
                    r[(c, d)] = m
                    deg_r[c] += m
                    deg_r[d] += m
    # walks of an optimal matching away from r end at classes with LP slack under one node
    q = sum(counts[v] - deg_r[v] for v in range(k) if 2 * counts[v] - deg2_x[v] < 2)
    if q == 0:
        return r
    fixed = {e: m - 2 * q for e, m in r.items() if m > 2 * q}
    deg_l = [0] * k
    for (c, d), m in fixed.items():
        deg_l[c] += m
        deg_l[d] += m
    rest = [min(counts[v] - deg_l[v], deg_r[v] - deg_l[v] + 2 * q) for v in range(k)]
    if sum(rest) >= sum(counts):
        return _blossom(counts, weights)
    got = _blossom(rest, weights)
    for e, m in fixed.items():
        got[e] = got.get(e, 0) + m
    return got


__all__ = ["BLOSSOM_NODES", "class_pairs", "lp_class_pairs"]
