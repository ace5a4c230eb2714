"""Muri's grouping (SIGCOMM'22): jobs with different bottlenecks share one set of GPUs.

Registered as group policy ``muri``.  Muri-S is ``--order srsf-events --group muri``
(durations known: remaining time × GPUs, re-sorted on arrivals and completions only), Muri-L is ``--order las-gpu-events
--group muri`` (durations unknown: attained GPU-time, no queues, re-sorted on
arrivals and completions only, as Muri's simulator ranks it; ``2d-las`` is
Tiresias'); both names are also in :data:`VARIANTS` for scripts.  The order decides *which* jobs enter the
grouping and the rank of every resulting unit; this stage only decides who
shares with whom.

One round:

1. **Admission** (Muri's rule): walk the ordered jobs keeping a count of the
   cluster's GPUs; a job whose GPU count still fits takes them and brings the
   next ``max_group - 1`` not yet admitted jobs *of its GPU count* along as
   candidates to share its GPUs.  So at most ``max_group``-fold the cluster
   enters the grouping, the highest-priority jobs first.  Jobs without a stage
   profile are admitted alone and never grouped.
2. **Buckets**: candidates are split by GPU count; a multi-GPU job is grouped
   only with jobs of the same count, so no member holds GPUs it cannot use and
   no job waits on a bigger group.
3. **Matching rounds**: in every bucket nodes start as single jobs.  A round
   builds, per bucket, the graph whose edges join two nodes that may merge -
   together at most ``max_group`` jobs, and interleaving them beats letting
   them take turns (the merged group's iteration time, overhead included, is
   below the sum of the two nodes' own) - weighted by the merged group's
   interleaving efficiency (:func:`~gpuloom.perf.interleave.efficiency`,
   scaled to integers by ``WEIGHT_SCALE``), and takes a maximum-weight
   matching (:func:`class_matching`).  Nodes with the same profiles are
   interchangeable, so the matching is one of *classes* of nodes with their
   counts (:mod:`gpuloom.policies.bmatch`: up to 32 nodes Blossom on them,
   past that on the classes: the LP on the bipartite double cover, rounded
   down, then Blossom on a small residual),
   classes in order of their profiles, which makes the choice among equally
   good matchings a function of the classes and counts alone.  Each pair of
   classes goes first to jobs that run together now (partners are not
   reshuffled every round), then to the highest-ranked.  With ``rule="muri"``
   Blossom runs on the nodes laid out class by class and the jobs take its
   places in rank order: which jobs of a class pair up is left to Blossom, as
   in Muri's simulator.  As in Muri, matched
   pairs are merged only while the admitted units need more GPUs than the
   cluster has - most efficient pairs first, weighted by their GPU count
   (``(1 - efficiency) x GPUs``, then rank) - since sharing slows every
   member down and is worth it only instead of waiting.  Rounds repeat (pairs,
   then pairs of pairs or pair + single, ...) until the units fit, groups hold
   ``max_group`` (default: one job per resource of the interleaving cycle, 4
   for Muri's storage/CPU/GPU/network; a larger value is an error) jobs, or
   nothing can merge.  With two resource types one round is the optimal pairing.
   ``pack_all=True`` merges every matched pair regardless of demand.
   ``match="repair"`` (the default, ``"auto"``, under Muri-L's ``las-gpu-events``
   order, whose buckets change at every event): a bucket past ``repair_nodes``
   nodes whose classes changed by at most ``repair_changed`` jobs since its
   last matching (same GPU count, same merge round) carries that matching over
   (:func:`~gpuloom.policies.repair.repair_pairs`) instead of solving a new one.
4. **Units**: every group and every job left alone becomes a unit, ranked by
   its highest-priority member; the size and place stages then treat a unit as
   one request holding one GPU set (``Request.jobs``; see
   :meth:`~gpuloom.policies.base.PlacePolicy._allocs`), each member getting an
   even share of the GPU-proportional CPU and memory
   (:func:`~gpuloom.policies.base.split_parts`).

Speed: edge weights come from :func:`~gpuloom.perf.interleave.cycle_times`,
batched in numpy over the *distinct* profile combinations of a bucket (a trace
has a few dozen model × GPU-count profiles), and are needed per pair of
classes only.  Each bucket keeps its nodes' profile keys through its merges.
A class matching depends on the classes and their counts alone, so one met in
the last ``_MATCHINGS_KEPT`` gets its class pairs again instead of being solved
anew.  The
interleaving model (threshold, per-size overhead) is read from the throughput
model's ``interleave`` factor, so grouping and simulation agree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import combinations, compress
from operator import is_not, itemgetter
from typing import ClassVar, cast

import numpy as np
import rustworkx as rx

from ..core.cluster import Cluster
from ..core.job import Job
from ..perf.interleave import InterleaveFactor, Profile, cycle_times
from ..perf.model import Factor
from .base import GroupPolicy, PolicyError, Stage, View, register
from .bmatch import BLOSSOM_NODES, class_pairs
from .repair import repair_pairs

#: integer scale of efficiencies (in [0, 1]) for the matching weights
WEIGHT_SCALE = 1_000_000
#: nodes in a node-level matching (Muri's rule) past which its edges are found with numpy rather than loops
_NUMPY_NODES = 32
#: class matchings kept by their input (the last ones used)
_MATCHINGS_KEPT = 20_000
_BUCKETS_KEPT = 256
_ROWS_KEPT = 4096
_CLASS_ORDERS_KEPT = 100_000
#: sort key (a C getter, not a lambda: the sorts run every round): a node's or unit's first member
_first = itemgetter(0)
#: whether a job's profile is known (a C call: a filter over every ordered job at every round)
_is_profile = partial(is_not, None)
#: grouping rules: ``gpuloom`` (the module notes) or ``muri``, Muri's simulator's: an edge wherever the
#: merged group's efficiency is positive, no preference for partners already together, pairs merged in bucket order (buckets by
#: their best job, pairs by their later node) rather than most efficient first (Muri sorts them but
#: drops the sorted copy), and *autopack*: a final group slower than its members taking turns is split
RULES = ("gpuloom", "muri")
#: how a bucket's matching is found: ``exact`` (a maximum one, solved or met again), ``repair`` (past
#: ``repair_nodes`` nodes, the bucket's last one carried over while few jobs changed; not with Muri's
#: rule) or ``auto`` (``repair`` under the orders in ``REPAIR_ORDERS``, else ``exact``)
MATCHES = ("auto", "exact", "repair")
#: orders under which ``match=auto`` repairs: Muri-L's (its order changes at every event)
REPAIR_ORDERS = ("las-gpu-events",)
#: (order, group) registry names of Muri's two variants
VARIANTS = {"muri-s": ("srsf-events", "muri"), "muri-l": ("las-gpu-events", "muri")}


def max_weight_pairs(n: int, edges: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Maximum-weight matching on nodes ``0..n-1`` with integer-weighted edges, as sorted pairs."""
    if n < 2 or not edges:
        return []
    g = rx.PyGraph(multigraph=False)
    g.add_nodes_from(range(n))
    g.add_edges_from(list(edges))
    m = rx.max_weight_matching(g, max_cardinality=False, weight_fn=int)
    return sorted((a, b) if a < b else (b, a) for a, b in m)


def max_weight_pairs_dense(weights: np.ndarray) -> list[tuple[int, int]]:
    """:func:`max_weight_pairs` for a symmetric ``n x n`` matrix of integral weights (0: no edge,
    diagonal ignored): the same graph, edges in the same (row-major, ``a < b``) order, so the same
    matching, built in one call instead of from a list of Python tuples."""
    n = len(weights)
    if n < 2:
        return []
    w = np.array(weights, dtype=np.float64)
    w.flat[:: n + 1] = 0.0
    g = rx.PyGraph.from_adjacency_matrix(w, 0.0)
    if g.num_edges() == 0:
        return []
    m = rx.max_weight_matching(g, max_cardinality=False, weight_fn=int)
    return sorted((a, b) if a < b else (b, a) for a, b in m)


def _node_slots(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> list[tuple[int, int, int, int, int]]:
    """:func:`class_slots` by Blossom on the nodes laid out class by class (``c = 0`` first): which
    nodes of a class pair up is Blossom's choice (Muri's rule gives them to jobs by these places)."""
    kid = [c for c, m in enumerate(counts) for _ in range(m)]
    n = len(kid)
    if n < 2:
        return []
    if n > _NUMPY_NODES:
        ka = np.array(kid, dtype=np.intp)
        pairs = max_weight_pairs_dense(np.array(weights, dtype=np.int64)[ka[:, None], ka[None, :]])
    else:
        edges = []
        for a in range(n - 1):
            row = weights[kid[a]]
            edges.extend([(a, c, w) for c in range(a + 1, n) if (w := row[kid[c]]) > 0])
        pairs = max_weight_pairs(n, edges)
    start = [0] * (len(counts) + 1)
    for c, m in enumerate(counts):
        start[c + 1] = start[c] + m
    # (a < c, so kid[a] <= kid[c])
    return sorted((kid[a], a - start[kid[a]], kid[c], c - start[kid[c]], int(weights[kid[a]][kid[c]])) for a, c in pairs)


def class_slots(counts: Sequence[int], weights: Sequence[Sequence[int]],
                places: bool = False) -> list[tuple[int, int, int, int, int]]:
    """Maximum-weight matching of nodes in classes: ``counts[c]`` interchangeable nodes of class ``c``,
    ``weights[c][d]`` the integer weight of pairing a node of ``c`` with one of ``d`` (0: no edge).

    Solved on the classes (:func:`~gpuloom.policies.bmatch.class_pairs`), so the result is a function
    of ``counts`` and ``weights`` alone: among equally good matchings the same one, whatever order the
    nodes came in.  Returns ``(c, i, d, j, weight)``: the ``i``-th node of class ``c`` pairs with the
    ``j``-th of class ``d`` (``c <= d``), sorted; class pairs in order take their classes' nodes in order.
    ``places``: Blossom on the nodes instead (:func:`_node_slots`), for Muri's rule, where the places
    matter.
    """
    if places:
        return _node_slots(counts, weights)
    nxt = [0] * len(counts)
    out: list[tuple[int, int, int, int, int]] = []
    for (c, d), m in sorted(class_pairs(counts, weights).items()):
        w = int(weights[c][d])
        for _ in range(m):
            i = nxt[c]
            nxt[c] += 1
            j = nxt[d]
            nxt[d] += 1
            out.append((c, i, d, j, w))
    out.sort()
    return out


def class_matching(counts: Sequence[int], weights: Sequence[Sequence[int]]) -> list[tuple[int, int, int, int]]:
    """:func:`class_slots` as counts: ``(c, d, pairs, weight)`` with ``c <= d``, sorted."""
    got: dict[tuple[int, int], int] = {}
    for c, _, d, _, _ in class_slots(counts, weights):
        got[(c, d)] = got.get((c, d), 0) + 1
    return [(c, d, m, int(weights[c][d])) for (c, d), m in sorted(got.items())]


def _pair_counts(slots: Sequence[tuple[int, int, int, int, int]]) -> tuple[tuple[int, int, int, int], ...]:
    """A class matching's ``slots`` as ``(c, d, pairs, weight)``, sorted (kept with the slots: :func:`_assign`)."""
    got: dict[tuple[int, int], list[int]] = {}
    for c, _, d, _, w in slots:
        e = got.get((c, d))
        if e is None:
            got[(c, d)] = [1, w]
        else:
            e[0] += 1
    return tuple([(c, d, m, w) for (c, d), (m, w) in sorted(got.items())])


def _class_counts(pairs: Mapping[tuple[int, int], int], weights: Sequence[Sequence[int]]) -> tuple[tuple[int, int, int, int], ...]:
    """:func:`_pair_counts` of the slots that class pairs ``{(c, d): pairs}`` lay out (class pairs in order
    taking their classes' nodes in order, as :func:`class_slots` does), without laying them out:
    ``(c, d, pairs, weight)``, sorted, class pairs without pairs left out."""
    return tuple([(c, d, m, int(weights[c][d])) for (c, d), m in sorted(pairs.items()) if m > 0])


def _assign(slots: Sequence[tuple[int, int, int, int, int]], members: Sequence[list[int]],
            labels: Sequence[int] | None, first: Sequence[int] | None, places: bool,
            counts: Sequence[tuple[int, int, int, int]] | None = None) -> list[tuple[int, int, int]]:
    """Node pairs ``(a, b, weight)``, ``a < b``, sorted, for a class matching's ``slots``
    (:func:`class_slots`); ``members[c]`` are class ``c``'s nodes in rank order (``first``, default:
    position).  ``places``: the nodes take the slots (Blossom's places) in rank order (Muri's rule).  Otherwise
    each class pair goes first to nodes that run together now (the same ``labels[x] >= 0``; groups
    in rank order), then to the highest-ranked nodes left: partners are kept across rounds.
    ``counts``: :func:`_pair_counts` of ``slots``, when the caller keeps it."""
    if places:
        out = [(members[c][i], members[d][j], w) for c, i, d, j, w in slots]
        out = [(x, y, w) if x < y else (y, x, w) for x, y, w in out]
        out.sort()
        return out
    if counts is None:
        counts = _pair_counts(slots)
    # (class pairs in sorted order, as the pairs left are handed out below)
    need = {(c, d): m for c, d, m, _ in counts}
    weight = {(c, d): w for c, d, _, w in counts}
    n = sum(map(len, members))
    used = [False] * n
    res: list[tuple[int, int, int]] = []
    if labels is not None:
        groups: dict[int, list[int]] = {}
        if first is None:
            for x, lab in enumerate(labels):
                if lab >= 0:
                    grp = groups.get(lab)  # (not setdefault: no new list per node of a known group)
                    if grp is None:
                        groups[lab] = [x]
                    else:
                        grp.append(x)
        else:
            for x in sorted(range(n), key=first.__getitem__):
                if labels[x] >= 0:
                    groups.setdefault(labels[x], []).append(x)
        # (in order of their first member; a node alone in its group has no partner to keep)
        multi = [grp for grp in groups.values() if len(grp) > 1]
        if multi:
            cls = [0] * n
            for c, m in enumerate(members):
                for x in m:
                    cls[x] = c
            get = need.get
            for grp in multi:
                if len(grp) == 2:
                    # (a group of two, most of them: its one pair, neither node used yet, as groups are
                    # disjoint; written out, without a loop over one pair)
                    x, y = grp
                    cx, cy = cls[x], cls[y]
                    k = (cx, cy) if cx <= cy else (cy, cx)
                    left = get(k, 0)
                    if left > 0:
                        need[k] = left - 1
                        used[x] = used[y] = True
                        res.append((x, y, weight[k]) if x < y else (y, x, weight[k]))
                    continue
                for x, y in combinations(grp, 2):
                    if used[x] or used[y]:
                        continue
                    cx, cy = cls[x], cls[y]
                    k = (cx, cy) if cx <= cy else (cy, cx)
                    if need.get(k, 0) > 0:
                        need[k] -= 1
                        used[x] = used[y] = True
                        res.append((x, y, weight[k]) if x < y else (y, x, weight[k]))
    ptr = [0] * len(members)
    for (c, d), cnt in need.items():
        if not cnt:
            continue
        w = weight[(c, d)]
        lc, ld = members[c], members[d]
        for _ in range(cnt):
            # each class's first node in rank order not yet used (c's, then d's: the same class twice
            # takes two nodes)
            p = ptr[c]
            while used[lc[p]]:
                p += 1
            ptr[c] = p + 1
            x = lc[p]
            used[x] = True
            p = ptr[d]
            while used[ld[p]]:
                p += 1
            ptr[d] = p + 1
            y = ld[p]
            used[y] = True
            res.append((x, y, w) if x < y else (y, x, w))
    res.sort()
    return res


def _common_label(lab: Sequence[int], node: list[int], otherwise: int) -> int:
    first = lab[node[0]]
    if first < 0:
        return otherwise
    for x in node:
        if lab[x] != first:
            return otherwise
    return first


class _BucketState:
    """Matching state of one GPU-count bucket: ``nodes`` are lists of indices into ``members``."""

    __slots__ = ("gpus", "members", "profiles", "labels", "nodes", "keys", "gids", "gen", "common", "any_label",
                 "matched", "cands", "merges", "pending")

    def __init__(self, gpus: int, members: list[int], profiles: list[Profile], current: Sequence[str | None]) -> None:
        self.gpus = gpus
        self.members = members
        self.profiles = profiles
        ids: dict[str, int] = {}
        self.labels = [-1 if c is None else ids.setdefault(c, len(ids)) for c in current]
        self.nodes: list[list[int]] = [[i] for i in range(len(members))]
        # each node's sorted profiles and their id in the policy's key table (of generation gen),
        # kept along with the nodes rather than rebuilt at every matching round
        self.keys: list[tuple[Profile, ...]] = [(p,) for p in profiles]
        self.gids: list[int] = []
        self.gen = -1
        # each node's members' common label (-1: none), and whether any member has a label
        self.common: list[int] = list(self.labels)
        self.any_label = any(x >= 0 for x in self.labels)
        # the last matching of these nodes (None: not computed since the last merge)
        self.matched: list[tuple[int, int, int]] | None = None
        # its merge candidates for the policy's round (built with ``matched``)
        self.cands: list[tuple[int, int, _BucketState, int, int]] | None = None
        self.merges = 0  # merge rounds so far
        self.pending: list[tuple[int, int]] = []  # pairs the policy's round merges

    @classmethod
    def built(cls, gpus: int, members: list[int], profiles: list[Profile], labels: list[int],
              keys: list[tuple[Profile, ...]], gids: list[int], gen: int) -> _BucketState:
        """A state whose labels (ids by first appearance, -1: none), single-node keys and their ids
        (of generation ``gen``) the caller read in its own pass over the members."""
        bs = cls.__new__(cls)
        bs.gpus = gpus
        bs.members = members
        bs.profiles = profiles
        bs.labels = labels
        bs.nodes = [[i] for i in range(len(members))]
        bs.keys = keys
        bs.gids = gids
        bs.gen = gen
        bs.common = labels[:]
        bs.any_label = max(labels, default=-1) >= 0
        bs.matched = None
        bs.cands = None
        bs.merges = 0
        bs.pending = []
        return bs

    def merge(self, pairs: Sequence[tuple[int, int]],
              ids: tuple[dict[tuple[Profile, ...], int], dict[tuple[int, int], int]] | None = None) -> None:
        """Merge node pairs; ``ids``: the key table the nodes' ids (``gids``, all known) are of and its
        unions (two nodes' ids, smaller first, to their union's id), so merged nodes get their ids here
        rather than by hashing their longer keys at the next matching."""
        # nodes are disjoint and kept in order of their first member, so a merged pair's node takes
        # the place of its earlier node and the later one leaves: the order holds without a sort
        # (the lists are this state's own: changed in place, then the nodes left are kept with compress)
        nodes, keys, common, gids = self.nodes, self.keys, self.common, self.gids
        keep = [True] * len(nodes)
        key_ids, unions = ids if ids is not None and gids else ({}, None)
        for a, c in pairs:
            if c < a:
                a, c = c, a
            la = common[a]
            na, nc, ka, kc = nodes[a], nodes[c], keys[a], keys[c]
            # (sorted unions; already sorted when one side comes wholly before the other, as two single
            # nodes in rank order do, and equal profiles are equal, so the concatenation is the same)
            nodes[a] = na + nc if na[-1] < nc[0] else sorted(na + nc)
            keys[a] = kk = ka + kc if ka[-1] <= kc[0] else (kc + ka if kc[-1] <= ka[0] else tuple(sorted(ka + kc)))
            common[a] = la if la == common[c] else -1
            if unions is not None:  # (the union of two keys is a function of the two: its id by theirs)
                ga, gc = gids[a], gids[c]
                u = (ga, gc) if ga <= gc else (gc, ga)
                g = unions.get(u)
                if g is None:
                    g = unions[u] = key_ids.setdefault(kk, len(key_ids))
                gids[a] = g
            elif gids:
                gids[a] = -1  # (a new key: its id is looked up at the next matching)
            keep[c] = False
        self.nodes = list(compress(nodes, keep))
        self.keys = list(compress(keys, keep))
        self.common = list(compress(common, keep))
        self.gids = list(compress(gids, keep)) if gids else []
        self.matched = None
        self.cands = None
        self.merges += 1


@register("group", "muri")
class MuriGrouping(GroupPolicy):
    """Maximum-weight matching rounds over GPU-count buckets (see the module docstring)."""

    name: ClassVar[str] = "muri"
    #: the interleave factor gives the stage profiles it groups by (the model always has one; the
    #: driver binds it to the jobs after this default is added)
    requires_factors: ClassVar[Mapping[str, Callable[[Cluster], Factor] | None]] = {
        "interleave": lambda cluster: InterleaveFactor()}

    def __init__(self, max_group: int | None = None, pack_all: bool = False, rule: str = "gpuloom",
                 match: str = "auto", repair_changed: int = 4,
                 repair_nodes: int = BLOSSOM_NODES) -> None:
        if max_group is not None and int(max_group) < 1:
            raise ValueError(f"max_group must be >= 1, got {max_group}")
        if rule not in RULES:
            raise ValueError(f"group 'muri': rule must be one of {', '.join(RULES)}, got {rule!r}")
        self.rule = rule  # "muri": Muri's own edges, merge order and autopack (see RULES)
        if match not in MATCHES:
            raise ValueError(f"group 'muri': match must be one of {', '.join(MATCHES)}, got {match!r}")
        # "repair": a large bucket's matching carried over from its last one (:mod:`.repair`); "auto":
        # repair under Muri-L's order (``las-gpu-events``, known once the stack is built: refuse()), else exact
        self.match = match
        self._repair = match == "repair" and rule != "muri"  # (Muri's rule matches from scratch)
        self.repair_changed = int(repair_changed)
        self.repair_nodes = int(repair_nodes)
        # per (GPU count, merge round), the last class matching: ((class id, nodes) in class order, its matching)
        self._last: dict[tuple[int, int], tuple[tuple[tuple[int, int], ...], tuple]] = {}
        self.max_group = None if max_group is None else int(max_group)
        self.pack_all = bool(pack_all)  # merge every matched pair, even when the cluster has room
        self.last_rounds = 0  # matching rounds in the last call (for tests/benchmarks)
        # weight of merging two nodes, keyed by the ids (in _key_ids) of their (sorted) profile tuples
        self._wcache: dict[tuple[int, int], int] = {}
        self._key_ids: dict[tuple[Profile, ...], int] = {}
        # two keys' ids (smaller first) -> their union's id in _key_ids (merged nodes' ids without their keys hashed)
        self._unions: dict[tuple[int, int], int] = {}
        self._tcache: dict[tuple[Profile, ...], float] = {}
        self._cache_sig: tuple[float, dict[int, float], int] | None = None
        self._gen = 0  # generation of _key_ids (bumped when the caches are cleared)
        # by id() of a profile: (the profile, its single-node key, the key's id in _key_ids)
        self._single: dict[int, tuple[Profile, tuple[Profile, ...], int]] = {}
        # the last class matchings: (max_group, (class key id, count) in class order) -> their class_slots
        # and its _pair_counts
        self._rounds: OrderedDict[tuple, tuple[tuple[tuple[int, int, int, int, int], ...],
                                               tuple[tuple[int, int, int, int], ...]]] = OrderedDict()
        # the last buckets' node pairs: (max_group, the nodes' key ids, their labels) -> _match_keys's pairs
        self._buckets: OrderedDict[tuple, list[tuple[int, int, int]]] = OrderedDict()
        # the last weight rows: (max_group, the classes' key ids in order) -> _weight_rows's rows
        self._rows: OrderedDict[tuple[int, tuple[int, ...]], list[list[int]]] = OrderedDict()
        # the classes of a matching in their canonical order (by key), by their sorted key ids
        self._class_order: dict[tuple[int, ...], list[int]] = {}

    # -- public ---------------------------------------------------------------
    def refuse(self, stages: Mapping[str, Stage]) -> str | None:
        # (nothing is refused: this is where the stage learns the order it groups under, for match=auto)
        if self.match == "auto":
            order = stages.get("order")
            self._repair = order is not None and order.name in REPAIR_ORDERS and self.rule != "muri"
        return None

    def group(self, ordered: Sequence[Job], view: View) -> list[tuple[Job, ...]]:
        factor = view.model.get("interleave")
        if not isinstance(factor, InterleaveFactor):
            raise PolicyError("group policy 'muri' needs an 'interleave' factor in the throughput model")
        # (each job's profile and GPU count, read once for admission, buckets and demand)
        profiles, job_gpus = factor.profiles_gpus(ordered)
        ks = set(map(len, cast("Iterable[Profile]", filter(_is_profile, profiles))))
        if len(ks) > 1:
            raise PolicyError(f"group policy 'muri': jobs have stage profiles of different lengths {sorted(ks)}")
        has_profiles = bool(ks)
        k = ks.pop() if ks else 1
        K = factor.cycle_length(k) if has_profiles else 1
        if self.max_group is not None and has_profiles and self.max_group > K:
            raise PolicyError(f"group policy 'muri': max_group={self.max_group}, but jobs with {k}-stage profiles "
                              f"interleave on {K} resources, so a group holds at most {K} jobs")
        cap_group = min(self.max_group or K, K)
        gl = job_gpus if has_profiles and cap_group >= 2 else None
        admitted = self._admit(ordered, profiles, view.cluster.num_gpus, cap_group, job_gpus)
        units: list[list[int]] = []
        buckets: dict[int, list[int]] = {}
        if gl is None:
            units.extend([[i] for i in admitted])
        else:
            for i in admitted:
                if profiles[i] is None:
                    units.append([i])
                else:
                    buckets.setdefault(gl[i], []).append(i)
        self.last_rounds = 0
        # current group of each job (the smallest id among it and its co-runners), to keep groups stable,
        # numbered by first appearance in its bucket; each member's profile, its single-node key and
        # the key's id, kept by the profile object while the key table lasts (one pass per bucket)
        cur = view.current
        states: list[_BucketState] = []
        if buckets:
            self._check_cache(factor)
        gen, single = self._gen, self._single
        for g, members in buckets.items():
            # (every member has a profile: profiled jobs alone join buckets)
            profs: list[Profile] = [profiles[i] for i in members]  # type: ignore[misc]
            # (an entry holds its profile, so while it lasts no other object has the profile's id)
            try:
                hits = [single[id(p)] for p in profs]
            except KeyError:
                hits = [single.get(id(p)) or self._single_key(p) for p in profs]
            keys = [h[1] for h in hits]
            gids = [h[2] for h in hits]
            labels: list[int] = []
            names: dict[str, int] = {}
            for i in members:
                jid = ordered[i].id
                alloc = cur.get(jid)
                if alloc is not None and (co := alloc.group):
                    m = min(co)  # (min over the job and its co-runners, without building the tuple)
                    labels.append(names.setdefault(jid if jid < m else m, len(names)))
                else:
                    labels.append(-1)
            states.append(_BucketState.built(g, members, profs, labels, keys, gids, gen))
        # demand of the admitted units; sharing only as much as needed to fit the cluster
        required = sum([job_gpus[i] for i in admitted])
        capacity = view.cluster.num_gpus
        while self.pack_all or required > capacity:
            cands: list[tuple[int, int, _BucketState, int, int]] = []
            for bs in states:
                got = bs.cands
                if got is None:  # (a bucket no merge changed keeps its matching and candidates)
                    if bs.matched is None:
                        bs.matched = self._match_bucket(bs, cap_group, factor)
                    nodes, bm, gpus = bs.nodes, bs.members, bs.gpus
                    # Muri's order: efficient pairs and small GPU counts first (1 - eff) x GPUs, then rank
                    # (the pair's best member: node a's first, as a < c and nodes are in order of their first)
                    got = bs.cands = [((WEIGHT_SCALE - w) * gpus, bm[nodes[a][0]], bs, a, c)
                                      for a, c, w in bs.matched]
                cands.extend(got)
            if not cands:
                break
            self.last_rounds += 1
            if self.rule == "muri":  # bucket order (states are in order of their best job), then later node
                pos = {id(bs): n for n, bs in enumerate(states)}
                cands.sort(key=lambda c: (pos[id(c[2])], c[4]))
            else:  # (by cost, then rank: ranks differ, so the tuples never compare past them)
                cands.sort()
            pack = self.pack_all
            for _, _, bs, a, c in cands:
                if required <= capacity and not pack:
                    break
                bs.pending.append((a, c))
                required -= bs.gpus
            ids = (self._key_ids, self._unions)
            for bs in states:
                pairs = bs.pending
                if pairs:
                    # (the ids of the key table in use now: those of an older one are looked up again)
                    bs.merge(pairs, ids if bs.gen == self._gen else None)
                    bs.pending = []
        # (each unit's members sorted: a bucket's members are in order of admission, not of rank)
        for bs in states:
            bm = bs.members
            if self.rule != "muri":
                units.extend([sorted([bm[x] for x in grp]) if len(grp) > 1 else [bm[grp[0]]] for grp in bs.nodes])
                continue
            for grp in bs.nodes:
                if len(grp) > 1 and self._slower_than_turns(bs, grp, factor, ordered):
                    units.extend([bm[x]] for x in grp)  # autopack: unpacked
                else:
                    units.append(sorted([bm[x] for x in grp]))
        units.sort(key=_first)
        # the units hold the admitted jobs; every other job runs alone: all in order of first member,
        # the jobs past the last admitted one taken as they come
        held = set(admitted)
        end = max(admitted, default=-1) + 1
        out: list[tuple[Job, ...]] = []
        nxt = 0
        for u in units:
            f = u[0]
            if nxt < f:
                out.extend([(ordered[i],) for i in range(nxt, f) if i not in held])
            out.append((ordered[f],) if len(u) == 1 else tuple([ordered[i] for i in u]))
            nxt = f + 1
        if nxt < end:
            out.extend([(ordered[i],) for i in range(nxt, end) if i not in held])
            nxt = end
        out.extend([(j,) for j in ordered[nxt:]])
        return out

    def match_round(
        self,
        profiles: list[Profile],
        nodes: list[list[int]],
        max_group: int,
        factor: InterleaveFactor,
        labels: Sequence[int] | None = None,
    ) -> list[tuple[int, int, int]]:
        """One maximum-weight matching over ``nodes`` (lists of indices into ``profiles``).

        Returns matched node pairs ``(a, b, weight)``, ``a < b``.  ``labels[i] >= 0``
        names the group member ``i`` runs in now: each pair of classes goes
        first to nodes that run together - ties are common, since many jobs
        share a profile - so running groups are kept instead of shuffling
        partners (and paying restarts) every round; then to nodes in order of
        their lowest member, so the result does not depend on the order of
        ``nodes``.
        """
        sizes = [len(nd) for nd in nodes]
        if len(nodes) < 2 or min(sizes) * 2 > max_group:
            return []
        self._check_cache(factor)
        # nodes with the same multiset of profiles share weights: work on distinct keys
        keys = [(profiles[nd[0]],) if len(nd) == 1 else tuple(sorted(profiles[x] for x in nd)) for nd in nodes]
        ids = self._key_ids
        gid = [ids.setdefault(kk, len(ids)) for kk in keys]
        nl = None
        if labels is not None and any(x >= 0 for x in labels):
            nl = [_common_label(labels, nd, -2 - x) for x, nd in enumerate(nodes)]
        return self._match_keys(keys, gid, nl, max_group, factor, [min(nd) for nd in nodes])

    def _match_bucket(self, bs: _BucketState, max_group: int, factor: InterleaveFactor) -> list[tuple[int, int, int]]:
        """:meth:`match_round` over a bucket's nodes, with the keys the bucket keeps."""
        nodes = bs.nodes
        # (before the bucket's first merge every node is one job, so the smallest holds one)
        if len(nodes) < 2 or (min(map(len, nodes)) if bs.merges else 1) * 2 > max_group:
            return []
        self._check_cache(factor)
        ids = self._key_ids
        if bs.gen != self._gen or not bs.gids:
            bs.gids = [ids.setdefault(kk, len(ids)) for kk in bs.keys]
            bs.gen = self._gen
        elif -1 in bs.gids:  # merged without the table's ids (-1; the others kept theirs), found by a scan in C
            gids, keys = bs.gids, bs.keys
            n = len(gids)
            x = gids.index(-1)
            while True:
                gids[x] = ids.setdefault(keys[x], len(ids))
                x += 1
                if x == n:
                    break
                try:
                    x = gids.index(-1, x)
                except ValueError:
                    break
        # (as match_round labels them: the members' common label, else one of the node's own)
        nl = bs.common if bs.any_label else None  # (-1: no common label)
        # the pairs depend on the nodes' keys and labels alone: a bucket met again (a round that
        # changed nothing in it) gets them again
        bk = (max_group, tuple(bs.gids), None if nl is None else tuple(nl))
        got = self._buckets.get(bk)
        if got is None:
            slot = (bs.gpus, bs.merges) if self._repair else None
            got = self._match_keys(bs.keys, bs.gids, nl, max_group, factor, slot=slot)
            self._buckets[bk] = got
            if len(self._buckets) > _BUCKETS_KEPT:
                self._buckets.popitem(last=False)  # (the oldest; its stored hash: the long key is not hashed again)
        else:
            self._buckets.move_to_end(bk)
        return got

    def _match_keys(self, keys: list[tuple[Profile, ...]], gid: list[int], nl: list[int] | None, max_group: int,
                    factor: InterleaveFactor, first: Sequence[int] | None = None,
                    slot: tuple[int, int] | None = None) -> list[tuple[int, int, int]]:
        """:meth:`match_round` once the nodes' keys, their ids and their labels are known; ``first``: each
        node's first member (its rank; default: its position); ``slot``: the GPU count and merge round
        of a bucket whose matching may be carried over from its last one there (``match=repair``)."""
        if self.rule == "muri":
            nl = None  # (Muri matches from scratch: no preference for partners already together)
        # nodes with the same key are interchangeable: the matching is one of their classes (with
        # multiplicities), solved once per distinct set of classes and counts, then given to nodes
        by_key: dict[int, list[int]] = {}
        for x, g in enumerate(gid):
            m = by_key.get(g)  # (not setdefault: no new list per node of a known class)
            if m is None:
                by_key[g] = [x]
            else:
                m.append(x)
        # canonical: by the profiles themselves.  Distinct ids are distinct keys of one table, never equal,
        # so the order is a function of the set of ids: kept by their sorted ids (sorting ints rather
        # than comparing tuples of profiles)
        known = tuple(sorted(by_key))
        cls = self._class_order.get(known)
        if cls is None:
            if len(self._class_order) >= _CLASS_ORDERS_KEPT:
                self._class_order.clear()
            cls = self._class_order[known] = sorted(by_key, key=lambda g: keys[by_key[g][0]])
        members = [by_key[g] for g in cls]
        if first is not None:
            for m in members:
                m.sort(key=first.__getitem__)
        rk = (max_group, tuple([(g, len(m)) for g, m in zip(cls, members, strict=True)]))
        got = None
        W: list[list[int]] | None = None
        if slot is not None:  # (match=repair: carried over from the bucket's last matching where few jobs changed)
            last = self._last.get(slot)
            if last is not None and len(gid) > self.repair_nodes:
                # (its counts and pairs by class id made here, not at every matching: few are read)
                prev = dict(last[0])
                if prev == dict(rk[1]):  # the same classes and counts: the same pairs (carried over or not)
                    got = last[1]
                else:
                    was = [g for g, _ in last[0]]
                    W = self._weight_rows([keys[m[0]] for m in members], max_group, factor, cls)
                    fixed = repair_pairs(prev, {(was[c], was[d]): n for c, d, n, _ in last[1][1]}, cls,
                                         [len(m) for m in members], W, self.repair_changed)
                    if fixed is not None:
                        got = ((), _class_counts(fixed, W))  # (not kept with the exact ones)
        if got is None:
            got = self._rounds.get(rk)
            if got is None:
                if W is None:
                    W = self._weight_rows([keys[m[0]] for m in members], max_group, factor, cls)
                cnt = [len(m) for m in members]
                if self.rule == "muri":  # (Blossom's places matter: the slots are kept)
                    pairs = tuple(class_slots(cnt, W, True))
                    got = (pairs, _pair_counts(pairs))
                else:  # (only the counts per class pair are read: no slots laid out)
                    got = ((), _class_counts(class_pairs(cnt, W), W))
                self._rounds[rk] = got
                if len(self._rounds) > _MATCHINGS_KEPT:
                    self._rounds.popitem(last=False)
            else:
                self._rounds.move_to_end(rk)
        if slot is not None:
            self._last[slot] = (rk[1], got)
        return _assign(got[0], members, nl, first, self.rule == "muri", got[1])

    # -- helpers ------------------------------------------------------------------
    def _slower_than_turns(self, bs: _BucketState, grp: list[int], factor: InterleaveFactor,
                           ordered: Sequence[Job]) -> bool:
        """Muri's autopack test: the group's iteration time exceeds the sum of its members' alone (with raw
        stage times a job's time alone is its iteration time, not its stages' sum)."""
        key = tuple(sorted(bs.profiles[x] for x in grp))
        if factor.raw:
            return self._own_time(key, factor) > sum(factor.solo_time(ordered[bs.members[x]]) for x in grp)
        return self._own_time(key, factor) > sum(self._own_time((bs.profiles[x],), factor) for x in grp)

    def _single_key(self, p: Profile) -> tuple[Profile, tuple[Profile, ...], int]:
        """``_single``'s entry for profile ``p``, made: (``p``, its single-node key, the key's id)."""
        kk = (p,)
        hit = self._single[id(p)] = (p, kk, self._key_ids.setdefault(kk, len(self._key_ids)))
        return hit

    def _check_cache(self, factor: InterleaveFactor) -> None:
        # (compared field by field, the overheads as dicts: this runs at every matching round)
        sig = self._cache_sig
        if (sig is None or sig[0] != factor.threshold or sig[1] != factor.overhead or sig[2] != factor.resources
                or len(self._wcache) > 2_000_000):
            self._cache_sig = (factor.threshold, dict(factor.overhead), factor.resources)
            self._wcache.clear()
            self._tcache.clear()
            self._key_ids.clear()
            self._unions.clear()
            self._single.clear()
            self._rounds.clear()
            self._buckets.clear()
            self._last.clear()
            self._rows.clear()
            self._class_order.clear()
            self._gen += 1

    def _own_time(self, key: tuple[Profile, ...], factor: InterleaveFactor) -> float:
        t = self._tcache.get(key)
        if t is None:
            t = factor.group_time(key)
            self._tcache[key] = t
        return t

    def _weight_rows(self, ukeys: list[tuple[Profile, ...]], max_group: int, factor: InterleaveFactor,
                     uid: list[int] | None = None) -> list[list[int]]:
        """Integer edge weights between distinct node keys (0 = may not merge), row by row; cached
        across rounds.  ``uid``: the keys' ids in ``_key_ids``, when the caller has them.

        A pair may merge when the union holds at most ``max_group`` jobs and
        its interleaved iteration time is below the sum of the two nodes' own
        (taking turns); its weight is the union's efficiency x ``WEIGHT_SCALE``.
        """
        nk = len(ukeys)
        # weights are cached by the keys' ids (a key, a tuple of profiles, is hashed once per call
        # here, not once per pair), computed for the pair in profile order
        if uid is None:
            ids = self._key_ids
            uid = [ids.setdefault(kk, len(ids)) for kk in ukeys]
        # the whole rows again for the same keys in the same order (the classes of a bucket met again
        # with other counts: Muri-L's matchings repeat their classes in 59 % of these calls on trace4,
        # 2d-las + muri's in 76 %); the rows are only read by their callers
        rk = (max_group, tuple(uid))
        rows = self._rows
        got = rows.get(rk)
        if got is not None:
            rows.move_to_end(rk)
            return got
        W = [[0] * nk for _ in range(nk)]
        rows[rk] = W
        if len(rows) > _ROWS_KEPT:
            rows.popitem(last=False)
        cache = self._wcache
        sizes = [len(kk) for kk in ukeys]
        missing: dict[int, list[tuple[int, int, tuple[int, int]]]] = {}
        for a in range(nk):
            ia, la, row = uid[a], sizes[a], W[a]
            for b in range(a, nk):
                if la + sizes[b] > max_group:
                    continue
                ib = uid[b]
                ck = (ia, ib) if ia <= ib else (ib, ia)
                w = cache.get(ck)
                if w is None:
                    missing.setdefault(la + sizes[b], []).append((a, b, ck))
                else:
                    row[b] = W[b][a] = w
        if missing:
            spans = factor.layout(len(ukeys[0][0]))
            k = sum(spans)
            for m, todo in missing.items():
                members = np.array([ukeys[a] + ukeys[b] if ukeys[a] <= ukeys[b] else ukeys[b] + ukeys[a]
                                    for a, b, _ in todo], dtype=np.float64)  # (E, m, k)
                T, _ = cycle_times(members, spans)
                T = T * factor.overhead_for(m)
                work = members.sum(axis=(1, 2))
                for (a, b, ck), t, wk in zip(todo, T.tolist(), work.tolist(), strict=True):
                    apart = self._own_time(ukeys[a], factor) + self._own_time(ukeys[b], factor)
                    if t < apart * (1.0 - 1e-12) or (self.rule == "muri" and wk > 0):
                        w = max(1, int(round(WEIGHT_SCALE * wk / (k * t))))
                    else:
                        w = 0
                    cache[ck] = w
                    W[a][b] = W[b][a] = w
        return W

    @staticmethod
    def _admit(ordered: Sequence[Job], profiles: Sequence[Profile | None], capacity: int, max_group: int,
               gl: list[int] | None = None) -> list[int]:
        """Indices of the jobs that enter the grouping (Muri's k-fold admission); ``gl``: each job's GPU
        count, when the caller read them."""
        admitted: list[int] = []
        n = len(ordered)
        taken = [False] * n
        # per GPU count, the position in ``ordered`` up to which candidates were looked for (the walk
        # stops where the cluster is full, so most of a long queue is never read)
        ptr: dict[int, int] = {}
        cap = capacity
        # (without gl, each job's GPU count is read once the first candidates are looked for)
        for i, j in enumerate(ordered):
            if cap <= 0:
                break
            if taken[i]:
                continue
            g = j.spec.gpus if gl is None else gl[i]
            if g > cap:
                continue
            cap -= g
            taken[i] = True
            admitted.append(i)
            if profiles[i] is None:
                continue
            extra = max_group - 1
            p = ptr.get(g, 0)
            if extra > 0 and p < n and gl is None:
                gl = [o.spec.gpus for o in ordered]
            while extra > 0 and p < n and gl is not None:
                # the next job of this GPU count (a scan in C: a rare count's candidates lie far apart)
                try:
                    x = gl.index(g, p)
                except ValueError:
                    p = n
                    break
                p = x + 1
                if not taken[x] and profiles[x] is not None:
                    taken[x] = True
                    admitted.append(x)
                    extra -= 1
            ptr[g] = p
        return admitted


__all__ = ["MuriGrouping", "VARIANTS", "WEIGHT_SCALE", "class_matching", "class_slots", "max_weight_pairs",
           "max_weight_pairs_dense"]
