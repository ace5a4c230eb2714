"""What a user may see of other users' jobs (like Slurm's ``PrivateData``).

Everyone sees every job's id, name, owner, state, size, times and reason (a
shared queue must be explainable); only the job's owner and admins see what
could hold secrets or help an attack: the command line, paths (checkpoint
directory, working directory), processes, and the detail of its events.
"""

from __future__ import annotations

from typing import Any

#: fields of a job's JSON hidden from users who neither own it nor are admins
PRIVATE_FIELDS = ("command", "checkpoint_dir", "workdir", "procs", "env")


def may_see_all(row_user: str, user: str, admin: bool) -> bool:
    return admin or row_user == user


def redact_job(d: dict[str, Any], user: str, admin: bool) -> dict[str, Any]:
    """``d`` (a job's JSON) with :data:`PRIVATE_FIELDS` set to None unless ``user`` may see them."""
    if may_see_all(d.get("user", ""), user, admin):
        return d
    out = dict(d)
    for k in PRIVATE_FIELDS:
        if k in out:
            out[k] = None
    alloc = out.get("alloc")
    if isinstance(alloc, dict):  # where it runs is public, its core ids and pids are not needed
        out["alloc"] = {"parts": [{k: v for k, v in p.items() if k != "cores"} for p in alloc.get("parts", [])],
                        "group": alloc.get("group", [])}
    return out


def redact_events(events: list[dict[str, Any]], owner: str, user: str, admin: bool) -> list[dict[str, Any]]:
    """A job's events; their detail (pids, allocations, errors) only for its owner and admins."""
    if may_see_all(owner, user, admin):
        return events
    return [{**e, "detail": {}} for e in events]
