"""The HTTP API of queues (admin for changes): mounted by :func:`gpuloom.runtime.api.create_app`.

=================================  ==================================================
``GET    /queues``                 usage vs quota per queue, users' default queues
``PUT    /queues/{name}``          create or change a queue: ``parent``, ``guarantee``,
                                   ``limit`` (GPUs, or ``{gpus, cpus, mem_gb}``), ``weight``
``DELETE /queues/{name}``          remove a queue without sub-queues or active jobs
``PUT    /users/{user}/queue``     ``{"queue": NAME}``: the user's default queue (null clears)
``PUT    /queue-default``          ``{"queue": NAME}``: the queue of jobs that name none
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

from ..core.queues import Queue, QueueError, parse_quota
from .queues import QueueConflict

QUEUE_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class QueueBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    parent: str | None = Field(None, pattern=QUEUE_RE)
    guarantee: float | dict[str, float] | None = None
    limit: float | dict[str, float] | None = None
    weight: float = Field(1.0, gt=0)


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

    @app.get("/queues")
    def queues(who: Auth) -> dict[str, Any]:
        out: dict[str, Any] = app.state.service.queues.usage()
        return out

    @app.put("/queues/{name}")
    def put_queue(name: Name, body: QueueBody, who: Auth) -> dict[str, Any]:
        admin_only(who)
        try:
            q = Queue(name, body.parent, parse_quota(body.guarantee, "guarantee"), parse_quota(body.limit, "limit"),
                      body.weight)
        except QueueError as e:
            raise HTTPException(422, str(e)) from None
        return change(app.state.service.queues.set_queue, q)

    @app.delete("/queues/{name}")
    def delete_queue(name: Name, who: Auth) -> dict[str, Any]:
        admin_only(who)
        try:
            return change(app.state.service.queues.delete_queue, name)
        except KeyError:
            raise HTTPException(404, f"no queue {name!r}") from None

    @app.put("/users/{user}/queue")
    def user_queue(user: Annotated[str, Path(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")], body: QueueChoice,
                   who: Auth) -> dict[str, Any]:
        admin_only(who)
        return change(app.state.service.queues.set_user, user, body.queue)

    @app.put("/queue-default")
    def default_queue(body: QueueChoice, who: Auth) -> dict[str, Any]:
        admin_only(who)
        return change(app.state.service.queues.set_default, body.queue)
