"""Slurm-grade job commands: ``submit``, ``queue``, ``show``, ``history``, ``logs``.

=======================================  ==========  =========================================
gpuloom                                  Slurm       what
=======================================  ==========  =========================================
``submit job.yaml``                      sbatch      a YAML/JSON job spec (flags override it)
``submit --gpus 2 -- python t.py``       sbatch      a job from flags; ``--wrap "cmd"`` too;
                                                     ``--array 0-9%2``, ``--dependency afterok:5``
``queue``                                squeue      short states (PD R CG CD F CA) and reasons
``show ID``                              scontrol    every field, the allocations, the timeline
``history``                              sacct       start, end, elapsed, GPU-hours, exit code
``logs ID [-f]``                         (log file)  the job's output; ``-f`` follows it
=======================================  ==========  =========================================
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ..core.lifecycle import TERMINAL, JobState
from ..core.units import parse_wall_time
from ..runtime.state.history import format_duration, format_mem
from . import app
from .client import Client, JsonOpt, StateDirOpt, TokenOpt, UrlOpt, load_job_file
from .common import PlainTable as Table
from .common import console, err_console, plain, print_json, print_table
from .timefmt import local_time

ACTIVE_CODES = ("PD", "R", "CG")
#: the states of jobs not ended (the service's ACTIVE_STATES), from the lifecycle: listing jobs does not
#: load the service (its database layer and scheduler: ~0.4 s of a command's start)
ACTIVE = tuple(s.value for s in JobState if s not in TERMINAL)
#: the fields of a job the queue's table shows (``GET /jobs?fields=``)
QUEUE_FIELDS = ("id", "array", "name", "user", "queue", "st", "state", "time_limit", "held_s", "gpus", "gpu_type",
                "progress", "nodes", "pending_reason", "reason")
HISTORY_PAGE = 1000  # records per /history request
LIST_PAGE = 2000  # jobs per /jobs request (from a server without /jobs/stream)
STREAM = "/jobs/stream"  # the whole listing in one response
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _queue_rows(block: list[list[Any]], fields: list[str], long: bool) -> list[list[str]]:
    """The queue table's rows for jobs given as lists of the values of ``fields`` (:data:`QUEUE_FIELDS`)."""
    at = {f: i for i, f in enumerate(fields)}
    i_id, i_arr, i_name, i_user, i_q, i_st, i_state, i_tl, i_held, i_gpus, i_type, i_prog, i_nodes, i_pr, i_why = \
        (at[f] for f in QUEUE_FIELDS)
    times: dict[Any, str] = {}  # (most waiting jobs have held 0 s: each duration is laid out once)
    rows = []
    for v in block:
        st = v[i_st]
        if st in ("R", "CG"):  # squeue's NODELIST(REASON): the nodes of a job holding some, else why it waits
            reason = ",".join(v[i_nodes] or []) or "-"
        elif st == "PD":
            reason = f"({v[i_pr] or v[i_why] or 'None'})"
        else:
            reason = f"({v[i_why]})" if v[i_why] else ""
        row = [str(v[i_id]), v[i_arr] or "", v[i_name], v[i_user], v[i_q] or "-", st]
        if long:
            row += [v[i_state].upper(), format_duration(v[i_tl])]
        held = v[i_held]
        if (took := times.get(held)) is None:
            took = times[held] = format_duration(held)
        it = v[i_prog]
        row += [took, f"{v[i_type]}:{v[i_gpus]}" if v[i_type] else str(v[i_gpus]),  # Slurm's TYPE:N
                "-" if it is None else str(int(it)), reason]
        rows.append(row)
    return rows


_print_json = print_json
_print_table = print_table  # a terminal's width for a few rows; plain lines for many, or into a pipe or file


# ---------------------------------------------------------------------------------------------
def _exported(names: str | None) -> dict[str, str]:
    """The named variables of the submitting shell (``--export``): a job's environment is otherwise the
    server's allow-list and its spec's ``env``, so e.g. ``python3`` is the default PATH's, not this shell's."""
    out: dict[str, str] = {}
    for name in (n.strip() for n in (names or "").split(",")):
        if not name:
            continue
        if name.upper() in ("ALL", "NONE") or "=" in name:
            raise typer.BadParameter(f"--export {name!r}: name the variables to copy (PATH,VIRTUAL_ENV); "
                                     "set a value with --env NAME=VALUE")
        if name not in os.environ:
            raise typer.BadParameter(f"--export {name}: not set in this shell")
        out[name] = os.environ[name]
    return out


@app.command()
def submit(
    args: Annotated[list[str] | None, typer.Argument(
        help="A job spec file (.yaml/.yml/.json), or the command to run (after --).", show_default=False)] = None,
    name: Annotated[str | None, typer.Option("--name", "-J", help="Job name.")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", "-G", help="GPUs (default 1), or TYPE:N for N GPUs of a "
                                             "type (v100:2, as Slurm's --gpus).")] = None,
    cpus: Annotated[int | None, typer.Option("--cpus", "-c", help="CPU cores (default: the GPU-proportional share).")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="Memory: 8G (10^9 bytes), 8Gi (2^30 bytes), 512M, or MB.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", "-t", help="Time limit as Slurm: minutes (60), MM:SS, HH:MM:SS, D-HH:MM:SS, 90s, 2h.")] = None,
    wrap: Annotated[str | None, typer.Option("--wrap", help="The command as one string (run by /bin/sh -c).")] = None,
    array: Annotated[str | None, typer.Option("--array", "-a", help="Job array: 0-9, 1,3,5-7, 0-15:4, 0-9%2 (at most 2 at once).")] = None,
    dependency: Annotated[str | None, typer.Option("--dependency", "-d", help="afterok:ID[:ID], afterany:, afternotok:, after:; ID_N for one array task; comma = all.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Queue to submit to.")] = None,
    reservation: Annotated[str | None, typer.Option("--reservation", help="Run only inside this reservation.")] = None,
    workdir: Annotated[str | None, typer.Option("--chdir", "-D", help="Working directory (default: the current one, as sbatch).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="Extra environment NAME=VALUE (repeatable).")] = None,
    export: Annotated[str | None, typer.Option("--export", help="Variables of this shell the job gets, comma-separated "
                                               "(as sbatch --export=PATH,VIRTUAL_ENV; --env wins).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job (like sbatch): from a spec file, or from flags and a command.

    \b
    gpuloom submit job.yaml
    gpuloom submit --gpus 2 --mem 16G --time 1:00:00 -- python train.py --epochs 3
    gpuloom submit --wrap "python train.py" --array 0-9 --dependency afterok:5
    """
    args = list(args or [])
    body: dict[str, Any] = {}
    if len(args) == 1 and args[0].lower().endswith(SPEC_SUFFIXES) and wrap is None:
        body = load_job_file(Path(args[0]))
    elif args:
        if wrap is not None:
            raise typer.BadParameter("give the command after -- or with --wrap, not both")
        body["command"] = shlex.join(args) if len(args) > 1 else args[0]
    if wrap is not None:
        body["command"] = wrap
    if "command" not in body:
        raise typer.BadParameter("nothing to run: give a job spec file, a command after --, or --wrap \"command\"")
    if gpus is not None:  # a count, or TYPE:COUNT (gpu:TYPE:COUNT): the server reads both
        gpus = gpus.strip()
    flags = {"name": name, "gpus": int(gpus) if gpus is not None and gpus.isdigit() else gpus, "cpus": cpus,
             "mem": mem, "time_limit": time_limit, "array": array,
             "dependency": dependency, "queue": queue, "workdir": workdir, "reservation": reservation}
    body.update({k: v for k, v in flags.items() if v is not None})
    if env or export:
        extra = dict(body.get("env") or {})
        extra.update(_exported(export))
        for item in env or ():
            k, eq, v = item.partition("=")
            if not eq or not k:
                raise typer.BadParameter(f"--env {item!r}: expected NAME=VALUE")
            extra[k] = v
        body["env"] = extra
    body.setdefault("gpus", 1)
    _check_request(body, args[0] if len(args) == 1 and args[0].lower().endswith(SPEC_SUFFIXES) else None)
    # like sbatch: the job runs in the directory it was submitted from unless --chdir/workdir says
    # otherwise, and a relative one is taken from there (a node without it runs the job in the
    # account's home instead and says so in the job's log)
    wd = body.get("workdir")
    if wd is None or isinstance(wd, str):  # anything else is the server's to refuse, by field name
        body["workdir"] = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(wd or ".")))
    if "name" not in body:
        body["name"] = "wrap" if wrap is not None else os.path.basename(shlex.split(body["command"])[0]) or "job"
    import uuid

    # a retry after a lost answer must not submit twice: the key makes the server answer with the same job
    key = {"Idempotency-Key": uuid.uuid4().hex}
    job = Client(url, token, state_dir).call("POST", "/jobs", retries=2, json=body, headers=key)
    if as_json:
        _print_json(job)
    elif job.get("array_id") is not None:
        console.print(f"Submitted job array {job['array_id']} ({body['array']})", highlight=False)
    else:
        console.print(f"Submitted job {job['id']}", highlight=False)


def _check_request(body: dict[str, Any], path: str | None) -> None:
    """Refuse a spec the server would refuse for its fields, naming the field (and the spec file) before
    anything is sent; the server reads the same body (:func:`gpuloom.core.request.parse_request`)."""
    from ..core.request import RequestError, parse_request

    try:
        parse_request(body)
    except RequestError as e:
        raise typer.BadParameter(f"{path}: {e}" if path else str(e)) from None


@app.command()
def queue(
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Include finished, failed and cancelled jobs.")] = False,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    state: Annotated[list[str] | None, typer.Option("--state", "-t", help="Only these states: PD, R, CG, CD, F, CA or lifecycle names (repeatable, or comma-separated).")] = None,
    long: Annotated[bool, typer.Option("--long", "-l", help="Also the lifecycle state and the time limit.")] = False,
    out_format: Annotated[str | None, typer.Option("--format", "-o", help="squeue's codes (\"%.8i %u %j %t %M %l %D %b %R\") or field names (jobid,user,name,st); see docs/operations.md.")] = None,
    expand: Annotated[bool, typer.Option("--array", "-r", help="One line per array task (pending tasks of an array are one line otherwise).")] = False,
    start: Annotated[bool, typer.Option("--start", help="Waiting jobs by position, with estimated start times "
                                                        "(like squeue --start).")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs (like squeue): ST is PD (pending), R (running), CG (stopping), CD, F, CA; pending jobs show why;
    the pending tasks of an array are one line (16_[3-291]) unless --array."""
    from .queuefmt import FormatError, parse_format

    try:
        fmt = None if out_format is None else parse_format(out_format)
    except FormatError as e:
        raise typer.BadParameter(str(e)) from None
    if start:
        from .starts import show_starts

        return show_starts(Client(url, token, state_dir), user, as_json)
    params: dict[str, Any] = {}
    if state:
        from ..runtime.api.ops import states_of

        try:
            params["state"] = states_of(state)
        except Exception as e:  # HTTPException from states_of
            raise typer.BadParameter(getattr(e, "detail", str(e))) from None
    elif not all_jobs:
        params["state"] = list(ACTIVE)
    if user:
        params["user"] = user
    cols = ["JOBID", "ARRAY", "NAME", "USER", "QUEUE", "ST"] + (["STATE", "TIME_LIMIT"] if long else []) + \
        ["TIME", "GPUS", "ITER", "NODELIST(REASON)"]
    t = Table(*cols)
    jobs: list[dict[str, Any]] = []
    kept: list[list[Any]] = []  # (to collapse arrays, or lay out a --format)
    names = list(QUEUE_FIELDS)
    if not as_json:  # only what the table shows (a third of the bytes)
        params["fields"] = ",".join(QUEUE_FIELDS)
    for fields, block in _listing(Client(url, token, state_dir), params):
        if as_json:
            jobs += [dict(zip(fields, v, strict=True)) for v in block]
        elif expand and fmt is None:  # each block becomes rows as it comes (its values are not kept)
            t.add_rows(_queue_rows(block, fields, long))
        else:
            names = fields
            kept += block
    if as_json:
        _print_json(jobs)
    elif expand and fmt is None:
        _print_table(t)
    else:
        _print_queue(kept, names, long, expand, fmt, t)


def _print_queue(values: list[list[Any]], fields: list[str], long: bool, expand: bool, fmt: Any, t: Table) -> None:
    """The queue's lines, pending array tasks collapsed unless ``expand``: the table ``t``, or ``fmt``."""
    from .queuefmt import cells, code_lines, collapse

    rows, counts = (values, {}) if expand else collapse(values, fields)
    if fmt is None:
        out = _queue_rows(rows, fields, long)
        for k, n in counts.items():
            out[k][-1] += f" {n} tasks"
        t.add_rows(out)
        _print_table(t)
    elif isinstance(fmt, list):  # field names: a table
        named = Table(*(n.upper() for n in fmt))
        named.add_rows([cells(v, fields, fmt, counts.get(k, 1)) for k, v in enumerate(rows)])
        _print_table(named)
    else:
        import sys

        sys.stdout.write("\n".join(plain(x) for x in code_lines(rows, fields, counts, fmt)) + "\n")


def _listing(client: Client, params: dict[str, Any]) -> Iterator[tuple[list[str], list[list[Any]]]]:
    """The jobs ``GET /jobs`` lists with ``params``, a block at a time (field names, each job's values in their
    order): from one response of
    ``GET /jobs/stream`` (:mod:`gpuloom.runtime.api.listing`), or page by page from a server without it
    (which reads ``stream`` as a job id: 422 on the path)."""
    import httpx

    started = False
    try:
        with client.http.stream("GET", STREAM, params=params) as r:
            if r.status_code >= 400:
                r.read()
                if not (r.status_code == 404 or (r.status_code == 422 and '"path"' in r.text)):
                    client.refused(r)
            else:
                started = True
                yield from _blocks(r.iter_lines(), client.url)
                return
    except httpx.HTTPError as e:
        if started:
            _cut_short(client.url, e)
        client.unreachable(e)
    for page in _pages(client, "/jobs", params):
        if page:
            keys = list(page[0])
            yield keys, [[j[k] for k in keys] for j in page]


def _cut_short(url: str, why: object) -> NoReturn:
    err_console.print(f"[bold red]error:[/] the listing from {url} was cut short ({why})", highlight=False)
    raise typer.Exit(1)


def _blocks(lines: Iterator[str], url: str) -> Iterator[tuple[list[str], list[list[Any]]]]:
    """The jobs of a ``/jobs/stream`` response's lines, a block at a time; an error if it was cut short."""
    fields: list[str] | None = None
    for line in lines:
        item = json.loads(line)
        if fields is None:
            fields = item["fields"]
        elif isinstance(item, list):
            yield fields, item
        else:
            return  # {"end": COUNT}
    _cut_short(url, "no end line")


def _pages(client: Client, path: str, params: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """The pages of a paged listing, in order.  Each is asked for as soon as the one before names it
    (``X-Next-After``), by a thread of its own: the server builds the next page while this process
    decodes and lays out the last.  An error (the client's exit) is raised here."""
    import threading
    from queue import Queue

    pages: Queue[Any] = Queue(maxsize=2)

    def fetch() -> None:
        after = None
        try:
            while True:
                r = client.call("GET", path, raw=True,
                                params={**params, "limit": LIST_PAGE, **({"after": after} if after else {})})
                pages.put(r)
                after = r.headers.get("X-Next-After")
                if not after:
                    break
        except BaseException as e:  # (typer.Exit after the client's message)
            pages.put(e)
            return
        pages.put(None)

    threading.Thread(target=fetch, name="gpuloom-pages", daemon=True).start()
    while (page := pages.get()) is not None:
        if isinstance(page, BaseException):
            raise page
        yield page.json()


@app.command()
def show(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Everything about one job (like scontrol show job), with its allocations and event timeline."""
    c = Client(url, token, state_dir)
    j = c.call("GET", f"/jobs/{job_id}")
    events = c.call("GET", f"/jobs/{job_id}/events")
    (rec,) = c.call("GET", "/history", params={"job": job_id, "allocations": True}) or [None]
    if as_json:
        _print_json({**j, "events": events, "accounting": rec})
        return
    gpus = " ".join(f"{p['node']}:{','.join(map(str, p.get('local_gpus', p['gpus'])))}"
                    for p in (j.get("alloc") or {}).get("parts", [])) or "-"
    lines = [
        [("JobId", j["id"]), ("JobName", j["name"]), ("ArrayJob", j.get("array") or "-")],
        [("User", j["user"]), ("Queue", j.get("queue") or "-"), ("JobState", f"{j['state'].upper()} ({j['st']})")],
        [("Reason", (j.get("pending_reason") if j["st"] == "PD" else None) or j.get("reason") or "None"),
         ("Dependency", j.get("dependency") or "-")],
        *([[("Position", j.get("queue_position") or "-"), ("QueuePosition", j.get("queue_position_in_queue") or "-"),
            ("EstStartTime", local_time(j.get("est_start"), "N/A"))]] if j["st"] == "PD" else []),
        [("GPUs", f"{j['gpu_type']}:{j['gpus']}" if j.get("gpu_type") else j["gpus"]), ("CPUs", j.get("cpus") if j.get("cpus") is not None else "proportional"),
         ("Memory", format_mem(j.get("mem_mb")) if j.get("mem_mb") is not None else "proportional"),
         ("TimeLimit", format_duration(j.get("time_limit")) if j.get("time_limit") else "UNLIMITED")],
        [("SubmitTime", local_time(j.get("submit_time"))), ("StartTime", local_time(j.get("first_start"))),
         ("EndTime", local_time(j.get("end_time")))],
        [("Elapsed", format_duration(rec["elapsed_s"]) if rec else "-"), ("Held", format_duration(j.get("held_s"))),
         ("GPUHours", f"{rec['gpu_hours']:.4f}" if rec else "-")],
        [("Nodes", ",".join(j.get("nodes") or []) or "-"), ("GPUIds", gpus)],
        [("Attempts", j["attempts"]), ("Resumes", j["resume_count"]), ("Preemptions", j["preemptions"]),
         ("Iterations", "-" if j.get("progress") is None else int(j["progress"])),
         ("ExitCode", "-" if j.get("exit_code") is None else j["exit_code"])],
        [("Command", j.get("command"))],
        [("GPUUtil", _gpu_util(rec)), ("GPUMemMax", _gpu_mem(rec)), ("GPUEnergy", _gpu_energy(rec))],
        [("CheckpointDir", j.get("checkpoint_dir") or "-")],
    ]
    for i, kv in enumerate(lines):
        typer.echo(plain(("" if i == 0 else "   ") + " ".join(f"{k}={v}" for k, v in kv)))
    if rec and rec.get("allocations"):
        typer.echo("Allocations:")
        t = Table("FROM", "TO", "NODES", "GPUS", "CPUS", "MEMORY", "TAKEN BY", "GIVEN UP BY")
        for a in rec["allocations"]:
            t.add_row(local_time(a["start"]), local_time(a["end"]) if a["end"] else "(holding)", ",".join(a["nodes"]),
                      " ".join(f"{n}:{','.join(map(str, g))}" for n, g in a["local_gpus"].items()), str(a["cpus"]),
                      format_mem(a["mem_mb"]), a["opened_by"] or "", a["closed_by"] or "")
        _print_table(t)
    typer.echo("Events:")
    t = Table("TIME", "EVENT", "DETAIL")
    for e in events:
        d = e.get("detail") or {}
        d = {k: v for k, v in d.items() if k != "alloc"}
        t.add_row(local_time(e["time"]), e["kind"], json.dumps(d, sort_keys=True) if d else "")
    _print_table(t)


def _gpu_util(rec: dict[str, Any] | None) -> str:
    """NVML utilisation of a history record: ``mean%/max%`` (``-``: not sampled)."""
    if not rec or rec.get("gpu_util_mean") is None:
        return "-"
    return f"{rec['gpu_util_mean']:g}%/{rec['gpu_util_max']:g}%"


def _gpu_mem(rec: dict[str, Any] | None) -> str:
    return "-" if not rec or rec.get("gpu_mem_max_mb") is None else f"{rec['gpu_mem_max_mb']:g}MiB"


def _gpu_energy(rec: dict[str, Any] | None) -> str:
    return "-" if not rec or rec.get("gpu_energy_wh") is None else f"{rec['gpu_energy_wh']:g}Wh"


@app.command()
def history(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    state: Annotated[list[str] | None, typer.Option("--state", "-s", help="Only these states: CD, F, CA, PD, R, CG or lifecycle names (repeatable).")] = None,
    since: Annotated[str | None, typer.Option("--since", "-S", help="Jobs not ended before: 2026-01-31, 2026-01-31T09:00, or an age (2h, 7d).")] = None,
    until: Annotated[str | None, typer.Option("--until", "-E", help="Jobs submitted by this time (same forms).")] = None,
    allocations: Annotated[bool, typer.Option("--allocations", help="Also each allocation a job held (nodes, GPUs, from, to).")] = False,
    as_trace: Annotated[Path | None, typer.Option("--as-trace", help="Write the finished jobs as a gpuloom JSONL trace to this file, and the cluster beside it (NAME.cluster.toml): replay them with gpuloom simulate --trace FILE --cluster NAME.cluster.toml.", show_default=False)] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Accounting (like sacct): submit, start, end, elapsed, GPU-hours and exit code of past and current jobs."""
    now = time.time()
    params: dict[str, Any] = {"allocations": allocations}
    for key, v in (("since", since), ("until", until)):
        if v is not None:
            try:
                params[key] = repr(parse_wall_time(v, now, f"--{key}", -1))
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
    if user:
        params["user"] = user
    if as_trace is not None:
        from .export import write_trace

        if state:
            raise typer.BadParameter("--as-trace exports the finished jobs: --state does not apply")

        params.pop("allocations")
        client = Client(url, token, state_dir)
        write_trace(client.call("GET", "/history/trace", params=params), as_trace, as_json,
                    client.call("GET", "/nodes"))
        return
    if state:
        params["state"] = state
    client = Client(url, token, state_dir)
    params["limit"] = HISTORY_PAGE
    recs = client.call("GET", "/history", params=params)
    while client.last is not None and client.last.headers.get("X-Next-After"):  # the next page
        recs += client.call("GET", "/history", params={**params, "after": client.last.headers["X-Next-After"]})
    if as_json:
        _print_json(recs)
        return
    t = Table("JOBID", "NAME", "USER", "QUEUE", "STATE", "SUBMIT", "START", "END", "ELAPSED", "GPUS", "GPU-HOURS",
              "EXITCODE", "GPU-UTIL", "GPU-MEM", "ENERGY")
    for r in recs:
        t.add_row(r["array"] or str(r["id"]), r["name"], r["user"], r["queue"] or "-", r["state"].upper(),
                  local_time(r["submit"]), local_time(r["start"]), local_time(r["end"]), format_duration(r["elapsed_s"]),
                  str(r["gpus"]), f"{r['gpu_hours']:.3f}", "-" if r["exit_code"] is None else str(r["exit_code"]),
                  _gpu_util(r), _gpu_mem(r), _gpu_energy(r))
        for a in r.get("allocations") or []:
            gpus = " ".join(f"{n}:{','.join(map(str, g))}" for n, g in a["local_gpus"].items())
            t.add_row("", f"  {a['opened_by']}", "", "", "", "", local_time(a["start"]), local_time(a["end"]), "", str(a["gpus"]),
                      "", gpus)
    _print_table(t)


@app.command()
def logs(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    tail: Annotated[int | None, typer.Option(help="Only the last N bytes.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new output until the job ends.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between reads with -f.")] = 0.5,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's stdout and stderr (-f: follow it until the job ends)."""
    c = Client(url, token, state_dir)
    params = {"tail": tail} if tail else {}
    r = c.call("GET", f"/jobs/{job_id}/logs", params=params, raw=True)
    if as_json and not follow:
        _print_json({"id": job_id, "log": r.text})
        return
    typer.echo(r.text, nl=False)
    if not follow:
        return
    offset = int(r.headers.get("X-Log-Offset", 0))
    try:
        while True:
            ended = c.call("GET", f"/jobs/{job_id}")["st"] in ("CD", "F", "CA")
            r = c.call("GET", f"/jobs/{job_id}/logs", params={"offset": offset}, raw=True)
            if r.text:
                typer.echo(r.text, nl=False)
            offset = int(r.headers.get("X-Log-Offset", offset))
            if ended and not r.text:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        err_console.print("")
