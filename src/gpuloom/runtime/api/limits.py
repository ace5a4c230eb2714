"""Size limits of the API, and error answers that never echo what was sent.

* **Bodies**: at most :data:`MAX_BODY_BYTES`; a larger one gets 413 before it
  is read whole (:class:`BodyLimit`, a plain ASGI middleware: it checks
  ``Content-Length`` and counts the bytes of a streamed body as they arrive).
* **Fields**: the job model (:mod:`.bodies`) bounds every string, list and map
  with the constants below, so one job can neither grow the store by
  megabytes nor slow every listing.
* **Validation errors** (:func:`validation_error`): a 422 lists each offending
  field (``loc``), a short message and its type; Pydantic's ``input`` and
  ``ctx`` are dropped, so a 20 MB invalid body gets a small answer, and a
  value JSON cannot encode (``NaN``) cannot turn the answer into a 500.
* **Text** (:func:`check_text`): no NUL bytes (PostgreSQL refuses them, and
  ``exec`` cannot pass them to a process).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_BODY_BYTES = 1 << 20  # a whole request body
MAX_COMMAND = 64 << 10  # bytes of a job's command line
MAX_NAME = 200
MAX_PATH = 4096
MAX_ENV_VARS = 128
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 32 << 10
MAX_ENV_TOTAL = 256 << 10  # names and values of one job's environment together
MAX_CURVE_POINTS = 1024  # entries of a throughput curve
MAX_MSG = 300  # characters of one error message
MAX_ERRORS = 20  # errors listed in one 422
MAX_PAGE = 10_000  # jobs in one listing page
MAX_ID = 2**63 - 1  # the largest id a store column holds

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def check_text(v: str, what: str) -> str:
    """``v`` unless it holds a NUL byte (raises ``ValueError`` naming ``what``)."""
    if "\x00" in v:
        raise ValueError(f"{what} must not contain NUL bytes")
    return v


class TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: 413 for request bodies over ``limit`` bytes, declared or streamed."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers") or ():
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                if n < 0 or n > self.limit:
                    await self._refuse(send, n)
                    return
        seen = 0
        started = False

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise TooLarge
            return msg

        async def tracked(msg: MutableMapping[str, Any]) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counted, tracked)
        except TooLarge:
            if not started:
                await self._refuse(send, seen)

    async def _refuse(self, send: Send, n: int) -> None:
        what = "a body of unknown or invalid length" if n < 0 else f"{n} bytes"
        body = json.dumps({"detail": f"request body too large: {what}, the limit is {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _short(s: Any) -> str:
    s = str(s)
    return s if len(s) <= MAX_MSG else s[: MAX_MSG - 3] + "..."


def clean_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic errors as ``{loc, msg, type}`` only: no input echoed, messages bounded."""
    out = []
    for e in list(errors)[:MAX_ERRORS]:
        loc = [x if isinstance(x, int) else _short(x)[:80] for x in e.get("loc", ())]
        out.append({"loc": loc, "msg": _short(e.get("msg", "")), "type": str(e.get("type", "value_error"))})
    return out


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse(status_code=422, content={"detail": clean_errors(errors)})
