"""Queue position and estimated start of the waiting jobs, from the last round's backfill plan.

The scheduler's backfill hook (:mod:`gpuloom.policies.backfill`) records, each round, every waiting job's
position in the order (overall and within its queue) and the estimated start of the first ``depth`` of
them (their reservations), in service time.  Here they become what the API returns: wall-clock times.
A job the scheduler has not seen yet (held for a dependency or an array limit) has neither; with the
backfill guarantee off (``serve --reserve-depth 0``) no job has them.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..state.history import iso


class _Hook(Protocol):
    @property
    def starts(self) -> dict[str, float]: ...

    @property
    def positions(self) -> dict[str, tuple[int, int]]: ...


class _Scheduler(Protocol):
    @property
    def backfill(self) -> _Hook | None: ...


class _Clock(Protocol):
    def time(self) -> float: ...


class Planned(Protocol):
    """What this module reads of the service."""

    @property
    def clock(self) -> _Clock: ...

    @property
    def scheduler(self) -> _Scheduler: ...

    def now(self) -> float: ...


#: the keys :func:`job_start` returns
START_KEYS = ("queue_position", "queue_position_in_queue", "est_start")


def pending_starts(service: Planned) -> dict[str, dict[str, Any]]:
    """Job id -> ``{queue_position, queue_position_in_queue, est_start}`` (ISO 8601 UTC, or None when the
    job has no reservation) for every waiting job of the last round."""
    bf = service.scheduler.backfill
    if bf is None:
        return {}
    starts, positions = bf.starts, bf.positions  # (each replaced whole by a round: read once)
    now_s, wall = service.now(), service.clock.time()
    out: dict[str, dict[str, Any]] = {}
    for jid, (n, k) in positions.items():
        est = starts.get(jid)
        out[jid] = {"queue_position": n, "queue_position_in_queue": k,
                    "est_start": None if est is None else iso(wall + max(0.0, est - now_s))}
    return out


def job_start(service: Planned, job_id: int | str) -> dict[str, Any]:
    """:func:`pending_starts`' entry for one job, with every key None when it has none."""
    bf = service.scheduler.backfill
    if bf is None:
        return dict.fromkeys(START_KEYS)
    jid = str(job_id)
    pos = bf.positions.get(jid)
    if pos is None:
        return dict.fromkeys(START_KEYS)
    est = bf.starts.get(jid)
    return {"queue_position": pos[0], "queue_position_in_queue": pos[1],
            "est_start": None if est is None else iso(service.clock.time() + max(0.0, est - service.now()))}
