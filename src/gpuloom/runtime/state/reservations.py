"""Advance reservations in the store: the ``reservations`` table, and the times users write for them.

A reservation is stored with wall-clock times (Unix seconds), so it survives a restart; the table is
created on first use where an older database lacks it (:func:`ensure`).  ``start`` is read by
:func:`gpuloom.core.units.parse_wall_time` (``now``, ``now+1h``, an ISO date/time, Unix seconds).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Column, Float, String, Table, Text, delete, insert, select

from ...core.reservations import Reservation
from .store import Store, metadata

reservations_t = Table(
    "reservations",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("start", Float, nullable=False),  # wall seconds
    Column("end", Float, nullable=False),
    Column("users", Text, nullable=False),  # JSON list
    Column("nodes", Text, nullable=False),  # JSON list (empty: a GPU count)
    Column("gpus", Float, nullable=False),
    Column("created", Float, nullable=False),
    Column("creator", String(100), nullable=False),
)

def ensure(store: Store) -> None:
    """Create the table where the database lacks it (one made by an older release)."""
    with store.lock:
        reservations_t.create(store.engine, checkfirst=True)


def load(store: Store) -> list[Reservation]:
    """Every stored reservation (wall-clock times), by start."""
    with store.lock, store.engine.connect() as c:
        rows = c.execute(select(reservations_t).order_by(reservations_t.c.start, reservations_t.c.name)).all()
    return [Reservation(r.name, r.start, r.end, frozenset(json.loads(r.users)), tuple(json.loads(r.nodes)),
                        int(r.gpus)) for r in rows]


def add(store: Store, r: Reservation, creator: str, now: float) -> None:
    with store.lock, store._begin(True) as c:
        c.execute(insert(reservations_t).values(
            name=r.name, start=r.start, end=r.end, users=json.dumps(sorted(r.users)), nodes=json.dumps(list(r.nodes)),
            gpus=float(r.gpus), created=now, creator=creator))


def remove(store: Store, name: str) -> bool:
    """Delete the reservation ``name``; whether there was one."""
    with store.lock, store._begin(True) as c:
        return bool(c.execute(delete(reservations_t).where(reservations_t.c.name == name)).rowcount)


def as_json(r: Reservation, now: float, kept: tuple[int, ...] | None = None) -> dict[str, Any]:
    from .history import iso

    return {"name": r.name, "start": iso(r.start), "end": iso(r.end), "duration_s": r.end - r.start,
            "users": sorted(r.users), "nodes": list(r.nodes), "gpus": r.gpus or None,
            "state": "active" if r.start <= now < r.end else "over" if r.end <= now else "waiting",
            "gpu_ids": list(kept) if kept is not None else None}
