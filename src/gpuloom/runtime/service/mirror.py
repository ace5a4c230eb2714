"""The service's in-memory mirror of its store: stored rows and the driver's jobs, one id type.

The store is the truth; the driver works on :class:`~gpuloom.core.job.Job`
objects.  :class:`Mirror` keeps the two in step:

* **One id type.**  The store's primary keys are integers; everything above it
  (the driver, the plan, the executor's ids ``"7"``/``"7.1"``) uses the string
  form, and so do the mirror's methods (:meth:`Mirror.write` takes a string id).
* :meth:`Mirror.load` builds the job the driver schedules from a stored row: its
  spec (:func:`~..state.specs.job_spec`), its lifecycle started in the stored state,
  its counters, and its remaining work as stored (``work_left`` at ``work_at``)
  or, for a job that never ran, its whole work estimate.
* **Service time** (:meth:`Mirror.now`) runs on the monotonic clock (:class:`~..exec.clock.ServiceTime`);
  a stored wall time (a submission, a first start) becomes service time by its age on the wall
  clock now, never negative and never before ``floor`` (:meth:`Mirror.since`): a wall-clock step
  moves it by no more than those bounds.
* :meth:`Mirror.work` is the remaining-work record written with every change of
  speed (launch, promotion, regroup, stop, end), so a restarted service resumes
  each job's work exactly where the model says it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...core.job import Job
from ...core.lifecycle import JobState
from ..exec.clock import Clock, ServiceTime
from ..state.specs import DEFAULT_DURATION, job_spec
from ..state.store import JobRow, Store, StoreUnavailable, unavailable
from .outbox import Outbox


class Mirror:
    def __init__(self, store: Store, clock: Clock, epoch: float, default_duration: float = DEFAULT_DURATION,
                 protect_factor: float = 3.0, timebase: ServiceTime | None = None,
                 outbox: Outbox | None = None) -> None:
        self.store = store
        self.clock = clock
        #: records the store has not taken yet (:mod:`.outbox`); the service's, kept across rebuilds
        self.outbox = outbox if outbox is not None else Outbox(store, clock.time)
        self.epoch = epoch
        self.timebase = timebase if timebase is not None else ServiceTime(clock, max(0.0, clock.time() - epoch))
        self.default_duration = default_duration
        self.protect_factor = protect_factor
        self.rows: dict[str, JobRow] = {}
        self._unsaved_reasons: dict[int, str | None] = {}  # pending reasons the store refused, for the next call
        #: job id -> arrival (service time) of the jobs loaded, kept until they end: a job loaded again
        #: (a rebuild, a parked job admitted) keeps its place whatever the wall clock did since
        self.arrivals: dict[str, float] = {}

    def now(self) -> float:
        """Service time: seconds since the stored epoch, on the monotonic clock."""
        return self.timebase.now()

    def since(self, wall_t: float, floor: float = 0.0) -> float:
        """The service time of the stored wall time ``wall_t``: now less its age on the wall clock,
        within ``[floor, now]``."""
        now = self.now()
        return min(now, max(floor, now - max(0.0, self.clock.time() - wall_t)))

    def load(self, row: JobRow, state: JobState, profile: Any = None, arrival: float | None = None) -> Job:
        """The driver's job for a stored row, its lifecycle starting now in ``state``; ``arrival`` in
        service time (default: from its submission time, :meth:`since`)."""
        now = self.now()
        if arrival is None:
            arrival = self.arrivals.get(str(row.id))
        if arrival is None:
            arrival = self.since(row.submit_time)
        self.arrivals[str(row.id)] = arrival
        job = Job(job_spec(row, self.epoch, self.default_duration, profile, arrival), row.id)
        job.arrive(now, self.protect_factor, state)
        job.attained_time = row.held_time
        job.attained_gpu_time = row.held_gpu_time
        job.preemptions = row.preemptions
        job.first_start = None if row.first_start is None else self.since(row.first_start)
        if row.work_left is not None:
            job.remaining = max(float(row.work_left), 0.0)
            job.last_update = float(row.work_at) if row.work_at is not None else now
        else:
            job.last_update = now
        self.rows[job.id] = row
        return job

    def drop(self, jid: str) -> JobRow | None:
        self.arrivals.pop(jid, None)
        return self.rows.pop(jid, None)

    @staticmethod
    def work(job: Job) -> dict[str, float]:
        """The remaining-work fields of ``job`` (exact as of its last advance)."""
        return {"work_left": job.remaining, "work_at": job.last_update}

    def write(self, jid: str, fields: Mapping[str, Any], event: str | None = None,
              detail: Mapping[str, Any] | None = None, durable: bool = False,
              expect_state: Iterable[str] | None = None) -> bool:
        """Update the job's row (and log ``event``) in one transaction, now; False if ``expect_state``
        failed.  For a change that must be stored before the loop acts on it (a launch's intent): it
        raises if the store refuses it, or (:class:`~..state.store.StoreUnavailable`) records still wait."""
        if not self.outbox.flush():
            raise StoreUnavailable(f"records wait for the store: {self.outbox.error}")
        return self.store.update_job(int(jid), dict(fields), event, dict(detail or {}), durable=durable,
                                     expect_state=expect_state, now=self.clock.time())

    def write_many(self, changes: Sequence[tuple[str, Mapping[str, Any], str, Mapping[str, Any]]]) -> None:
        """Several jobs' changes ``(id, fields, event, detail)`` in one transaction, now (no allocations);
        like :meth:`write`, it raises if the store refuses them or records still wait."""
        if not changes:
            return
        if not self.outbox.flush():
            raise StoreUnavailable(f"records wait for the store: {self.outbox.error}")
        self.store.update_jobs([(int(j), f, e, d) for j, f, e, d in changes], now=self.clock.time())

    def record(self, jid: str, fields: Mapping[str, Any], event: str | None = None,
               detail: Mapping[str, Any] | None = None, expect_state: Iterable[str] | None = None) -> None:
        """Record a change that has happened (an exit, a finished stop): now, or as soon as the store
        takes it, in order (:mod:`.outbox`).  Never raises for the store's state."""
        self.outbox.put(jid, fields, event, detail, expect_state)

    def record_reasons(self, jobs: Iterable[Job]) -> None:
        """Store why these jobs wait, as the last round said (``job.reason``; only the changes): the jobs
        whose reasons the round set (``Driver.reasoned``).  Reasons a store refused are kept and stored
        with the next call (a quiet round sets no reasons of its own)."""
        changed = {k: why for k, why in self._unsaved_reasons.items() if str(k) in self.rows}
        for job in jobs:
            row = self.rows.get(job.id)
            if row is not None and row.pending_reason != job.reason:
                changed[int(job.id)] = job.reason
        if not changed:
            return
        try:
            self.store.set_pending_reasons(changed)
        except Exception as e:
            if not unavailable(e):
                raise
            self._unsaved_reasons = changed
            return
        self._unsaved_reasons = {}
        for k, why in changed.items():
            self.rows[str(k)].pending_reason = why

    def event(self, jid: str, kind: str, detail: Mapping[str, Any] | None = None) -> None:
        self.outbox.put(jid, None, kind, detail)
