"""Operator control endpoints, mounted on the API by :func:`mount` (:mod:`..service.control`).

================================  ==============================================================
``POST /nodes/{name}/drain``      ``{"reason", "mode": "wait"|"checkpoint"}`` (admin)
``POST /nodes/{name}/resume``     back in service (admin)
``POST /nodes/{name}/maintenance`` ``{"start", "duration", "reason"}``: a window (admin)
``POST /jobs/{id}/update``        a pending job's ``{"gpus", "time_limit", "queue", "priority"}``
                                  (scontrol update), through the submission's checks
``POST /jobs/actions``            ``{"action": cancel|hold|release|requeue, "jobs": ["16", "16_3",
                                  "16_[1-5]"], "user", "state", "queue", "name"}``: per job, what
                                  was done; others' jobs: ``denied`` (named) or ``skipped`` (count)
================================  ==============================================================
"""

# (no ``from __future__ import annotations``: the endpoints' annotations name a dependency made in mount())
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from ...core.queues import QueueError
from ...core.units import parse_wall_time
from ..service.bulk import ACTIONS, SelectError, Selector, apply, select
from ..service.control import ControlError
from ..service.errors import NotFound, PermissionDenied, SubmitError
from ..service.queues import QueueDenied
from ..service.service import Service
from ..state.specs import parse_duration

NodeName = Annotated[str, PathParam(max_length=255)]


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(max_length=500)
    mode: str = Field("wait", max_length=20)


class MaintenanceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: str | float = Field(description="now, now+1h, seconds since the epoch, or ISO 8601 (UTC)")
    duration: str | float = Field(description="2h, 30m, 1:30:00 or seconds")
    reason: str = Field(max_length=500)


class UpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int | None = Field(None, ge=1, le=1_000_000, strict=True)
    time_limit: str | float | None = Field(None, description="as at submission: 1:30:00, 90m, 2h")
    queue: str | None = Field(None, max_length=255)
    priority: int | None = Field(None, ge=-(10**9), le=10**9, strict=True)


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str = Field(max_length=20)
    jobs: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=10_000)
    user: str | None = Field(None, max_length=255)
    state: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=20)
    queue: str | None = Field(None, max_length=255)
    name: str | None = Field(None, max_length=255)


@contextmanager
def node_errors(name: str) -> Iterator[None]:
    """A node route's errors as HTTP: no such node -> 404, a request that cannot be carried out -> 422."""
    try:
        yield
    except NotFound:
        raise HTTPException(404, f"no node {name!r}") from None
    except ControlError as e:
        raise HTTPException(422, str(e)) from None


def mount(app: FastAPI, service: Service, auth: Callable[..., tuple[str, bool]]) -> None:
    Auth = Annotated[tuple[str, bool], Depends(auth)]
    ctl = service.control

    def admin_only(who: tuple[str, bool], what: str) -> None:
        if not who[1]:
            raise HTTPException(403, f"{what} needs the admin token")

    def node_out(name: str) -> dict[str, Any]:
        for n in service.nodes():
            if n["name"] == name:
                return n
        raise HTTPException(404, f"no node {name!r}")

    @app.post("/nodes/{name}/drain", tags=["operations"])
    def drain(name: NodeName, body: DrainBody, who: Auth) -> dict[str, Any]:
        """Drain a node: ``wait`` lets its jobs finish, ``checkpoint`` moves them elsewhere."""
        admin_only(who, "draining a node")
        with node_errors(name):
            ctl.drain(name, body.reason, body.mode, who[0])
        return node_out(name)

    @app.post("/nodes/{name}/resume", tags=["operations"])
    def resume(name: NodeName, who: Auth) -> dict[str, Any]:
        admin_only(who, "resuming a node")
        with node_errors(name):
            ctl.resume(name, who[0])
        return node_out(name)

    @app.post("/nodes/{name}/maintenance", tags=["operations"])
    def maintenance(name: NodeName, body: MaintenanceBody, who: Auth) -> dict[str, Any]:
        """A maintenance window: no job that would still run at ``start`` goes there; drained until
        ``start + duration``, then back by itself."""
        admin_only(who, "a maintenance window")
        with node_errors(name):
            try:
                start = parse_wall_time(body.start, service.clock.time(), "start")
            except ValueError as e:
                raise ControlError(str(e), "start") from None
            try:
                dur = float(parse_duration(body.duration))
            except (TypeError, ValueError) as e:
                raise ControlError(f"duration: {e}", "duration") from None
            ctl.maintenance(name, start, dur, body.reason, who[0])
        return node_out(name)

    @app.post("/jobs/{job_id}/update", tags=["jobs"])
    def update(job_id: Annotated[int, PathParam(ge=1, le=2**62)], body: UpdateBody, who: Auth) -> dict[str, Any]:
        """Change a pending job's GPUs, time limit, queue or priority (scontrol update), within what a
        submission may ask: a user may lower a priority, raise it only up to the queue's limit."""
        changes = body.model_dump(exclude_none=True)
        try:
            if "time_limit" in changes:
                changes["time_limit"] = parse_duration(changes["time_limit"], "time_limit")
            row = service.control.update(job_id, changes, who[0], who[1])
        except NotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        except (PermissionDenied, QueueDenied) as e:
            raise HTTPException(403, str(e)) from None
        except (ControlError, SubmitError, QueueError, ValueError) as e:
            raise HTTPException(409 if isinstance(e, ControlError) and e.field == "job" else 422, str(e)) from None
        s = row.spec
        return {"id": row.id, "user": row.user, "state": row.state, "gpus": s.get("gpus"),
                "time_limit": s.get("time_limit"), "queue": str(s.get("queue") or ""), "priority": s.get("priority")}

    @app.post("/jobs/actions", tags=["jobs"])
    def job_actions(body: ActionBody, who: Auth) -> dict[str, Any]:
        """Cancel, hold, release or requeue the jobs selected (ids, array ids, filters), as scancel."""
        if body.action not in ACTIONS:
            raise HTTPException(422, f"action: expected one of {', '.join(ACTIONS)}, got {body.action!r}")
        user, admin = who
        try:
            sel = select(service, Selector(body.jobs, body.user, body.state, body.queue, body.name), user, admin)
        except SelectError as e:
            raise HTTPException(422, str(e)) from None
        if body.jobs and not sel.rows and sel.denied and not sel.missing:
            raise HTTPException(403, f"job(s) {', '.join(map(str, sel.denied))} belong to other users; only "
                                     "their owners or an admin may act on them")
        return apply(service, body.action, sel, user, admin)
