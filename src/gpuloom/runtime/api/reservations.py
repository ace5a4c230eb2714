"""``/reservations``: advance reservations (Slurm's ``scontrol create reservation``), made and removed by admins.

``POST /reservations`` ``{"name"?, "nodes": [...] | "gpus": K, "start": "now+1h", "duration": "2h", "users": [...]}``
(admin) stores one and hands it to the scheduler at once; ``GET /reservations`` lists them (anyone), with
the GPUs each keeps this round; ``DELETE /reservations/{name}`` (admin).  A bad request is refused with
422 naming the field; a name taken or a node reserved twice over overlapping windows with 409.  The
stored reservations are handed to the scheduler when the API starts (:func:`sync`), so they survive a
restart.
"""

# (no ``from __future__ import annotations``: the endpoints' annotations name a dependency made in mount())

import dataclasses
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi import Path as PathParam
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field

from ...core.reservations import NAME_RE, Reservation, ReservationError, check_overlaps
from ...core.units import parse_wall_time
from ..service.service import Service
from ..state import reservations as stored
from ..state.specs import parse_duration

_LIST = re.compile(r"[,\s]+")
USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class ReservationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, max_length=64)
    nodes: list[str] | str | None = None
    gpus: int | None = Field(None, ge=1, le=1_000_000, strict=True)
    start: str | float = "now"
    duration: str | float
    users: list[str] | str


def _names(v: list[str] | str | None) -> tuple[str, ...]:
    items = v if isinstance(v, list) else _LIST.split(v or "")
    return tuple(x.strip() for x in items if x.strip())


def _refuse(field: str, msg: str) -> HTTPException:
    return HTTPException(422, [{"loc": ["body", field], "msg": msg, "type": "reservation"}])


def check_submit(store: Any, name: str, user: str) -> None:
    """Refuse a job for reservation ``name`` that does not exist (422) or does not admit ``user`` (403)."""
    r = next((r for r in stored.load(store) if r.name == name), None)
    if r is None:
        raise _refuse("reservation", f"no reservation {name!r}")
    if not r.admits(user):
        raise HTTPException(403, f"reservation {name!r} is not open to {user!r} (users: {', '.join(sorted(r.users))})")


def sync(service: Service) -> None:
    """Hand the stored reservations to the scheduler's backfill hook, in service time (adding the hook,
    with no reservations of waiting jobs, to a scheduler without one)."""
    rs = stored.load(service.store)
    shift = service.now() - service.clock.time()
    with service.lock:
        hook = service.scheduler.backfill
        if hook is None:
            if not rs:
                return
            hook = service.scheduler.reserve(0)
        hook.reservations = [dataclasses.replace(r, start=r.start + shift, end=r.end + shift) for r in rs]


class _Gauges(Collector):
    """``gpuloom_reservation_gpus{name,state}`` (the GPUs it keeps: its nodes' or its count) and
    ``gpuloom_reservation_start_seconds`` / ``_end_seconds`` (Unix time), read at scrape time."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def describe(self) -> Any:
        return iter(())  # (computed at scrape time)

    def collect(self) -> Any:
        svc = self.service
        now = svc.clock.time()
        per_node = {n.name: n.gpus for n in svc.cluster.nodes}
        gpus = GaugeMetricFamily("gpuloom_reservation_gpus", "GPUs an advance reservation keeps.",
                                 labels=["name", "state"])
        start = GaugeMetricFamily("gpuloom_reservation_start_seconds", "When a reservation begins (Unix time).",
                                  labels=["name"])
        end = GaugeMetricFamily("gpuloom_reservation_end_seconds", "When a reservation ends (Unix time).",
                                labels=["name"])
        for r in stored.load(svc.store):
            d = stored.as_json(r, now)
            gpus.add_metric([r.name, d["state"]], r.gpus or sum(per_node.get(n, 0) for n in r.nodes))
            start.add_metric([r.name], r.start)
            end.add_metric([r.name], r.end)
        yield from (gpus, start, end)


def mount(app: FastAPI, service: Service, auth: Callable[..., tuple[str, bool]]) -> None:
    Auth = Annotated[tuple[str, bool], Depends(auth)]
    store = service.store
    sync(service)
    service.telemetry.registry.register(_Gauges(service))

    def admin(who: tuple[str, bool], what: str) -> None:
        if not who[1]:
            raise HTTPException(403, f"only an admin may {what} reservations")

    @app.post("/reservations", status_code=201, tags=["operations"])
    def create(body: ReservationCreate, who: Auth) -> dict[str, Any]:
        admin(who, "create")
        now = service.clock.time()
        existing = stored.load(store)
        name = body.name or next(f"resv{k}" for k in range(1, len(existing) + 2)
                                 if f"resv{k}" not in {r.name for r in existing})
        if not NAME_RE.match(name):
            raise _refuse("name", "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        try:
            start = parse_wall_time(body.start, now, "start")
        except ValueError as e:
            raise _refuse("start", str(e)) from None
        try:
            duration = parse_duration(body.duration, "duration")
        except ValueError as e:
            raise _refuse("duration", str(e)) from None
        users = _names(body.users)
        bad = [u for u in users if not USER_RE.match(u)]
        if bad:
            raise _refuse("users", f"not a user name: {bad[0][:64]!r}")
        if start + duration <= now:
            raise _refuse("start", "the reservation would be over before it is made")
        try:
            r = Reservation(name, start, start + duration, frozenset(users), _names(body.nodes), body.gpus or 0)
            r.check(service.cluster)
        except ReservationError as e:
            field = next((f for f in ("nodes", "gpus", "users", "duration") if f"{f}" in str(e)), "body")
            raise _refuse(field, str(e)) from None
        try:
            check_overlaps([*existing, r])
        except ReservationError as e:
            raise HTTPException(409, str(e)) from None
        stored.add(store, r, who[0], now)
        sync(service)
        return stored.as_json(r, now)

    @app.get("/reservations", tags=["operations"])
    def listing(who: Auth) -> list[dict[str, Any]]:
        now = service.clock.time()
        hook = service.scheduler.backfill
        kept = dict(hook.kept) if hook is not None else {}
        return [stored.as_json(r, now, kept.get(r.name)) for r in stored.load(store)]

    @app.delete("/reservations/{name}", tags=["operations"])
    def remove(name: Annotated[str, PathParam(max_length=64)], who: Auth) -> dict[str, Any]:
        admin(who, "delete")
        if not stored.remove(store, name):
            raise HTTPException(404, f"no reservation {name[:64]!r}")
        sync(service)
        return {"name": name, "deleted": True}
