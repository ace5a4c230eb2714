"""A job as the API returns it: its JSON (:func:`job_json`), the names of its fields, and the
``?fields=`` list that picks some of them."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from ..state.history import array_label, iso, short_state
from ..state.store import JobRow


def job_json(row: JobRow, live_progress: int | None = None, now: float | None = None) -> dict[str, Any]:
    """A job as the API returns it; ``now`` (wall seconds) adds the live ``held_s`` of a running job."""
    s = row.spec
    nodes = [p["node"] for p in (row.alloc or {}).get("parts", [])]
    held = row.held_time
    if now is not None and row.alloc and row.last_start is not None and row.end_time is None:
        held += max(0.0, now - row.last_start)
    return {
        "id": row.id,
        "name": row.name,
        "user": row.user,
        "state": row.state,
        "st": short_state(row.state),
        "pending_reason": row.pending_reason,
        "queue": str(s.get("queue") or ""),
        "array": array_label(row),
        "array_id": row.array_id,
        "array_task": row.array_task,
        "dependency": s.get("dependency"),
        "gpus": s.get("gpus"),
        "gpu_type": s.get("gpu_type"),
        "cpus": s.get("cpus"),
        "mem_mb": s.get("mem_mb"),
        "command": s.get("command"),
        "model": s.get("model"),
        "time_limit": s.get("time_limit"),
        "submit_time": iso(row.submit_time),
        "first_start": iso(row.first_start),
        "last_start": iso(row.last_start),
        "end_time": iso(row.end_time),
        "nodes": nodes,
        "alloc": row.alloc,
        "procs": row.procs,
        "attempts": row.attempts,
        "resume_count": row.resume_count,
        "preemptions": row.preemptions,
        "held_time": row.held_time,
        "held_s": held,
        "checkpoint_dir": row.checkpoint_dir,
        "workdir": s.get("workdir"),
        "progress": live_progress if live_progress is not None else row.progress,
        "exit_code": row.exit_code,
        "reason": row.reason,
        "cancel_requested": row.cancel_requested,
    }


#: the fields of a job's JSON (:func:`job_json`), which ``GET /jobs?fields=`` may name
JOB_FIELDS = ("id", "name", "user", "state", "st", "pending_reason", "queue", "array", "array_id", "array_task",
              "dependency", "gpus", "gpu_type", "cpus", "mem_mb", "command", "model", "time_limit", "submit_time", "first_start",
              "last_start", "end_time", "nodes", "alloc", "procs", "attempts", "resume_count", "preemptions",
              "held_time", "held_s", "checkpoint_dir", "workdir", "progress", "exit_code", "reason",
              "cancel_requested")


def job_fields(text: str | None) -> list[str] | None:
    """``"id,name,st"`` -> those field names (None: all); a 422 saying which one is unknown (by position:
    an error never echoes its input)."""
    if text is None:
        return None
    keys = [k.strip() for k in text.split(",")]
    bad = [i for i, k in enumerate(keys) if k not in JOB_FIELDS]
    if bad:
        raise HTTPException(422, [{"loc": ["query", "fields"], "msg": f"name {bad[0] + 1} of the list is no field of a "
                                   f"job; a job's fields are {', '.join(JOB_FIELDS)}", "type": "bad_fields"}])
    return list(dict.fromkeys(keys))
