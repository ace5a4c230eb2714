"""A class matching carried over from the last one of the same bucket instead of solved anew.

Muri-L's order (attained GPU-time) changes at every arrival and completion, so its buckets meet
class counts they never met before and every one is a new maximum-weight matching
(:func:`gpuloom.policies.bmatch.class_pairs`).  Between two events a bucket's classes change by a
few jobs; :func:`repair_pairs` keeps the last matching's pairs of classes where the new counts still
hold them, drops the lightest pairs of a class that lost jobs, and pairs the nodes left free greedily,
heaviest pair of classes first.  The result is a matching (every class within its count, edges of
positive weight only), not necessarily a maximum one: used by ``group`` policy ``muri`` with
``match=repair``, which solves the matching exactly again when too much changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def repair_pairs(prev_counts: Mapping[int, int], prev_pairs: Mapping[tuple[int, int], int], classes: Sequence[int],
                 counts: Sequence[int], weights: Sequence[Sequence[int]],
                 max_changed: int) -> dict[tuple[int, int], int] | None:
    """Pairs of classes ``{(c, d): pairs}`` (``c <= d``, indices into ``classes``) for ``counts`` nodes of
    ``classes`` (class ids) with ``weights`` between them, from the last matching of the bucket:
    ``prev_pairs`` by class ids (``(a, b)``, either order) for ``prev_counts`` nodes by class id.

    ``None`` when more than ``max_changed`` nodes entered or left the classes (counted per class), or
    when nothing changed (the caller solves those exactly).
    """
    idx = {g: i for i, g in enumerate(classes)}
    changed = sum(n for g, n in prev_counts.items() if g not in idx)
    for g, n in zip(classes, counts, strict=True):
        changed += abs(n - prev_counts.get(g, 0))
    if changed == 0 or changed > max_changed:
        return None
    k = len(classes)
    x: dict[tuple[int, int], int] = {}
    for (ga, gb), m in prev_pairs.items():
        c, d = idx.get(ga), idx.get(gb)
        if c is None or d is None:
            continue
        if c > d:
            c, d = d, c
        if weights[c][d] > 0:
            x[(c, d)] = x.get((c, d), 0) + m
    deg = [0] * k
    for (c, d), m in x.items():
        deg[c] += m
        deg[d] += m
    for c in range(k):
        # a class that lost nodes gives up its lightest pairs (ties: the last pair of classes)
        while deg[c] > counts[c]:
            p = min((q for q in x if c in q), key=lambda q: (weights[q[0]][q[1]], -q[0], -q[1]))
            x[p] -= 1
            if not x[p]:
                del x[p]
            deg[p[0]] -= 1
            deg[p[1]] -= 1
    free = [n - dg for n, dg in zip(counts, deg, strict=True)]
    edges = sorted((-weights[c][d], c, d) for c in range(k) if free[c] for d in range(c, k)
                   if free[d] and weights[c][d] > 0)
    for _, c, d in edges:
        m = free[c] // 2 if c == d else min(free[c], free[d])
        if m > 0:
            x[(c, d)] = x.get((c, d), 0) + m
            free[c] -= m
            free[d] -= m
    return {p: m for p, m in sorted(x.items()) if m > 0}


__all__ = ["repair_pairs"]
