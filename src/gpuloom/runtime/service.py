"""The scheduler service core: store-backed jobs, the scheduling loop, plan → executor.

The service is the simulator's twin.  Each round it builds a
:class:`~gpuloom.policies.base.View` from its jobs (plain
:class:`~gpuloom.core.job.Job` objects mirrored from the store) and the current
allocations, asks the very same :class:`~gpuloom.scheduler.Scheduler` (built by
``Scheduler.from_names`` from the names ``simulate`` takes) for a plan, checks
it with :func:`~gpuloom.core.plan.check_plan`, and carries out
``diff(current, plan)`` through an injected :class:`~.executor.Executor`:

* ``start``  → one :meth:`Executor.launch` per part of the allocation (a part is
  one node; a job spanning nodes gets one process per node, executor ids
  ``ID.RANK``), with node-local GPU ids (``Cluster.local_index``), concrete
  cores from a :class:`~.executor.CoreAllocator`, the part's memory limit and
  ``GPULOOM_JOB_ID``, ``GPULOOM_CHECKPOINT_DIR`` and, when the job ran before,
  ``GPULOOM_RESUME=1`` in its environment;
* ``stop``   → :meth:`Executor.stop` with the grace period (SIGTERM, the job
  checkpoints, SIGKILL after the grace), the job goes back to the queue;
* ``move``/``resize`` → stop, then launch on the new allocation with resume;
* ``regroup`` → only the record changes.

Nothing here assumes one machine: every launch names its node.

Profiling (with a :class:`ProfilingConfig`; ``gpuloom serve --profile``):

* a job is profiled before its first launch when it wants a profile (a
  ``model``, or ``profile: true``; :func:`.profiles.wants_profile`) and neither
  the store (``profiles`` table, key ``<model>/<gpus>gpu``) nor the throughput
  model's catalogue (``--profiles``) has one for its model and GPU count;
* profiling is the first part of the job's first ``start``: on the GPUs the
  plan gave it, with every core of its node that no running job holds (taken
  in the core allocator meanwhile) and memory up to the node's free memory,
  :func:`~gpuloom.perf.profiler.optimistic_profile` drives a
  :class:`~.profiling.RealProfiler` (short runs of the job's command measured
  from its ``GPULOOM_PROGRESS`` lines).  It runs synchronously in the round,
  after the round's stops and before its other launches, so nothing else can
  be given those GPUs or cores: no double booking, no lifecycle state of its
  own (the job stays ``waiting_for_initial_resource``; events
  ``profile-start``/``profiled``/``unprofilable`` record it).  The price is a
  round that lasts as long as the profiling (about ``points x (startup +
  warmup + window)``, 5 points for a 4-core node); the API keeps answering;
* the outcome is stored (demand, measured points, estimated matrix), every
  queued job of the model gets the profile as its ``JobSpec.profile`` (what
  :class:`~gpuloom.perf.sensitivity.SensitivityFactor` and the Synergy sizers
  read), the round's remaining starts are left to the next round, which sizes
  the job with its demand and launches it for real;
* a job that prints no progress line within the timeout (or exits without
  one) is recorded ``unprofilable`` and launched at once on the plan's
  (GPU-proportional) allocation; its model is not profiled again.

Design decisions:

* **The store is the truth.**  API calls write to the store (committed with
  ``synchronous=FULL``) before they answer; the loop's records of processes
  commit with ``synchronous=NORMAL`` (see :mod:`.store` for why that is safe); the loop picks new jobs up by id and keeps an in-memory mirror
  for the scheduler.  Every state change the loop makes is committed before
  the next action.  After a restart :meth:`Service.recover` rebuilds the
  mirror from the store and re-attaches to processes that are still alive
  (``Executor.adopt`` with pid + process start time); a job whose processes
  died is requeued and resumes from its checkpoint.
* **Rounds on a timer and on events.**  The loop wakes every ``tick`` (at most
  0.1 s) to poll the executor; a round runs when ``round_s`` has elapsed or
  something happened (submission, cancel, completion).
* **Time.**  Job arrival times are seconds since the service's *epoch* (stored
  in ``meta``, so it survives restarts).  A job's work estimate (``duration``)
  is its time limit, or ``default_duration`` without one; SJF-like orders use
  it, LAS-like orders use the wall seconds it has held GPUs (persisted).
* **Job states** are :class:`~.lifecycle.JobState` (the lifecycle shared with
  the simulator), kept per job in ``job.extra["lifecycle"]`` so policies and
  hysteresis hooks see them, and stored in ``jobs.state``: submitted →
  ``waiting_for_initial_contact``; picked up by the loop →
  ``waiting_for_initial_resource``; launched → ``standby`` → ``launching``;
  first ``GPULOOM_PROGRESS`` line (or ``launch_timeout_s`` without any) →
  ``running_protected`` (for 3 × the measured launch time) → ``running``;
  preempted/moved/resized → ``checkpointing`` (SIGTERM sent) → ``stopping`` →
  ``standby``; and ``finished`` / ``failed`` / ``cancelled``.
* **Exits.**  A process that exits while the service did not stop it ends the
  job: code 0 → ``FINISHED``, otherwise ``FAILED`` with the code.  A process
  the service stopped (preemption, move, resize) is requeued (the job
  checkpoints on SIGTERM and exits non-zero, conventionally 143), unless it
  exited 0: it had completed.  After a restart, a process that is gone but
  left an exit record of 0 completed while the service was down.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job, JobSpec, JobStatus
from ..core.plan import Action, ActionKind, Allocation, Part, Plan, diff
from ..perf.model import ThroughputModel
from ..perf.profiler import ProfileError, optimistic_profile
from ..perf.sensitivity import (
    DEFAULT_THRESHOLD,
    SensitivityError,
    SensitivityFactor,
    SensitivityProfile,
    add_sensitivity,
)
from ..policies.base import View
from ..scheduler import Scheduler
from ..sim.setup import build_model
from .executor import CoreAllocator, Executor, LaunchSpec, ProcInfo
from .lifecycle import HOLDING_STATES, LIFECYCLE_KEY, TERMINAL, JobState, Lifecycle
from .profiles import (
    OK,
    profile_from_record,
    profile_key,
    record_from_result,
    unprofilable_record,
    wants_profile,
)
from .profiling import NoProgress, RealProfiler
from .progress import ProgressError
from .progress import parse_line as parse_progress
from .store import JobRow, Store

log = logging.getLogger("gpuloom.service")

DEFAULT_DURATION = 3600.0  # work estimate (s) for jobs without a time limit
#: job-spec fields passed to policies as ``JobSpec.attrs`` (priority, Muri stage times, elastic curves)
SPEC_ATTRS = ("priority", "batch_size", "throughput", "min_gpus", "resource_times", "iteration_time")
MIN_EVENT_GAP_S = 0.02  # event-triggered rounds are at least this far apart (bursts batch)
PROGRESS_MARK = b"GPULOOM_PROGRESS"  # progress lines: ``GPULOOM_PROGRESS iter=N``


S = JobState
#: holding nothing, waiting for the plan to give it resources
QUEUED_STATES = (S.WAITING_FOR_INITIAL_CONTACT.value, S.WAITING_FOR_INITIAL_RESOURCE.value, S.STANDBY.value)
#: a process exists (starting, progressing, or being stopped)
HOLDING = tuple(s.value for s in JobState if s in HOLDING_STATES)
ACTIVE_STATES = QUEUED_STATES + HOLDING
FINAL_STATES = tuple(s.value for s in JobState if s in TERMINAL)


@dataclass(frozen=True, slots=True)
class ProfilingConfig:
    """How the service profiles new jobs (see :mod:`.profiles` and "Profiling" in the module notes).

    ``warmup_s``/``window_s``: job time skipped after the first progress line, then
    measured, per point; ``timeout_s``: a run with no progress line by then makes
    the job unprofilable; ``mem_points``: memory points (equal steps up to the
    node's free memory); ``threshold``: the optimistic profiler's (and Synergy's)
    10 % rule; ``grace_s``: how long a profile run gets to exit on SIGTERM.
    """

    warmup_s: float = 2.0
    window_s: float = 5.0
    timeout_s: float = 60.0
    threshold: float = DEFAULT_THRESHOLD
    mem_points: int = 4
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("warmup_s", "grace_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"profiling {name} must be >= 0, got {getattr(self, name)}")
        for name in ("window_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"profiling {name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.threshold < 10:
            raise ValueError(f"profiling threshold must be in [0, 10), got {self.threshold}")
        if self.mem_points < 1:
            raise ValueError(f"profiling mem_points must be >= 1, got {self.mem_points}")


class SubmitError(ValueError):
    """A job the service refuses; ``field`` names the offending field when there is one."""

    def __init__(self, msg: str, field: str | None = None) -> None:
        super().__init__(msg)
        self.field = field


class PermissionDenied(PermissionError):
    pass


class NotFound(KeyError):
    pass


@dataclass(slots=True)
class Running:
    """What the loop knows about a launched job."""

    procs: dict[str, ProcInfo]  # executor id -> process
    exited: dict[str, int]  # executor id -> exit code, for parts already gone
    cores: dict[str, tuple[int, ...]]  # node name -> core ids
    start: float  # wall time (time.time) of this launch
    log_offset: int = 0  # size of the log before this launch (progress lines after it count)


def alloc_to_json(alloc: Allocation, cluster: Cluster, cores: Mapping[str, Sequence[int]] | None = None) -> dict:
    parts = []
    for p in alloc.parts:
        name = cluster.nodes[p.node].name
        parts.append(
            {
                "node": name,
                "gpus": list(p.gpus),
                "local_gpus": [cluster.local_index(g) for g in p.gpus],
                "cpus": p.cpus,
                "mem_mb": p.mem_mb,
                "cores": list((cores or {}).get(name, ())),
            }
        )
    return {"parts": parts, "group": list(alloc.group)}


def proc_to_json(p: ProcInfo, cores: Sequence[int]) -> dict[str, Any]:
    """A launched process as stored: every :class:`ProcInfo` field plus its core ids."""
    return {**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, "cores": list(cores)}


def proc_from_json(d: Mapping[str, Any]) -> ProcInfo:
    names = {f.name for f in dataclasses.fields(ProcInfo)}
    return ProcInfo(**{k: v for k, v in d.items() if k in names})


def alloc_from_json(job_id: str, d: Mapping[str, Any], cluster: Cluster) -> Allocation:
    """Inverse of :func:`alloc_to_json`; ``KeyError``/``ValueError`` if the cluster no longer matches."""
    parts = []
    for p in d["parts"]:
        node = cluster.node_index(p["node"])
        gpus = tuple(int(g) for g in p["gpus"])
        for g in gpus:
            if g not in cluster.node_gpus(node):
                raise ValueError(f"GPU {g} is not on node {p['node']}")
        parts.append(Part(node, gpus, int(p["cpus"]), int(p["mem_mb"])))
    return Allocation(job_id, tuple(parts), tuple(d.get("group", ())))


def refuse_reason(cluster: Cluster, gpus: int, cpus: int | None, mem_mb: int | None) -> tuple[str, str] | None:
    """Why a job can never run on ``cluster`` (field, message), or None if it can."""
    if gpus > cluster.num_gpus:
        return "gpus", f"needs {gpus} GPUs, the cluster has {cluster.num_gpus}"
    if cpus is not None and cpus > cluster.total_cpus:
        return "cpus", f"needs {cpus} CPU cores, the cluster has {cluster.total_cpus}"
    if mem_mb is not None and mem_mb > cluster.total_mem_mb:
        return "mem", f"needs {mem_mb} MB of memory, the cluster has {cluster.total_mem_mb}"
    if gpus <= cluster.max_node_gpus:
        # fits on one node by GPUs: some node must also hold its CPU and memory
        ok = any(
            n.gpus >= gpus and (cpus is None or cpus <= n.cpus) and (mem_mb is None or mem_mb <= n.mem_mb)
            for n in cluster.nodes
        )
        if not ok and gpus <= min(n.gpus for n in cluster.nodes if n.gpus > 0):
            what = "cpus" if cpus is not None and all(cpus > n.cpus for n in cluster.nodes) else "mem"
            return what, (
                f"{gpus} GPUs with {cpus if cpus is not None else 'proportional'} cores and "
                f"{mem_mb if mem_mb is not None else 'proportional'} MB fit on no node"
            )
    return None


class _JobsById(Mapping[str, Job]):
    """The service's active jobs keyed by string id, as throughput factors look co-runners up."""

    def __init__(self, jobs: dict[int, Job]) -> None:
        self.jobs = jobs

    def __getitem__(self, key: str) -> Job:
        return self.jobs[int(key)]

    def __iter__(self) -> Iterator[str]:
        return (str(k) for k in self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


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
    ) -> None:
        if not round_s > 0:
            raise ValueError(f"round length must be > 0, got {round_s}")
        self.store = store
        self.cluster = cluster
        self.executor = executor
        self.scheduler = scheduler
        self.state_dir = Path(state_dir)
        self.log_dir = self.state_dir / "logs"
        self.ckpt_dir = self.state_dir / "checkpoints"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.round_s = float(round_s)
        self.grace_s = float(grace_s)
        self.default_duration = float(default_duration)
        self.protect_factor = float(protect_factor)
        self.launch_timeout_s = float(launch_timeout_s)
        self.model = model or build_model(cluster)  # the same model `simulate` builds
        self.profiling = profiling
        from ..policies.synergy import uses_profiles

        if (profiling is not None or uses_profiles(scheduler.size)) and not isinstance(self.model.get("sensitivity"), SensitivityFactor):
            # stored profiles, and profiles submitted with a job, reach the sizers through it
            add_sensitivity(self.model)
        self._profiles: dict[str, SensitivityProfile | None] = {}  # profile key -> profile (None: unprofilable)
        self._profiled = False  # a job got a profile in this round
        self.rng = np.random.default_rng(seed)
        self.epoch = float(store.set_meta_default("epoch", repr(time.time())))
        self.cores = CoreAllocator({n.name: n.cpus for n in cluster.nodes})
        self.jobs: dict[int, Job] = {}  # active jobs, submission order
        self.model.bind(_JobsById(self.jobs))  # factors that need co-runners' specs (interleaving)
        self.rows: dict[int, JobRow] = {}
        self.current: dict[str, Allocation] = {}
        self.running: dict[int, Running] = {}
        self.exec_owner: dict[str, int] = {}  # executor id -> job id
        self.last_id = 0
        self.rounds = 0
        self.lock = threading.RLock()  # in-memory state: loop vs API readers
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cancels: set[int] = set()
        self._cancel_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpuloom-stop")
        self.last_round_s = 0.0

    # -- clock ------------------------------------------------------------------
    def now(self) -> float:
        """Service time: seconds since the epoch stored in the database."""
        return time.time() - self.epoch

    # -- API side (any thread) -------------------------------------------------------
    def validate(self, spec: Mapping[str, Any]) -> None:
        reason = refuse_reason(self.cluster, int(spec["gpus"]), spec.get("cpus"), spec.get("mem_mb"))
        if reason is not None:
            raise SubmitError(f"job can never run on this cluster: {reason[1]}", reason[0])

    def submit(self, spec: Mapping[str, Any], user: str) -> int:
        """Store a validated spec (committed) and wake the loop; return the job id."""
        self.validate(spec)
        jid = self.store.add_job(spec, user, S.WAITING_FOR_INITIAL_CONTACT.value)
        self._wake.set()
        return jid

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
            {"state": S.CANCELLED.value, "cancel_requested": True, "end_time": time.time(),
             "reason": f"cancelled by {user}"},
            "cancel",
            {"by": user},
            expect_state=QUEUED_STATES,
        )
        if not done:
            self.store.update_job(job_id, {"cancel_requested": True}, "cancel-request", {"by": user})
        with self._cancel_lock:
            self._cancels.add(job_id)
        self._wake.set()
        return self.store.get_job(job_id)  # type: ignore[return-value]

    def nodes(self) -> list[dict[str, Any]]:
        """Per-node use.  Reads a snapshot of the allocations without the loop's lock, so it
        answers at once even while a round waits for jobs to checkpoint."""
        current = dict(self.current)  # a C-level copy: atomic under the GIL
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
                    "jobs": sorted(jobs, key=int),
                    "state": "mixed" if 0 < len(used_g) < n.gpus else ("alloc" if used_g else "idle"),
                }
            )
        return out

    def log_path(self, job_id: int) -> Path:
        return self.log_dir / f"{job_id}.log"

    def last_progress(self, job_id: int) -> int | None:
        """The iteration count of the job's last ``GPULOOM_PROGRESS`` line (last 8 KiB of its log)."""
        try:
            with open(self.log_path(job_id), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 8192))
                tail = f.read().decode(errors="replace")
        except OSError:
            return None
        for line in reversed(tail.splitlines()):
            try:
                p = parse_progress(line)
            except ProgressError:
                continue
            if p is not None:
                return p.iter
        return None

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
        self._pool.shutdown(wait=True)
        self.executor.close()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        tick = min(self.round_s, 0.1)
        gap = min(self.round_s, MIN_EVENT_GAP_S)
        next_round = 0.0
        last = 0.0
        while not self._stop.is_set():
            woke = self._wake.wait(timeout=tick)
            if woke:
                # a burst of submissions: let it gather for a moment so one round takes them all
                time.sleep(max(0.0, last + gap - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                with self.lock:
                    changed = self._reap() or woke
                    t = time.monotonic()
                    if changed or t >= next_round:
                        self.round()
                        last = time.monotonic()
                        next_round = last + self.round_s
            except Exception:  # a bad round must not kill the service
                log.exception("scheduling round failed")

    # -- recovery ----------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the mirror from the store; adopt live processes, requeue dead ones.

        A job that held a process (launching, running, being stopped) is adopted
        if all its processes are alive (same pid and start time); a stop the
        previous service had begun (checkpointing, stopping) is finished now.
        A job whose processes are gone is FINISHED if they all left exit
        records of 0 and it was running, else requeued (STANDBY) to resume from
        its checkpoint.  Lifecycles restart from the stored state (their
        history before the restart is in the events table).
        """
        with self.lock:
            for row in self.store.list_jobs(ACTIVE_STATES):
                self.last_id = max(self.last_id, row.id)
                if row.state in QUEUED_STATES:
                    if self._fits_or_fail(row):
                        self._mirror(row, JobState(row.state))
                    continue
                self._recover_holding(row)
                if row.cancel_requested:
                    with self._cancel_lock:
                        self._cancels.add(row.id)
            self.last_id = max(self.last_id, self._max_id())
        self._wake.set()

    def _recover_holding(self, row: JobRow) -> None:
        state = JobState(row.state)
        procs = [proc_from_json(d) for d in row.procs or []]
        alloc = None
        adopted: list[ProcInfo] = []
        if procs and row.alloc:
            try:
                alloc = alloc_from_json(str(row.id), row.alloc, self.cluster)
            except (KeyError, ValueError) as e:
                log.warning("job %s: stored allocation no longer fits the cluster (%s)", row.id, e)
            adopted = [p for p in procs if self._adopt(p)]
        alive = alloc is not None and bool(procs) and len(adopted) == len(procs)
        stopping = state in (S.CHECKPOINTING, S.STOPPING)
        if alive and not stopping:
            assert alloc is not None and row.alloc is not None
            job = self._mirror(row, state)
            cores = {p["node"]: tuple(p.get("cores", ())) for p in row.alloc["parts"]}
            for p in procs:
                self.cores.claim(p.node, p.job_id, cores.get(p.node, ()))
                self.exec_owner[p.job_id] = row.id
            self.running[row.id] = Running({p.job_id: p for p in procs}, {}, cores, row.last_start or time.time(),
                                           self._log_size(row.id) if state is S.LAUNCHING else 0)
            self.current[str(row.id)] = alloc
            job.alloc = alloc
            job.status = JobStatus.RUNNING
            job.speed = self.model.speed(job, alloc)
            self.store.add_event(row.id, "adopt", {"pids": [p.pid for p in procs]}, durable=False)
            log.info("job %s: adopted running process(es) %s", row.id, [p.pid for p in procs])
            return
        for p in adopted:  # partly alive, or a stop to finish: stop what is left
            self._stop_quietly(p.job_id)
        gone = [p for p in procs if p not in adopted]
        if (not stopping and procs and not adopted and state in (S.LAUNCHING, S.RUNNING_PROTECTED, S.RUNNING)
                and all(self._exit_code(p) == 0 for p in gone)):
            self._mirror(row, state)
            self._finish(row.id, S.FINISHED, 0, "finished while the service was down")
            return
        held = row.held_time + max(0.0, time.time() - (row.last_start or time.time()))
        ngpu = int(row.spec["gpus"])
        row.held_gpu_time += (held - row.held_time) * ngpu
        row.held_time = held
        why = "stop completed after a restart" if stopping else "process lost while the service was down"
        self.store.update_job(
            row.id,
            {"state": S.STANDBY.value, "alloc": None, "procs": None, "held_time": held,
             "held_gpu_time": row.held_gpu_time, "reason": f"{why}; requeued to resume"},
            "requeue",
            {"why": why},
            durable=False,
        )
        row.state = S.STANDBY.value
        self._mirror(row, S.STANDBY)

    def _log_size(self, jid: int) -> int:
        try:
            return self.log_path(jid).stat().st_size
        except OSError:
            return 0

    def _adopt(self, p: ProcInfo) -> bool:
        try:
            return bool(self.executor.adopt(p))
        except Exception as e:  # e.g. the node is no longer served by this executor
            log.warning("job %s: cannot adopt pid %s on %s: %s", p.job_id, p.pid, p.node, e)
            return False

    def _exit_code(self, p: ProcInfo) -> int | None:
        try:
            return self.executor.exit_code(p)  # type: ignore[attr-defined]
        except AttributeError:  # an executor without exit records
            return None
        except Exception:
            return None

    def _stop_quietly(self, eid: str) -> int | None:
        try:
            return self.executor.stop(eid, self.grace_s)
        except Exception as e:
            log.warning("stopping %s failed: %s", eid, e)
            return None

    def _max_id(self) -> int:
        rows = self.store.list_jobs(None, after_id=self.last_id)
        return max([self.last_id] + [r.id for r in rows])

    # -- mirror ------------------------------------------------------------------------
    def job_spec(self, row: JobRow) -> JobSpec:
        s = row.spec
        duration = float(s.get("time_limit") or self.default_duration)
        attrs = {k: s[k] for k in SPEC_ATTRS if s.get(k) is not None}
        return JobSpec(
            str(row.id),
            max(0.0, row.submit_time - self.epoch),
            int(s["gpus"]),
            duration,
            model=str(s.get("model") or ""),
            user=row.user,
            cpus=s.get("cpus"),
            mem_mb=s.get("mem_mb"),
            profile=self._stored_profile(s) or s.get("profile"),
            attrs=attrs,
        )

    def _mirror(self, row: JobRow, state: JobState) -> Job:
        job = Job(self.job_spec(row), row.id)
        job.status = JobStatus.WAITING
        job.extra[LIFECYCLE_KEY] = Lifecycle(str(row.id), self.now(), state, self.protect_factor)
        job.attained_time = row.held_time
        job.attained_gpu_time = row.held_gpu_time
        job.remaining = max(job.spec.duration - row.held_time, 1e-9)
        job.preemptions = row.preemptions
        job.first_start = None if row.first_start is None else row.first_start - self.epoch
        job.last_update = self.now()
        self.jobs[row.id] = job
        self.rows[row.id] = row
        return job

    def _fits_or_fail(self, row: JobRow) -> bool:
        """False (and the job FAILED) if it can never run on the cluster, e.g. after the cluster shrank."""
        s = row.spec
        reason = refuse_reason(self.cluster, int(s["gpus"]), s.get("cpus"), s.get("mem_mb"))
        if reason is None:
            return True
        self.store.update_job(
            row.id, {"state": S.FAILED.value, "end_time": time.time(), "alloc": None, "procs": None,
                     "reason": f"can never run on this cluster: {reason[1]}"},
            "failed", {"reason": reason[1]},
        )
        return False

    def _load_new(self) -> bool:
        """Mirror jobs submitted since the last round; they make contact (-> WAITING_FOR_INITIAL_RESOURCE)."""
        rows = self.store.list_jobs([S.WAITING_FOR_INITIAL_CONTACT.value], after_id=self.last_id)
        for row in rows:
            if self._fits_or_fail(row):
                self._mirror(row, S.WAITING_FOR_INITIAL_CONTACT)
        if rows:
            self.last_id = rows[-1].id
        self._contact()
        return bool(rows)

    def _contact(self) -> None:
        """WAITING_FOR_INITIAL_CONTACT -> WAITING_FOR_INITIAL_RESOURCE for every mirrored job.

        The service has no agent protocol: a job is in contact once the loop
        has it.  One UPDATE for the whole batch."""
        ids = [jid for jid, j in self.jobs.items()
               if self._lc(jid).state is S.WAITING_FOR_INITIAL_CONTACT]
        if not ids:
            return
        self.store.set_states(ids, S.WAITING_FOR_INITIAL_RESOURCE.value, [S.WAITING_FOR_INITIAL_CONTACT.value])
        now = self.now()
        for jid in ids:
            self._to(jid, now, S.WAITING_FOR_INITIAL_RESOURCE)
            self.rows[jid].state = S.WAITING_FOR_INITIAL_RESOURCE.value

    def _lc(self, jid: int) -> Lifecycle:
        return self.jobs[jid].extra[LIFECYCLE_KEY]

    def _to(self, jid: int, now: float, *states: JobState) -> JobState:
        """Walk the job's lifecycle through ``states`` (in memory); returns the last."""
        lc = self._lc(jid)
        for st in states:
            lc.to(st, max(now, lc.since))
        return lc.state

    # -- one round -----------------------------------------------------------------------
    def compute_plan(self, now: float | None = None) -> Plan:
        """The scheduler's plan for the current jobs and allocations (no side effects on processes)."""
        now = self.now() if now is None else now
        jobs = []
        for j in self.jobs.values():
            j.advance(now)
            jobs.append(j)
        view = View(now, self.cluster, jobs, self.current, self.model, self.rng, self.rounds)
        plan = self.scheduler.schedule(view)
        self.scheduler.check(plan, view)
        return plan

    def round(self) -> list[Action]:
        """Reap, enforce limits and cancels, pick up new jobs, plan, act.  Returns the actions taken."""
        t0 = time.perf_counter()
        with self.lock:
            self._reap()
            self._handle_cancels()
            self._enforce_time_limits()
            self._load_new()
            self._promote()
            self.rounds += 1
            now = self.now()
            plan = self.compute_plan(now)
            actions = diff(self.current, plan)
            stops = [a for a in actions if a.kind in (ActionKind.STOP, ActionKind.MOVE, ActionKind.RESIZE)]
            self._stop_many([int(a.job_id) for a in stops], requeue=True)
            self._profiled = False
            for a in actions:
                jid = int(a.job_id)
                if jid not in self.jobs:
                    continue
                if self._profiled and a.kind is ActionKind.START:
                    continue  # a new profile changes sizes: the next round re-plans the starts left
                if a.kind is ActionKind.REGROUP:
                    self.current[a.job_id] = a.new  # type: ignore[assignment]
                    self.jobs[jid].alloc = a.new
                    self.store.update_job(jid, {"alloc": alloc_to_json(a.new, self.cluster, self.running[jid].cores)})  # type: ignore[arg-type]
                elif a.new is not None:
                    self._launch(jid, a.new, a.kind)
        self.last_round_s = time.perf_counter() - t0
        return actions

    # -- completions ---------------------------------------------------------------------
    def _reap(self) -> bool:
        codes = self.executor.poll()
        changed = False
        for eid, code in codes.items():
            jid = self.exec_owner.get(eid)
            if jid is None or jid not in self.running:
                continue
            run = self.running[jid]
            if eid not in run.procs:
                continue
            run.exited[eid] = -1 if code is None else code
            changed = True
            if code != 0:
                others = [e for e in run.procs if e not in run.exited]
                for e in others:
                    self._stop_quietly(e)
                what = "with an unknown exit code" if code is None else f"with code {code}"
                self._finish(jid, S.FAILED, code, f"process {eid} ended {what}")
            elif len(run.exited) == len(run.procs):
                self._finish(jid, S.FINISHED, 0, None)
        return changed

    def _finish(self, jid: int, state: JobState, code: int | None, reason: str | None) -> None:
        """End a job: FINISHED (from a launching or running state), FAILED or CANCELLED (from any)."""
        lc = self._lc(jid)
        now = self.now()
        if state is S.FINISHED and lc.state is S.LAUNCHING:
            # done before its first progress line: it ran, launch time is all we know
            self._to(jid, now, S.RUNNING_PROTECTED)
        self._to(jid, now, state)
        job = self.jobs.pop(jid)
        row = self.rows.pop(jid)
        run = self.running.pop(jid, None)
        held = row.held_time
        if run is not None:
            held += time.time() - run.start
            self._release(jid, run)
        alloc = self.current.pop(str(jid), None)
        self.store.update_job(
            jid,
            {"state": state.value, "end_time": time.time(), "alloc": None, "procs": None, "exit_code": code,
             "reason": reason, "held_time": held, "progress": self.last_progress(jid),
             "held_gpu_time": row.held_gpu_time + (held - row.held_time) * (alloc.num_gpus if alloc else 0)},
            state.value,
            {"exit_code": code, "reason": reason},
            durable=False,
        )
        job.status = JobStatus.FINISHED
        # co-runners lose a partner
        if alloc is not None:
            for other in alloc.group:
                oa = self.current.get(other)
                if oa is not None:
                    self.current[other] = Allocation(oa.job_id, oa.parts, tuple(x for x in oa.group if x != str(jid)))
                    self.jobs[int(other)].alloc = self.current[other]

    def _release(self, jid: int, run: Running) -> None:
        for eid, p in run.procs.items():
            self.cores.release(p.node, eid)
            self.exec_owner.pop(eid, None)

    def _handle_cancels(self) -> None:
        with self._cancel_lock:
            ids, self._cancels = self._cancels, set()
        to_stop = []
        for jid in sorted(ids):
            if jid in self.running:
                to_stop.append(jid)
            elif jid in self.jobs:  # queued (the API marked it cancelled, unless it was running then)
                self._to(jid, self.now(), S.CANCELLED)
                self.jobs.pop(jid)
                self.rows.pop(jid, None)
                self.store.update_job(
                    jid, {"state": S.CANCELLED.value, "end_time": time.time(), "reason": "cancelled"},
                    "cancel", {}, expect_state=QUEUED_STATES,
                )
            # not mirrored yet: _load_new only loads jobs still waiting for contact, so it is skipped
        if to_stop:
            self._stop_many(to_stop, requeue=False)
            for jid in to_stop:
                self._finish(jid, S.CANCELLED, None, "cancelled")

    def _enforce_time_limits(self) -> None:
        t = time.time()
        over = []
        for jid, run in self.running.items():
            limit = self.rows[jid].spec.get("time_limit")
            if limit and self.rows[jid].held_time + (t - run.start) > float(limit):
                over.append(jid)
        if over:
            self._stop_many(over, requeue=False)
            for jid in over:
                self._finish(jid, S.FAILED, None, f"time limit of {self.rows[jid].spec['time_limit']} s reached")

    # -- actions ---------------------------------------------------------------------------
    def _stop_many(self, jids: Sequence[int], requeue: bool) -> None:
        """Stop jobs' processes in parallel (each gets the full grace period).

        With ``requeue`` (preemption, move, resize) the lifecycle goes
        RUNNING -> CHECKPOINTING -> STOPPING -> STANDBY (a protected job ends
        its protection first, a launching one goes straight to STOPPING), and
        the checkpointing state is in the store while the job checkpoints.
        Without, the caller ends the job (cancel, time limit).
        """
        futs = []
        now = self.now()
        for jid in jids:
            run = self.running.get(jid)
            if run is None:
                continue
            if requeue:
                st = self._lc(jid).state
                if st is S.RUNNING_PROTECTED:
                    self._to(jid, now, S.RUNNING)
                st = self._to(jid, now, S.STOPPING if st is S.LAUNCHING else S.CHECKPOINTING)
                self.store.update_job(jid, {"state": st.value}, st.value, {}, durable=False)
            for eid in run.procs:
                if eid not in run.exited:
                    futs.append((jid, eid, self._pool.submit(self.executor.stop, eid, self.grace_s)))
        codes: dict[int, list[int | None]] = {}
        for jid, eid, f in futs:
            try:
                code = f.result()
            except Exception as e:  # executor failure: the process is gone or unreachable
                log.warning("job %s: stopping %s failed: %s", jid, eid, e)
                code = None
            codes.setdefault(jid, []).append(code)
            self.store.add_event(jid, "stopped", {"exec_id": eid, "exit_code": code}, durable=False)
        if not requeue:
            return
        for jid in jids:
            run = self.running.get(jid)
            if run is None:
                continue
            del self.running[jid]
            # a job that happened to complete as it was stopped (exit 0) is requeued too: the
            # lifecycle has no CHECKPOINTING -> FINISHED; it resumes from a finished checkpoint
            t = self.now()
            if self._lc(jid).state is S.CHECKPOINTING:
                self._to(jid, t, S.STOPPING)
            self._to(jid, t, S.STANDBY)
            self._release(jid, run)
            row = self.rows[jid]
            job = self.jobs[jid]
            alloc = self.current.pop(str(jid))
            held = row.held_time + (time.time() - run.start)
            row.held_gpu_time += (held - row.held_time) * alloc.num_gpus
            row.held_time = held
            row.preemptions += 1
            job.alloc = None
            job.status = JobStatus.WAITING
            job.speed = 0.0
            job.preemptions += 1
            job.version += 1
            self.store.update_job(
                jid,
                {"state": S.STANDBY.value, "alloc": None, "procs": None, "held_time": row.held_time,
                 "held_gpu_time": row.held_gpu_time, "preemptions": row.preemptions, "reason": "preempted",
                 "progress": self.last_progress(jid)},
                "preempt",
                {},
                durable=False,
            )

    def _launch(self, jid: int, alloc: Allocation, kind: ActionKind) -> None:
        row = self.rows[jid]
        if kind is ActionKind.START and self._needs_profile(row) and self._profile(jid, alloc):
            self._profiled = True
            return  # profiled: queued again, the next round sizes it with its profile
        job = self.jobs[jid]
        spec = row.spec
        resume = row.attempts > 0
        ckpt = spec.get("checkpoint_dir") or str(self.ckpt_dir / str(jid))
        Path(ckpt).mkdir(parents=True, exist_ok=True)
        multi = len(alloc.parts) > 1
        procs: dict[str, ProcInfo] = {}
        cores: dict[str, tuple[int, ...]] = {}
        env_common = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        env_common.update(
            {
                "GPULOOM_JOB_ID": str(jid),
                "GPULOOM_JOB_NAME": row.name,
                "GPULOOM_CHECKPOINT_DIR": ckpt,
                "GPULOOM_ATTEMPT": str(row.attempts + 1),
                "GPULOOM_NUM_GPUS": str(alloc.num_gpus),
                "GPULOOM_NUM_NODES": str(len(alloc.parts)),
            }
        )
        if resume:
            env_common["GPULOOM_RESUME"] = "1"
        log_offset = self._log_size(jid)
        try:
            for rank, p in enumerate(alloc.parts):
                node = self.cluster.nodes[p.node].name
                eid = f"{jid}.{rank}" if multi else str(jid)
                c = self.cores.take(node, eid, p.cpus)
                cores[node] = c
                self.exec_owner[eid] = jid
                env = dict(env_common, GPULOOM_NODE_RANK=str(rank))
                ls = LaunchSpec(
                    eid,
                    str(spec["command"]),
                    node,
                    tuple(self.cluster.local_index(g) for g in p.gpus),
                    c,
                    int(p.mem_mb),
                    str(self.log_path(jid)),
                    env,
                    spec.get("workdir"),
                )
                procs[eid] = self.executor.launch(ls)
        except Exception as e:
            log.exception("job %s: launch failed", jid)
            for eid in procs:
                self._stop_quietly(eid)
            for eid in [f"{jid}.{r}" for r in range(len(alloc.parts))] + [str(jid)]:
                for n in self.cluster.nodes:
                    if eid in self.cores.used[n.name]:
                        self.cores.release(n.name, eid)
                self.exec_owner.pop(eid, None)
            self.running.pop(jid, None)
            self._finish(jid, S.FAILED, None, f"launch failed: {e}")
            return
        t = time.time()
        self.running[jid] = Running(procs, {}, cores, t, log_offset)
        if self._lc(jid).state is S.WAITING_FOR_INITIAL_RESOURCE:
            self._to(jid, self.now(), S.STANDBY)
        self._to(jid, self.now(), S.LAUNCHING)
        self.current[str(jid)] = alloc
        now = self.now()
        job.advance(now)
        job.alloc = alloc
        job.status = JobStatus.RUNNING
        job.speed = self.model.speed(job, alloc)
        job.last_start = now
        if job.first_start is None:
            job.first_start = now
        job.version += 1
        row.attempts += 1
        if resume:
            row.resume_count += 1
        if row.first_start is None:
            row.first_start = t
        alloc_json = alloc_to_json(alloc, self.cluster, cores)
        self.store.update_job(
            jid,
            {
                "state": S.LAUNCHING.value,
                "alloc": alloc_json,
                "procs": [proc_to_json(p, cores[p.node]) for p in procs.values()],
                "attempts": row.attempts,
                "resume_count": row.resume_count,
                "first_start": row.first_start,
                "last_start": t,
                "checkpoint_dir": ckpt,
                "reason": None,
            },
            "launch" if kind is ActionKind.START else kind.value,
            {"resume": resume, "pids": [p.pid for p in procs.values()], "alloc": alloc_json},
            durable=False,
        )

    def _promote(self) -> None:
        """LAUNCHING -> RUNNING_PROTECTED once the job prints its first progress line
        (``GPULOOM_PROGRESS``) after this launch, or after ``launch_timeout_s`` for jobs that
        print none; RUNNING_PROTECTED -> RUNNING when protection expires."""
        now = self.now()
        t = time.time()
        for jid, run in self.running.items():
            lc = self._lc(jid)
            if lc.state is S.LAUNCHING:
                if self._progress_since(run, jid) or t - run.start >= self.launch_timeout_s:
                    self._to(jid, now, S.RUNNING_PROTECTED)
                    self.store.update_job(jid, {"state": lc.state.value}, lc.state.value,
                                          {"launch_s": lc.last_launch_time}, durable=False)
            if lc.state is S.RUNNING_PROTECTED and lc.refresh(now) is S.RUNNING:
                self.store.update_job(jid, {"state": S.RUNNING.value}, S.RUNNING.value, {}, durable=False)

    def _progress_since(self, run: Running, jid: int) -> bool:
        """Whether a progress line appeared in the log since ``run.log_offset`` (advanced as it reads)."""
        try:
            with open(self.log_path(jid), "rb") as f:
                f.seek(run.log_offset)
                chunk = f.read(1 << 16)
        except OSError:
            return False
        if PROGRESS_MARK in chunk:
            return True
        run.log_offset += max(0, len(chunk) - len(PROGRESS_MARK))
        return False

    # -- profiling ----------------------------------------------------------------------
    def _stored_profile(self, spec: Mapping[str, Any]) -> SensitivityProfile | None:
        """The stored profile of a job's model (cached), when profiling is on and the job wants one."""
        if self.profiling is None or not wants_profile(spec):
            return None
        key = profile_key(spec)
        if key not in self._profiles:
            rec = self.store.get_profile(key)
            if rec is None:
                return None
            try:
                self._profiles[key] = profile_from_record(key, rec)
            except SensitivityError as e:
                log.warning("%s: it will be profiled again", e)
                return None
        return self._profiles[key]

    def _needs_profile(self, row: JobRow) -> bool:
        """A first launch of a job that wants a profile its model does not have yet (store or catalogue)."""
        if self.profiling is None or row.attempts > 0 or not wants_profile(row.spec):
            return False
        key = profile_key(row.spec)
        if key in self._profiles or self._stored_profile(row.spec) is not None or key in self._profiles:
            return False
        f = self.model.get("sensitivity")
        model, g = row.spec.get("model"), int(row.spec["gpus"])
        if model and isinstance(f, SensitivityFactor):
            p = f.catalogue.get(str(model), g)
            if p is not None and p.gpus == g:  # --profiles already has a measured matrix
                return False
        return True

    def _profile(self, jid: int, alloc: Allocation) -> bool:
        """Profile a job on the GPUs its plan gave it, before its first real launch.

        Runs synchronously inside the round (see the module notes): the job's GPUs
        are its plan's, its cores every core of its node no running job holds
        (taken in the core allocator for the duration), its memory points equal
        steps up to the node's memory no running job holds.  Stores the outcome
        under the model's key and returns True when the job got a profile (it
        stays queued and the next round sizes it with the profile), False when it
        should launch now on ``alloc`` (unprofilable, or profiling impossible).
        """
        cfg = self.profiling
        assert cfg is not None
        row = self.rows[jid]
        spec = row.spec
        key = profile_key(spec)
        if len(alloc.parts) != 1:  # the profiler measures one process
            log.info("job %s: spans %d nodes, not profiled", jid, len(alloc.parts))
            self._profiles[key] = None  # for this service run only
            self.store.add_event(jid, "profile-skip", {"why": "spans nodes"}, durable=False)
            return False
        part = alloc.parts[0]
        node = self.cluster.nodes[part.node]
        rid = f"{jid}.profile"
        cores = self.cores.take(node.name, rid, len(self.cores.free(node.name)))
        used_mem = sum(p.mem_mb for a in self.current.values() for p in a.parts if p.node == part.node)
        mem_cap = max(int(part.mem_mb), node.mem_mb - used_mem, 1)
        n = cfg.mem_points
        mem_points = sorted({max(1, mem_cap * k // n) for k in range(1, n + 1)})
        cpu_points = list(range(1, len(cores) + 1))
        g = alloc.num_gpus
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        env.update({"GPULOOM_JOB_NAME": row.name, "GPULOOM_NUM_GPUS": str(g), "GPULOOM_NUM_NODES": "1",
                    "GPULOOM_NODE_RANK": "0"})
        prof = RealProfiler(
            self.executor, str(jid), str(spec["command"]), node.name,
            tuple(self.cluster.local_index(x) for x in part.gpus), cores, self.log_dir / "profile", env,
            spec.get("workdir"), warmup_s=cfg.warmup_s, window_s=cfg.window_s, startup_timeout_s=cfg.timeout_s,
            grace_s=min(self.grace_s, cfg.grace_s),
        )
        where = {"key": key, "node": node.name, "gpus": list(part.gpus), "cpu_points": cpu_points,
                 "mem_points": mem_points}
        self.store.add_event(jid, "profile-start", where, durable=False)
        log.info("job %s: profiling %s on %s (%d cores, up to %d MB)", jid, key, node.name, len(cores), mem_cap)
        t0 = time.monotonic()
        try:
            res = optimistic_profile(prof, cpu_points, mem_points, cfg.threshold, gpus=g, model=key)
            rec = record_from_result(res)
        except (NoProgress, ProfileError) as e:
            rec = unprofilable_record(g, str(e))
        except Exception as e:  # executor trouble: not the job's fault, nothing stored
            log.exception("job %s: profiling failed", jid)
            self._profiles[key] = None
            self.store.add_event(jid, "profile-failed", {"error": str(e)}, durable=False)
            return False
        finally:
            self.cores.release(node.name, rid)
        wall = time.monotonic() - t0
        rec.update(node=node.name, window_s=cfg.window_s, warmup_s=cfg.warmup_s, wall_s=round(wall, 3),
                   runs=len(prof.runs), job=jid)
        self.store.put_profile(key, rec)
        p = profile_from_record(key, rec)
        self._profiles[key] = p
        detail = {k: rec[k] for k in ("status", "wall_s", "runs") if k in rec}
        if p is None:
            detail["reason"] = rec["reason"]
            log.warning("job %s: %s; it runs with GPU-proportional resources", jid, rec["reason"])
        else:
            detail.update({k: rec[k] for k in ("cpus", "mem_mb", "points_measured", "grid_size")})
            for oid, other in self.jobs.items():  # every queued job of the model gets it
                ospec = self.rows[oid].spec
                if wants_profile(ospec) and profile_key(ospec) == key:
                    other.spec = dataclasses.replace(other.spec, profile=p)
        self.store.add_event(jid, "profiled" if rec["status"] == OK else "unprofilable", detail, durable=False)
        self._wake.set()
        return p is not None

    # -- introspection ------------------------------------------------------------------
    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no job is active (tests, shutdown scripts)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if not self.jobs and self.store.count_jobs(ACTIVE_STATES) == 0:
                    return True
            time.sleep(0.05)
        return False


def parse_mem(value: Any, where: str = "mem") -> int:
    """``"8G"``/``"512M"``/``"1.5T"``/``2048`` (MB) → MB.  Raises ``ValueError`` naming ``where``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a size like 8G or a number of MB, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{where}: must be >= 0 MB, got {value}")
        return int(value)
    s = str(value).strip().upper().removesuffix("B")
    mult = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    try:
        if s and s[-1] in mult:
            v = float(s[:-1]) * mult[s[-1]]
        else:
            v = float(s)
    except ValueError:
        raise ValueError(f"{where}: expected a size like 8G, 512M or a number of MB, got {value!r}") from None
    if v < 0 or not math.isfinite(v):
        raise ValueError(f"{where}: must be >= 0, got {value!r}")
    return int(v)


def parse_duration(value: Any, where: str = "time_limit") -> float:
    """Seconds from a number or a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) or ``90s/10m/2h/1d``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected seconds or a time like 1:30:00, got {value!r}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        s = str(value).strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            if s and s[-1].lower() in units and s[:-1].replace(".", "", 1).isdigit():
                v = float(s[:-1]) * units[s[-1].lower()]
            else:
                days = 0
                if "-" in s:
                    d, s = s.split("-", 1)
                    days = int(d)
                    fields = [int(x) for x in s.split(":")]
                    while len(fields) < 3:
                        fields.append(0)
                    h, m, sec = fields
                else:
                    fields = [int(x) for x in s.split(":")]
                    if len(fields) == 1:
                        h, m, sec = 0, fields[0], 0  # Slurm: a bare number is minutes
                    elif len(fields) == 2:
                        h, m, sec = 0, fields[0], fields[1]
                    elif len(fields) == 3:
                        h, m, sec = fields
                    else:
                        raise ValueError
                v = float(days * 86400 + h * 3600 + m * 60 + sec)
        except ValueError:
            raise ValueError(f"{where}: expected seconds or a time like 30:00, 1:30:00, 2-00:00:00 or 2h, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be > 0, got {value!r}")
    return v
