"""Queues on the command line: the simulator's ``--queues``/``--queue-policy``, and ``gpuloom queues``.

Simulator (``simulate``, ``compare``): ``--queues`` names the queue tree, a
TOML file (see :mod:`gpuloom.core.queues`), ``demand`` (one queue per queue
name in the trace, guarantees in proportion to its GPU demand) or
``config:FILE`` (guarantees from a VC configuration CSV, matched by rank of
demand: :mod:`gpuloom.sim.quotas`); ``--queue-policy`` the queue stage
(``quota`` when ``--queues`` is given, else ``none``).  A run without a queue
stage is still measured against ``--queues``.  Per-queue results go to
``queues.csv``, ``queue_series.csv`` and ``queue_share.png``.

Service (Slurm's ``sacctmgr``/``sshare``, Kueue's ClusterQueues):

=================================  ============================================
``gpuloom queues``                 usage vs quota per queue (``list``)
``gpuloom queues set NAME ...``    create or change a queue (admin)
``gpuloom queues delete NAME``     remove a queue without sub-queues (admin)
``gpuloom queues user USER QUEUE`` a user's default queue (admin; ``-`` clears)
``gpuloom queues default QUEUE``   the queue of jobs that name none (admin)
``gpuloom queues group NAME U...`` a group's members (admin; ``-`` removes it)
=================================  ============================================

``queues set`` also says who may submit (``--user``, ``--group``, ``--open``)
and the queue's limits (``--max-priority``, ``--max-pending``,
``--per-user`` with ``--per-user-limit``): see :mod:`gpuloom.core.queues`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import app
from .common import console

if TYPE_CHECKING:
    from rich.table import Table

    from ..core.cluster import Cluster
    from ..core.job import JobSpec
    from ..core.queues import QueueTree
    from ..sim.metrics import RunResult
    from ..sim.runconfig import RunConfig

log = logging.getLogger("gpuloom.service")
QueuePolicyOpt = Annotated[str | None, typer.Option(
    "--queue-policy", help="Queue stage: none, quota, drf, fairshare (default: quota with --queues, else none).")]
QueuesOpt = Annotated[str | None, typer.Option(
    "--queues", help="Queue tree: a TOML file, 'demand' (guarantees in proportion to each trace queue's GPU "
                     "demand) or 'config:FILE' (a VC configuration CSV).")]


# -- simulator ----------------------------------------------------------------------------------
def queue_stage(policy: str | None, queues: str | None) -> str:
    """The queue stage's name: as given, else ``quota`` when a tree is given, else ``none``."""
    return policy or ("quota" if queues else "none")


def served_queue_stage(policy: str | None, queues: str | None, url: str, store: Any = None) -> str:
    """``serve``'s queue stage: as given, or ``quota`` with ``--queues``; else, when the store at ``url``
    (``store``, the server's, once opened) holds a tree, the policy stored with it (``quota`` if none was).  A
    policy given beside a stored tree overrides the stored one, which is logged (``none``: a warning that the
    stored tree is not used)."""
    if queues:
        return queue_stage(policy, queues)
    from ..runtime.service.queues import stored_queues

    try:
        found = stored_queues(url, store)
    except Exception as e:  # (the store is opened again below, and its error reported there)
        log.debug("queues: cannot read the stored tree: %s", e)
        found = None
    if found is None:
        return queue_stage(policy, queues)
    count, stored = found
    if policy is None:
        log.info("queues: scheduling with the stored tree (%d queues) and its policy %s", count, stored)
        return stored
    if policy == "none":
        log.warning("queues: --queue-policy none: this service runs without the stored tree of %d queues "
                    "(stored policy %s); restart without --queue-policy to use it", count, stored)
    elif policy != stored:
        log.warning("queues: --queue-policy %s replaces the stored policy %s for the stored tree of %d queues",
                    policy, stored, count)
    return policy


def apply_queues(configs: Sequence[RunConfig], queues: str | None, specs: Sequence[JobSpec],
                 cluster: Cluster) -> QueueTree | None:
    """Give ``--queues``' tree to every configuration with a queue stage that names none; returns the tree
    (every run is measured against it), or None without ``--queues``."""
    if not queues:
        return None
    from ..policies.queues import as_tree
    from ..sim.quotas import quota_spec

    tree = as_tree(quota_spec(queues, specs, cluster.num_gpus))
    for rc in configs:
        if rc.queue != "none" and "queues" not in rc.params and "queue.queues" not in rc.params:
            if not rc.label:
                rc.label = rc.name  # made before the tree joins the parameters: a short label
            rc.params["queue.queues"] = tree
    return tree


def queue_outputs(results: Mapping[str, RunResult], folder: Path, plots: bool) -> Table | None:
    """Write the per-queue files (several runs: one ``queues.csv`` with a ``run`` column); return the
    per-queue table to print, or None when no run recorded queues."""
    from ..sim.queue_report import queue_rows, queue_table, write_queue_report

    with_queues = {k: r for k, r in results.items() if queue_rows(r)}
    if not with_queues:
        return None
    if len(results) == 1:
        write_queue_report(next(iter(with_queues.values())), folder, plots)
    else:
        import csv

        from ..sim.queue_report import QUEUE_COLUMNS, csv_cell

        with open(folder / "queues.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(("run", *QUEUE_COLUMNS))
            for label, r in with_queues.items():
                for row in queue_rows(r):
                    w.writerow([label, *(csv_cell(row[c]) for c in QUEUE_COLUMNS)])
    return queue_table(with_queues)


# -- service ------------------------------------------------------------------------------------
queues_app = typer.Typer(help="Queues: usage vs quota; create, change and remove queues (admin).",
                         invoke_without_command=True)
app.add_typer(queues_app, name="queues")


def _client(url: str | None, token: str | None, state_dir: Path | None) -> Any:
    from .client import Client

    return Client(url, token, state_dir)


UrlOpt = Annotated[str | None, typer.Option("--url", envvar="GPULOOM_URL", help="Server URL.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="GPULOOM_TOKEN", help="API token.")]
StateDirOpt = Annotated[Path | None, typer.Option("--state-dir", envvar="GPULOOM_STATE_DIR",
                                                  help="State directory (default ~/.gpuloom).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _num(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "-"
    return f"{v:g}" if isinstance(v, float) else str(v)


def print_usage(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(box=None)
    t.add_column("QUEUE", no_wrap=True, min_width=max((len(r["name"]) + 2 * r.get("depth", 0) for r in rows),
                                                       default=5) + 2)
    for c in ("GPUS", "QUOTA", "LIMIT", "OVER", "WEIGHT", "RUN", "PEND"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("ACCESS")
    t.add_column("REASONS")
    for r in rows:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.get("reasons", {}).items()))
        name = ("  " * r.get("depth", 0)) + r["name"] + (" *" if r.get("default") else "")
        t.add_row(name, _num(r["used"]["gpus"]), _num(r["guarantee"].get("gpus")), _num(r["limit"].get("gpus")),
                  _num(r.get("borrowed")), _num(r["weight"]), str(r.get("running", 0)), str(r.get("pending", 0)),
                  access(r), reasons)
    console.print(t)
    console.print("[dim]GPUS held / QUOTA guaranteed / LIMIT at most; OVER: held beyond the quota (borrowed); "
                  "* the default queue; ACCESS: who may submit besides those below it inherit[/]")


def access(r: Mapping[str, Any]) -> str:
    """Who may submit to a queue, and its own limits, in a few words."""
    parts = ["open"] if r.get("open") else []
    if r.get("per_user"):
        parts.append("per-user" + (f" (limit {_num(r['per_user_limit'].get('gpus'))})" if r.get("per_user_limit")
                                   else ""))
    parts += list(r.get("users") or []) + [f"@{g}" for g in r.get("groups") or []]
    if r.get("max_priority") is not None:
        parts.append(f"prio<={r['max_priority']}")
    if r.get("max_pending") is not None:
        parts.append(f"pend<={r['max_pending']}")
    return " ".join(parts)


@queues_app.callback()
def queues_main(ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
                as_json: JsonOpt = False) -> None:
    """Usage vs quota per queue (like sshare); subcommands change queues."""
    if ctx.invoked_subcommand is None:
        queues_list(url, token, state_dir, as_json)


@queues_app.command("list")
def queues_list(url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None,
                as_json: JsonOpt = False) -> None:
    """Each queue's GPUs held against its guarantee and limit, running and pending jobs (like sshare)."""
    out = _client(url, token, state_dir).call("GET", "/queues")
    if as_json:
        console.print_json(json.dumps(out))
        return
    if not out["queues"]:
        console.print("this service runs without queues (serve --queues FILE or --queue-policy)")
        return
    print_usage(out["queues"])
    users = out.get("users") or {}
    if users:
        console.print("default queues: " + ", ".join(f"{u} → {q}" for u, q in sorted(users.items())),
                      highlight=False)


@queues_app.command("set")
def queues_set(
    name: Annotated[str, typer.Argument(help="Queue name.")],
    parent: Annotated[str | None, typer.Option(help="Parent queue (none: top level).")] = None,
    guarantee: Annotated[float | None, typer.Option(help="Guaranteed GPUs.")] = None,
    limit: Annotated[float | None, typer.Option(help="At most this many GPUs.")] = None,
    weight: Annotated[float, typer.Option(help="Weight among its siblings.")] = 1.0,
    cpus: Annotated[float | None, typer.Option(help="Guaranteed CPU cores.")] = None,
    mem_gb: Annotated[float | None, typer.Option(help="Guaranteed memory (GB).")] = None,
    users: Annotated[list[str] | None, typer.Option("--user", help="A user who may submit (repeatable).")] = None,
    groups: Annotated[list[str] | None, typer.Option("--group", help="A group whose users may submit (repeatable).")]
    = None,
    open_: Annotated[bool, typer.Option("--open", help="Everyone may submit (and to the queues below).")] = False,
    max_priority: Annotated[int | None, typer.Option(help="Highest priority users may give a job here.")] = None,
    max_pending: Annotated[int | None, typer.Option(help="Jobs that may wait in it (and below it) at once.")] = None,
    per_user: Annotated[bool, typer.Option("--per-user", help="Each user gets a queue of their own under it.")]
    = False,
    per_user_limit: Annotated[float | None, typer.Option(help="GPUs each per-user queue may hold.")] = None,
    url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False,
) -> None:
    """Create or change a queue (admin): every field as given, the rest to its default."""
    g: dict[str, float] = {}
    if guarantee is not None:
        g["gpus"] = guarantee
    if cpus is not None:
        g["cpus"] = cpus
    if mem_gb is not None:
        g["mem_gb"] = mem_gb
    body: dict[str, Any] = {"weight": weight, "guarantee": g}
    if parent is not None:
        body["parent"] = parent
    if limit is not None:
        body["limit"] = {"gpus": limit}
    body.update(users=users or [], groups=groups or [], open=open_, per_user=per_user)
    for key, v in (("max_priority", max_priority), ("max_pending", max_pending)):
        if v is not None:
            body[key] = v
    if per_user_limit is not None:
        body["per_user_limit"] = {"gpus": per_user_limit}
    out = _client(url, token, state_dir).call("PUT", f"/queues/{name}", json=body)
    if as_json:
        console.print_json(json.dumps(out))
    else:
        console.print(f"queue {name} set", highlight=False)


@queues_app.command("delete")
def queues_delete(name: Annotated[str, typer.Argument(help="Queue name.")], url: UrlOpt = None,
                  token: TokenOpt = None, state_dir: StateDirOpt = None) -> None:
    """Remove a queue that has no sub-queues and no active jobs (admin)."""
    _client(url, token, state_dir).call("DELETE", f"/queues/{name}")
    console.print(f"queue {name} removed", highlight=False)


@queues_app.command("user")
def queues_user(user: Annotated[str, typer.Argument(help="User name.")],
                queue: Annotated[str, typer.Argument(help="Default queue of the user's jobs ('-' clears it).")],
                url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None) -> None:
    """Set a user's default queue (admin)."""
    _client(url, token, state_dir).call("PUT", f"/users/{user}/queue",
                                        json={"queue": None if queue == "-" else queue})
    console.print(f"{user}: {'no default queue' if queue == '-' else queue}", highlight=False)


@queues_app.command("default")
def queues_default(queue: Annotated[str, typer.Argument(help="Queue of jobs that name none ('-' clears it).")],
                   url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None) -> None:
    """Set the queue of jobs that name none and whose user has no default (admin)."""
    _client(url, token, state_dir).call("PUT", "/queue-default", json={"queue": None if queue == "-" else queue})
    console.print(f"default queue: {queue}", highlight=False)


@queues_app.command("group")
def queues_group(group: Annotated[str, typer.Argument(help="Group name.")],
                 users: Annotated[list[str], typer.Argument(help="Its users ('-' removes the group).")],
                 url: UrlOpt = None, token: TokenOpt = None, state_dir: StateDirOpt = None) -> None:
    """Set a group's members: queues that name the group take them (admin)."""
    gone = users == ["-"]
    _client(url, token, state_dir).call("PUT", f"/groups/{group}", json={"users": None if gone else users})
    console.print(f"group {group}: {'removed' if gone else ', '.join(users)}", highlight=False)
