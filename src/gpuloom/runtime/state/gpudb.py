"""Tables of GPU telemetry and of the dashboard's time series, on the store's metadata.

* ``gpu_usage``: one row per job that held GPUs while NVML was sampled: samples taken, the sum
  and the maximum of its GPUs' mean utilisation, the most memory its GPUs held at once, and the
  energy they drew (None where a GPU had no power sensor);
* ``series``: the cluster sampled over time, one row per point (``doc``: JSON of GPUs allocated
  and busy, jobs pending and running, GPUs used per queue), in two tiers: ``step`` = the sample
  interval for the last :data:`FINE_KEEP_S`, and :data:`COARSE_S` averages kept for
  :data:`COARSE_KEEP_S` (so the table holds at most about 43,200 + 8,640 rows at 2 s samples).

Writes are not fsynced one by one (``durable=False``, SQLite's NORMAL): a crash may lose the
last points, never the database; a full disk raises :class:`~.store.StoreFull` as elsewhere.
The tables are defined with the others in :mod:`.store`, so the store's own ``create_all`` makes
them: an older database gains them when it opens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update

from .store import gpu_usage_t, series_t

if TYPE_CHECKING:
    from .store import Store

FINE_KEEP_S = 24 * 3600.0
COARSE_S = 300.0
COARSE_KEEP_S = 30 * 86400.0

# -- per-job GPU usage ------------------------------------------------------------------------------
def load_usage(store: Store, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    with store.lock, store.engine.connect() as c:
        rows = c.execute(select(gpu_usage_t).where(gpu_usage_t.c.job_id.in_(ids))).mappings().all()
    return {int(r["job_id"]): dict(r) for r in rows}


def save_usage(store: Store, rows: Mapping[int, Mapping[str, Any]], known: set[int]) -> None:
    """Write these jobs' rows (``known``: the ids already stored, updated; the others inserted)."""
    if not rows:
        return
    with store.lock, store._begin(durable=False) as c:
        for jid, r in rows.items():
            vals = {k: r[k] for k in ("samples", "util_sum", "util_max", "mem_max_mb", "energy_j", "updated")}
            if jid in known:
                c.execute(update(gpu_usage_t).where(gpu_usage_t.c.job_id == jid).values(**vals))
            else:
                c.execute(insert(gpu_usage_t).values(job_id=jid, **vals))


def usage_summary(r: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row as shown (``show``, ``history``): mean and max utilisation, max memory, energy."""
    n = int(r["samples"])
    return {"gpu_util_mean": round(r["util_sum"] / n, 1) if n else None, "gpu_util_max": r["util_max"],
            "gpu_mem_max_mb": round(r["mem_max_mb"], 1),
            "gpu_energy_wh": None if r["energy_j"] is None else round(r["energy_j"] / 3600.0, 3),
            "gpu_samples": n}


def job_usage(store: Store, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Job id -> :func:`usage_summary` for the jobs that have a row."""
    return {j: usage_summary(r) for j, r in load_usage(store, job_ids).items()}


# -- the time series -----------------------------------------------------------------------------------
def add_points(store: Store, points: Iterable[tuple[float, float, Mapping[str, Any]]]) -> None:
    """Store (time, step, doc) points."""
    rows = [{"time": t, "step": s, "doc": json.dumps(d, separators=(",", ":"))} for t, s, d in points]
    if not rows:
        return
    with store.lock, store._begin(durable=False) as c:
        c.execute(insert(series_t), rows)


def prune(store: Store, now: float, fine_step: float) -> None:
    """Drop fine points older than FINE_KEEP_S and coarse ones older than COARSE_KEEP_S."""
    with store.lock, store._begin(durable=False) as c:
        c.execute(delete(series_t).where(series_t.c.step < COARSE_S, series_t.c.time < now - FINE_KEEP_S))
        c.execute(delete(series_t).where(series_t.c.step >= COARSE_S, series_t.c.time < now - COARSE_KEEP_S))


def points(store: Store, since: float, until: float | None = None,
           coarse: bool = False) -> list[tuple[float, float, dict[str, Any]]]:
    """(time, step, doc) from ``since`` on, by time: coarse points where no fine one is kept, fine ones
    after; with ``coarse``, coarse points wherever there are some, fine ones only after the last."""
    is_fine, is_coarse = series_t.c.step < COARSE_S, series_t.c.step >= COARSE_S
    with store.lock, store.engine.connect() as c:
        q = select(series_t.c.time, series_t.c.step, series_t.c.doc).where(series_t.c.time >= since)
        if until is not None:
            q = q.where(series_t.c.time <= until)
        if coarse:
            end = c.execute(select(series_t.c.time + series_t.c.step).where(is_coarse)
                            .order_by(series_t.c.time.desc()).limit(1)).scalar()
            first = q.where(is_coarse)
            later = q.where(is_fine) if end is None else q.where(is_fine, series_t.c.time >= end)
        else:
            start = c.execute(select(series_t.c.time).where(is_fine, series_t.c.time >= since)
                              .order_by(series_t.c.time).limit(1)).scalar()
            first = q.where(is_coarse) if start is None else q.where(is_coarse, series_t.c.time + series_t.c.step <= start)
            later = q.where(is_fine)
        rows = list(c.execute(first.order_by(series_t.c.time))) + list(c.execute(later.order_by(series_t.c.time)))
    return [(float(t), float(s), json.loads(d)) for t, s, d in rows]
