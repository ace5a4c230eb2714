"""``gpuloom nodes [drain|resume|maintenance]`` and ``gpuloom cancel|hold|release|requeue``.

As Slurm's ``scontrol update nodename=X state=drain reason=...``, ``scontrol hold/release/requeue``
and ``scancel``: jobs are selected by id (``16``: a job, or every task of array 16; ``16_3``; ``16_[1-5]``)
and by ``--user``, ``--state``, ``--queue``, ``--name`` (:mod:`gpuloom.runtime.service.bulk`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from . import app
from .client import Client, JsonOpt, StateDirOpt, TokenOpt, UrlOpt
from .common import cell, console
from .service import nodes as list_nodes

nodes_app = typer.Typer(help="Nodes and their use (like sinfo); drain, resume, maintenance (admin).",
                        invoke_without_command=True)
app.add_typer(nodes_app, name="nodes")

NodeArg = Annotated[str, typer.Argument(help="Node name (as `gpuloom nodes` lists it).")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (shown in `gpuloom nodes` and the dashboard).")]


@nodes_app.callback()
def nodes(
    ctx: typer.Context,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Nodes and their use (like sinfo): STATE idle/mixed/alloc, drng/drain (drained), maint; REASON."""
    if ctx.invoked_subcommand is None:
        list_nodes(url, token, state_dir, as_json)


def _node_line(n: dict[str, Any]) -> str:
    out = f"node {n['name']}: {n['state']}"
    if n.get("reason"):
        out += f" ({n['reason']})"
    return out


def _show_node(n: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(n))
    else:
        console.print(cell(_node_line(n)), highlight=False)


@nodes_app.command("drain")
def drain(
    node: NodeArg,
    reason: ReasonOpt,
    mode: Annotated[str, typer.Option(
        "--mode", help="wait: running jobs finish there; checkpoint: they are checkpointed and moved.")] = "wait",
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Drain NODE: no new job starts there (admin)."""
    _show_node(Client(url, token, state_dir).call("POST", f"/nodes/{node}/drain",
                                                  json={"reason": reason, "mode": mode}), as_json)


@nodes_app.command("resume")
def resume(node: NodeArg, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
           as_json: JsonOpt = False) -> None:
    """Put NODE back in service (admin)."""
    _show_node(Client(url, token, state_dir).call("POST", f"/nodes/{node}/resume"), as_json)


@nodes_app.command("maintenance")
def maintenance(
    node: NodeArg,
    start: Annotated[str, typer.Option("--start", help="now, now+2h, ISO 8601 (UTC unless it says) or epoch s.")],
    duration: Annotated[str, typer.Option("--duration", help="How long: 2h, 30m, 1:30:00.")],
    reason: ReasonOpt,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A maintenance window on NODE: drained from START for DURATION, then back by itself (admin).

    Before START the node takes only jobs whose time limit ends by START."""
    _show_node(Client(url, token, state_dir).call("POST", f"/nodes/{node}/maintenance",
                                                  json={"start": start, "duration": duration, "reason": reason}),
               as_json)


JobsArg = Annotated[list[str] | None, typer.Argument(help="Job ids: 16 (a job, or all of array 16), 16_3, 16_[1-5].")]
UserOpt = Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")]
StateOpt = Annotated[list[str] | None, typer.Option("--state", "-t", help="Only jobs in this state: PD, R, ...")]
QueueOpt = Annotated[str | None, typer.Option("--queue", "-q", help="Only jobs of this queue.")]
NameOpt = Annotated[str | None, typer.Option("--name", "-n", help="Only jobs of this name.")]


def _act(action: str, jobs: list[str] | None, user: str | None, state: list[str] | None, queue: str | None,
         name: str | None, url: str | None, token: str | None, state_dir: Any, as_json: bool) -> None:
    body: dict[str, Any] = {"action": action, "jobs": jobs or [], "state": state or []}
    for k, v in (("user", user), ("queue", queue), ("name", name)):
        if v is not None:
            body[k] = v
    out = Client(url, token, state_dir).call("POST", "/jobs/actions", json=body)
    if as_json:
        console.print_json(json.dumps(out))
        return
    for j in out["jobs"]:
        console.print(cell(f"job {j['array'] or j['id']}: {j['result']}"), highlight=False)
    for d in out["denied"]:
        console.print(cell(f"job {d}: denied: another user's job"), highlight=False)
    for m in out["missing"]:
        console.print(cell(f"job {m}: no such job"), highlight=False)
    if out["skipped"]:
        console.print(cell(f"{out['skipped']} job(s) of other users skipped"), highlight=False)
    if not out["jobs"] and not out["denied"] and not out["missing"]:
        console.print("no job selected", highlight=False)


@app.command()
def cancel(jobs: JobsArg = None, user: UserOpt = None, state: StateOpt = None, queue: QueueOpt = None,
           name: NameOpt = None, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
           as_json: JsonOpt = False) -> None:
    """Cancel jobs (like scancel): your own, or any with the admin token."""
    _act("cancel", jobs, user, state, queue, name, url, token, state_dir, as_json)


@app.command()
def hold(jobs: JobsArg = None, user: UserOpt = None, state: StateOpt = None, queue: QueueOpt = None,
         name: NameOpt = None, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
         as_json: JsonOpt = False) -> None:
    """Hold pending jobs (scontrol hold): they stay PD (JobHeldUser/JobHeldAdmin) until released."""
    _act("hold", jobs, user, state, queue, name, url, token, state_dir, as_json)


@app.command()
def release(jobs: JobsArg = None, user: UserOpt = None, state: StateOpt = None, queue: QueueOpt = None,
            name: NameOpt = None, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
            as_json: JsonOpt = False) -> None:
    """Release held jobs (scontrol release); an admin's hold only with the admin token."""
    _act("release", jobs, user, state, queue, name, url, token, state_dir, as_json)


@app.command()
def requeue(jobs: JobsArg = None, user: UserOpt = None, state: StateOpt = None, queue: QueueOpt = None,
            name: NameOpt = None, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
            as_json: JsonOpt = False) -> None:
    """Requeue running jobs (scontrol requeue): checkpointed, stopped and queued again (one new attempt)."""
    _act("requeue", jobs, user, state, queue, name, url, token, state_dir, as_json)


@app.command()
def update(
    job: Annotated[int, typer.Argument(help="A pending job's id.")],
    gpus: Annotated[int | None, typer.Option("--gpus", "-G", help="GPUs.")] = None,
    time: Annotated[str | None, typer.Option("--time", "-t", help="Time limit: 1:30:00, 90m, 2h.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Queue (its permissions apply).")] = None,
    priority: Annotated[int | None, typer.Option("--priority", help="Priority: lower freely, raise up to the "
                                                                   "queue's limit (admin: any).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a pending job (scontrol update jobid=...): GPUs, time limit, queue, priority."""
    body = {k: v for k, v in (("gpus", gpus), ("time_limit", time), ("queue", queue), ("priority", priority))
            if v is not None}
    out = Client(url, token, state_dir).call("POST", f"/jobs/{job}/update", json=body)
    if as_json:
        console.print_json(json.dumps(out))
    else:
        console.print(cell(f"job {out['id']}: updated ({', '.join(f'{k}={body[k]}' for k in body)})"),
                      highlight=False)
