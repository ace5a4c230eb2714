"""The loop's records that the store could not take yet, kept in order until it does.

What the scheduling loop observes (a process ended, a stop finished, a job
progressed, a job's group changed) has already happened: it cannot be undone
because the store is unreachable or its disk is full.  So the loop never
drops such a record: :meth:`Outbox.put` writes it at once, or, when the store
refuses (:func:`~..state.store.unavailable`), or earlier records still wait, keeps it
behind them.  :meth:`Outbox.flush` (every loop tick) writes the waiting
records oldest first and stops at the first refusal: records reach the store
in the order their changes happened, with the times they happened (an
allocation closed while the database was down is closed at that time).

The loop *acts* (launches, preempts) only once the outbox is empty, so a
GPU released in memory is released in the store before another job's launch
records it taken (:meth:`Service.may_act <.service.Service.may_act>`).

Nothing is journaled on local disk: every waiting record has a trace that
outlives the process and that recovery reads (:mod:`.recovery`).  An exit
leaves its exit record (written in place by the job's wrapper, so a full disk
does not lose it); a stop half done is stored as checkpointing before its
SIGTERM, and recovery finishes it; a launch is stored (its intent, then its
processes) before it counts, and undone otherwise.  A journal would also live
on the state disk, the one that fills.

A record the store rejects for another reason (a bug, data it cannot hold) is
logged and dropped rather than blocking the ones behind it forever.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..state.store import Store, unavailable

log = logging.getLogger("gpuloom.service")


@dataclass(slots=True)
class Record:
    """One change of a job: its fields (None: an event alone) and event, at wall time ``at``."""

    job_id: int
    fields: dict[str, Any] | None
    event: str | None
    detail: dict[str, Any]
    at: float
    expect_state: tuple[str, ...] | None = None


class Outbox:
    def __init__(self, store: Store, wall: Callable[[], float]) -> None:
        self.store = store
        self.wall = wall
        self.pending: deque[Record] = deque()
        self.error: BaseException | None = None  # why the last write was refused (None: the last one went in)
        self.refused_since: float | None = None  # wall time of the first refusal of the current outage
        self.closed = False  # another server took over: nothing more is written (see Service.give_up)

    def __len__(self) -> int:
        return len(self.pending)

    def jobs(self) -> set[int]:
        """The jobs that have records waiting."""
        return {r.job_id for r in self.pending}

    def put(self, job_id: int | str, fields: Mapping[str, Any] | None, event: str | None = None,
            detail: Mapping[str, Any] | None = None, expect_state: Iterable[str] | None = None) -> None:
        """Record a change now, or keep it behind those waiting (see the module notes)."""
        rec = Record(int(job_id), None if fields is None else dict(fields), event, dict(detail or {}), self.wall(),
                     None if expect_state is None else tuple(expect_state))
        if not self.pending and not self.closed:
            try:
                self._write(rec)
                return
            except Exception as e:
                if not self._refused(rec, e):
                    return
        self.pending.append(rec)

    def flush(self) -> bool:
        """Write the waiting records, oldest first, until one is refused; whether none is left."""
        while self.pending and not self.closed:
            rec = self.pending[0]
            try:
                self._write(rec)
            except Exception as e:
                if self._refused(rec, e):
                    return False
            self.pending.popleft()
        if self.refused_since is not None and not self.pending:
            log.warning("the store takes records again: every waiting one is recorded (%.1f s after the first "
                        "refusal)", self.wall() - self.refused_since)
            self.refused_since = None
        return not self.pending

    def _write(self, rec: Record) -> None:
        if rec.fields:
            self.store.update_job(rec.job_id, rec.fields, rec.event, rec.detail, expect_state=rec.expect_state,
                                  now=rec.at, durable=False)
        elif rec.event is not None:
            self.store.add_event(rec.job_id, rec.event, rec.detail, durable=False, now=rec.at)
        self.error = None

    def _refused(self, rec: Record, e: Exception) -> bool:
        """Note a failed write; True if it is to be retried (the store's state), False if dropped."""
        if not unavailable(e):
            log.error("job %s: the store rejects the record of %s (%s: %s); dropped", rec.job_id,
                      rec.event or "a change", type(e).__name__, e)
            return False
        if self.refused_since is None:
            self.refused_since = self.wall()
            log.error("the store cannot record changes (%s); they are kept in order and retried every tick, and "
                      "no job is started or preempted until they are recorded", str(e).splitlines()[0])
        self.error = e
        return True
