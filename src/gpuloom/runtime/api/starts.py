"""``GET /starts``: the waiting jobs in the order they would start, with estimated starts (``squeue --start``).

Positions and estimates come from the last round's backfill plan (:mod:`..service.starts`).
"""

# (no ``from __future__ import annotations``: the endpoint's annotations name a dependency made in mount())

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI

from ..service.service import Service
from ..service.starts import pending_starts


def mount(app: FastAPI, service: Service, auth: Callable[..., tuple[str, bool]]) -> None:
    Auth = Annotated[tuple[str, bool], Depends(auth)]

    @app.get("/starts", tags=["operations"])
    def starts(who: Auth) -> list[dict[str, Any]]:
        """Every waiting job the scheduler has seen, by position: ``id``, ``user``, ``name``, ``queue``,
        ``gpus``, ``pending_reason``, ``queue_position`` (overall), ``queue_position_in_queue`` and
        ``est_start`` (ISO 8601 UTC; null beyond the reserved jobs)."""
        rows = dict(service.mirror.rows)
        out = []
        for jid, d in sorted(pending_starts(service).items(), key=lambda kv: kv[1]["queue_position"]):
            row = rows.get(jid)
            if row is None:
                continue
            job = {"id": row.id, "user": row.user, "name": row.name, "queue": str(row.spec.get("queue") or ""),
                   "gpus": row.spec.get("gpus"), "pending_reason": row.pending_reason, **d}
            out.append(job)  # (nothing private: what `queue` shows everyone)
        return out
