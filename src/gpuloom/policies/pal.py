"""Variability- and locality-aware placement (PAL, SC'24): ``pm-first`` and ``pal``.

Both read the PM-scores from the throughput model's ``variability`` factor
(:class:`~gpuloom.perf.variability.VariabilityFactor`, added with
:func:`~gpuloom.perf.variability.add_variability`), so the scores that decide
placement are the scores that decide speed.  Placement works on the *binned*
scores of the job's class (bin levels, 1.0 = median bin); the locality
penalty comes from the model's ``locality`` factor for the job's model
(1.0 when the model has none), unless ``locality_penalty`` is given.
Without a variability factor every GPU counts as a median GPU (one bin; PAL
then only weighs locality) and a warning says so; ``require_scores=True``
makes that an error instead.  Both
policies are non-sticky (every round re-places every job; a job placed on the
GPUs it already holds does not move) and deterministic.

**Placement priority.**  As in PAL, the jobs of the order policy's queue that
fit the cluster together (the prefix whose GPU demands sum to at most the
cluster size) are placed class by class, A (most variability-sensitive)
first, so compute-bound jobs get first pick of the fast GPUs; inside a class
the order policy's order is kept (``priority="class"``, PAL's artifact), or
larger jobs go first (``priority="class-size"``, they have the fewest good
options).  Jobs past the prefix follow in queue order (backfill; with
``backfill=False`` they wait, as in PAL's artifact).
``priority="queue"`` keeps the order policy's order unchanged.

**PM-First** takes the job's ``N`` free GPUs with the best (lowest) raw
PM-scores for its class, ties by GPU id, with no locality tie-break: the
paper's PM-First (SC'24, Sec. IV).  ``-P pm_sort=binned`` sorts by binned
level instead and, among GPUs of the same level, prefers nodes whose count of
free GPUs of that level best matches what is still needed (PAL's best-match
locality score), then lower node and GPU ids: PAL's artifact.

**PAL** walks the LV matrix: every (level ``v``, within/across) pair has the
LV-product ``v * L`` with ``L = 1`` inside a node and ``L = penalty`` across
nodes; candidates are tried in increasing LV-product (:func:`lv_order`; ties
prefer within-node, then the lower level).  A *within* entry at level ``v``
is feasible when some node has ``N`` free GPUs of level <= ``v``; an *across*
entry when the whole cluster has.  The first feasible entry is found in
closed form instead of walking the list: the best within-node choice has
level ``v_w`` = the smallest, over nodes, ``N``-th best free level on that
node, the best across choice ``v_a`` = the ``N``-th best free level in the
cluster; within wins iff ``v_w <= v_a * penalty``.  Within, among the nodes
reaching ``v_w``, the one with fewest free GPUs is taken (best fit; PAL's
artifact takes the node with the most qualifying GPUs, which fragments
nodes); across, PM-First picks among the GPUs of level <= ``v_a``.  Jobs of
one GPU or of more GPUs than a node holds are placed by PM-First (as PAL).

Speed: per class the GPUs are pre-sorted by (level, node, GPU) and, per node,
by level; a decision is a few O(G) numpy passes over boolean masks (no Python
loop over GPUs), see ``benchmarks/bench_pal.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.cluster import Cluster
from ..core.plan import Part
from ..perf.model import LocalityFactor
from ..perf.variability import PMScores, VariabilityFactor
from .base import FreeState, PlacePolicy, PolicyError, Request, View, register, split_parts


def lv_order(levels: Sequence[float], l_within: float = 1.0, l_across: float = 1.7) -> list[tuple[float, bool, float]]:
    """PAL's LV matrix traversal: ``(level, within_node, level * L)`` by increasing product.

    Ties go to within-node entries, then to the lower level.
    """
    if l_within <= 0 or l_across <= 0:
        raise ValueError("locality penalties must be > 0")
    out = [(float(v), True, float(v) * l_within) for v in levels]
    out += [(float(v), False, float(v) * l_across) for v in levels]
    out.sort(key=lambda t: (t[2], not t[1], t[0]))
    return out


@dataclass(slots=True)
class _ClassView:
    vals: np.ndarray  # (G,) binned level per GPU
    order: np.ndarray  # (G,) GPU ids sorted by (level, node, id)
    order_vals: np.ndarray  # vals[order]
    node_sorted: np.ndarray  # (N, gmax) GPU ids per node sorted by level; padding -> G (never free)
    node_vals: np.ndarray  # (N, gmax) their levels; padding inf


class _Scores:
    """Per-class arrays for one cluster and one variability factor, built once."""

    def __init__(self, cluster: Cluster, factor: VariabilityFactor) -> None:
        self.cluster = cluster
        self.factor = factor
        g = cluster.num_gpus
        node = cluster.gpu_node
        sizes = np.diff(cluster.gpu_offset)
        self.gmax = int(sizes.max())
        n = cluster.num_nodes
        pad = np.full((n, self.gmax), g, dtype=np.int64)
        col = np.arange(g) - cluster.gpu_offset[node]
        pad[node, col] = np.arange(g)
        self.classes: dict[int, _ClassView] = {}
        self._pad = pad

    def cls(self, c: int) -> _ClassView:
        v = self.classes.get(c)
        if v is None:
            vals = self.factor.bins(c).values.astype(np.float64)
            g = vals.size
            node = self.cluster.gpu_node
            order = np.lexsort((np.arange(g), node, vals))
            ext = np.append(vals, np.inf)
            pv = ext[self._pad]
            srt = np.argsort(pv, axis=1, kind="stable")
            ns = np.take_along_axis(self._pad, srt, axis=1)
            v = _ClassView(vals, order, vals[order], ns, ext[ns])
            self.classes[c] = v
        return v


_UNIFORM = "uniform (no PM-scores in the model)"


class _VariabilityPlace(PlacePolicy):
    sticky = False
    dynamic = False
    arranges = True  # classes first (arrange)
    #: PM-scores (uniform without, unless ``require_scores``) and per-model locality penalties
    reads_factors = PlacePolicy.reads_factors | {"variability", "locality"}

    def __init__(self, locality_penalty: float | None = None, priority: str = "class",
                 require_scores: bool = False, backfill: bool | str = True) -> None:
        super().__init__(backfill)
        if locality_penalty is not None and locality_penalty < 1.0:
            raise ValueError(f"locality_penalty must be >= 1, got {locality_penalty}")
        if priority not in ("class", "class-size", "queue"):
            raise ValueError(f"priority must be class, class-size or queue, got {priority!r}")
        self.locality_penalty = locality_penalty
        self.priority = priority
        self.require_scores = require_scores
        self._state: _Scores | None = None

    # -- shared machinery -----------------------------------------------------
    def scores(self, view: View) -> _Scores:
        f = view.model.get("variability")
        if not isinstance(f, VariabilityFactor):
            if self.require_scores:
                raise PolicyError(
                    f"place policy {self.name!r} needs PM-scores: add a variability factor to the throughput "
                    "model (gpuloom.perf.variability.add_variability)"
                )
            st = self._state
            if st is not None and st.cluster is view.cluster and st.factor.pm.source == _UNIFORM:
                return st
            warnings.warn(
                f"place policy {self.name!r}: the throughput model has no PM-scores, every GPU counts as a "
                "median GPU (add_variability to use measured or generated scores)",
                stacklevel=2,
            )
            f = VariabilityFactor(PMScores(np.ones((view.cluster.num_gpus, 4)), _UNIFORM))
        st = self._state
        if st is None or st.factor is not f or st.cluster is not view.cluster:
            if f.scores.shape[0] != view.cluster.num_gpus:
                raise PolicyError(
                    f"place policy {self.name!r}: PM-scores cover {f.scores.shape[0]} GPUs, "
                    f"the cluster has {view.cluster.num_gpus}"
                )
            st = _Scores(view.cluster, f)
            self._state = st
        return st

    def penalty(self, req: Request, view: View) -> float:
        if self.locality_penalty is not None:
            return self.locality_penalty
        loc = view.model.get("locality")
        return float(loc.penalty_for(req.job.spec.model)) if isinstance(loc, LocalityFactor) else 1.0

    def priority_order(self, requests: Sequence[Request], view: View) -> list[Request]:
        if self.priority == "queue":
            return list(requests)
        f = self.scores(view).factor
        cap = view.cluster.num_gpus
        used = 0
        cut = len(requests)
        for i, r in enumerate(requests):
            used += r.gpus
            if used > cap:
                cut = i
                break
        head = list(requests[:cut])
        if self.priority == "class":
            head.sort(key=lambda r: f.job_class(r.job))
        else:
            head.sort(key=lambda r: (f.job_class(r.job), -r.gpus))
        return head + list(requests[cut:])

    def arrange(self, requests: Sequence[Request], view: View, preemptive: bool = True) -> list[Request]:
        """PAL's placement priority (see the module notes), then the base rule (running first if not preemptive)."""
        return super().arrange(self.priority_order(requests, view), view, preemptive)

    def _parts(self, req: Request, free: FreeState, gpus: np.ndarray) -> tuple[Part, ...] | None:
        cl = free.cluster
        nodes = cl.gpu_node[gpus]
        by_node: dict[int, list[int]] = {}
        for g, n in zip(gpus.tolist(), nodes.tolist(), strict=True):
            by_node.setdefault(n, []).append(g)
        parts = split_parts(cl, req, by_node)
        return parts if free.fits(parts, len(req.jobs)) else None

    @staticmethod
    def pm_first(cv: _ClassView, free: FreeState, k: int) -> np.ndarray | None:
        """The ``k`` best free GPUs (PM-First), or None if fewer are free."""
        idx = np.flatnonzero(free.gpu_free[cv.order])  # (much faster than boolean-mask indexing)
        if idx.size < k:
            return None
        cand = cv.order[idx]
        cvals = cv.order_vals[idx]
        v_a = cvals[k - 1]
        lo = int(np.searchsorted(cvals, v_a, side="left"))
        hi = int(np.searchsorted(cvals, v_a, side="right"))
        if hi <= k:
            return cand[:k]
        need = k - lo
        tie = cand[lo:hi]
        tnode = free.cluster.gpu_node[tie]
        cnt = np.bincount(tnode)[tnode]  # free GPUs of this level on the same node
        pick = np.lexsort((tie, tnode, np.abs(cnt - need)))[:need]
        return np.concatenate([cand[:lo], tie[pick]])

    @staticmethod
    def best_within(cv: _ClassView, free: FreeState, k: int) -> tuple[float, np.ndarray] | None:
        """(level, GPUs) of the best single-node set of ``k`` free GPUs, or None."""
        fm = np.append(free.gpu_free, False)[cv.node_sorted]
        cs = np.cumsum(fm, axis=1, dtype=np.int32)
        ok = np.flatnonzero(cs[:, -1] >= k)
        if ok.size == 0:
            return None
        pos = np.argmax(cs[ok] >= k, axis=1)
        kth = cv.node_vals[ok, pos]
        v_w = kth.min()
        best = ok[kth == v_w]
        node = int(best[np.argmin(cs[best, -1])])
        row = cv.node_sorted[node][fm[node]][:k]
        return float(v_w), row


@register("place", "pm-first")
class PMFirst(_VariabilityPlace):
    """PM-First: the job's N best free GPUs for its class, wherever they are.

    ``pm_sort="raw"`` (default, the paper): by raw PM-score, ties by GPU id;
    ``"binned"``: by binned level with the best-match locality tie-break (the artifact).
    """

    def __init__(self, locality_penalty: float | None = None, priority: str = "class",
                 require_scores: bool = False, backfill: bool | str = True, pm_sort: str = "raw") -> None:
        super().__init__(locality_penalty, priority, require_scores, backfill)
        if pm_sort not in ("raw", "binned"):
            raise ValueError(f"pm_sort must be raw or binned, got {pm_sort!r}")
        self.pm_sort = pm_sort
        self._raw: dict[tuple[int, int], np.ndarray] = {}

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        st = self.scores(view)
        c = st.factor.job_class(req.job)
        if self.pm_sort == "raw":
            key = (id(st), c)
            order = self._raw.get(key)
            if order is None:
                raw = np.asarray(st.factor.scores, dtype=np.float64)
                col = raw[:, c] if raw.ndim == 2 else raw
                order = self._raw[key] = np.lexsort((np.arange(col.size), col))
            idx = np.flatnonzero(free.gpu_free[order])
            if idx.size < req.gpus:
                return None
            return self._parts(req, free, order[idx[: req.gpus]])
        cv = st.cls(c)
        gpus = self.pm_first(cv, free, req.gpus)
        return None if gpus is None else self._parts(req, free, gpus)


@register("place", "pal")
class PAL(_VariabilityPlace):
    """PAL: the candidate GPU set with the lowest LV-product (locality x variability)."""

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        st = self.scores(view)
        cv = st.cls(st.factor.job_class(req.job))
        k = req.gpus
        across = self.pm_first(cv, free, k)
        if across is None:
            return None
        if k == 1 or k > st.gmax:
            return self._parts(req, free, across)
        within = self.best_within(cv, free, k)
        if within is not None:
            v_a = float(cv.vals[across].max())
            if within[0] <= v_a * self.penalty(req, view):
                parts = self._parts(req, free, within[1])
                if parts is not None:
                    return parts
        return self._parts(req, free, across)
