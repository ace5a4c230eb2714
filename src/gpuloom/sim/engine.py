"""The event loop: arrivals, completions and scheduling rounds, nothing hidden.

The simulator is the driver's (:mod:`gpuloom.driver`) first face: this module
keeps the clock and the event queue, and :class:`SimBackend` says what the
driver's decisions mean in simulated time.  Everything about jobs and plans
(rounds, actions, co-runners, speeds, lifecycle steps) is the driver's.

Time advances from event to event.  At equal times completions come first,
then arrivals, then the round, so a GPU freed at ``t`` is reusable at ``t``.

* **Arrivals** join the queue; with ``reschedule_on_arrival`` a round runs at once.
* **Rounds** happen every ``round_len`` seconds (the first at time 0).  A
  periodic round is skipped when the stack proves it could change nothing: the
  last round computed planned no action, no job arrived or finished since, and
  the round comes before the stages' :meth:`~gpuloom.scheduler.Scheduler.next_change`
  (never, for a stack whose output does not change with time alone: FIFO; the
  next crossing of two jobs' keys for SRTF, SRSF, LAS, FTF; the next demotion
  for 2D-LAS; the next end of an active job's protection, overhead or
  lifecycle step under elastic sizing; at once after a round that drew random
  GPUs).  The results are those of computing every round
  (``SimConfig.skip_rounds=False`` does; ``RunResult.rounds_computed`` counts).
* **Completions** happen exactly when a job's remaining work reaches zero
  (its predicted finish), not at the next round; the job is checked to have
  done exactly its work.  Predictions are invalidated by bumping ``job.version``.

Jobs that no placement can ever hold (:func:`gpuloom.core.fit.never_fits`: GPUs,
cores, memory, GPU type), or that this stack can never run
(:meth:`~gpuloom.scheduler.Scheduler.never_runs`: no throughput on a static slot, more
GPUs than static slots on one node hold), are an error when the simulator is built,
or, with ``drop_impossible``, never become active and count as unfinished
(``RunResult.impossible``).  A **stall guard** stops the run when, for
``STALL_ROUNDS`` rounds in a row, jobs wait, no job can finish as things stand
and none is left to arrive; ``RunResult.stalled`` names the waiting jobs.

**The lifecycle always runs.**  Every job walks the lifecycle the service uses
(:mod:`gpuloom.core.lifecycle`), timed by :class:`~gpuloom.core.lifecycle.LifecycleTimes`:

* start: (→ STANDBY) → LAUNCHING for the launch time → RUNNING_PROTECTED, which
  lasts ``protect_factor`` × that launch time → RUNNING;
* move/resize of a running job: CHECKPOINTING → STOPPING → STANDBY → LAUNCHING
  → RUNNING_PROTECTED; a job still launching is stopped and launched again; a
  job already in the middle of a reallocation keeps its schedule;
* stop (preemption): CHECKPOINTING → STOPPING → STANDBY; a later start waits
  until the stop has finished;
* completion: → FINISHED.

A job makes progress only while RUNNING_PROTECTED or RUNNING: ``busy_until``
is its entry to RUNNING_PROTECTED.  Simplification: the plan's resources are
taken (and the old ones freed) at the decision time.

With ``SimConfig.starts_wait_for_stops`` a round's launches begin once all
of its stops are done (the service stops a round's jobs in parallel, then
launches), instead of at the decision.

``SimConfig.lifecycle`` gives the times; without it the classic overhead model
is the preset :meth:`LifecycleTimes.overheads <gpuloom.core.lifecycle.LifecycleTimes.overheads>`
(a first start costs ``launch_overhead``, every resume, migration or resize
``restart_overhead``, stops are instant, no protection).  Per job,
``attrs["launch_time"|"checkpoint_time"|"stop_time"]`` override the times.
Deterministic for a given seed.
"""

from __future__ import annotations

import heapq
import math
import operator
import time as _time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..core.cluster import Cluster
from ..core.fit import impossible_jobs, impossible_message
from ..core.gcpause import cycle_collection_paused
from ..core.job import Job, JobError, JobSpec
from ..core.lifecycle import JobState, LifecycleTimes, phase_times_of
from ..core.plan import ActionKind, Allocation
from ..driver import Driver, Step
from ..perf.assembly import build_model
from ..perf.model import ThroughputModel
from ..perf.startup import event_overhead
from ..policies.base import STAGE_DEFAULTS, FreeState
from ..scheduler import RequirementError, Scheduler
from .metrics import JobRecord, RunResult, TimeSeries

__all__ = ["LifecycleTimes", "SimConfig", "SimulationError", "Simulator", "simulate"]


_STOP, _STANDBY = ActionKind.STOP, JobState.STANDBY  # (read once per action: plain globals, not Enum attributes)


class SimulationError(RuntimeError):
    pass


#: Stall guard: stop after this many rounds in which jobs wait, no job can finish and none will arrive.
STALL_ROUNDS = 3
#: the completion heap is cleared of stale entries once longer than this and twice its live entries
_HEAP_MIN = 256


@dataclass(slots=True)
class SimConfig:
    round_len: float = 300.0
    reschedule_on_arrival: bool = False
    reschedule_on_completion: bool = False
    launch_overhead: float = 0.0
    restart_overhead: float = 10.0
    seed: int = 0
    check: bool = True  # verify plan invariants every round (incrementally; the whole plan now and then)
    max_time: float = math.inf  # stop here; jobs not done are unfinished
    drop_impossible: bool = False  # jobs that can never fit: error (False) or unfinished (True)
    lifecycle: LifecycleTimes | None = None  # lifecycle times; None: the overhead preset
    skip_rounds: bool = True  # skip periodic rounds that provably change nothing (False: compute all)
    starts_wait_for_stops: bool = False  # a round's launches begin when its stops are done (as the service does)
    #: Muri's accounting: a job running from one computed round to the next loses its start-up time's
    #: progress ("muri": gpuloom.perf.startup's table; seconds: every job alike; "none"); no round is skipped
    event_overhead: str | float = "none"

    def __post_init__(self) -> None:
        if not self.round_len > 0:
            raise ValueError(f"round length must be > 0, got {self.round_len}")
        if self.launch_overhead < 0 or self.restart_overhead < 0:
            raise ValueError("overheads must be >= 0")
        event_overhead(self.event_overhead)  # (a bad value is an error here, naming the option)

    @property
    def times(self) -> LifecycleTimes:
        """The lifecycle times in force (the overhead preset unless ``lifecycle`` is given)."""
        if self.lifecycle is not None:
            return self.lifecycle
        return LifecycleTimes.overheads(self.launch_overhead, self.restart_overhead)


class SimBackend:
    """The driver's backend in simulated time: times lifecycle steps, keeps completion events."""

    def __init__(self, times: LifecycleTimes, starts_wait_for_stops: bool = False) -> None:
        self.times = times
        self.heap: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.wait_for_stops = starts_wait_for_stops
        self.stops_done: tuple[float, float] = (-math.inf, -math.inf)  # (round time, when its stops are done)
        # a job without attrs has the common times (what times.of gives it, computed once), by `first`
        self._plain = (times.of("", None, False), times.of("", None, True))

    def _times(self, job: Job, first: bool) -> tuple[float, float, float]:
        attrs = job.spec.attrs
        # (attrs that name none of the three times give the common ones, as times.of would: Muri's
        # traces give every job attrs, its stage times, and this runs at every stop and launch)
        if not attrs or ("launch_time" not in attrs and "checkpoint_time" not in attrs
                         and "stop_time" not in attrs):
            return self._plain[first]
        try:
            return self.times.of(job.id, attrs, first)
        except ValueError as e:
            raise JobError(str(e)) from None

    def stop(self, driver: Driver, steps: Sequence[Step], now: float) -> None:
        # (once per stopped job: the action kind and state compared with module constants, the
        # latest STANDBY found without building lists)
        done = now
        schedule = self.times.schedule
        for st in steps:
            job = st.job
            lc = job.lifecycle
            assert lc is not None  # a job being stopped has arrived
            schedule(lc, st.stop, (), now, self._times(job, False))
            if st.action.kind is _STOP:
                job.busy_until = now
            for t, s in lc.planned:  # done = the latest of done and every planned STANDBY
                if s is _STANDBY and t > done:
                    done = t
        self.stops_done = (now, done)

    def launch(self, driver: Driver, step: Step, now: float) -> bool:
        job = step.job
        lc = job.lifecycle
        assert lc is not None
        # the first launch costs `launch`; every later one `relaunch` (taken before the steps run)
        barrier = None
        if self.wait_for_stops:
            done = self.stops_done
            if done[0] == now:
                barrier = done[1]
        job.busy_until = self.times.schedule(lc, None, step.start, now, self._times(job, not lc.launched), barrier)
        return True

    def regrouped(self, driver: Driver, job: Job, now: float) -> None:
        pass

    def progressed(self, driver: Driver, job: Job, now: float) -> None:
        # (Job.predicted_finish, written out: called for every action; a job that holds nothing or
        # makes no progress has no completion to schedule)
        sp = job.speed
        if job.alloc is None or not sp > 0:
            return
        b = job.busy_until
        t = (b if b > now else now) + job.remaining / sp
        if math.isfinite(t):
            self.seq += 1
            heapq.heappush(self.heap, (t, self.seq, job.id, job.version))


class Simulator:
    """Replays ``specs`` on ``cluster`` under ``scheduler``; :meth:`run` returns a :class:`RunResult`.

    ``model`` None: the model ``gpuloom simulate`` builds with default options,
    plus any factor a stage requires; a given model must already have them
    (:class:`SimulationError` otherwise).

    ``observers`` are called ``obs(sim, "round" | "complete")`` after each round and
    completion; the driver keeps every waiting job's pending reason for them unless each says
    ``reads_reasons = False``, and one with an ``attach(sim)`` method is attached when the
    simulator is built (to follow the driver's changes: :class:`~gpuloom.driver.Listener`).
    """

    def __init__(
        self,
        cluster: Cluster,
        specs: Sequence[JobSpec],
        scheduler: Scheduler,
        model: ThroughputModel | None = None,
        config: SimConfig | None = None,
        observers: Sequence[Callable[[Simulator, str], None]] = (),
        impossible: Mapping[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        strict = model is not None
        self.model = model if model is not None else build_model(cluster)
        self.config = config or SimConfig()
        self.observers = list(observers)
        # by arrival, ties in input order (a stable sort; none at all where they come in order, as from a trace)
        arrivals = list(map(operator.attrgetter("arrival"), specs))
        if all(map(operator.le, arrivals, arrivals[1:])):
            self.jobs: list[Job] = list(map(Job, specs, range(len(specs))))
        else:
            self.jobs = [Job(specs[i], k) for k, i in enumerate(sorted(range(len(specs)), key=arrivals.__getitem__))]
        self.by_id = dict(zip(map(operator.attrgetter("id"), self.jobs), self.jobs, strict=True))
        if len(self.by_id) != len(specs):  # (an id twice: the first repeated, in input order)
            ids = set()
            for s in specs:
                if s.id in ids:
                    raise JobError(f"duplicate job id {s.id!r}")
                ids.add(s.id)
        # jobs no placement can ever hold (GPUs, cores, memory, GPU type): an error, or never active
        # (given by a caller that has already asked impossible_jobs of these specs and this cluster)
        self.impossible: dict[str, str] = dict(impossible) if impossible is not None else impossible_jobs(specs, cluster)
        if self.impossible and not self.config.drop_impossible:
            raise JobError(impossible_message(self.impossible))
        self.stalled: list[str] = []  # jobs left waiting when the stall guard stopped the run
        self.completed: list[Job] = []  # in the order they completed (a completed job no longer changes)
        self.now = 0.0
        self.rng = np.random.default_rng(self.config.seed)
        times = self.config.times
        self.backend = SimBackend(times, self.config.starts_wait_for_stops)
        try:
            # pending reasons (job.reason) cost a pass over the waiting jobs: kept only for observers,
            # which may read them (tests), unless they say they do not (``reads_reasons = False``)
            reasons = any(getattr(obs, "reads_reasons", True) for obs in self.observers)
            self.driver = Driver(cluster, scheduler, self.model, self.backend, self.rng, self.config.check,
                                 times.protect_factor, strict=strict, reasons=reasons)
        except RequirementError as e:
            raise SimulationError(str(e)) from None
        if scheduler.checks_jobs:  # jobs this stack can never run: refused as those no placement can hold
            refused = {}
            for j in self.jobs:
                if j.id not in self.impossible:
                    why = scheduler.never_runs(j, self.model)
                    if why is not None:
                        refused[j.id] = why
            if refused and not self.config.drop_impossible:
                raise JobError(impossible_message(refused))
            self.impossible.update(refused)
        for obs in self.observers:  # an observer that follows the driver's changes (a queue report)
            attach = getattr(obs, "attach", None)
            if attach is not None:
                attach(self)
        self.series = TimeSeries()
        self.rounds = 0
        self.rounds_computed = 0
        self._event_charge = event_overhead(self.config.event_overhead)
        self._charges: dict[str, tuple[float, float]] = {}  # job -> (charge s, speed) at the last round
        self._last_round = 0.0
        self._heap_limit = _HEAP_MIN  # backend.heap's length past which its stale entries are dropped

    # -- what observers and tests read ----------------------------------------------------
    @property
    def current(self) -> dict[str, Allocation]:
        return self.driver.current

    @property
    def active(self) -> dict[str, Job]:
        return self.driver.jobs

    @property
    def free(self) -> FreeState:
        return self.driver.free

    @property
    def used(self) -> list[int]:
        return self.driver.used

    def _record(self) -> None:
        """The time series' point for now: the driver's used resources and job counts (read from the
        driver each time: it replaces its jobs and current dicts now and then)."""
        d = self.driver
        u, n = d.used, len(d.current)
        self.series.record(self.now, u[0], u[1], u[2], n, len(d.jobs) - n)

    def _next_completion(self) -> float:
        h = self.backend.heap
        by_id = self.by_id
        if len(h) > self._heap_limit:
            # entries of an older version of their job (moved, regrouped, stopped or ended since) are
            # never valid again: dropped together, not popped one by one from a heap they make 100x
            # longer than the running jobs (Muri-L on trace1: 6,000 entries on average, for 35 running
            # jobs).  The entries differ by their sequence number, so the valid ones come out in the same
            # order whatever the heap's layout.
            h[:] = [e for e in h if by_id[e[2]].version == e[3]]
            heapq.heapify(h)
            self._heap_limit = max(_HEAP_MIN, 2 * len(h))
        while h:
            t, _, jid, ver = h[0]
            j = by_id[jid]
            if j.version == ver and j.alloc is not None:
                return t
            heapq.heappop(h)
        return math.inf

    # -- events -------------------------------------------------------------
    def _complete(self, job: Job) -> None:
        now = self.now
        job.advance(now)
        d = job.spec.duration
        tol = 1e-6 * (d if d > 1.0 else 1.0)  # max(1.0, d), written out (see _run)
        if job.remaining > tol:
            raise SimulationError(f"job {job.id} completed with {job.remaining} work left")
        job.remaining = 0.0
        self.driver.finish(job, now)
        self.completed.append(job)
        if self.observers:
            for obs in self.observers:
                obs(self, "complete")

    def _arrive(self, job: Job) -> None:
        self.driver.admit(job, self.now)

    def _round(self) -> float:
        """Compute a round; returns until when periodic rounds may be skipped (see the module notes)."""
        self.rounds += 1
        self.rounds_computed += 1
        charging = self._event_charge is not None
        if charging:
            self._charge_event()
        actions = self.driver.round(self.now)
        if charging:
            self._note_charges()
        for obs in self.observers:
            obs(self, "round")
        if actions or not self.config.skip_rounds or charging:
            return -math.inf
        return self.driver.settled_until(self.now)

    def _charge_event(self) -> None:
        """Muri's per-event overhead (``SimConfig.event_overhead``), charged as Muri's simulator
        does: every job that has run since the last round loses the progress of the first
        ``min(charge, time since)`` seconds of it, its charge being the sum of its group's start-up
        times when that round planned it (its own when alone), at the speed it had then.  So a
        job pays for every round it runs through, and nothing for the stretch that ends in its
        completion."""
        now, jobs, driver = self.now, self.driver.jobs, self.driver
        since = self._last_round
        for jid, (oh, speed) in self._charges.items():
            job = jobs.get(jid)
            if job is None or job.alloc is None or speed <= 0:
                continue
            d = job.spec.duration
            if job.remaining_at(now) <= 1e-6 * (d if d > 1.0 else 1.0):
                continue  # it completes at this instant too (Muri ends such jobs before charging)
            lost = (oh if oh < now - since else now - since) * speed
            if lost > 0:
                driver.set_back(job, lost, now)

    def _note_charges(self) -> None:
        """Each running job's charge at the next round (see :meth:`_charge_event`)."""
        charge = self._event_charge
        assert charge is not None
        by_id = self.by_id
        out: dict[str, tuple[float, float]] = {}
        for jid, a in self.driver.current.items():
            job = by_id[jid]
            g = job.spec.gpus
            out[jid] = (charge(job.spec, g) + sum(charge(by_id[o].spec, g) for o in a.group), job.speed)
        self._charges = out
        self._last_round = self.now

    # -- main loop ----------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> RunResult:
        # the cyclic garbage collector paused: it would only rescan every live job again and again (a
        # quarter of the time), and turned on as it was after, with the run's objects in its oldest generation
        with cycle_collection_paused():
            return self._run(progress)

    def _run(self, progress: Callable[[int, int], None] | None) -> RunResult:
        t0 = _time.perf_counter()
        cfg = self.config
        R = cfg.round_len
        jobs = self.jobs
        n = len(jobs)
        ptr = 0
        next_round = 0.0
        settled = -math.inf  # periodic rounds before this time can change nothing
        done = 0
        idle_rounds = 0
        total_to_finish = n - len(self.impossible)
        impossible = self.impossible
        driver = self.driver
        heap = self.backend.heap
        by_id = self.by_id
        complete, arrive, record, next_completion = self._complete, self._arrive, self._record, self._next_completion
        heappop = heapq.heappop
        inf = math.inf
        t_arr = jobs[0].spec.arrival if n else inf  # the next arrival (kept as ptr moves)
        while done < total_to_finish:
            t_done = next_completion()
            if not driver.jobs and t_arr > next_round:
                # nothing to schedule until the next arrival: jump to its round
                next_round = t_arr if cfg.reschedule_on_arrival else math.ceil(t_arr / R) * R
            # min(t_arr, t_done, next_round), written out (the same comparisons, in the same order):
            # builtin min and max parse their arguments as keywords in Python 3.11, about 1,000
            # instructions a call, and this loop runs once per event
            t = t_arr
            if t_done < t:
                t = t_done
            if next_round < t:
                t = next_round
            if t > cfg.max_time or t == inf:
                break
            if t < self.now:
                raise SimulationError(f"time ran backwards: {t} < {self.now}")
            self.now = t
            if t_done == t:
                complete(by_id[heappop(heap)[2]])
                done += 1
                settled = -inf
                if progress is not None and done % 32 == 0:
                    progress(done, total_to_finish)
                if cfg.reschedule_on_completion:
                    settled = self._round()
                record()
                continue
            if t_arr == t:
                job = jobs[ptr]
                ptr += 1
                t_arr = jobs[ptr].spec.arrival if ptr < n else inf
                if job.id in impossible:
                    continue
                arrive(job)
                settled = -inf
                if cfg.reschedule_on_arrival:
                    # batch every arrival at this instant into one round
                    while ptr < n and jobs[ptr].spec.arrival == t:
                        if jobs[ptr].id not in impossible:
                            arrive(jobs[ptr])
                        ptr += 1
                    t_arr = jobs[ptr].spec.arrival if ptr < n else inf
                    settled = self._round()
                record()
                continue
            # a periodic round
            next_round = t + R
            if t >= settled:
                settled = self._round()
            else:
                self.rounds += 1
            record()
            # stall guard: jobs wait, none will ever finish as things stand, none will arrive
            if ptr >= n and self.active and self._next_completion() == math.inf and not _reserved_after(
                    self.scheduler, t):
                idle_rounds += 1
                if idle_rounds >= STALL_ROUNDS:
                    self.stalled = sorted(self.active, key=lambda i: self.by_id[i].index)
                    break
            else:
                idle_rounds = 0
        if cfg.check:
            self.driver.check_state()  # the incremental state, once more at the end
        for j in self.jobs:
            if j.lifecycle is not None and j.finish is None:
                j.advance(self.now)
                j.lifecycle.sync(self.now)
        if progress is not None:
            progress(done, total_to_finish)
        phases = phase_times_of([j.lifecycle for j in self.jobs], self.now)
        records = [
            JobRecord(
                j.id, j.spec.model, j.spec.gpus, j.spec.arrival, j.spec.duration, j.first_start, j.finish,
                j.preemptions, j.migrations, j.resizes, j.attained_time, j.overhead_time, j.queued_time, ph,
            )
            for j, ph in zip(self.jobs, phases, strict=True)
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


def _reserved_after(sched: Scheduler, t: float) -> bool:
    """An advance reservation is not over at ``t`` (jobs it keeps waiting are not stalled)."""
    bf = sched.backfill
    return bf is not None and any(r.end > t for r in bf.reservations)


def simulate(
    cluster: Cluster,
    specs: Sequence[JobSpec],
    order: str = STAGE_DEFAULTS["order"],
    group: str = STAGE_DEFAULTS["group"],
    size: str = STAGE_DEFAULTS["size"],
    place: str = STAGE_DEFAULTS["place"],
    preemptive: bool = True,
    params: dict | None = None,
    model: ThroughputModel | None = None,
    hooks: Sequence[Callable] = (),
    queue: str = "none",
    **config: object,
) -> RunResult:
    """One call: build the scheduler from names and run (``config`` → :class:`SimConfig`)."""
    sched = Scheduler.from_names(order, group, size, place, preemptive, params, queue)
    sched.hooks.extend(hooks)
    # ``config`` is SimConfig's fields by name: typing it would take a TypedDict copy of SimConfig
    return Simulator(cluster, specs, sched, model, SimConfig(**config)).run()  # type: ignore[arg-type]
