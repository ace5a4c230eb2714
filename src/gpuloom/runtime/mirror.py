"""The service's in-memory mirror of its store: stored rows and the driver's jobs, one id type.

The store is the truth; the driver works on :class:`~gpuloom.core.job.Job`
objects.  :class:`Mirror` keeps the two in step:

* **One id type.**  The store's primary keys are integers; everything above it
  (the driver, the plan, the executor's ids ``"7"``/``"7.1"``) uses the string
  form.  Conversion happens here only: :meth:`Mirror.write` takes a string id.
* :meth:`Mirror.load` builds the job the driver schedules from a stored row: its
  spec (:func:`~.specs.job_spec`), its lifecycle started in the stored state,
  its counters, and its remaining work as stored (``work_left`` at ``work_at``)
  or, for a job that never ran, its whole work estimate.
* :meth:`Mirror.work` is the remaining-work record written with every change of
  speed (launch, promotion, regroup, stop, end), so a restarted service resumes
  each job's work exactly where the model says it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.job import Job
from ..core.lifecycle import JobState
from .clock import Clock
from .specs import DEFAULT_DURATION, job_spec
from .store import JobRow, Store


class Mirror:
    def __init__(self, store: Store, clock: Clock, epoch: float, default_duration: float = DEFAULT_DURATION,
                 protect_factor: float = 3.0) -> None:
        self.store = store
        self.clock = clock
        self.epoch = epoch
        self.default_duration = default_duration
        self.protect_factor = protect_factor
        self.rows: dict[str, JobRow] = {}

    def now(self) -> float:
        """Service time: seconds since the epoch stored in the database."""
        return self.clock.time() - self.epoch

    def load(self, row: JobRow, state: JobState, profile: Any = None) -> Job:
        """The driver's job for a stored row, its lifecycle starting now in ``state``."""
        now = self.now()
        job = Job(job_spec(row, self.epoch, self.default_duration, profile), row.id)
        job.arrive(now, self.protect_factor, state)
        job.attained_time = row.held_time
        job.attained_gpu_time = row.held_gpu_time
        job.preemptions = row.preemptions
        job.first_start = None if row.first_start is None else row.first_start - self.epoch
        if row.work_left is not None:
            job.remaining = max(float(row.work_left), 0.0)
            job.last_update = float(row.work_at) if row.work_at is not None else now
        else:
            job.last_update = now
        self.rows[job.id] = row
        return job

    def drop(self, jid: str) -> JobRow | None:
        return self.rows.pop(jid, None)

    @staticmethod
    def work(job: Job) -> dict[str, float]:
        """The remaining-work fields of ``job`` (exact as of its last advance)."""
        return {"work_left": job.remaining, "work_at": job.last_update}

    def write(self, jid: str, fields: Mapping[str, Any], event: str | None = None,
              detail: Mapping[str, Any] | None = None, durable: bool = False,
              expect_state: Iterable[str] | None = None) -> bool:
        """Update the job's row (and log ``event``) in one transaction; False if ``expect_state`` failed."""
        return self.store.update_job(int(jid), dict(fields), event, dict(detail or {}), durable=durable,
                                     expect_state=expect_state, now=self.clock.time())

    def record_reasons(self, jobs: Iterable[Job]) -> None:
        """Store why these jobs wait, as the last round said (``job.reason``; only the changes): the jobs
        whose reasons the round set (``Driver.reasoned``)."""
        changed: dict[int, str | None] = {}
        for job in jobs:
            row = self.rows.get(job.id)
            if row is not None and row.pending_reason != job.reason:
                row.pending_reason = job.reason
                changed[int(job.id)] = job.reason
        self.store.set_pending_reasons(changed)

    def event(self, jid: str, kind: str, detail: Mapping[str, Any] | None = None) -> None:
        self.store.add_event(int(jid), kind, dict(detail or {}), durable=False, now=self.clock.time())
