"""The scheduler service: store-backed jobs, rounds on a timer and on events, plan → executor.

(Over 500 lines: the API entry points and the loop's phases share the service's lock and mirror; the
parts that stand alone are in the modules listed below.)

The service is the simulator's twin: both are faces of one
:class:`~gpuloom.driver.Driver`, which owns the active jobs and the current
plan and asks the very same :class:`~gpuloom.scheduler.Scheduler` (built from
the names ``simulate`` takes) for each round.  What the service adds lives in
its own modules:

========================  ==================================================
:mod:`.mirror`            stored rows ↔ the driver's jobs (one id type), the
                          remaining-work record
:mod:`.actuator`          the driver's backend: launch and stop through the
                          executor, progress, exits
:mod:`.recovery`          adopt or requeue after a restart
:mod:`.profile_manager`   profiling new jobs before their first launch
:mod:`.specs`             the API's fields (``8G``, ``1:30:00``) and stored
                          specs as ``JobSpec``
:mod:`.admission`         what is refused at submission
:mod:`.codec`             allocations and processes as stored JSON
:mod:`.clock`             the injected clock
:mod:`.deps`              job arrays and dependencies: the gate new jobs pass
:mod:`.telemetry`         a log line per job transition, metrics, samples
:mod:`.history`           accounting from the store (``gpuloom history``)
:mod:`.inventory`         nodes joining and leaving (Ray): rebuild, park
========================  ==================================================

**A round is observe, then act** (as Ray's autoscaler v2 reconciler does):
observe reaps exits, applies cancels and time limits, picks up new
submissions and promotes jobs that reported progress; act asks the driver for
a plan and applies it (stops, then launches).  A job the scheduler cannot plan
for, or whose launch fails, fails alone with the reason (:mod:`.isolation`);
rounds that still fail back off exponentially and are logged once.

Design decisions:

* **The store is the truth.**  API calls write to the store (committed with
  ``synchronous=FULL``) before they answer; the loop's records of processes
  commit with ``synchronous=NORMAL`` (see :mod:`.store` for why that is safe).
  Every state change the loop makes is committed before the next action.
* **Rounds on a timer and on events.**  The loop wakes every ``tick`` (at most
  0.1 s) to poll the executor; a round runs when ``round_s`` has elapsed or
  something happened (submission, cancel, completion).
* **Time.**  Every reading comes from the injected :class:`~.clock.Clock`.
  Job arrival times are seconds since the service's *epoch* (stored in
  ``meta``, so it survives restarts).  A job's work estimate is its time limit,
  or ``default_duration`` without one; SJF-like orders use it, LAS-like orders
  the wall seconds it has held GPUs (persisted).  A job's remaining work falls
  at the model's speed while it reports progress, and is stored with every
  change, so SRTF-like orders see the same remaining work after a restart.
* **Job states** are the lifecycle's (:mod:`gpuloom.core.lifecycle`), stored in
  ``jobs.state``: submitted → ``waiting_for_initial_contact``; picked up by the
  loop → ``waiting_for_initial_resource``; launched → ``standby`` →
  ``launching``; first ``GPULOOM_PROGRESS`` line (or ``launch_timeout_s``
  without any) → ``running_protected`` (for 3 × the measured launch time) →
  ``running``; preempted/moved/resized → ``checkpointing`` (SIGTERM sent) →
  ``stopping`` → ``standby``; and ``finished`` / ``failed`` / ``cancelled``.
* **Exits.**  A process that exits while the service did not stop it ends the
  job: code 0 → ``FINISHED``, otherwise ``FAILED`` with the code.  A process
  the service stopped (preemption, move, resize) is requeued (the job
  checkpoints on SIGTERM and exits non-zero, conventionally 143), unless it
  exited 0: it had completed.  After a restart, exit records are final: a
  process that is gone and left 0 completed while the service was down, one
  that left another code failed (:mod:`.recovery`).
* **Sharing** (:mod:`.security`): jobs run as unprivileged OS accounts, the
  state is private, one bad job fails alone (:mod:`.isolation`).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.lifecycle import HOLDING_STATES, TERMINAL, JobState
from ..core.plan import Action
from ..driver import Driver
from ..perf.assembly import build_model
from ..perf.model import ThroughputModel
from ..perf.sensitivity import SensitivityFactor, add_sensitivity
from ..scheduler import Scheduler
from . import joblogs
from .actuator import PROGRESS_MARK, Actuator, Running, gpu_type_env
from .admission import NotFound, PermissionDenied, SubmitError, check_submittable, refuse_reason
from .clock import Clock, SystemClock
from .deps import Gate, parse_array, resolve_dependency
from .disk import PRESSURE_CAP, DiskGuard
from .executor import Executor
from .identity import Identities
from .inventory import InventorySource, unpark
from .inventory import follow as follow_inventory
from .isolation import Backoff, culprits
from .mirror import Mirror
from .profile_manager import ProfilingConfig, ProfilingManager
from .queues import QueueAdmin
from .security import Guard
from .specs import DEFAULT_DURATION, SPEC_ATTRS, parse_duration, parse_mem
from .store import JobRow, Store, StoreFull
from .typespeeds import TypeMeter

__all__ = [
    "ACTIVE_STATES", "DEFAULT_DURATION", "FINAL_STATES", "HOLDING", "PROGRESS_MARK", "QUEUED_STATES", "SPEC_ATTRS",
    "NotFound", "PermissionDenied", "ProfilingConfig", "Running", "Service", "SubmitError", "parse_duration",
    "parse_mem",
]

log = logging.getLogger("gpuloom.service")

MIN_EVENT_GAP_S = 0.02  # event-triggered rounds are at least this far apart (bursts batch)
FULL_RETRY_S = 1.0  # the longest wait after a round that failed on a full disk
#: a running job's log over this is cut (its first 1/8 and last 1/4 kept, :mod:`.joblogs`); 0: no cap
DEFAULT_LOG_CAP = 256 << 20

S = JobState
#: holding nothing, waiting for the plan to give it resources
QUEUED_STATES = (S.WAITING_FOR_INITIAL_CONTACT.value, S.WAITING_FOR_INITIAL_RESOURCE.value, S.STANDBY.value)
#: a process exists (starting, progressing, or being stopped)
HOLDING = tuple(s.value for s in JobState if s in HOLDING_STATES)
ACTIVE_STATES = QUEUED_STATES + HOLDING
FINAL_STATES = tuple(s.value for s in JobState if s in TERMINAL)


class Service:
    """Runs scheduling rounds over the store's jobs and drives the executor."""

    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        executor: Executor,
        scheduler: Scheduler,
        state_dir: str | Path,
        round_s: float = 5.0,
        grace_s: float = 10.0,
        default_duration: float = DEFAULT_DURATION,
        model: ThroughputModel | None = None,
        seed: int = 0,
        protect_factor: float = 3.0,
        launch_timeout_s: float = 60.0,
        profiling: ProfilingConfig | None = None,
        clock: Clock | None = None,
        identities: Identities | None = None,
        job_dir: str | Path | None = None,
        checkpoint_roots: Sequence[str | Path] | None = None,
        keep_finished_s: float | None = None,
        model_factory: Callable[[Cluster], ThroughputModel] | None = None,
        data_dir: str | Path | None = None,
        inventory: InventorySource | None = None,
        log_dir: str | Path | None = None,
        log_cap: int = DEFAULT_LOG_CAP,
    ) -> None:
        if not round_s > 0:
            raise ValueError(f"round length must be > 0, got {round_s}")
        if log_cap != 0 and not log_cap >= joblogs.MIN_CAP:
            raise ValueError(f"log cap must be 0 (none) or at least {joblogs.MIN_CAP} bytes, got {log_cap}")
        self.store = store
        self.executor = executor
        self.scheduler = scheduler
        self.state_dir = Path(os.path.abspath(state_dir))  # never resolved later from another directory
        #: logs/ and checkpoints/ (a directory shared with the nodes, e.g. NFS; default the state dir)
        self.data_dir = Path(os.path.abspath(data_dir)) if data_dir is not None else self.state_dir
        #: jobs' logs (default data_dir/logs): best on another file system than the database (:mod:`.disk`)
        self.log_dir = Path(log_dir).absolute() if log_dir is not None else None
        self.log_cap = int(log_cap)  # bytes; a running job's log over it is cut (:mod:`.joblogs`)
        #: job id -> the end record (fields, event, detail) the store refused (a full disk): retried every tick
        self.unrecorded: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {}
        self.clock: Clock = clock or SystemClock()
        self.round_s = float(round_s)
        self.model_factory = model_factory or build_model  # the same model `simulate` builds
        self.inventory = inventory  # nodes that come and go (:mod:`.inventory`); None: a fixed cluster
        #: job id -> wall time from which it may be planned again (inf: once the inventory changes)
        self.parked: dict[int, float] = {}
        epoch = float(store.set_meta_default("epoch", repr(self.clock.time())))
        self.service_id = store.set_meta_default("service_id", secrets.token_hex(4))
        # who runs the jobs, where their checkpoints go, how long finished jobs are kept (see .security)
        self.guard = Guard(self.state_dir, self.service_id, identities, job_dir, checkpoint_roots, keep_finished_s)
        self._parts = (profiling, epoch, float(default_duration), float(protect_factor), float(grace_s),
                       float(launch_timeout_s), seed)
        self.assemble(cluster, model)
        self.last_id = 0
        self.lock = threading.RLock()  # in-memory state: loop vs API readers
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cancels: set[str] = set()
        self._cancel_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.last_round_s = 0.0
        self.backoff = Backoff()
        self.gate = Gate(store, self.clock)  # arrays and dependencies (:mod:`.deps`)
        from .admission import Limiter, SubmitLimits
        from .telemetry import Telemetry

        self.telemetry = Telemetry(self)  # transition log lines, metrics, history samples
        self.limits = Limiter(SubmitLimits(), self.clock.monotonic)  # per-user submission limits (:mod:`.admission`)
        self.queues = QueueAdmin(self)  # the queue tree: stored, validated, given to the scheduler
        self.disk = DiskGuard(store.path.parent if store.path is not None else None, self.actuator.log_dir)

    def assemble(self, cluster: Cluster, model: ThroughputModel | None = None) -> None:
        """The parts built for one cluster: model, mirror, actuator, profiler, driver.  Called again
        (then :meth:`recover`) when the inventory changes (:func:`.inventory.rebuild`)."""
        profiling, epoch, duration, protect, grace, launch_timeout, seed = self._parts
        old = getattr(self, "actuator", None)
        if old is not None:
            old.close()
        self.cluster = cluster
        self.model = model or self.model_factory(cluster)
        if (profiling is not None or self.scheduler.needs_profiles) and not isinstance(self.model.get("sensitivity"),
                                                                                        SensitivityFactor):
            # stored profiles, and profiles submitted with a job, reach the sizers through it
            add_sensitivity(self.model)
        self.mirror = Mirror(self.store, self.clock, epoch, duration, protect)
        self.actuator = Actuator(self.mirror, cluster, self.executor, self.data_dir, grace, launch_timeout,
                                 self.guard.identities, self.guard.job_dir, self.log_dir)
        self.profiler = ProfilingManager(self, profiling) if profiling is not None else None
        self.actuator.profiler = self.profiler
        self.driver = Driver(cluster, self.scheduler, self.model, self.actuator, np.random.default_rng(seed),
                             check=True, protect_factor=protect)
        self.meter = TypeMeter(self.model, self.actuator.last_progress, self.clock.time,
                               lambda jid, d: self.mirror.event(jid, "measured", d))  # speeds per GPU type

    # -- what the API and tests read --------------------------------------------------------
    @property
    def epoch(self) -> float:
        return self.mirror.epoch

    @property
    def jobs(self) -> dict[str, Job]:
        """Active jobs (mirrored), by id."""
        return self.driver.jobs

    @property
    def current(self) -> dict[str, Any]:
        return self.driver.current

    @property
    def running(self) -> dict[str, Running]:
        return self.actuator.running

    @property
    def rounds(self) -> int:
        return self.driver.rounds

    def now(self) -> float:
        """Service time: seconds since the epoch stored in the database."""
        return self.mirror.now()

    def log_path(self, job_id: int | str) -> Path:
        return self.actuator.log_path(job_id)

    def last_progress(self, job_id: int | str) -> int | None:
        return self.actuator.last_progress(job_id)

    def wake(self) -> None:
        self._wake.set()

    # -- API side (any thread) -------------------------------------------------------
    def validate(self, spec: Mapping[str, Any], user: str | None = None) -> None:
        check_submittable(self.cluster, dict(spec))
        self.guard.check_spec(self.cluster, dict(spec), user)

    def submit(self, spec: Mapping[str, Any], user: str) -> int:
        """Store a validated spec (committed) and wake the loop; return the job id (an array's first task's)."""
        self.disk.check_submit()
        self.validate(spec, user)
        spec, tasks = self._expand(spec)
        ids = self.store.add_jobs([spec] * (len(tasks) if tasks else 1), user, S.WAITING_FOR_INITIAL_CONTACT.value,
                                  now=self.clock.time(), array_tasks=tasks)
        self._wake.set()
        return ids[0]

    def _expand(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], list[int] | None]:
        """The spec as stored (array limit, resolved dependencies) and its array's task indices."""
        spec = dict(spec)
        tasks = None
        if spec.get("array") is not None:
            try:
                tasks, limit = parse_array(spec["array"])
            except ValueError as e:
                raise SubmitError(str(e), "array", "bad_array") from None
            if limit is not None:
                spec["array_limit"] = limit
        if spec.get("dependency"):
            spec["depends_on"] = resolve_dependency(self.store, spec["dependency"])
        return spec, tasks

    def submit_once(self, spec: Mapping[str, Any], user: str, key: str) -> tuple[int, bool]:
        """:meth:`submit` under an idempotency key: (job id, True) the first time, (the same id, False)
        when ``user`` retries with the same key."""
        old = self.store.job_for_key(user, key)
        if old is not None:
            return old, False
        self.disk.check_submit()
        self.validate(spec, user)
        spec, tasks = self._expand(spec)
        ids, new = self.store.add_jobs_once([spec] * (len(tasks) if tasks else 1), user,
                                            S.WAITING_FOR_INITIAL_CONTACT.value, key, now=self.clock.time(),
                                            array_tasks=tasks)
        if new:
            self._wake.set()
        return ids[0], new

    def cancel(self, job_id: int, user: str, admin: bool) -> JobRow:
        row = self.store.get_job(job_id)
        if row is None:
            raise NotFound(job_id)
        if not admin and row.user != user:
            raise PermissionDenied(f"job {job_id} belongs to {row.user}; only its owner or an admin may cancel it")
        if row.state in FINAL_STATES:
            return row
        # queued: cancelled at once (compare-and-set against a concurrent launch)
        done = self.store.update_job(
            job_id,
            {"state": S.CANCELLED.value, "cancel_requested": True, "end_time": self.clock.time(),
             "reason": f"cancelled by {user}"},
            "cancel",
            {"by": user},
            expect_state=QUEUED_STATES,
            now=self.clock.time(),
        )
        if not done:
            self.store.update_job(job_id, {"cancel_requested": True}, "cancel-request", {"by": user},
                                  now=self.clock.time())
        self.request_cancel(str(job_id))
        self._wake.set()
        row = self.store.get_job(job_id)
        assert row is not None  # it was there above, and jobs are never deleted
        return row

    def request_cancel(self, jid: str) -> None:
        with self._cancel_lock:
            self._cancels.add(jid)

    def nodes(self) -> list[dict[str, Any]]:
        """Per-node use.  Reads a snapshot of the allocations without the loop's lock, so it
        answers at once even while a round waits for jobs to checkpoint."""
        current = dict(self.driver.current)  # a C-level copy: atomic under the GIL
        out = []
        for i, n in enumerate(self.cluster.nodes):
            used_g: set[int] = set()
            cpus = mem = 0
            jobs = []
            for jid, a in current.items():
                for p in a.parts:
                    if p.node == i:
                        used_g.update(p.gpus)
                        cpus += p.cpus
                        mem += p.mem_mb
                        jobs.append(jid)
            out.append(
                {
                    "name": n.name,
                    "gpus": n.gpus,
                    "gpus_used": len(used_g),
                    "cpus": n.cpus,
                    "cpus_used": cpus,
                    "mem_mb": n.mem_mb,
                    "mem_mb_used": mem,
                    "gpu_type": n.gpu_type,
                    "gres": f"gpu:{gpu_type_env(n.gpu_type) or 'none'}:{n.gpus}",  # Slurm's form
                    "jobs": sorted(jobs, key=int),
                    "state": "mixed" if 0 < len(used_g) < n.gpus else ("alloc" if used_g else "idle"),
                }
            )
        return out

    # -- the loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Recover from the store, then run rounds in a background thread."""
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="gpuloom-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the loop; running jobs keep running (a restarted service adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self.lock:
            self._retry_ends()
            for jid, (fields, event, _) in self.unrecorded.items():
                log.error("job %s %s (exit code %s) but the store could not record it; after a restart it ends "
                          "as its exit record says (requeued without one)", jid, event, fields.get("exit_code"))
        self.actuator.close()
        self.executor.close()
        self.telemetry.close()

    def _loop(self) -> None:
        tick = min(self.round_s, 0.1)
        gap = min(self.round_s, MIN_EVENT_GAP_S)
        next_round = 0.0
        last = 0.0
        clock = self.clock
        while not self._stop.is_set():
            woke = self._wake.wait(timeout=tick)
            if woke:
                # a burst of submissions: let it gather for a moment so one round takes them all
                self._stop.wait(max(0.0, last + gap - clock.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                with self.lock:
                    self._cap_logs()
                    changed = follow_inventory(self) or self._reap() or woke
                    t = clock.monotonic()
                    if changed or t >= next_round:
                        self.round()
                        last = clock.monotonic()
                        next_round = last + self.round_s
                    self.guard.maybe_purge(self, t)
                self.backoff.succeeded()
            except Exception as e:  # a bad round must not kill the service: back off, log once
                delay = self.backoff.failed()
                # a full disk: retry soon (ends wait to be recorded), not after the backoff's 30 s
                self._stop.wait(min(delay, FULL_RETRY_S) if isinstance(e, StoreFull) else delay)

    def recover(self) -> None:
        """Rebuild the mirror from the store; adopt live processes, requeue dead ones (:mod:`.recovery`)."""
        from .recovery import recover

        recover(self)
        with self.lock:
            self._cap_logs()  # adopted jobs' logs that grew while no server watched them

    # -- mirror ------------------------------------------------------------------------
    def admit_row(self, row: JobRow, state: JobState) -> Job:
        """Mirror a stored job and hand it to the driver, its lifecycle in ``state``."""
        profile = self.profiler.stored_profile(row.spec) if self.profiler is not None else None
        job = self.mirror.load(row, state, profile)
        return self.driver.admit(job, self.now())

    def fits_or_fail(self, row: JobRow) -> bool:
        """False (and the job FAILED) if it can never run on the cluster, e.g. after the cluster shrank.

        With an inventory that follows a changing cluster, such a job is parked (kept out of the
        plan until the inventory changes) instead; a parked job is not admitted (:mod:`.inventory`)."""
        if row.id in self.parked:
            return False
        s = row.spec
        reason = refuse_reason(self.cluster, int(s["gpus"]), s.get("cpus"), s.get("mem_mb"))
        if reason is None:
            return True
        if self.inventory is not None:
            self.parked[row.id] = float("inf")
            self.store.set_pending_reasons({row.id: f"Nodes: {reason[1]} while nodes are missing"})
            return False
        self.store.update_job(
            row.id, {"state": S.FAILED.value, "end_time": self.clock.time(), "alloc": None, "procs": None,
                     "reason": f"can never run on this cluster: {reason[1]}"},
            "failed", {"reason": reason[1]}, now=self.clock.time(),
        )
        return False

    # -- one round: observe, then act ------------------------------------------------------
    def round(self) -> list[Action]:
        """Observe (reap, cancels, time limits, new jobs, progress), then act (plan → actions)."""
        t0 = self.clock.monotonic()
        with self.lock:
            self.observe()
            # a nearly full state disk: no starts or stops, whose records might not fit (:mod:`.disk`)
            actions = [] if self.disk.db_low() else self.act()
        self.last_round_s = self.clock.monotonic() - t0
        self.telemetry.round_done(actions, self.last_round_s)
        return actions

    def observe(self) -> bool:
        """Bring the mirror up to date with the world; True if anything changed."""
        changed = self._reap()
        self._handle_cancels()
        self._enforce_time_limits()
        unpark(self)
        changed = self._load_new() or changed
        self.actuator.promote(self.driver.jobs, self.now())
        self.meter.observe(self.driver.jobs, self.actuator.running, self.driver.speed, self.now())
        return changed

    def act(self) -> list[Action]:
        now = self.now()
        for j in self.driver.jobs.values():
            j.advance(now)
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
        self.mirror.record_reasons(self.driver.jobs)
        self.actuator.profiled = False
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

    def _reap(self) -> bool:
        self._retry_ends()
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
        self._write_end(
            jid,
            {"state": state.value, "end_time": self.clock.time(), "alloc": None, "procs": None, "exit_code": code,
             "reason": reason, "held_time": held, "progress": self.last_progress(jid),
             "held_gpu_time": row.held_gpu_time + held_now * (gpus or 0),
             **self.mirror.work(job)},
            state.value,
            {"exit_code": code, "reason": reason},
        )

    def _write_end(self, jid: str, fields: dict[str, Any], event: str, detail: dict[str, Any]) -> None:
        """Record a job's end.  One the store refuses (its disk is full) is kept and retried every tick
        until it is taken: the job is gone from the mirror, nothing else would record it, and a restart
        that found it still running in the store would requeue it."""
        try:
            self.mirror.write(jid, fields, event, detail)
        except Exception as e:
            if jid not in self.unrecorded:
                log.error("job %s %s, but the store cannot record it yet (%s); retrying every tick", jid, event, e)
            self.unrecorded[jid] = (fields, event, detail)

    def _retry_ends(self) -> None:
        for jid, (fields, event, detail) in list(self.unrecorded.items()):
            try:
                self.mirror.write(jid, fields, event, detail)
            except Exception:
                return  # still refused: the next tick tries again
            del self.unrecorded[jid]
            log.warning("job %s %s: recorded now", jid, event)

    def _cap_logs(self) -> None:
        """Cut running jobs' logs over the cap; while the logs' disk is nearly full, the largest ones
        over :data:`.disk.PRESSURE_CAP`, one at a time, until it is not."""
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
                self.store.update_job(
                    int(jid), {"state": S.CANCELLED.value, "end_time": self.clock.time(), "reason": "cancelled"},
                    "cancel", {}, expect_state=QUEUED_STATES, now=self.clock.time(),
                )
            else:  # not mirrored yet: held back by the gate or parked, or skipped by _load_new
                self.gate.drop(int(jid))
                self.parked.pop(int(jid), None)
        if to_stop:
            self.actuator.terminate(to_stop)
            for jid in to_stop:
                self.end(jid, S.CANCELLED, None, "cancelled")

    def _enforce_time_limits(self) -> None:
        wall = self.clock.time()
        over = []
        for jid, run in self.actuator.running.items():
            limit = self.mirror.rows[jid].spec.get("time_limit")
            if limit and self.mirror.rows[jid].held_time + (wall - run.start) > float(limit):
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
        rows = self.store.list_jobs([S.WAITING_FOR_INITIAL_CONTACT.value], after_id=self.last_id)
        for row in rows:
            self.gate.add(row)
        if rows:
            self.last_id = rows[-1].id
        for row in self.gate.ready():  # those whose dependencies and array limits let them run
            if self.fits_or_fail(row):
                self.admit_row(row, S.WAITING_FOR_INITIAL_CONTACT)
        new = [jid for jid, j in self.driver.jobs.items()
               if j.lifecycle is not None and j.lifecycle.state is S.WAITING_FOR_INITIAL_CONTACT]
        if new:
            self.store.set_states([int(j) for j in new], S.WAITING_FOR_INITIAL_RESOURCE.value,
                                  [S.WAITING_FOR_INITIAL_CONTACT.value], now=self.clock.time())
            now = self.now()
            for jid in new:
                lc = self.driver.jobs[jid].lifecycle
                assert lc is not None
                lc.walk([S.WAITING_FOR_INITIAL_RESOURCE], now)
                self.mirror.rows[jid].state = S.WAITING_FOR_INITIAL_RESOURCE.value
        return bool(rows)

    # -- tests and shutdown scripts ------------------------------------------------------
    def terminate_all(self) -> None:
        """Stop every running job's processes and end the jobs as cancelled (test clean-up)."""
        with self.lock:
            jids = list(self.actuator.running)
            self.actuator.terminate(jids)
            for jid in jids:
                self.end(jid, S.CANCELLED, None, "terminated")

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no job is active (tests, shutdown scripts)."""
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if not self.driver.jobs and self.store.count_jobs(ACTIVE_STATES) == 0:
                    return True
            time.sleep(0.05)
        return False
