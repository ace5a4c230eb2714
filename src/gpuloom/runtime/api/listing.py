"""``GET /jobs/stream``: every job a filter matches, in one response of JSON lines.

``gpuloom queue`` lists thousands of jobs at once; a page of ``GET /jobs`` builds each job's whole JSON
(:func:`.jobjson.job_json`) and has FastAPI validate and encode it, and the client asks page after page.
Here one response carries the whole listing, read from the store a block at a time with only the
columns the asked fields need, each job a list of values (no dict per job):

* line 1: ``{"fields": [NAME, ...]}``;
* then one line per block of jobs: ``[[VALUE, ...], ...]``, each job's values in the order of ``fields``
  and equal to those ``GET /jobs`` gives (redacted alike for other users' jobs, :mod:`.privacy`);
* last: ``{"end": COUNT}``, the jobs sent.  A response without it was cut short.

Blocks follow one another by id (each one statement, so the loop waits for the store at most that
long): no job comes twice, and a job that matches the filter from start to end comes once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...core.lifecycle import JobState
from ..state.history import iso, short_state
from ..state.store import Store
from .privacy import may_see_all, redact_job

JOB_STATES = tuple(s.value for s in JobState)

BLOCK = 2000  # jobs per store statement and per line

#: the columns each field of a job's JSON is made from (``id`` and ``user`` are always read)
FIELD_COLUMNS: dict[str, tuple[str, ...]] = {
    "id": (), "name": ("name",), "user": (), "state": ("state",), "st": ("state",),
    "pending_reason": ("pending_reason",), "queue": ("spec",), "array": ("array_id", "array_task"),
    "array_id": ("array_id",), "array_task": ("array_task",), "dependency": ("spec",), "gpus": ("spec",),
    "gpu_type": ("spec",), "cpus": ("spec",), "mem_mb": ("spec",), "command": ("spec",), "model": ("spec",),
    "time_limit": ("spec",), "submit_time": ("submit_time",), "first_start": ("first_start",),
    "last_start": ("last_start",), "end_time": ("end_time",), "nodes": ("alloc",), "alloc": ("alloc",),
    "procs": ("procs",), "attempts": ("attempts",), "resume_count": ("resume_count",),
    "preemptions": ("preemptions",), "held_time": ("held_time",),
    "held_s": ("held_time", "alloc", "last_start", "end_time"), "checkpoint_dir": ("checkpoint_dir",),
    "workdir": ("spec",), "progress": ("progress", "state"), "exit_code": ("exit_code",), "reason": ("reason",),
    "cancel_requested": ("cancel_requested",),
}

Live = Callable[[int, str], Any]  # (job id, state) -> its live progress, or None
Getter = Callable[[tuple[Any, ...], float, Live], Any]  # (the job's columns, wall seconds now, live) -> a value


def _getters(ix: dict[str, int]) -> dict[str, Getter]:
    """Each field's value from a job's columns (at the positions ``ix`` names), as :func:`.api.job_json`
    gives it; only the fields whose columns ``ix`` has are usable."""
    g = ix.get
    i_state, i_spec, i_alloc, i_ls, i_end = g("state", -1), g("spec", -1), g("alloc", -1), g("last_start", -1), \
        g("end_time", -1)
    i_aid, i_at, i_held, i_prog = g("array_id", -1), g("array_task", -1), g("held_time", -1), g("progress", -1)
    short = {s: short_state(s) for s in JOB_STATES}

    def col(name: str) -> Getter:
        i = ix.get(name, -1)
        return lambda t, now, live: t[i]

    def spec(key: str) -> Getter:
        return lambda t, now, live: t[i_spec].get(key)

    def held(t: tuple[Any, ...], now: float, live: Live) -> float:
        h = t[i_held]
        if t[i_alloc] and t[i_ls] is not None and t[i_end] is None:
            h += max(0.0, now - t[i_ls])
        return h

    def progress(t: tuple[Any, ...], now: float, live: Live) -> Any:
        p = live(t[0], t[i_state])
        return p if p is not None else t[i_prog]

    out: dict[str, Getter] = {k: col(k) for k in ("name", "state", "pending_reason", "array_id", "array_task",
                                                  "alloc", "procs", "attempts", "resume_count", "preemptions",
                                                  "held_time", "checkpoint_dir", "exit_code", "reason",
                                                  "cancel_requested")}
    out.update({k: spec(k) for k in ("dependency", "gpus", "gpu_type", "cpus", "mem_mb", "command", "model",
                                      "time_limit", "workdir")})
    out.update({k: (lambda i: lambda t, now, live: iso(t[i]))(ix.get(k, -1))
                for k in ("submit_time", "first_start", "last_start", "end_time")})
    out.update({
        "id": lambda t, now, live: t[0],
        "user": lambda t, now, live: t[1],
        "st": lambda t, now, live: short.get(t[i_state]) or short_state(t[i_state]),
        "queue": lambda t, now, live: str(t[i_spec].get("queue") or ""),
        "array": lambda t, now, live: None if t[i_aid] is None else f"{t[i_aid]}_{t[i_at]}",
        "nodes": lambda t, now, live: [p["node"] for p in (t[i_alloc] or {}).get("parts", [])],
        "held_s": held,
        "progress": progress,
    })
    return out


def columns_for(fields: Sequence[str]) -> list[str]:
    """The store columns the ``fields`` of a job's JSON are made from, ``id`` and ``user`` first."""
    cols = ["id", "user"]
    for f in fields:
        cols += [c for c in FIELD_COLUMNS[f] if c not in cols]
    return cols


def job_lines(store: Store, fields: Sequence[str], viewer: tuple[str, bool], now: Callable[[], float], live: Live,
              states: Sequence[str] | None = None, user: str | None = None, since: float | None = None,
              block: int = BLOCK) -> Iterator[bytes]:
    """The listing's lines (see the module's notes); the first block is read before anything is yielded,
    so a store that cannot answer fails the request before it starts.  ``viewer``: (user, admin)."""
    cols = columns_for(fields)
    getters = [_getters({c: i for i, c in enumerate(cols)})[f] for f in fields]
    who, admin = viewer
    after: int | None = None
    sent = 0
    head = json.dumps({"fields": list(fields)}).encode() + b"\n"
    while True:
        rows = store.job_columns(cols, states, user=user, after_id=after, since=since, limit=block)
        t = now()
        values = []
        for tup in rows:
            v = [g(tup, t, live) for g in getters]
            if not admin and tup[1] != who and not may_see_all(tup[1], who, admin):
                d = redact_job({**dict(zip(fields, v, strict=True)), "user": tup[1]}, who, admin)
                v = [d[f] for f in fields]
            values.append(v)
        sent += len(values)
        line = json.dumps(values, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode() + b"\n" \
            if values else b""
        if len(rows) < block:
            yield head + line + json.dumps({"end": sent}).encode() + b"\n"
            return
        yield head + line
        head = b""
        after = rows[-1][0]
