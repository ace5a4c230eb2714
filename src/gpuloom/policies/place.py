"""Baseline placement policies: packed or random, sticky or not.

=====================  ==========================================================
packed-sticky          Tiresias: consolidate (best-fit single node, else fewest
                       nodes); running jobs keep their GPUs, resumed jobs go back
                       to their old GPUs when free
packed-non-sticky      Gandiva: consolidate, re-placing every job each round
                       (running jobs may migrate, paying the restart overhead)
random-sticky          uniformly random free GPUs; running jobs stay put
random-non-sticky      uniformly random free GPUs, drawn again every round
=====================  ==========================================================

The packed policies *consolidate* by default, as Tiresias' and Muri's YARN-style
placement does: a job that fits on one node runs on one node or waits, and a
larger job takes the fewest nodes that can hold it or waits.  ``-P
consolidate=false`` lets them split a job over more nodes when no such set is
free (Gandiva-style); the throughput model then charges the locality penalty
for the extra nodes.  Random placement draws GPUs from the whole cluster
(PAL's random baselines).  All selection and gang logic lives in
:class:`~gpuloom.policies.base.PlacePolicy`; these classes only pick GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence

import numpy as np

from ..core.plan import Part
from ..perf.model import min_nodes
from .base import FreeState, PlacePolicy, Request, View, need_on, parse_flag, register, split_parts

_NONE: frozenset[int] = frozenset()


def _prefer(ids: list[int], prev: frozenset[int]) -> list[int]:
    """Free GPU ids with the job's current GPUs first (no pointless moves on a node)."""
    if not prev:
        return ids
    return [g for g in ids if g in prev] + [g for g in ids if g not in prev]


def packed_choice(req: Request, free: FreeState, view: View, consolidate: bool = False) -> tuple[Part, ...] | None:
    """Best fit on one node (fewest free GPUs that fit), else the fewest nodes.

    With ``consolidate`` a job never spans more nodes than the fewest that
    could hold it on an empty cluster (one, for a job that fits on a node):
    if no such set is free, it gets nothing and waits.

    Ties between equally good nodes go to the node the job already runs on, and
    on a node the job's current GPUs come first, so re-placing a running job
    (non-sticky) only moves it when that consolidates it.
    """
    cl = free.cluster
    k = req.gpus
    was = req.jobs[0].alloc  # req.prev, without the property call (every try reads it)
    if was is None:  # (a new job: most requests placed in a long queue's round)
        prev = prev_nodes = _NONE
    else:
        prev, prev_nodes = frozenset(was.gpu_ids), frozenset(was.nodes)
    nc, nm = free.cpu_counts, free.mem_counts
    members = len(req.jobs)
    sizes = _node_sizes(cl)
    top = sizes[0]
    for node in best_fit(free.gpu_counts, k, prev_nodes, top):
        c, m = need_on(cl, req, node, k)
        if nc[node] >= c and nm[node] >= m:
            # split_parts' one part, built here: all k GPUs on the node, so the request's cores and
            # memory (or the node's share for k GPUs) per member, need_on's totals over the members,
            # which the node has free (as have its GPUs, taken from the free ones): it fits
            if k == 1 and not prev:  # (most placements: the node's first free GPU, one C scan)
                return (Part(node, (free.first_free(node),), c // members, m // members),)
            ids = _prefer(free.free_on(node), prev)[:k]
            return (Part(node, tuple(sorted(ids)) if prev else tuple(ids), c // members, m // members),)
    if free.free_gpus < k:
        return None
    limit = min_nodes(sizes, k) if consolidate else cl.num_nodes
    if consolidate:
        if limit <= 1:  # (most tries that get nothing end here, before the numpy views are made)
            return None
        if limit < cl.num_nodes and most_free(free.gpu_counts, limit, top) < k:
            return None  # (no ``limit`` nodes hold k free GPUs together: the walk below gives up)
    ng = free.node_gpus
    by_node: dict[int, list[int]] = {}
    left = k
    for node in np.argsort(-ng, kind="stable").tolist():
        if left == 0 or ng[node] == 0:
            break
        take = min(left, int(ng[node]))
        while take > 0:
            c, m = need_on(cl, req, node, take)
            if nc[node] >= c and nm[node] >= m:
                break
            take -= 1
        if take:
            if len(by_node) >= limit:
                return None
            by_node[node] = _prefer(free.free_on(node), prev)[:take]
            left -= take
    if left:
        return None
    parts = split_parts(cl, req, by_node)
    return parts if free.fits(parts, len(req.jobs)) else None


def best_fit(ng: Sequence[int], k: int, own: Collection[int] = (), top: int | None = None) -> Iterator[int]:
    """The nodes with at least ``k`` free GPUs (``ng``: free GPUs per node, ``top``: at least the most
    any node has), best fit first: fewest free GPUs, then the nodes in ``own`` (the job's), then node
    order.  Lazy: a job that fits on the first node it is offered costs a C scan of ``ng``
    (``in``, ``index``) per free-GPU count tried, not a sort.
    """
    if top is None:
        top = max(ng, default=0)
    for f in range(k, top + 1):
        if f not in ng:
            continue
        if own:
            yield from sorted(nd for nd in own if ng[nd] == f)
        i = ng.index(f)
        while True:
            if i not in own:
                yield i
            try:
                i = ng.index(f, i + 1)
            except ValueError:
                break


def most_free(ng: Sequence[int], n: int, top: int | None = None) -> int:
    """The free GPUs of the ``n`` nodes with the most together (``ng``: free GPUs per node, ``top``:
    at least the most any node has; one C scan per free-GPU count, largest first)."""
    total = 0
    for f in range(max(ng, default=0) if top is None else top, 0, -1):
        c = ng.count(f)
        if c >= n:
            return total + f * n
        total += f * c
        n -= c
    return total


_SIZES: dict[int, tuple[object, tuple[int, ...]]] = {}


def _node_sizes(cl) -> tuple[int, ...]:  # noqa: ANN001
    """Node GPU counts, largest first (cached per cluster object)."""
    hit = _SIZES.get(id(cl))
    if hit is not None and hit[0] is cl:
        return hit[1]
    sizes = tuple(sorted((n.gpus for n in cl.nodes), reverse=True))
    if len(_SIZES) > 64:
        _SIZES.clear()
    _SIZES[id(cl)] = (cl, sizes)
    return sizes


def random_choice(req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
    """``k`` GPUs drawn uniformly from all free GPUs (may span nodes)."""
    ids = np.flatnonzero(free.gpu_free)
    if ids.size < req.gpus:
        return None
    pick = np.sort(view.rng.choice(ids, size=req.gpus, replace=False))
    by_node: dict[int, list[int]] = {}
    for g in pick.tolist():
        by_node.setdefault(int(free.cluster.gpu_node[g]), []).append(g)
    parts = split_parts(free.cluster, req, by_node)
    return parts if free.fits(parts, len(req.jobs)) else None


@register("place", "packed-sticky", "tiresias")
class PackedSticky(PlacePolicy):
    """Packed placement; ``consolidate`` (default true) keeps jobs on the fewest nodes or makes them wait."""

    sticky = True
    pure_choose = True

    def __init__(self, backfill: bool | str = True, consolidate: bool | str = True) -> None:
        super().__init__(backfill)
        self.consolidate = parse_flag(consolidate, "consolidate")

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        return packed_choice(req, free, view, self.consolidate)


@register("place", "packed-non-sticky", "gandiva")
class PackedNonSticky(PackedSticky):
    sticky = False


@register("place", "random-sticky")
class RandomSticky(PlacePolicy):
    """GPUs drawn at random from the run's generator (``view.rng``).

    The generator is state a round changes even when it plans no action (a draw whose GPUs
    then lack the cores or memory, a grown request a plan hook turns down), and the next
    round then draws differently: after a round that drew, a round may change something at
    once (:meth:`next_change`); after one that drew nothing, it repeats that round.
    """

    sticky = True
    spreads = True

    def __init__(self, backfill: bool | str = True) -> None:
        super().__init__(backfill)
        self._drew: tuple[float, int] | None = None  # (now, round_index) of the last round that drew

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        self._drew = (view.now, view.round_index)
        return random_choice(req, free, view)

    def next_change(self, view: View) -> float:
        if self.dynamic or self._drew == (view.now, view.round_index):
            return view.now
        return math.inf


@register("place", "random-non-sticky")
class RandomNonSticky(RandomSticky):
    sticky = False
    dynamic = True
