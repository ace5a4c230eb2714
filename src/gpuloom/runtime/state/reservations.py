"""Advance reservations in the store: the ``reservations`` table, and the times users write for them.

A reservation is stored with wall-clock times (Unix seconds), so it survives a restart; the table
(:data:`.store.reservations_t`) is made when the store opens, as the others are.  ``start`` is read by
:func:`gpuloom.core.units.parse_wall_time` (``now``, ``now+1h``, an ISO date/time, Unix seconds).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, insert, select

from ...core.reservations import Reservation
from .store import Store, reservations_t


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
