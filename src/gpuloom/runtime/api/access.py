"""The access log of ``gpuloom serve --access-log FILE|-``: one line per request.

Fields: time (UTC), client address (``unix`` for the local socket), user (the token's, ``-``
before or without one: never the token), method, path, status, duration (seconds) and the
response's body bytes; as text (``2026-11-28T22:57:01.123Z 127.0.0.1 alice GET /jobs?state 200
0.004 1234``) or, with ``--log-format json``, one JSON object per line.

No secret is written: headers are not logged, a query string is reduced to its parameter names
(``/jobs?state&user``), and a path segment under ``/tokens/`` that is not a token id is
``<redacted>`` (a token pasted there by mistake).  uvicorn's own access log stays off
(:func:`.listen.serve_http`), so each request is logged once.  The file is reopened when
rotated away (``WatchedFileHandler``).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("gpuloom.access")
_TOKEN_ID = re.compile(r"[0-9a-f]{12}\Z")


def safe_path(path: str, query: bytes) -> str:
    """``path`` with no secret in it, and the query's parameter names (see the module notes)."""
    if path.startswith("/tokens/"):
        head, _, rest = path[len("/tokens/"):].partition("/")
        if not _TOKEN_ID.match(head):
            path = "/tokens/<redacted>" + (f"/{rest}" if rest else "")
    if query:
        names = dict.fromkeys(p.split(b"=", 1)[0].decode("latin-1") for p in query.split(b"&") if p)
        path += "?" + "&".join(re.sub(r"[^A-Za-z0-9_.-]", "?", n)[:40] for n in names)
    return path


class AccessLog:
    """ASGI middleware: one record on logger ``gpuloom.access`` per HTTP request, when its response ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.time()
        m0 = time.monotonic()
        status = 0
        sent = 0
        logged = False

        def done() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            client = scope.get("client")
            user = (scope.get("state") or {}).get("user") or "-"
            log.info("access", extra={"access": {
                "time": datetime.fromtimestamp(t0, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "client": client[0] if client else "unix", "user": user, "method": scope["method"],
                "path": safe_path(scope["path"], scope.get("query_string", b"")), "status": status or 500,
                "duration_s": round(time.monotonic() - m0, 6), "bytes": sent}})

        async def sending(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                done()

        try:
            await self.app(scope, receive, sending)
        finally:
            done()  # (a response cut short, or none: logged once all the same)


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        a = record.access  # type: ignore[attr-defined]
        return (f"{a['time']} {a['client']} {a['user']} {a['method']} {a['path']} {a['status']} "
                f"{a['duration_s']:.3f} {a['bytes']}")


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record.access)  # type: ignore[attr-defined]


def open_log(target: str, fmt: str = "text") -> logging.Handler:
    """The access log's handler: ``target`` a file (appended to; ``OSError`` if it cannot be opened) or ``-``
    (standard output), lines in ``fmt`` (text or json)."""
    handler: logging.Handler = (logging.StreamHandler(sys.stdout) if target == "-"
                                else logging.handlers.WatchedFileHandler(target, encoding="utf-8"))
    handler.setFormatter(_Json() if fmt == "json" else _Text())
    return handler


def enable(app: Any, handler: logging.Handler) -> None:
    """Log ``app``'s requests through ``handler`` (:func:`open_log`; close it to stop)."""
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # its own file: not the server's log too
    app.add_middleware(AccessLog)
