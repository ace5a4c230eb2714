"""``gpuloom audit``: who did what (admins; like Slurm's ``sacctmgr show transactions``).

Reads ``GET /audit`` (:mod:`gpuloom.runtime.api.audit`): job state changes with their actor,
token and queue changes.  ``--since`` takes the forms ``history`` takes (an ISO time, Unix
seconds, an age such as ``2h``); ``--actor`` a user name or ``scheduler``; ``--kind`` a kind
(``cancel``, ``token.create``) or a family (``token``, ``queue``).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from ..core.units import parse_wall_time
from . import app
from .client import Client, JsonOpt, StateDirOpt, TokenOpt, UrlOpt
from .common import PlainTable as Table
from .common import print_json, print_table

PAGE = 10_000  # records per request (the server's most)


DETAIL_WIDTH = 100  # a detail is cut to this many characters in the table (--json has it whole)


def _detail(d: dict[str, Any]) -> str:
    text = ",".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in sorted(d.items()))
    return text if len(text) <= DETAIL_WIDTH else text[:DETAIL_WIDTH - 3] + "..."


@app.command()
def audit(
    since: Annotated[str | None, typer.Option("--since", "-S", help="From this time: 2026-01-31T09:00, Unix seconds, or an age (2h, 7d); default 1d.")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Only what this user (or 'scheduler') did.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only this kind (cancel, submit, token.create) or family (token, queue).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit trail (admin): job changes with who made them, token and queue changes."""
    try:
        start = parse_wall_time(since if since is not None else "1d", time.time(), "--since", -1)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    params: dict[str, Any] = {"since": repr(start), "limit": PAGE}
    if actor:
        params["actor"] = actor
    if kind:
        params["kind"] = kind
    client = Client(url, token, state_dir)
    recs: list[dict[str, Any]] = client.call("GET", "/audit", params=params)
    while client.last is not None and client.last.headers.get("X-Next-After"):  # the next page
        recs += client.call("GET", "/audit", params={**params, "after": client.last.headers["X-Next-After"]})
    if as_json:
        print_json(recs)
        return
    t = Table("TIME", "ACTOR", "KIND", "SUBJECT", "TARGET", "DETAIL")
    for r in recs:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["t"]))
        target = str(r["job"]) if r["job"] is not None else (r["target"] or "-")
        t.add_row(when, r["actor"], r["kind"], r["subject"] or "-", target, _detail(r["detail"]) or "-")
    print_table(t)
