"""The scheduler service: store-backed jobs, rounds on a timer and on events, plan → executor.

The service is the simulator's twin: both are faces of one
:class:`~gpuloom.driver.Driver`, which owns the active jobs and the current
plan and asks the very same :class:`~gpuloom.scheduler.Scheduler` (built from
the names ``simulate`` takes) for each round.  What the service adds lives in
its own modules:

==========================  ================================================
:mod:`.apiside`             the API's calls: submit, cancel, per-node use
:mod:`.rounds`              one round: observe, then act; jobs' ends; whether
                            this server may act
:mod:`.config`              the settings (:class:`~.config.ServiceConfig`)
:mod:`.mirror`              stored rows ↔ the driver's jobs (one id type), the
                            remaining-work record
:mod:`.actuator`            the driver's backend: launch and stop through the
                            executor, progress, exits
:mod:`.recovery`            adopt or requeue after a restart
:mod:`.profile_manager`     profiling new jobs before their first launch
:mod:`.admission`           what is refused at submission
:mod:`.deps`                job arrays and dependencies: the gate new jobs pass
:mod:`.telemetry`           a log line per job transition, metrics, samples
:mod:`.inventory`           nodes joining and leaving (Ray): rebuild, park
:mod:`.outbox`              the loop's records the store has not taken yet
:mod:`.health`              liveness, readiness, systemd's watchdog
:mod:`..state.specs`        the API's fields (``8G``, ``1:30:00``) and stored
                            specs as ``JobSpec``
:mod:`..state.codec`        allocations and processes as stored JSON
:mod:`..state.history`      accounting from the store (``gpuloom history``)
:mod:`..exec.clock`         the injected clock
==========================  ================================================

**A round is observe, then act** (as Ray's autoscaler v2 reconciler does):
observe reaps exits, applies cancels and time limits, picks up new
submissions and promotes jobs that reported progress; act asks the driver for
a plan and applies it (stops, then launches).  A job the scheduler cannot plan
for, or whose launch fails, fails alone with the reason (:mod:`.isolation`);
rounds that still fail back off exponentially and are logged once.

Design decisions:

* **The store is the truth.**  API calls write to the store (committed with
  ``synchronous=FULL``) before they answer; the loop's records of processes
  commit with ``synchronous=NORMAL`` (see :mod:`..state.store` for why that is safe).
  Every state change the loop makes is committed before the next action.
* **The store may fail** (its disk full, the database down): what the loop
  observed is kept in order until it is recorded (:mod:`.outbox`); a round
  acts only on a store that has every record and this server's lock
  (:meth:`Service.may_act`); a launch or stop the store refuses is not applied.
* **Rounds on a timer and on events.**  The loop wakes every ``tick`` (at most
  0.1 s) to poll the executor; a round runs when ``round_s`` has elapsed or
  something happened (submission, cancel, completion).
* **Time.**  Every reading comes from the injected :class:`~..exec.clock.Clock`.
  Scheduling runs in *service time*: seconds since the *epoch* (stored in
  ``meta``), advanced by the monotonic clock and continued by a restart from
  the last stored mark (:mod:`..exec.clock`), so held time, time limits, launch
  timeouts, protection and fences ignore wall-clock steps; wall time is only
  what is stored and shown for people.  A job's work estimate is its time limit,
  or ``default_duration`` without one; SJF-like orders use it, LAS-like orders
  the seconds it has held GPUs (persisted).  A job's remaining work falls
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
from pathlib import Path
from typing import Any

import numpy as np

from ...core.cluster import Cluster
from ...core.job import Job
from ...core.lifecycle import JobState
from ...driver import Driver
from ...perf.assembly import build_model
from ...perf.model import ThroughputModel
from ...perf.sensitivity import SensitivityFactor, add_sensitivity
from ...scheduler import Scheduler
from ..exec.clock import Clock, ServiceTime, SystemClock, resume
from ..exec.executor import Executor
from ..state.disk import DiskGuard
from ..state.locks import ServerLocks
from ..state.specs import DEFAULT_DURATION, SPEC_ATTRS, parse_duration, parse_mem
from ..state.store import Store, unavailable
from .actuator import PROGRESS_MARK, Actuator, Running
from .apiside import ApiSide
from .config import ServiceConfig
from .control import Control
from .deps import Gate
from .errors import NotFound, PermissionDenied, SubmitError
from .gather import Gather
from .health import LOCK_CHECK_S, STORE_RETRY_S, Health, Watchdog
from .inventory import follow as follow_inventory
from .isolation import Backoff
from .mirror import Mirror
from .outbox import Outbox
from .profile_manager import ProfilingConfig, ProfilingManager
from .queues import QueueAdmin
from .rounds import Rounds
from .security import Guard
from .states import ACTIVE_STATES, FINAL_STATES, HOLDING, QUEUED_STATES
from .typespeeds import TypeMeter

__all__ = [
    "ACTIVE_STATES", "DEFAULT_DURATION", "FINAL_STATES", "HOLDING", "PROGRESS_MARK", "QUEUED_STATES", "SPEC_ATTRS",
    "NotFound", "PermissionDenied", "ProfilingConfig", "Running", "Service", "SubmitError",
    "parse_duration", "parse_mem",
]

log = logging.getLogger("gpuloom.service")

MIN_EVENT_GAP_S = 0.02  # event-triggered rounds are at least this far apart (bursts batch)
MAX_EVENT_GAP_S = 0.2  # ... and at most this far while events stream in (:mod:`.gather`)
STREAM_S = 0.1  # an event sooner than this after a round is part of a stream
MARK_S = 10.0  # service time is marked in the store at most this often (:meth:`Service.mark_time`)

S = JobState


class Service(Rounds, ApiSide):
    """Runs scheduling rounds over the store's jobs and drives the executor."""

    actuator: Actuator  # (made by assemble)
    driver: Driver

    def __init__(self, store: Store, cluster: Cluster, executor: Executor, scheduler: Scheduler,
                 config: ServiceConfig) -> None:
        self.config = config
        self.store = store
        self.executor = executor
        self.scheduler = scheduler
        self.state_dir = Path(os.path.abspath(config.state_dir))  # never resolved later from another directory
        #: logs/ and checkpoints/ (a directory shared with the nodes, e.g. NFS; default the state dir)
        self.data_dir = Path(os.path.abspath(config.data_dir)) if config.data_dir is not None else self.state_dir
        #: jobs' logs (default data_dir/logs): best on another file system than the database (:mod:`..state.disk`)
        self.log_dir = Path(config.log_dir).absolute() if config.log_dir is not None else None
        self.log_cap = int(config.log_cap)  # bytes; a running job's log over it is cut (:mod:`..exec.joblogs`)
        self.clock: Clock = config.clock or SystemClock()
        #: the loop's records the store has not taken yet (a full disk, a database down): kept in order,
        #: retried every tick (:mod:`.outbox`); the loop starts and preempts nothing while any wait
        self.outbox = Outbox(store, self.clock.time)
        #: the locks that make this the database's one server (the CLI's; checked before acting, :meth:`may_act`)
        self.server_locks: ServerLocks | None = None
        self.gave_up: str | None = None  # why this server stopped scheduling (another took over), if it did
        self.health = Health()  # what /ready reports: the last lock check, rounds, the store (:mod:`.health`)
        self.watchdog = Watchdog.from_env()  # systemd's, when it runs the service
        self.round_s = float(config.round_s)
        self.model_factory = config.model_factory or build_model  # the same model `simulate` builds
        self.inventory = config.inventory  # nodes that come and go (:mod:`.inventory`); None: a fixed cluster
        #: job id -> service time from which it may be planned again (inf: once the inventory changes)
        self.parked: dict[int, float] = {}
        epoch = float(store.set_meta_default("epoch", repr(self.clock.time())))
        # service time runs on the monotonic clock, continued from the last mark (:func:`..exec.clock.resume`)
        self.timebase = ServiceTime(self.clock, resume(self.clock, epoch, store.get_meta("clock")))
        self._next_mark = -float("inf")
        self.service_id = store.set_meta_default("service_id", secrets.token_hex(4))
        # who runs the jobs, where their checkpoints go, how long finished jobs are kept (see .security)
        self.guard = Guard(self.state_dir, self.service_id, config.identities, config.job_dir,
                           config.checkpoint_roots, config.keep_finished_s)
        self._stored_epoch = epoch
        self.assemble(cluster, config.model)
        self.last_id = 0
        self._contact: list[Job] = []  # admitted in WAITING_FOR_INITIAL_CONTACT since the last _load_new
        self.lock = threading.RLock()  # in-memory state: loop vs API readers
        self._wake = threading.Event()
        self.gather = Gather(min(self.round_s, MIN_EVENT_GAP_S), min(self.round_s, MAX_EVENT_GAP_S), STREAM_S)
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
        self.control = Control(self)  # node drain/maintenance, job hold/release/requeue (:mod:`.control`)
        self.disk = DiskGuard(store.path.parent if store.path is not None else None, self.actuator.log_dir)
        self._read_at = 0.0  # service time of the last read of new submissions (their arrivals are after it)
        self.mark_time()

    def assemble(self, cluster: Cluster, model: ThroughputModel | None = None) -> None:
        """The parts built for one cluster: model, mirror, actuator, profiler, driver.  Called again
        (then :meth:`recover`) when the inventory changes (:func:`.inventory.rebuild`)."""
        cfg, profiling = self.config, self.config.profiling
        old = getattr(self, "actuator", None)
        if old is not None:
            old.close()
        self.cluster = cluster
        self.model = model or self.model_factory(cluster)
        if (profiling is not None or self.scheduler.needs_profiles) and not isinstance(self.model.get("sensitivity"),
                                                                                        SensitivityFactor):
            # stored profiles, and profiles submitted with a job, reach the sizers through it
            add_sensitivity(self.model)
        self.mirror = Mirror(self.store, self.clock, self._stored_epoch, float(cfg.default_duration),
                             float(cfg.protect_factor), self.timebase, self.outbox)
        if old is not None:  # a rebuild: the active and parked jobs keep their arrivals
            keep = set(self.driver.jobs) | {str(j) for j in self.parked}
            self.mirror.arrivals = {j: a for j, a in old.mirror.arrivals.items() if j in keep}
        self.actuator = Actuator(self.mirror, cluster, self.executor, self.data_dir, float(cfg.grace_s),
                                 float(cfg.launch_timeout_s), self.guard.identities, self.guard.job_dir, self.log_dir)
        self.profiler = ProfilingManager(self, profiling) if profiling is not None else None
        self.actuator.profiler = self.profiler
        self.driver = Driver(cluster, self.scheduler, self.model, self.actuator, np.random.default_rng(cfg.seed),
                             check=True, protect_factor=float(cfg.protect_factor))
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
        """Service time: seconds since the stored epoch, on the monotonic clock (:class:`..exec.clock.ServiceTime`)."""
        return self.mirror.now()

    def mark_time(self, force: bool = True) -> None:
        """Store where service time is (at most every :data:`MARK_S` unless ``force``): a restart
        continues from it (:func:`..exec.clock.resume`).  A store that cannot take it now keeps the last one."""
        t = self.clock.monotonic()
        if not force and t < self._next_mark:
            return
        self._next_mark = t + MARK_S  # (also after a failure: tried, and logged, once per MARK_S)
        try:
            self.store.set_meta("clock", self.timebase.mark())
        except Exception as e:
            log.warning("cannot record the service time yet: %s", e)

    def log_path(self, job_id: int | str) -> Path:
        return self.actuator.log_path(job_id)

    def last_progress(self, job_id: int | str) -> int | None:
        return self.actuator.last_progress(job_id)

    def wake(self) -> None:
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Recover from the store, then run rounds in a background thread."""
        self.recover()
        self.health.started = self.clock.monotonic()
        self._thread = threading.Thread(target=self._loop, name="gpuloom-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the loop; running jobs keep running (a restarted service adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self.lock:
            self.mark_time()
            if not self.outbox.flush():
                log.error("%d change(s) of job(s) %s were never recorded (%s); a restarted server ends each such "
                          "job as its exit record says (requeued without one), finishes a stop begun, and stops "
                          "a process whose launch is not recorded", len(self.outbox),
                          ", ".join(map(str, sorted(self.outbox.jobs()))), self.outbox.error or "another server")
        self.actuator.close()
        self.executor.close()
        self.telemetry.close()

    def _loop(self) -> None:
        self.store.lock.first()  # a stream of submissions cannot keep rounds waiting for the store
        tick = min(self.round_s, 0.1)
        next_round = 0.0
        last = 0.0
        clock = self.clock
        while not self._stop.is_set():
            self.watchdog.tick(clock.monotonic())  # the loop goes round (its rounds may still fail)
            # (a tick for exits and cancels, or until the next round is due if that comes first)
            woke = self._wake.wait(timeout=min(tick, max(0.0, next_round - clock.monotonic())))
            if woke:
                # a burst of submissions: let it gather for a moment so one round takes them all
                # (and longer while they stream in: :mod:`.gather`)
                self._stop.wait(max(0.0, last + self.gather.next(clock.monotonic() - last) - clock.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if clock.monotonic() - self.health.lock_checked >= LOCK_CHECK_S:
                    self.check_lock()  # between rounds too: a server whose database another took stops at once
                    if self.gave_up:
                        break
                with self.lock:
                    self._cap_logs()
                    self.outbox.flush()  # what the store refused before, oldest first
                    # (a rebuild recovers from the store: only once it has every record)
                    changed = (not self.outbox and follow_inventory(self)) or self.reap() or woke
                    t = clock.monotonic()
                    if changed or t >= next_round:
                        self.round()
                        last = clock.monotonic()
                        next_round = last + self.round_s
                    self.guard.maybe_purge(self, t)
                self.backoff.succeeded()
            except Exception as e:  # a bad round must not kill the service: back off, log once
                if self.store.fenced is not None:  # another server took the database: it alone acts now
                    self.give_up(self.store.fenced)
                    break
                self.health.failed(e, clock.monotonic())
                down = unavailable(e)
                delay = self.backoff.failed(e if down else None)
                # the store's state (a full disk, a database down): retry soon (records wait), not after 30 s
                self._stop.wait(min(delay, STORE_RETRY_S) if down else delay)

    def recover(self) -> None:
        """Rebuild the mirror from the store; adopt live processes, requeue dead ones (:mod:`.recovery`)."""
        from .recovery import recover

        recover(self)
        with self.lock:
            self._cap_logs()  # adopted jobs' logs that grew while no server watched them
    # -- tests and shutdown scripts ------------------------------------------------------
    def terminate_all(self) -> None:
        """Stop every running job's processes and end the jobs as cancelled (test clean-up)."""
        with self.lock:
            jids = list(self.actuator.running)
            self.actuator.terminate(jids)
            for jid in jids:
                self.end(jid, S.CANCELLED, None, "terminated")
