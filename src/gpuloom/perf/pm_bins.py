"""PM-score binning and application classes (PAL): 1-D k-means bins per class, 2-D k-means classes.

Split from :mod:`gpuloom.perf.variability`, which builds on it: PAL places jobs
on *binned* scores (a few levels per class), and groups applications into
classes by their variability profile.  Pure numpy, deterministic for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

CLASSES = ("A", "B", "C", "D")
CLASS_INDEX = {c: i for i, c in enumerate(CLASSES)}


class VariabilityError(ValueError):
    """Unusable variability data; the message names the file, line or value."""


# ---------------------------------------------------------------------------
# 1-D binning


@dataclass(frozen=True)
class Bins:
    """Binned scores of one class: ``levels[index[g]]`` is GPU ``g``'s level (ascending levels)."""

    index: np.ndarray  # (G,) int
    levels: np.ndarray  # (B,) ascending, normalised to the median centroid

    @property
    def values(self) -> np.ndarray:
        return self.levels[self.index]


def _kmeans_1d(xs: np.ndarray, k: int, iters: int = 100) -> np.ndarray:
    """Lloyd's k-means on sorted ``xs``; returns the sorted labels (contiguous runs)."""
    c = np.quantile(xs, (np.arange(k) + 0.5) / k)
    c = np.unique(c)
    labels = np.zeros(xs.size, dtype=np.int64)
    for _ in range(iters):
        cuts = (c[1:] + c[:-1]) / 2
        new = np.searchsorted(cuts, xs, side="right")
        used = np.unique(new)
        new = np.searchsorted(used, new)  # drop empty clusters
        cnew = np.bincount(new, weights=xs) / np.bincount(new)
        if new.size == labels.size and np.array_equal(new, labels) and cnew.size == c.size:
            break
        labels, c = new, cnew
    return labels


def _silhouette_1d(xs: np.ndarray, labels: np.ndarray) -> float:
    """Exact mean silhouette for sorted ``xs`` with contiguous ``labels`` (O(n))."""
    n = xs.size
    k = int(labels[-1]) + 1
    if k < 2:
        return -1.0
    P = np.concatenate([[0.0], np.cumsum(xs)])
    starts = np.searchsorted(labels, np.arange(k), side="left")
    ends = np.searchsorted(labels, np.arange(k), side="right")
    s = np.zeros(n)
    for c in range(k):
        lo, hi = starts[c], ends[c]
        m = hi - lo
        if m <= 1:
            continue  # singleton: silhouette 0
        i = np.arange(lo, hi)
        x = xs[lo:hi]
        within = x * (i - lo) - (P[i] - P[lo]) + (P[hi] - P[i + 1]) - x * (hi - i - 1)
        a = within / (m - 1)
        b = np.full(m, np.inf)
        if c > 0:
            l2, h2 = starts[c - 1], ends[c - 1]
            b = np.minimum(b, (x * (h2 - l2) - (P[h2] - P[l2])) / (h2 - l2))
        if c < k - 1:
            l2, h2 = starts[c + 1], ends[c + 1]
            b = np.minimum(b, ((P[h2] - P[l2]) - x * (h2 - l2)) / (h2 - l2))
        den = np.maximum(a, b)
        s[lo:hi] = np.where(den > 0, (b - a) / np.where(den > 0, den, 1.0), 0.0)
    return float(s.mean())


def _best_kmeans_1d(xs: np.ndarray, max_k: int) -> np.ndarray:
    if xs.size < 3 or xs[-1] - xs[0] <= 0:
        return np.zeros(xs.size, dtype=np.int64)
    best, best_s = None, -2.0
    for k in range(2, min(max_k, xs.size - 1) + 1):
        lab = _kmeans_1d(xs, k)
        s = _silhouette_1d(xs, lab)
        if s > best_s + 1e-12:
            best, best_s = lab, s
    return best if best is not None else np.zeros(xs.size, dtype=np.int64)


def bin_scores(scores: np.ndarray, max_k: int = 10, single: bool = False, flat_tol: float = 0.005,
               outlier_sigma: float = 3.0) -> Bins:
    """Bin one class's PM-scores (see the module docstring)."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise VariabilityError("bin_scores: need a non-empty 1-D array")
    med = float(np.median(x))
    p5, p95 = np.percentile(x, [5, 95])
    if single or (p95 - p5) / med < flat_tol:
        return Bins(np.zeros(x.size, dtype=np.int64), np.array([1.0]))
    order = np.argsort(x, kind="stable")
    xs = x[order]
    cut = x.mean() + outlier_sigma * x.std()
    n_in = int(np.searchsorted(xs, cut, side="right"))
    lab_in = _best_kmeans_1d(xs[:n_in], max_k)
    labels = lab_in
    if n_in < xs.size:
        lab_out = _best_kmeans_1d(xs[n_in:], max_k) if xs.size - n_in >= 3 else np.arange(xs.size - n_in)
        labels = np.concatenate([lab_in, lab_out + (int(lab_in[-1]) + 1 if n_in else 0)])
    cent = np.bincount(labels, weights=xs) / np.bincount(labels)
    levels = cent / float(np.median(cent))
    index = np.empty(x.size, dtype=np.int64)
    index[order] = labels
    return Bins(index, levels)


# ---------------------------------------------------------------------------
# application classes from (DRAM, SM) throughput


@dataclass(frozen=True)
class AppClassifier:
    """Centroids of the k-means application classes, compute-bound (A) first."""

    centroids: np.ndarray  # (k, 2): (dram, sm)
    labels: tuple[str, ...]

    def classify(self, dram: float, sm: float) -> str:
        d = np.hypot(self.centroids[:, 0] - dram, self.centroids[:, 1] - sm)
        return self.labels[int(np.argmin(d))]


def fit_app_classes(points: Mapping[str, tuple[float, float]] | np.ndarray, k: int = 4, seed: int = 0,
                    n_init: int = 10) -> tuple[AppClassifier, dict[str, str] | list[str]]:
    """2-D k-means on (DRAM throughput, SM throughput), classes ordered by DRAM share.

    Returns the classifier and the class of every input point (a dict when
    ``points`` is a mapping name -> (dram, sm)).
    """
    names = list(points) if isinstance(points, Mapping) else None
    X = np.asarray([points[n] for n in names] if names is not None else points, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2:
        raise VariabilityError(f"fit_app_classes: expected (n, 2) points, got shape {X.shape}")
    if not 1 <= k <= len(CLASSES) or X.shape[0] < k:
        raise VariabilityError(f"fit_app_classes: need 1 <= k <= 4 and at least k points (k={k}, n={X.shape[0]})")
    rng = np.random.default_rng(seed)
    best_c, best_inertia = None, math.inf
    for _ in range(n_init):
        # k-means++ seeding
        c = [X[int(rng.integers(len(X)))]]
        for _ in range(1, k):
            d2 = np.min(((X[:, None, :] - np.array(c)[None]) ** 2).sum(-1), axis=1)
            tot = d2.sum()
            c.append(X[int(rng.choice(len(X), p=d2 / tot))] if tot > 0 else X[int(rng.integers(len(X)))])
        cen = np.array(c)
        for _ in range(100):
            lab = np.argmin(((X[:, None, :] - cen[None]) ** 2).sum(-1), axis=1)
            new = np.array([X[lab == j].mean(0) if np.any(lab == j) else cen[j] for j in range(k)])
            if np.allclose(new, cen):
                break
            cen = new
        inertia = float(((X - cen[lab]) ** 2).sum())
        if inertia < best_inertia - 1e-12:
            best_c, best_inertia = cen, inertia
    assert best_c is not None
    share = best_c[:, 0] / np.maximum(best_c[:, 0] + best_c[:, 1], 1e-12)
    best_c = best_c[np.argsort(share, kind="stable")]
    clf = AppClassifier(best_c, CLASSES[:k])
    assigned = [clf.classify(float(d), float(s)) for d, s in X]
    return clf, (dict(zip(names, assigned, strict=True)) if names is not None else assigned)
