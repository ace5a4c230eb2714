"""The dashboard's time series, stored: a point per telemetry sample, kept in the database.

Each point (:meth:`SeriesRecorder.add`) is telemetry's sample (GPUs in all, allocated and busy,
jobs pending and running) with the GPUs each queue's running jobs hold (``queues``).  Points are
written in batches of :data:`FLUSH_EVERY` (and when the service stops), so a crash loses at most
that many; each :data:`~..state.gpudb.COARSE_S` window is also written as one averaged point,
which outlives the fine ones (:mod:`..state.gpudb` for the retention).  :func:`downsample` turns
what is read back into at most one point per ``step`` seconds for ``GET /stats/series``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..state import gpudb
from ..state.store import Store, unavailable

log = logging.getLogger("gpuloom.service")
FLUSH_EVERY = 5
PRUNE_EVERY_S = 600.0
MAX_UNSAVED = 5000  # points kept while the store refuses them (the oldest are dropped beyond)


def mean_point(points: Sequence[Mapping[str, Any]], t: float) -> dict[str, Any]:
    """The average of points (numbers, and the ``queues`` mapping key by key), dated ``t``."""
    n = len(points)
    out: dict[str, Any] = {"time": t}
    for k in points[0]:
        if k not in ("time", "queues"):
            out[k] = sum(float(p.get(k, 0.0)) for p in points) / n
    queues: dict[str, float] = {}
    for p in points:
        for q, v in (p.get("queues") or {}).items():
            queues[q] = queues.get(q, 0.0) + float(v) / n
    if queues or any("queues" in p for p in points):
        out["queues"] = queues
    return out


def downsample(points: Sequence[Mapping[str, Any]], step: float) -> list[dict[str, Any]]:
    """At most one point per ``step`` seconds (aligned to multiples of it): the mean of those in it,
    dated at its first point."""
    out: list[dict[str, Any]] = []
    bucket: list[Mapping[str, Any]] = []
    key = None
    for p in points:
        k = math.floor(float(p["time"]) / step)
        if bucket and k != key:
            out.append(mean_point(bucket, float(bucket[0]["time"])))
            bucket = []
        key = k
        bucket.append(p)
    if bucket:
        out.append(mean_point(bucket, float(bucket[0]["time"])))
    return out


class SeriesRecorder:
    def __init__(self, store: Store, step: float) -> None:
        self.store = store
        self.step = step  # the fine points' interval (telemetry's sample_s)
        self.unsaved: list[tuple[float, float, dict[str, Any]]] = []
        self._window: list[dict[str, Any]] = []  # the fine points of the current coarse window
        self._pruned = -math.inf

    def add(self, point: Mapping[str, Any]) -> None:
        p = dict(point)
        t = float(p["time"])
        if self._window and math.floor(t / gpudb.COARSE_S) != math.floor(float(self._window[0]["time"]) / gpudb.COARSE_S):
            start = math.floor(float(self._window[0]["time"]) / gpudb.COARSE_S) * gpudb.COARSE_S
            coarse = mean_point(self._window, start)
            self.unsaved.append((start, gpudb.COARSE_S, {k: v for k, v in coarse.items() if k != "time"}))
            self._window = []
        self._window.append(p)
        self.unsaved.append((t, self.step, {k: v for k, v in p.items() if k != "time"}))
        if len(self.unsaved) >= FLUSH_EVERY:
            self.flush(t)

    def flush(self, now: float | None = None) -> None:
        if not self.unsaved:
            return
        try:
            gpudb.add_points(self.store, self.unsaved)
            self.unsaved = []
            if now is not None and now - self._pruned >= PRUNE_EVERY_S:
                gpudb.prune(self.store, now, self.step)
                self._pruned = now
        except Exception as e:
            if not unavailable(e):
                raise
            log.debug("time series not stored this time: %s", e)
            del self.unsaved[:-MAX_UNSAVED]

    def read(self, since: float, until: float | None = None, coarse: bool = False) -> list[dict[str, Any]]:
        """Fine and coarse points from ``since`` (the stored ones, then those not written yet), by time;
        ``coarse``: the coarse ones wherever there are some (a long range read cheaply)."""
        got = [{"time": t, "step": s, **d} for t, s, d in gpudb.points(self.store, since, until, coarse)]
        last = max((p["time"] for p in got if p["step"] < gpudb.COARSE_S), default=-math.inf)
        got += [{"time": t, "step": s, **d} for t, s, d in self.unsaved
                if s < gpudb.COARSE_S and t > last and t >= since and (until is None or t <= until)]
        return got
