"""The audit trail's endpoint, mounted on the API by :func:`mount` (admins only).

=============================  =================================================
``GET /audit``                 who did what, from ``?since=`` (Unix seconds) on,
                               ``?actor=`` (a user, or ``scheduler``),
                               ``?kind=`` (``cancel``, ``token.create``, or a
                               family: ``token``, ``queue``), ``?limit=``
                               (:mod:`..state.audit`); a full page names the next in
                               ``X-Next-After`` (``?after=``)
=============================  =================================================

A user who is not an admin gets 403: the trail names every user's actions.
"""

# (no ``from __future__ import annotations``: the endpoint's annotations name a dependency made in mount())
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Response

from ..service.service import Service
from ..state.audit import MAX_TRAIL, parse_cursor, trail
from ..state.history import iso

NAME_RE = r"^[A-Za-z0-9_.@-]{1,64}$"
KIND_RE = r"^[a-z][a-z0-9_.-]{0,39}$"


def mount(app: FastAPI, service: Service, auth: Callable[..., tuple[str, bool]]) -> None:
    """Add ``GET /audit`` to ``app`` (``auth``: the API's token dependency)."""
    Auth = Annotated[tuple[str, bool], Depends(auth)]

    @app.get("/audit", tags=["operations"])
    def audit(
        who: Auth,
        response: Response,
        since: Annotated[float | None, Query(ge=0, le=1e11, allow_inf_nan=False)] = None,
        actor: Annotated[str | None, Query(pattern=NAME_RE)] = None,
        kind: Annotated[str | None, Query(pattern=KIND_RE)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_TRAIL)] = 1000,
        after: Annotated[str | None, Query(max_length=80)] = None,
    ) -> list[dict[str, Any]]:
        """Audit records by time (admins only): ``time`` (ISO 8601), ``actor``, ``kind``, ``subject`` (the
        user concerned), ``target``, ``job``, ``detail``, ``cursor``.  A full page names the next in
        ``X-Next-After``: its last record's cursor, to give as ``after``."""
        if not who[1]:
            raise HTTPException(403, "only an admin may read the audit trail")
        try:
            cursor = None if after is None else parse_cursor(after)
        except ValueError as e:
            raise HTTPException(422, [{"loc": ["query", "after"], "msg": str(e), "type": "bad_cursor"}]) from None
        recs = trail(service.store, since, actor, kind, limit, cursor)
        if len(recs) == limit:
            response.headers["X-Next-After"] = recs[-1]["cursor"]
        return [{**r, "time": iso(r["time"]), "t": r["time"]} for r in recs]
