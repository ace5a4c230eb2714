"""``gpuloom reservation``: advance reservations (like ``scontrol create/show/delete reservation``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from . import app
from .client import Client, JsonOpt, StateDirOpt, TokenOpt, UrlOpt
from .common import PlainTable as Table
from .common import print_json, print_table
from .timefmt import local_time

reservation_app = typer.Typer(help="Advance reservations: resources kept for some users over a window (admin).",
                              no_args_is_help=True)
app.add_typer(reservation_app, name="reservation")


@reservation_app.command("create")
def create(
    users: Annotated[str, typer.Option("--users", help="Users whose jobs may use it: alice,bob.")],
    duration: Annotated[str, typer.Option("--duration", help="How long: 90m, 2h, 1:30:00, D-HH:MM (a bare number is minutes).")],
    start: Annotated[str, typer.Option("--start", help="now, now+1h, an ISO date/time (UTC unless it says) or Unix seconds.")] = "now",
    nodes: Annotated[str | None, typer.Option("--nodes", help="Whole nodes: node-0,node-1.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="Or a number of GPUs, placed when the window comes.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Its name (default resvN).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Keep nodes (or a number of GPUs) for some users' jobs from START for DURATION; other jobs stay off them."""
    body: dict[str, Any] = {"users": users, "start": start, "duration": _minutes(duration)}
    if nodes is not None:
        body["nodes"] = nodes
    if gpus is not None:
        body["gpus"] = gpus
    if name is not None:
        body["name"] = name
    r = Client(url, token, state_dir).call("POST", "/reservations", json=body)
    if as_json:
        print_json(r)
    else:
        typer.echo(f"Reservation created: {r['name']}")


def _minutes(text: str) -> str:
    """A bare number is minutes, as Slurm reads ``Duration=``."""
    return f"{text}m" if text.strip().isdigit() else text


@reservation_app.command("list")
def listing(url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
            as_json: JsonOpt = False) -> None:
    """Every reservation: its window, users, what it keeps and whether it is active."""
    rows = Client(url, token, state_dir).call("GET", "/reservations")
    if as_json:
        print_json(rows)
        return
    t = Table("NAME", "STATE", "START", "END", "USERS", "NODES", "GPUS")
    for r in rows:
        t.add_row(r["name"], r["state"], local_time(r["start"]), local_time(r["end"]), ",".join(r["users"]),
                  ",".join(r["nodes"]) or "-", str(r["gpus"] or "-"))
    print_table(t)


@reservation_app.command("delete")
def remove(name: Annotated[str, typer.Argument(help="The reservation's name.")], url: UrlOpt = None,
           token: TokenOpt = None, state_dir: StateDirOpt = None) -> None:
    """Remove a reservation (admin)."""
    Client(url, token, state_dir).call("DELETE", f"/reservations/{name}")
    typer.echo(f"Reservation {name} deleted")
