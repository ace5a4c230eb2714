"""``gpuloom queue --start`` (like ``squeue --start``): waiting jobs by position, with estimated starts."""

from __future__ import annotations

from typing import Any

from .client import Client
from .common import PlainTable as Table
from .common import print_json, print_table
from .timefmt import local_time


def show_starts(client: Client, user: str | None, as_json: bool) -> None:
    """Print ``GET /starts`` (only ``user``'s jobs when given): position overall (POS) and in the job's
    queue (QPOS), and START_TIME, N/A beyond the jobs the scheduler keeps reservations for."""
    jobs: list[dict[str, Any]] = client.call("GET", "/starts")
    if user:
        jobs = [j for j in jobs if j["user"] == user]
    if as_json:
        print_json(jobs)
        return
    t = Table("JOBID", "NAME", "USER", "QUEUE", "ST", "POS", "QPOS", "START_TIME", "GPUS", "NODELIST(REASON)")
    for j in jobs:
        t.add_row(str(j["id"]), j["name"] or "", j["user"], j["queue"] or "-", "PD", str(j["queue_position"]),
                  str(j["queue_position_in_queue"]), local_time(j["est_start"], "N/A"), str(j["gpus"]),
                  f"({j['pending_reason'] or 'None'})")
    print_table(t)
