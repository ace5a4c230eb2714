"""Accounting: what each job asked for, when it ran, on what, for how long (Slurm's ``sacct``).

Everything here is read from the store, so it survives restarts and is the
same for every client:

* ``jobs``: submission, first start, end, exit code, reason, the spec;
* ``allocations``: one record per allocation a job held (nodes, GPU ids,
  cores, memory, co-runners), from when to when, and the events that took and
  gave it up (:data:`~.store.allocations_t`).

:func:`job_record` turns a job and its allocation records into one accounting
record: ``start`` is the first launch, ``elapsed_s`` runs from it to the end
(or now, like sacct's Elapsed), ``held_s`` counts only the time it held
resources (a preempted job holds nothing while it waits again), and
``gpu_hours`` sums GPUs x hours over its allocations (co-runners sharing GPUs
each count them).  Both are the job's held seconds as the service measured them
on its monotonic clock (``held_time``, ``held_gpu_time``: a wall-clock step
inside an allocation moves its shown ends, not the bill), plus, while it holds
an allocation, the wall seconds since its last launch.  With ``allocations=True`` the records list those
allocations: the history a replay of the service in the simulator starts from.
:func:`history` answers a page of records by job id (``after``, ``limit``):
the API's ``/history`` answers at most :data:`MAX_HISTORY_PAGE` at once.

Times in JSON are ISO 8601 in UTC (:func:`iso`); ``since``/``until`` are read by
:func:`gpuloom.core.units.parse_wall_time` (a bare duration there is an age: ``2h``, two hours ago).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...core.lifecycle import SHORT_STATE, JobState

if TYPE_CHECKING:  # (the CLI's job commands use the formatting here without loading the database layer)
    from .store import JobRow, Store

HISTORY_PAGE = 1000  # records per /history page unless asked (as /jobs)
MAX_HISTORY_PAGE = 10_000  # and at most
_ALLOC_CHUNK = 500  # job ids per query of their allocation records


def iso(t: float | None) -> str | None:
    """``1732172400.25`` -> ``"2024-11-21T07:00:00.250+00:00"`` (None stays None)."""
    if t is None:
        return None
    return datetime.fromtimestamp(float(t), UTC).isoformat(timespec="milliseconds")


def short_state(state: str) -> str:
    try:
        return SHORT_STATE[JobState(state)]
    except ValueError:
        return "?"


def array_label(row: JobRow) -> str | None:
    return None if row.array_id is None else f"{row.array_id}_{row.array_task}"


def span_json(a: Mapping[str, Any]) -> dict[str, Any]:
    alloc = a["alloc"]
    return {
        "start": iso(a["start_time"]), "end": iso(a["end_time"]), "gpus": a["gpus"], "nodes": a["nodes"].split(","),
        "gpu_ids": [g for p in alloc.get("parts", []) for g in p.get("gpus", [])],
        "local_gpus": {p["node"]: p.get("local_gpus", []) for p in alloc.get("parts", [])},
        "cpus": sum(int(p.get("cpus", 0)) for p in alloc.get("parts", [])),
        "mem_mb": sum(int(p.get("mem_mb", 0)) for p in alloc.get("parts", [])),
        "group": alloc.get("group", []), "opened_by": a["opened_by"], "closed_by": a["closed_by"],
    }


def job_record(row: JobRow, spans: Sequence[Mapping[str, Any]], now: float, allocations: bool = False) -> dict[str, Any]:
    """One accounting record (see the module notes)."""
    end = row.end_time
    start = row.first_start
    holding = [s for s in spans if s["end_time"] is None] if end is None else []
    live = max(0.0, now - row.last_start) if holding and row.last_start is not None else 0.0
    held = row.held_time + live
    gpu_s = row.held_gpu_time + live * sum(s["gpus"] for s in holding)
    nodes: list[str] = []
    for s in spans:
        for n in s["nodes"].split(","):
            if n and n not in nodes:
                nodes.append(n)
    out: dict[str, Any] = {
        "id": row.id,
        "array": array_label(row),
        "name": row.name,
        "user": row.user,
        "queue": str(row.spec.get("queue") or ""),
        "state": row.state,
        "st": short_state(row.state),
        "submit": iso(row.submit_time),
        "start": iso(start),
        "end": iso(end),
        "elapsed_s": None if start is None else max(0.0, (end or now) - start),
        "held_s": held,
        "gpus": row.spec.get("gpus"),
        "gpu_hours": gpu_s / 3600.0,
        "exit_code": row.exit_code,
        "reason": row.reason,
        "nodes": nodes,
        "attempts": row.attempts,
        "preemptions": row.preemptions,
    }
    if allocations:
        out["allocations"] = [span_json(s) for s in spans]
    return out


def history(store: Store, now: float, user: str | None = None, states: Iterable[str] | None = None,
            since: float | None = None, until: float | None = None, allocations: bool = False,
            job_ids: Iterable[int] | None = None, after: int | None = None,
            limit: int | None = None) -> list[dict[str, Any]]:
    """Accounting records of the jobs that match, by id: at most ``limit`` after id ``after``;
    ``since``/``until`` keep the jobs active in that window."""
    if job_ids is None:
        rows = store.list_jobs(states, user=user, after_id=after, since=since, until=until, limit=limit)
    else:  # a few named jobs (the API takes at most 1000): each read by id, then filtered as the query would
        keep = sorted(i for i in set(job_ids) if after is None or i > after)
        states = None if states is None else set(states)
        rows = [r for r in map(store.get_job, keep) if r is not None and (states is None or r.state in states)
                and (user is None or r.user == user) and (since is None or r.end_time is None or r.end_time >= since)
                and (until is None or r.submit_time <= until)][:limit]
    spans: dict[int, list[Mapping[str, Any]]] = {r.id: [] for r in rows}
    ids = [r.id for r in rows]
    for k in range(0, len(ids), _ALLOC_CHUNK):  # only this page's allocation records
        for s in store.allocations(ids[k:k + _ALLOC_CHUNK]):
            spans[s["job_id"]].append(s)
    return [job_record(r, spans[r.id], now, allocations) for r in rows]


def format_duration(seconds: float | None) -> str:
    """Slurm's ``[D-]HH:MM:SS`` (``MM:SS`` under an hour); ``-`` for None."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_mem(mb: float | None) -> str:
    """Memory for display, in the units jobs and nodes are given in (``G`` = 10^9 bytes, 1000 MB)."""
    if mb is None:
        return "-"
    mb = float(mb)
    for unit, size in (("T", 1e6), ("G", 1e3)):
        if mb >= size:
            v = mb / size
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 0.005 else f"{v:.2f}{unit}"
    return f"{mb:.0f}M"
