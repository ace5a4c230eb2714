"""The HTTP API of queues (admin for changes): mounted by :func:`gpuloom.runtime.api.app.create_app`.

=================================  ==================================================
``GET    /queues``                 usage vs quota per queue, users' default queues
``PUT    /queues/{name}``          create or change a queue: ``parent``, ``guarantee``,
                                   ``limit`` (GPUs, or ``{gpus, cpus, mem_gb}``), ``weight``;
                                   who may submit: ``users``, ``groups``, ``open``;
                                   ``max_priority``, ``max_pending``, ``per_user``,
                                   ``per_user_limit`` (:mod:`gpuloom.core.queues`)
``DELETE /queues/{name}``          remove a queue without sub-queues or active jobs
``PUT    /users/{user}/queue``     ``{"queue": NAME}``: the user's default queue (null clears)
``PUT    /queue-default``          ``{"queue": NAME}``: the queue of jobs that name none
``PUT    /groups/{name}``          ``{"users": [...]}``: a group's members (null removes it)
=================================  ==================================================

A change that makes an invalid tree (an unknown parent, a guarantee above its
limit or beyond the cluster) is a 422 naming it; one that would leave active
jobs without a queue a 409 naming them (:mod:`.queues`).

(No ``from __future__ import annotations`` here: FastAPI reads the routes'
annotations, built inside :func:`add_queue_routes`, at run time.)
"""


from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path
from pydantic import BaseModel, ConfigDict, Field

from ...core.queues import MAX_PRIORITY, Queue, QueueError, parse_quota
from ..service.queues import QueueConflict
from ..state.audit import record

#: queue names: a per-user queue is ``<parent>.<user>`` (user names may hold ``@``)
QUEUE_RE = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,129}$"
NAME_RE = r"^[A-Za-z0-9_.@-]{1,64}$"  # users and groups
Names = list[Annotated[str, Field(pattern=NAME_RE)]]


class QueueBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    parent: str | None = Field(None, pattern=QUEUE_RE)
    guarantee: float | dict[str, float] | None = None
    limit: float | dict[str, float] | None = None
    weight: float = Field(1.0, gt=0)
    users: Names = Field(default_factory=list, max_length=10_000)
    groups: Names = Field(default_factory=list, max_length=1000)
    open: bool = False
    max_priority: int | None = Field(None, ge=-MAX_PRIORITY, le=MAX_PRIORITY, strict=True)
    max_pending: int | None = Field(None, ge=0, le=10**9, strict=True)
    per_user: bool = False
    per_user_limit: float | dict[str, float] | None = None


class GroupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    users: Names | None = Field(..., max_length=10_000)


class QueueChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queue: str | None = Field(None, pattern=QUEUE_RE)


def add_queue_routes(app: FastAPI, auth: Any) -> None:
    """Mount the queue endpoints on ``app`` (``auth``: the API's token dependency)."""
    Auth = Annotated[tuple[str, bool], Depends(auth)]
    Name = Annotated[str, Path(pattern=QUEUE_RE)]

    def admin_only(who: tuple[str, bool]) -> None:
        if not who[1]:
            raise HTTPException(403, "only an admin may change queues")

    def change(fn: Any, *args: Any) -> dict[str, Any]:
        admin = app.state.service.queues
        try:
            fn(*args)
        except QueueConflict as e:
            raise HTTPException(409, str(e)) from None
        except QueueError as e:
            raise HTTPException(422, str(e)) from None
        out: dict[str, Any] = admin.usage()
        return out

    def audited(who: tuple[str, bool], kind: str, subject: str | None, target: str | None, detail: Any,
                fn: Any, *args: Any) -> dict[str, Any]:
        """:func:`change`, then its record in the audit trail (only a change that was made)."""
        out = change(fn, *args)
        record(app.state.service.store, who[0], kind, subject, target, detail)
        return out

    @app.get("/queues")
    def queues(who: Auth) -> dict[str, Any]:
        out: dict[str, Any] = app.state.service.queues.usage()
        return out

    @app.put("/queues/{name}")
    def put_queue(name: Name, body: QueueBody, who: Auth) -> dict[str, Any]:
        admin_only(who)
        try:
            q = Queue(name, body.parent, parse_quota(body.guarantee, "guarantee"), parse_quota(body.limit, "limit"),
                      body.weight, tuple(body.users), tuple(body.groups), body.open, body.max_priority,
                      body.max_pending, body.per_user, parse_quota(body.per_user_limit, "per_user_limit"))
        except QueueError as e:
            raise HTTPException(422, str(e)) from None
        return audited(who, "queue.set", None, name, body.model_dump(exclude_defaults=True),
                       app.state.service.queues.set_queue, q)

    @app.delete("/queues/{name}")
    def delete_queue(name: Name, who: Auth) -> dict[str, Any]:
        admin_only(who)
        try:
            return audited(who, "queue.delete", None, name, None, app.state.service.queues.delete_queue, name)
        except KeyError:
            raise HTTPException(404, f"no queue {name!r}") from None

    @app.put("/users/{user}/queue")
    def user_queue(user: Annotated[str, Path(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")], body: QueueChoice,
                   who: Auth) -> dict[str, Any]:
        admin_only(who)
        return audited(who, "queue.user", user, body.queue, {"queue": body.queue},
                       app.state.service.queues.set_user, user, body.queue)

    @app.put("/queue-default")
    def default_queue(body: QueueChoice, who: Auth) -> dict[str, Any]:
        admin_only(who)
        return audited(who, "queue.default", None, body.queue, {"queue": body.queue},
                       app.state.service.queues.set_default, body.queue)

    @app.put("/groups/{name}")
    def group(name: Annotated[str, Path(pattern=NAME_RE)], body: GroupBody, who: Auth) -> dict[str, Any]:
        admin_only(who)
        return audited(who, "queue.group", None, name, {"users": body.users},
                       app.state.service.queues.set_group, name, body.users)
