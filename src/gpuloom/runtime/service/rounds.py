"""One round of the service: observe (reap exits, cancels, time limits, new submissions, progress), then act
(plan, stop, launch); the jobs it mirrors and ends, and whether this server may act at all."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...core.lifecycle import JobState
from ..state.disk import PRESSURE_CAP
from ..state.locks import AlreadyServed
from ..state.store import unavailable
from .admission import refuse_reason
from .inventory import unpark
from .isolation import culprits
from .states import QUEUED_STATES

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from ...core.cluster import Cluster
    from ...core.job import Job
    from ...core.plan import Action
    from ...driver import Driver
    from ..exec.clock import Clock
    from ..exec.executor import Executor, InventorySource
    from ..state.disk import DiskGuard
    from ..state.locks import ServerLocks
    from ..state.store import JobRow, Store
    from .actuator import Actuator
    from .control import Control
    from .deps import Gate
    from .health import Health
    from .mirror import Mirror
    from .outbox import Outbox
    from .profile_manager import ProfilingManager
    from .queues import QueueAdmin
    from .telemetry import Telemetry
    from .typespeeds import TypeMeter


log = logging.getLogger("gpuloom.service")

S = JobState


class Rounds:
    """:class:`~.service.Service`'s rounds: observe, then act, and the jobs' ends they record."""

    # (set by Service.__init__ and assemble)
    store: Store
    cluster: Cluster
    clock: Clock
    driver: Driver
    actuator: Actuator
    mirror: Mirror
    profiler: ProfilingManager | None
    meter: TypeMeter
    control: Control
    health: Health
    telemetry: Telemetry
    disk: DiskGuard
    outbox: Outbox
    gate: Gate
    inventory: InventorySource | None
    executor: Executor
    queues: QueueAdmin
    server_locks: ServerLocks | None
    gave_up: str | None
    parked: dict[int, float]
    lock: threading.RLock
    last_round_s: float
    log_cap: int
    last_id: int
    _contact: list[Job]
    _read_at: float
    _stop: threading.Event
    _cancels: set[str]
    _cancel_lock: threading.Lock
    # (Service's)
    now: Callable[[], float]
    last_progress: Callable[[int | str], int | None]
    mark_time: Callable[..., None]
    wake: Callable[[], None]
    request_cancel: Callable[[str], None]
    assemble: Callable[..., None]

    # -- mirror ------------------------------------------------------------------------
    def admit_row(self, row: JobRow, state: JobState, arrival: float | None = None) -> Job:
        """Mirror a stored job and hand it to the driver, its lifecycle in ``state`` (``arrival``: see
        :meth:`.Mirror.load`)."""
        profile = self.profiler.stored_profile(row.spec) if self.profiler is not None else None
        job = self.driver.admit(self.mirror.load(row, state, profile, arrival), self.now())
        if state is S.WAITING_FOR_INITIAL_CONTACT:
            self._contact.append(job)
        return job

    def fits_or_fail(self, row: JobRow) -> bool:
        """False (and the job FAILED) if it can never run on the cluster, e.g. after the cluster shrank.

        With an inventory that follows a changing cluster, such a job is parked (kept out of the
        plan until the inventory changes) instead; a parked job is not admitted (:mod:`.inventory`)."""
        if row.id in self.parked or self.control.keeps_out(row):
            return False
        s = row.spec
        reason = refuse_reason(self.cluster, int(s["gpus"]), s.get("cpus"), s.get("mem_mb"))
        if reason is None:
            return True
        if self.inventory is not None:
            self.parked[row.id] = float("inf")
            self.mirror.record(str(row.id), {"pending_reason": f"Nodes: {reason[1]} while nodes are missing"})
            return False
        self.mirror.record(str(row.id), {"state": S.FAILED.value, "end_time": self.clock.time(), "alloc": None,
                                         "procs": None, "reason": f"can never run on this cluster: {reason[1]}"},
                           "failed", {"reason": reason[1]})
        return False

    # -- one round: observe, then act ------------------------------------------------------
    def round(self) -> list[Action]:
        """Observe (reap, cancels, time limits, new jobs, progress), then act (plan → actions)."""
        t0 = self.clock.monotonic()
        with self.lock:
            self.observe()
            actions = self.act() if self.may_act() else []
            if self.store.fenced is not None:  # a write of the round was refused: another server took over
                self.give_up(self.store.fenced)
                return []
            self.mark_time(force=False)
        t1 = self.clock.monotonic()
        self.last_round_s = t1 - t0
        self.health.round_done(t1)
        self.telemetry.round_done(actions, self.last_round_s)
        return actions

    def may_act(self) -> bool:
        """Whether this round may start and preempt jobs: the state disk has room for their records
        (:mod:`..state.disk`), every record of what happened is stored (so the store releases a GPU before it
        records another job taking it, :mod:`.outbox`), and this server still holds its database."""
        if self.disk.db_low():
            return False
        return self.outbox.flush() and self.check_lock()

    def check_lock(self) -> bool:
        """Confirm that this server still holds its locks (:meth:`..state.locks.ServerLocks.check`: a PostgreSQL
        session lost with a restart of the database is taken again).  False while that cannot be told (the
        database is unreachable), and for good once another server holds the database: this one gives up."""
        self.health.lock_checked = self.clock.monotonic()
        if self.store.fenced is not None:
            self.give_up(self.store.fenced)
        if self.gave_up is not None:
            return False
        if self.server_locks is None:
            return True
        try:
            self.server_locks.check()
        except AlreadyServed as e:
            self.give_up(str(e))
            return False
        except Exception as e:
            if not unavailable(e):
                raise
            self.health.lock = f"unknown: the database cannot be reached ({str(e).splitlines()[0]})"
            return False
        self.health.lock = "held"
        return True

    def give_up(self, why: str) -> None:
        """Stop scheduling for good: another server holds the database now.  Nothing more is written (that
        server recovers from the store and the jobs' exit records); the jobs run on, for it to adopt."""
        if self.gave_up is not None:
            return
        self.gave_up = why
        self.health.lock = f"lost: {why}"
        self.outbox.closed = True
        self._stop.set()
        log.critical("this server stops scheduling: %s", why)

    def observe(self) -> bool:
        """Bring the mirror up to date with the world; True if anything changed."""
        changed = self.reap()
        self._handle_cancels()
        self.control.observe()
        self._enforce_time_limits()
        unpark(self)
        changed = self._load_new() or changed
        self.actuator.promote(self.driver.jobs, self.now())
        self.meter.observe(self.driver.jobs, self.actuator.running, self.driver.speed, self.now())
        return changed

    def act(self) -> list[Action]:
        now = self.now()
        jobs = self.driver.jobs
        for jid in self.driver.current:  # (a waiting job's work does not change: advanced when it starts)
            jobs[jid].advance(now)
        try:
            _, actions = self.driver.plan(now)
        except Exception:
            bad = culprits(self.driver, now)
            if not bad:
                raise  # not one job's fault: the loop backs off
            for job, why in bad:  # each fails alone, with the error as its reason
                log.warning("job %s cannot be scheduled, failed: %s", job.id, why)
                self.fail(job.id, f"cannot be scheduled: {why}")
            _, actions = self.driver.plan(now)
        self.mirror.record_reasons(self.control.amend_reasons(self.driver))
        self.mirror.record_reasons(self.driver.reasoned)
        self.actuator.profiled = self.actuator.refused = False
        self.actuator.prepare_stops(self.driver, actions, now)  # a store that refuses it: nothing is applied
        failed = self.driver.apply(actions, now)
        for job in failed:
            held = 0.0
            if job.id in self.actuator.running:  # failed while holding (its new speed could not be rated)
                self.actuator.terminate([job.id])
                held = self.actuator.end(job.id)[1]
            self._record_end(job, S.FAILED, None, job.extra.get("failure"), None, held)
        return actions

    def fail(self, jid: str, reason: str) -> None:
        """End an active job as FAILED with ``reason``, stopping its processes if it has any."""
        if jid in self.actuator.running:
            self.actuator.terminate([jid])
            self.end(jid, S.FAILED, None, reason)
            return
        job = self.driver.jobs[jid]
        self.driver.finish(job, self.now(), S.FAILED)
        self._record_end(job, S.FAILED, None, reason, None, 0.0)

    def reap(self) -> bool:
        """Record the exits the executor reports (after what the outbox holds); True if any."""
        self.outbox.flush()
        ended = self.actuator.reap()
        for jid, state, code, reason in ended:
            self.end(jid, state, code, reason)
        return bool(ended)

    def end(self, jid: str, state: JobState, code: int | None, reason: str | None) -> None:
        """End a job: FINISHED (from a launching or running state), FAILED or CANCELLED (from any)."""
        self.actuator.cap_logs(self.log_cap, jids=[jid])  # what it wrote since the last tick's check
        _, held_now = self.actuator.end(jid)
        job = self.driver.jobs[jid]
        alloc = self.driver.finish(job, self.now(), state)  # co-runners are regrouped (and recorded)
        self._record_end(job, state, code, reason, alloc.num_gpus if alloc is not None else None, held_now)

    def _record_end(self, job: Job, state: JobState, code: int | None, reason: str | None, gpus: int | None,
                    held_now: float) -> None:
        jid = job.id
        row = self.mirror.drop(jid)
        if row is None:
            return
        held = row.held_time + held_now
        self.mirror.record(
            jid,
            {"state": state.value, "end_time": self.clock.time(), "alloc": None, "procs": None, "exit_code": code,
             "reason": reason, "held_time": held, "progress": self.last_progress(jid),
             "held_gpu_time": row.held_gpu_time + held_now * (gpus or 0),
             **self.mirror.work(job)},
            state.value,
            {"exit_code": code, "reason": reason},
        )

    def _cap_logs(self) -> None:
        """Cut running jobs' logs over the cap; while the logs' disk is nearly full, the largest ones
        over :data:`..state.disk.PRESSURE_CAP`, one at a time, until it is not."""
        self.actuator.cap_logs(self.log_cap)
        while self.disk.logs_low() and self.actuator.cap_logs(PRESSURE_CAP, " (its disk is nearly full)", most=1):
            pass

    def _handle_cancels(self) -> None:
        with self._cancel_lock:
            ids, self._cancels = self._cancels, set()
        to_stop = []
        for jid in sorted(ids, key=int):
            if jid in self.actuator.running:
                to_stop.append(jid)
            elif jid in self.driver.jobs:  # queued (the API marked it cancelled, unless it was running then)
                self.driver.finish(self.driver.jobs[jid], self.now(), S.CANCELLED)
                self.mirror.drop(jid)
                self.mirror.record(jid, {"state": S.CANCELLED.value, "end_time": self.clock.time(),
                                         "reason": "cancelled"}, "cancel", {}, expect_state=QUEUED_STATES)
            else:  # not mirrored yet: held back by the gate or parked, or skipped by _load_new
                self.gate.drop(int(jid))
                self.parked.pop(int(jid), None)
        if to_stop:
            self.actuator.terminate(to_stop)
            for jid in to_stop:
                self.end(jid, S.CANCELLED, None, "cancelled")

    def _enforce_time_limits(self) -> None:
        now = self.now()
        over = []
        for jid, run in self.actuator.running.items():
            limit = self.mirror.rows[jid].spec.get("time_limit")
            if limit and self.mirror.rows[jid].held_time + max(0.0, now - run.start) > float(limit):
                over.append(jid)
        if over:
            self.actuator.terminate(over)
            for jid in over:
                limit = self.mirror.rows[jid].spec["time_limit"]
                self.end(jid, S.FAILED, None, f"time limit of {limit} s reached")

    def _load_new(self) -> bool:
        """Mirror jobs submitted since the last round; they make contact (-> WAITING_FOR_INITIAL_RESOURCE).

        The service has no agent protocol: a job is in contact once the loop
        has it.  One UPDATE for the whole batch."""
        floor, self._read_at = self._read_at, self.now()
        rows = self.store.list_jobs([S.WAITING_FOR_INITIAL_CONTACT.value], after_id=self.last_id)
        # submitted since the last read: their arrivals lie between it and now, whatever the wall clock did
        fresh = {row.id: self.mirror.since(row.submit_time, floor) for row in rows}
        for row in rows:
            self.gate.add(row)
        if rows:
            self.last_id = rows[-1].id
        for row in self.gate.ready():  # those whose dependencies and array limits let them run
            if self.fits_or_fail(row):
                self.admit_row(row, S.WAITING_FOR_INITIAL_CONTACT, fresh.get(row.id))
        # those admitted since the last call, not every active job (a round costs O(new jobs) here)
        jobs = self.driver.jobs
        new = [j.id for j in self._contact if jobs.get(j.id) is j and j.lifecycle is not None
               and j.lifecycle.state is S.WAITING_FOR_INITIAL_CONTACT]
        if new:  # (a store that refuses it: they stay in _contact, and the next round tries again)
            self.store.set_states([int(j) for j in new], S.WAITING_FOR_INITIAL_RESOURCE.value,
                                  [S.WAITING_FOR_INITIAL_CONTACT.value], now=self.clock.time())
        self._contact = []
        if new:
            now = self.now()
            for jid in new:
                lc = self.driver.jobs[jid].lifecycle
                assert lc is not None
                lc.walk([S.WAITING_FOR_INITIAL_RESOURCE], now)
                self.mirror.rows[jid].state = S.WAITING_FOR_INITIAL_RESOURCE.value
        return bool(rows)
