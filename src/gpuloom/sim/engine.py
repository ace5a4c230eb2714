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

Overheads: a job's first start costs ``launch_overhead`` seconds without
progress; a resume after preemption, a migration, or a resize costs
``restart_overhead`` (checkpoint restore + warm-up).  Deterministic for a given seed.
"""

from __future__ import annotations

import heapq
import math
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job, JobError, JobSpec, JobStatus
from ..core.plan import ActionKind, Allocation, PlanError, check_plan, diff
from ..perf.model import ThroughputModel
from ..policies.base import View
from ..scheduler import Scheduler
from .metrics import JobRecord, RunResult, TimeSeries


class SimulationError(RuntimeError):
    pass


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
        self.model = model or ThroughputModel.default(cluster)
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
        self.impossible: set[str] = set()
        biggest = cluster.num_gpus
        for j in self.jobs:
            if j.spec.gpus > biggest:
                if not self.config.drop_impossible:
                    raise JobError(
                        f"job {j.id}: needs {j.spec.gpus} GPUs, the cluster has {biggest} "
                        "(use drop_impossible to count such jobs as unfinished)"
                    )
                self.impossible.add(j.id)
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
        self._gpu_ref = [0] * cluster.num_gpus  # jobs holding each GPU

    # -- bookkeeping --------------------------------------------------------
    def _record(self) -> None:
        self.series.record(
            self.now, self._used[0], self._used[1], self._used[2], len(self.current),
            len(self.active) - len(self.current),
        )

    def _hold(self, alloc: Allocation, sign: int) -> None:
        # a GPU shared by a group counts once: per-GPU holder counts, busy = count > 0
        # (exact however the members' allocations change, one by one, within a round)
        ref = self._gpu_ref
        for g in alloc.gpu_ids:
            before = ref[g]
            ref[g] = before + sign
            if before == 0 and sign > 0:
                self._used[0] += 1
            elif before == 1 and sign < 0:
                self._used[0] -= 1
        self._used[1] += sign * alloc.cpus
        self._used[2] += sign * alloc.mem_mb

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

    def _round(self) -> None:
        self.rounds += 1
        self.rounds_computed += 1
        now = self.now
        for jid in self.current:
            self.by_id[jid].advance(now)
        jobs = [j for j in self.active.values() if j.spec.gpus <= self.cluster.num_gpus]
        view = View(now, self.cluster, jobs, self.current, self.model, self.rng, self.rounds)
        plan = self.scheduler.schedule(view)
        if self.config.check:
            self._check(plan)
        for act in diff(self.current, plan):
            job = self.by_id[act.job_id]
            job.advance(now)
            k = act.kind
            if k is ActionKind.STOP:
                self._set_alloc(job, None)
                job.status = JobStatus.WAITING
                job.speed = 0.0
                job.preemptions += 1
            else:
                if k is ActionKind.START:
                    job.status = JobStatus.RUNNING
                    if job.first_start is None:
                        job.first_start = now
                        job.busy_until = now + self.config.launch_overhead
                    else:
                        job.busy_until = now + self.config.restart_overhead
                    job.last_start = now
                elif k is ActionKind.MOVE:
                    job.migrations += 1
                    job.busy_until = max(job.busy_until, now + self.config.restart_overhead)
                elif k is ActionKind.RESIZE:
                    job.resizes += 1
                    job.busy_until = max(job.busy_until, now + self.config.restart_overhead)
                self._set_alloc(job, act.new)
                job.speed = self.model.speed(job, act.new)  # type: ignore[arg-type]
            job.version += 1
            self._push_completion(job)
        for obs in self.observers:
            obs(self, "round")

    def _check(self, plan) -> None:  # noqa: ANN001
        check_plan(plan, self.cluster)
        for req in self.scheduler.last_requests:
            for j in req.jobs:
                a = plan.allocations.get(j.id)
                if a is not None and a.num_gpus != req.gpus:
                    raise PlanError(f"job {j.id}: gang broken, holds {a.num_gpus} of {req.gpus} GPUs")
        for jid in plan.allocations:
            if jid not in self.active:
                raise PlanError(f"job {jid} planned but not active")

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
                if progress is not None and done % 256 == 0:
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
                # stall guard: active jobs, nothing runs, nothing will arrive
                if not self.current and ptr >= n and self.active:
                    idle_rounds += 1
                    if idle_rounds > 2:
                        break
                else:
                    idle_rounds = 0
            else:
                self.rounds += 1
            self._record()
        for j in self.jobs:
            if j.status is JobStatus.RUNNING or j.status is JobStatus.WAITING:
                j.advance(self.now)
        if progress is not None:
            progress(done, total_to_finish)
        records = [
            JobRecord(
                j.id, j.spec.model, j.spec.gpus, j.spec.arrival, j.spec.duration, j.first_start, j.finish,
                j.preemptions, j.migrations, j.resizes, j.attained_time, j.overhead_time, j.queued_time,
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
        )


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
    **config: object,
) -> RunResult:
    """One call: build the scheduler from names and run (``config`` → :class:`SimConfig`)."""
    sched = Scheduler.from_names(order, group, size, place, preemptive, params)
    return Simulator(cluster, specs, sched, model, SimConfig(**config)).run()  # type: ignore[arg-type]
