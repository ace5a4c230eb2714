"""API times (ISO 8601, UTC) as the CLI prints them: local time without zone, like Slurm."""

from __future__ import annotations

from datetime import datetime


def local_time(iso: str | None, missing: str = "-") -> str:
    """``"2023-11-14T22:13:20.000+00:00"`` -> ``"2023-11-14T23:13:20"`` where local time is UTC+1;
    ``missing`` for no time."""
    if not iso:
        return missing
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
