"""The event loop: arrivals, completions and scheduling rounds, nothing hidden.

Time advances from event to event.  At equal times completions come first,
then arrivals, then the round, so a GPU freed at ``t`` is reusable at ``t``.

* **Arrivals** join the queue; with ``reschedule_on_arrival`` a round runs at once.
* **Rounds** happen every ``round_len`` seconds (the first at time 0).  A round
  asks the :class:`~gpuloom.scheduler.Scheduler` for a plan, checks it
  (:func:`~gpuloom.core.plan.check_plan` plus the gang rule) and carries out
  ``diff(current, plan)``.  When the scheduler is not ``dynamic`` and nothing
  arrived or finished since the last round, the round is skipped: it could
  not change anything.
* **Completions** happen exactly when a job's remaining work reaches zero
  (its predicted finish), not at the next round; the job is checked to have
  done exactly its work.  Predictions are invalidated by bumping ``job.version``.

Jobs that no placement can ever hold (:func:`gpuloom.core.fit.never_fits`: GPUs,
cores, memory, GPU type) are an error when the simulator is built, or, with
``drop_impossible``, never become active and count as unfinished
(``RunResult.impossible``).  A **stall guard** stops the run when, for
``STALL_ROUNDS`` rounds in a row, jobs wait, no job can finish as things stand
and none is left to arrive; ``RunResult.stalled`` names the waiting jobs.

Overheads: a job's first start costs ``launch_overhead`` seconds without
progress; a resume after preemption, a migration, or a resize costs
``restart_overhead`` (checkpoint restore + warm-up).  Deterministic for a given seed.

Lifecycle mode (``SimConfig.lifecycle = LifecycleTimes(...)``): every job gets
a :class:`~gpuloom.runtime.lifecycle.Lifecycle` in ``job.extra["lifecycle"]``
(the state machine the runtime uses) and the overheads follow it instead:

* arrival: WAITING_FOR_INITIAL_CONTACT → WAITING_FOR_INITIAL_RESOURCE;
* start: (→ STANDBY) → LAUNCHING for ``launch`` s → RUNNING_PROTECTED, which
  lasts ``protect_factor`` × that launch time → RUNNING;
* move/resize of a running job: CHECKPOINTING (``checkpoint`` s) → STOPPING
  (``stop`` s) → STANDBY → LAUNCHING (``launch`` s) → RUNNING_PROTECTED; a job
  still launching is stopped (``stop`` s) and launched again; a job already
  in the middle of a reallocation keeps its schedule (only its target changes);
* stop (preemption): CHECKPOINTING → STOPPING → STANDBY; a later start waits
  until the stop has finished;
* completion: → FINISHED (only reachable from the two running states).

A job makes progress only while RUNNING_PROTECTED or RUNNING: ``busy_until``
is set to the time it enters RUNNING_PROTECTED, which is all
:meth:`Job.advance` needs.  Future transitions are kept in
``job.extra["lifecycle_pending"]`` and recorded when time reaches them, so the
lifecycle never shows a state before it happens.  Simplification: the plan's
resources are taken (and the old ones freed) at the decision time; the job
holds its new GPUs through checkpoint/stop/launch, and a stopped job's GPUs
are free at once.  Per job, ``attrs["launch_time"|"checkpoint_time"|"stop_time"]``
override the configured durations (e.g. measured by the runtime).
"""

from __future__ import annotations

import heapq
import math
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..core.cluster import Cluster
from ..core.fit import impossible_jobs, impossible_message
from ..core.job import Job, JobError, JobSpec, JobStatus
from ..core.plan import ActionKind, Allocation, diff
from ..perf.model import ThroughputModel
from ..policies.base import FreeState, View
from ..runtime.lifecycle import LIFECYCLE_KEY, JobState, Lifecycle
from ..scheduler import Scheduler
from .metrics import JobRecord, RunResult, TimeSeries


class SimulationError(RuntimeError):
    pass


#: Stall guard: stop after this many rounds in which jobs wait, no job can finish and none will arrive.
STALL_ROUNDS = 3


@dataclass(slots=True)
class LifecycleTimes:
    """Durations (s) of the lifecycle's non-progress states, and the protection factor."""

    launch: float = 10.0
    checkpoint: float = 5.0
    stop: float = 2.0
    protect_factor: float = 3.0

    def __post_init__(self) -> None:
        for k in ("launch", "checkpoint", "stop", "protect_factor"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"lifecycle {k} must be a finite number >= 0, got {v!r}")

    def of(self, job: Job) -> tuple[float, float, float]:
        """(launch, checkpoint, stop) for ``job``: its ``attrs`` override the configured values."""
        a = job.spec.attrs or {}
        out = []
        for key, dflt in (("launch_time", self.launch), ("checkpoint_time", self.checkpoint), ("stop_time", self.stop)):
            v = a.get(key, dflt)
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise JobError(f"job {job.id}: attrs[{key!r}] must be a number, got {v!r}") from None
            if not math.isfinite(v) or v < 0:
                raise JobError(f"job {job.id}: attrs[{key!r}] must be >= 0, got {v}")
            out.append(v)
        return out[0], out[1], out[2]


@dataclass(slots=True)
class SimConfig:
    round_len: float = 300.0
    reschedule_on_arrival: bool = False
    reschedule_on_completion: bool = False
    launch_overhead: float = 0.0
    restart_overhead: float = 10.0
    seed: int = 0
    check: bool = True  # verify plan invariants every round
    max_time: float = math.inf  # stop here; jobs not done are unfinished
    drop_impossible: bool = False  # jobs that can never fit: error (False) or unfinished (True)
    lifecycle: LifecycleTimes | None = None  # lifecycle mode (see the module docstring)

    def __post_init__(self) -> None:
        if not self.round_len > 0:
            raise ValueError(f"round length must be > 0, got {self.round_len}")
        if self.launch_overhead < 0 or self.restart_overhead < 0:
            raise ValueError("overheads must be >= 0")


class Simulator:
    """Replays ``specs`` on ``cluster`` under ``scheduler``; :meth:`run` returns a :class:`RunResult`."""

    def __init__(
        self,
        cluster: Cluster,
        specs: Sequence[JobSpec],
        scheduler: Scheduler,
        model: ThroughputModel | None = None,
        config: SimConfig | None = None,
        observers: Sequence[Callable[[Simulator, str], None]] = (),
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        defaulted = model is None
        self.model = model or ThroughputModel.default(cluster)
        # factors a stage relies on (e.g. elastic sizing needs the scaling curves)
        for stage in (scheduler.order, scheduler.group, scheduler.size, scheduler.place):
            for fname, make in getattr(stage, "requires_factors", {}).items():
                if self.model.get(fname) is None:
                    if not defaulted:
                        raise SimulationError(
                            f"{stage.name} policy needs the {fname!r} factor in the throughput model; add it"
                        )
                    self.model.add(make())
        self.config = config or SimConfig()
        self.observers = list(observers)
        ids = set()
        for s in specs:
            if s.id in ids:
                raise JobError(f"duplicate job id {s.id!r}")
            ids.add(s.id)
        order = sorted(range(len(specs)), key=lambda i: (specs[i].arrival, i))
        self.jobs: list[Job] = [Job(specs[i], k) for k, i in enumerate(order)]
        self.by_id = {j.id: j for j in self.jobs}
        self.model.bind(self.by_id)  # factors that need co-runners' specs (interleaving)
        # jobs no placement can ever hold (GPUs, cores, memory, GPU type): an error, or never active
        self.impossible: dict[str, str] = impossible_jobs(specs, cluster)
        if self.impossible and not self.config.drop_impossible:
            raise JobError(impossible_message(self.impossible))
        self.stalled: list[str] = []  # jobs left waiting when the stall guard stopped the run
        self.now = 0.0
        self.rng = np.random.default_rng(self.config.seed)
        self.active: dict[str, Job] = {}
        self.current: dict[str, Allocation] = {}
        self.series = TimeSeries()
        self.rounds = 0
        self.rounds_computed = 0
        self._heap: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self._used = [0, 0, 0]  # GPUs, cores, MB held
        self.free = FreeState(cluster)  # what ``current`` leaves free, kept incrementally

    # -- bookkeeping --------------------------------------------------------
    def _record(self) -> None:
        self.series.record(
            self.now, self._used[0], self._used[1], self._used[2], len(self.current),
            len(self.active) - len(self.current),
        )

    def _hold(self, alloc: Allocation, sign: int) -> None:
        # a group's GPUs count once: only the first member in / last member out moves them
        gpus = not any(o in self.current for o in alloc.group)
        if gpus:
            self._used[0] += sign * alloc.num_gpus
        self._used[1] += sign * alloc.cpus
        self._used[2] += sign * alloc.mem_mb
        if sign > 0:
            self.free.take(alloc.parts, 1, gpus)
        else:
            self.free.release(alloc.parts, 1, gpus)

    def _push_completion(self, job: Job) -> None:
        t = job.predicted_finish(self.now)
        if math.isfinite(t):
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, job.id, job.version))

    def _next_completion(self) -> float:
        h = self._heap
        while h:
            t, _, jid, ver = h[0]
            j = self.by_id[jid]
            if j.version == ver and j.status is JobStatus.RUNNING:
                return t
            heapq.heappop(h)
        return math.inf

    def _set_alloc(self, job: Job, alloc: Allocation | None) -> None:
        old = self.current.pop(job.id, None)
        if old is not None:
            self._hold(old, -1)
        job.alloc = alloc
        if alloc is not None:
            self._hold(alloc, +1)
            self.current[job.id] = alloc

    # -- events -------------------------------------------------------------
    def _complete(self, job: Job) -> None:
        job.advance(self.now)
        tol = 1e-6 * max(1.0, job.spec.duration)
        if job.remaining > tol:
            raise SimulationError(f"job {job.id} completed with {job.remaining} work left")
        job.remaining = 0.0
        alloc = job.alloc
        self._set_alloc(job, None)
        lc = job.extra.get(LIFECYCLE_KEY)
        if lc is not None:
            self._lc_sync(job)
            lc.to(JobState.FINISHED, self.now)
        job.status = JobStatus.FINISHED
        job.finish = self.now
        job.speed = 0.0
        job.version += 1
        del self.active[job.id]
        # co-runners lose a partner: same GPUs, new group, new speed
        if alloc is not None:
            for other_id in alloc.group:
                other = self.by_id[other_id]
                oa = other.alloc
                if oa is not None:
                    other.advance(self.now)
                    na = Allocation(oa.job_id, oa.parts, tuple(x for x in oa.group if x != job.id))
                    self._set_alloc(other, na)
                    other.speed = self.model.speed(other, na)
                    other.version += 1
                    self._push_completion(other)
        for obs in self.observers:
            obs(self, "complete")

    def _arrive(self, job: Job) -> None:
        job.status = JobStatus.WAITING
        job.last_update = self.now
        self.active[job.id] = job
        lt = self.config.lifecycle
        if lt is not None:
            lc = Lifecycle(job.id, self.now, protect_factor=lt.protect_factor)
            lc.to(JobState.WAITING_FOR_INITIAL_RESOURCE, self.now)
            job.extra[LIFECYCLE_KEY] = lc
            job.extra["lifecycle_pending"] = []

    # -- lifecycle mode -----------------------------------------------------
    def _lc_sync(self, job: Job, now: float | None = None) -> Lifecycle:
        """Record the job's scheduled transitions up to ``now``, then expire its protection."""
        now = self.now if now is None else now
        lc: Lifecycle = job.extra[LIFECYCLE_KEY]
        pend: list[tuple[float, JobState]] = job.extra["lifecycle_pending"]
        k = 0
        while k < len(pend) and pend[k][0] <= now:
            lc.to(pend[k][1], pend[k][0])
            k += 1
        if k:
            del pend[:k]
        lc.refresh(now)
        return lc

    def _lc_action(self, job: Job, kind: ActionKind) -> None:
        """Schedule the lifecycle of a start / move / resize / stop at ``now``; set ``busy_until``."""
        now = self.now
        lt = self.config.lifecycle
        assert lt is not None
        launch, ckpt, stop = lt.of(job)
        lc = self._lc_sync(job)
        pend: list[tuple[float, JobState]] = job.extra["lifecycle_pending"]
        st = lc.state
        S = JobState
        if st is S.RUNNING_PROTECTED:
            lc.to(S.RUNNING, now)  # protection ends early: the plan overrides it
            st = S.RUNNING
        if kind is ActionKind.START:
            if st is S.WAITING_FOR_INITIAL_RESOURCE:
                lc.to(S.STANDBY, now)
            # after a stop, launch once the stop has finished
            t = pend[-1][0] if pend else now
            if pend and pend[-1][1] is not S.STANDBY:  # pragma: no cover - guarded by diff()
                raise SimulationError(f"job {job.id}: start while {pend[-1][1].name} is scheduled")
            pend += [(t, S.LAUNCHING), (t + launch, S.RUNNING_PROTECTED)]
        else:
            if st is S.RUNNING:
                pend[:] = [(now, S.CHECKPOINTING), (now + ckpt, S.STOPPING), (now + ckpt + stop, S.STANDBY)]
            elif st is S.LAUNCHING:
                pend[:] = [(now, S.STOPPING), (now + stop, S.STANDBY)]
            elif st is S.STANDBY:
                pend.clear()  # a launch still waiting for its stop to finish is called off
            else:  # already checkpointing / stopping: keep the way down to STANDBY
                cut = next((i for i, (_, s2) in enumerate(pend) if s2 is S.STANDBY), None)
                if cut is None:
                    raise SimulationError(f"job {job.id}: cannot reallocate in state {st.name}")
                del pend[cut + 1 :]
            if kind is not ActionKind.STOP:
                t = pend[-1][0] if pend else now
                pend += [(t, S.LAUNCHING), (t + launch, S.RUNNING_PROTECTED)]
        self._lc_sync(job)  # zero-length steps happen now
        job.busy_until = pend[-1][0] if kind is not ActionKind.STOP else now

    def _round(self) -> None:
        self.rounds += 1
        self.rounds_computed += 1
        now = self.now
        lifecycle = self.config.lifecycle is not None
        if self.scheduler.dynamic or lifecycle:
            # time-dependent orders read remaining work and attained service
            for jid in self.current:
                self.by_id[jid].advance(now)
        if lifecycle:
            for j in self.active.values():
                self._lc_sync(j)
        jobs = list(self.active.values())  # arrival order; impossible jobs never become active
        view = View(now, self.cluster, jobs, self.current, self.model, self.rng, self.rounds, free=self.free)
        plan = self.scheduler.schedule(view)
        if self.config.check:
            self.scheduler.check(plan, view)
        actions = diff(self.current, plan)
        # three passes: free everything that changes, then take the new
        # allocations, then compute speeds once every co-runner is in place
        for act in actions:
            job = self.by_id[act.job_id]
            job.advance(now)
            if act.old is not None:
                self._set_alloc(job, None)
        restart = self.config.restart_overhead
        for act in actions:
            job = self.by_id[act.job_id]
            k = act.kind
            if lifecycle and k is not ActionKind.REGROUP:
                self._lc_action(job, k)
            if k is ActionKind.STOP:
                job.status = JobStatus.WAITING
                job.speed = 0.0
                job.preemptions += 1
                continue
            if k is ActionKind.START:
                job.status = JobStatus.RUNNING
                if job.first_start is None:
                    job.first_start = now
                    if not lifecycle:
                        job.busy_until = now + self.config.launch_overhead
                elif not lifecycle:
                    job.busy_until = now + restart
                job.last_start = now
            elif k is ActionKind.MOVE:
                job.migrations += 1
                if not lifecycle:
                    job.busy_until = max(job.busy_until, now + restart)
            elif k is ActionKind.RESIZE:
                job.resizes += 1
                if not lifecycle:
                    job.busy_until = max(job.busy_until, now + restart)
            self._set_alloc(job, act.new)
        for act in actions:
            job = self.by_id[act.job_id]
            if act.new is not None:
                job.speed = self.model.speed(job, act.new)
            job.version += 1
            self._push_completion(job)
        for obs in self.observers:
            obs(self, "round")

    # -- main loop ----------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> RunResult:
        t0 = _time.perf_counter()
        cfg = self.config
        R = cfg.round_len
        jobs = self.jobs
        n = len(jobs)
        ptr = 0
        next_round = 0.0
        changed = True
        done = 0
        idle_rounds = 0
        total_to_finish = n - len(self.impossible)
        while done < total_to_finish:
            t_arr = jobs[ptr].spec.arrival if ptr < n else math.inf
            t_done = self._next_completion()
            if not self.active and t_arr > next_round:
                # nothing to schedule until the next arrival: jump to its round
                next_round = t_arr if cfg.reschedule_on_arrival else math.ceil(t_arr / R) * R
            t = min(t_arr, t_done, next_round)
            if t > cfg.max_time or t == math.inf:
                break
            if t < self.now:
                raise SimulationError(f"time ran backwards: {t} < {self.now}")
            self.now = t
            if t_done == t:
                _, _, jid, _ = heapq.heappop(self._heap)
                self._complete(self.by_id[jid])
                done += 1
                changed = True
                if progress is not None and done % 32 == 0:
                    progress(done, total_to_finish)
                if cfg.reschedule_on_completion:
                    self._round()
                self._record()
                continue
            if t_arr == t:
                job = jobs[ptr]
                ptr += 1
                if job.id in self.impossible:
                    continue
                self._arrive(job)
                changed = True
                if cfg.reschedule_on_arrival:
                    # batch every arrival at this instant into one round
                    while ptr < n and jobs[ptr].spec.arrival == t:
                        if jobs[ptr].id not in self.impossible:
                            self._arrive(jobs[ptr])
                        ptr += 1
                    self._round()
                self._record()
                continue
            # a periodic round
            next_round = t + R
            if changed or self.scheduler.dynamic:
                self._round()
                changed = False
            else:
                self.rounds += 1
            self._record()
            # stall guard: jobs wait, none will ever finish as things stand, none will arrive
            if ptr >= n and self.active and self._next_completion() == math.inf:
                idle_rounds += 1
                if idle_rounds >= STALL_ROUNDS:
                    self.stalled = sorted(self.active, key=lambda i: self.by_id[i].index)
                    break
            else:
                idle_rounds = 0
        for j in self.jobs:
            if j.status is JobStatus.RUNNING or j.status is JobStatus.WAITING:
                j.advance(self.now)
                if LIFECYCLE_KEY in j.extra:
                    self._lc_sync(j)
        if progress is not None:
            progress(done, total_to_finish)
        records = [
            JobRecord(
                j.id, j.spec.model, j.spec.gpus, j.spec.arrival, j.spec.duration, j.first_start, j.finish,
                j.preemptions, j.migrations, j.resizes, j.attained_time, j.overhead_time, j.queued_time,
                _phases(j, self.now),
            )
            for j in self.jobs
        ]
        return RunResult(
            config={
                **self.scheduler.names,
                "preemptive": self.scheduler.preemptive,
                **asdict(cfg),
                "cluster_nodes": self.cluster.num_nodes,
                "cluster_gpus": self.cluster.num_gpus,
            },
            jobs=records,
            series=self.series,
            cluster_gpus=self.cluster.num_gpus,
            cluster_cpus=self.cluster.total_cpus,
            cluster_mem_mb=self.cluster.total_mem_mb,
            end_time=self.now,
            wall_time=_time.perf_counter() - t0,
            rounds=self.rounds,
            rounds_computed=self.rounds_computed,
            impossible=dict(self.impossible),
            stalled=list(self.stalled),
        )


def _phases(job: Job, now: float) -> dict[str, float] | None:
    """Seconds per lifecycle phase: queued, launching (incl. checkpoint/stop), running."""
    lc = job.extra.get(LIFECYCLE_KEY)
    if lc is None:
        return None
    d = lc.durations(now)
    S = JobState
    return {
        "queued": d.get(S.WAITING_FOR_INITIAL_CONTACT, 0.0) + d.get(S.WAITING_FOR_INITIAL_RESOURCE, 0.0)
        + d.get(S.STANDBY, 0.0),
        "launching": d.get(S.LAUNCHING, 0.0) + d.get(S.CHECKPOINTING, 0.0) + d.get(S.STOPPING, 0.0),
        "running": d.get(S.RUNNING_PROTECTED, 0.0) + d.get(S.RUNNING, 0.0),
    }


def simulate(
    cluster: Cluster,
    specs: Sequence[JobSpec],
    order: str = "fifo",
    group: str = "none",
    size: str = "proportional",
    place: str = "packed-sticky",
    preemptive: bool = True,
    params: dict | None = None,
    model: ThroughputModel | None = None,
    hooks: Sequence[Callable] = (),
    **config: object,
) -> RunResult:
    """One call: build the scheduler from names and run (``config`` → :class:`SimConfig`)."""
    sched = Scheduler.from_names(order, group, size, place, preemptive, params)
    sched.hooks.extend(hooks)
    return Simulator(cluster, specs, sched, model, SimConfig(**config)).run()  # type: ignore[arg-type]
