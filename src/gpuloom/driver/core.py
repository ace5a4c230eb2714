"""The driver: one owner of jobs and the current plan, for the simulator and the service.

Both faces hand their jobs to a :class:`Driver` and call it at the same
moments; a :class:`Backend` says what the decisions mean for that face.

* :meth:`Driver.admit` — a job arrives (simulator) or is picked up from the
  store (service): it joins the active jobs, with its lifecycle.
* :meth:`Driver.round` — :meth:`plan` (a :class:`~gpuloom.policies.base.View`
  → the scheduler's :class:`~gpuloom.scheduler.Round`, checked) then
  :meth:`apply` (``diff(current, plan)``).
* :meth:`Driver.finish` — a job ends (its work done, a crash, a cancel); its
  co-runners lose a partner: same GPUs, a smaller group, a new speed.

Applying a round's actions, in three passes:

1. every job whose allocation changes is advanced to ``now`` and releases its
   old allocation (so a round's stops free what its starts take), except that
   a job regrouped on the same parts keeps holding them (:meth:`Driver._keep`);
2. the stop half of every stop, move and resize goes to :meth:`Backend.stop`
   together, with the lifecycle steps it walks (:func:`~gpuloom.core.lifecycle.stop_steps`);
   the driver then counts preemptions, migrations and resizes and takes the
   new allocations;
3. once every co-runner is in place, each job's speed comes from
   :meth:`Driver.speed` (the one place that asks the throughput model for
   either face), then :meth:`Backend.launch` carries out the start half
   (:func:`~gpuloom.core.lifecycle.start_steps`) or :meth:`Backend.regrouped`
   records a new group.  A launch the backend does not carry out (it returns
   False: the service profiled the job first) is rolled back; one that fails
   (:class:`LaunchFailed`), or whose speed the model cannot give, fails that
   job alone (never launched).

What differs between the faces is only in the backend: the simulator's times
the lifecycle steps (:class:`~gpuloom.core.lifecycle.LifecycleTimes`) and
schedules completion events; the service's stops and launches processes and
records everything in its store.  The driver never reads a clock: ``now``
comes from the caller.

The driver keeps what ``current`` leaves free (:class:`FreeState`, updated
per change) and passes it to the policies in the view, so a round costs
O(changes) in both faces, and the GPUs, cores and memory held (``used``).

**Checks.**  With ``check`` on, every round's plan is verified before it is
applied, in O(actions): :meth:`Scheduler.check_changes
<gpuloom.scheduler.Scheduler.check_changes>` checks each changed allocation
against what the unchanged ones hold (the free state and ``holders``, the jobs
on each GPU), which is sound because ``current`` passed the same checks.
Every ``full_check_every`` rounds (more rarely with many jobs running, so the
whole check costs no more per round than the incremental one) the whole plan
is checked (:meth:`Scheduler.check <gpuloom.scheduler.Scheduler.check>`) and
:meth:`Driver.check_state` recomputes the incremental state from ``current``.

**Compact dicts.**  ``jobs`` and ``current`` lose entries all the time, mostly at their
oldest end (the first jobs admitted are the first to end), and every round iterates
``jobs`` from its start (the ordered queue, :class:`~gpuloom.core.job.ActiveJobs`) and
copies ``current`` (:meth:`Plan.extending <gpuloom.core.plan.Plan.extending>`).  CPython
leaves a hole where an entry is deleted until an insertion outgrows the table: iteration
walks the holes, and ``dict.copy`` of a dict more than a third holes re-inserts its entries
one by one instead of cloning the table.  So at the start of a round, once either dict has
lost more entries since it was last rebuilt than half of what it holds, the driver replaces it
with a compact copy (same entries, same order; ``dict(d)`` re-inserts into a table sized for
them): O(n) once per n/2 deletions (docs/performance.md).  The dicts are replaced, not rebuilt in place, because the service's
API threads copy them without the loop's lock (``dict(driver.current)``, one C call: atomic
under the GIL) and must never see one half rebuilt; so nothing may keep ``driver.jobs`` or
``driver.current`` across rounds (the model's factors are bound to the new ``jobs`` again).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import lt
from typing import Protocol

import numpy as np

from ..core.cluster import Cluster
from ..core.job import ActiveJobs, Job
from ..core.lifecycle import JobState, start_steps, stop_steps
from ..core.plan import Action, ActionKind, Allocation, PlanError, check_plan, diff
from ..perf.model import ThroughputModel
from ..policies.base import FreeState, View
from ..policies.incremental import Tally
from ..scheduler import Round, Scheduler

S = JobState
# the action kinds and states read once per action or per job, as plain globals (an Enum's class
# attribute is read through EnumType.__getattr__, about 4x a plain one)
_START, _STOP, _MOVE, _RESIZE, _REGROUP = (ActionKind.START, ActionKind.STOP, ActionKind.MOVE, ActionKind.RESIZE,
                                           ActionKind.REGROUP)
_STANDBY, _LAUNCHING, _PROTECTED, _FINISHED = S.STANDBY, S.LAUNCHING, S.RUNNING_PROTECTED, S.FINISHED


class DriverError(RuntimeError):
    """A driver invariant broken (a bug, not bad input)."""


class LaunchFailed(RuntimeError):
    """Raised by :meth:`Backend.launch`: this job cannot be launched; it fails alone, with this reason."""


@dataclass(slots=True)
class Step:
    """One action for one job, with the lifecycle steps it walks.

    ``stop`` is None for an action without a stop half (a start); ``start`` is
    empty for a stop.
    """

    job: Job
    action: Action
    stop: tuple[JobState, ...] | None
    start: tuple[JobState, ...]

    @property
    def kind(self) -> ActionKind:
        return self.action.kind


class Listener(Protocol):
    """Told of every change to the active jobs and what they hold, as it happens (a report that keeps
    per-queue totals up to date in O(changes) instead of reading every job after each event)."""

    def on_admit(self, job: Job) -> None:
        """``job`` became active."""

    def on_hold(self, job: Job, old: Allocation | None, new: Allocation | None) -> None:
        """``job``'s allocation changed from ``old`` to ``new`` (None: nothing)."""

    def on_end(self, job: Job) -> None:
        """``job`` is no longer active (after :meth:`on_hold` let go of what it held)."""


class Backend(Protocol):
    """What a face does with the driver's decisions (see the module notes)."""

    def stop(self, driver: Driver, steps: Sequence[Step], now: float) -> None:
        """Carry out the stop halves of a round, together; on return each job's lifecycle has
        walked (or planned) its ``stop`` steps."""

    def launch(self, driver: Driver, step: Step, now: float) -> bool:
        """Carry out a start, or the start half of a move/resize, on ``step.action.new`` (the job's
        speed is already set).  False: not launched this round (rolled back); raise
        :class:`LaunchFailed` to fail the job."""

    def regrouped(self, driver: Driver, job: Job, now: float) -> None:
        """``job`` keeps its resources with other co-runners (new ``alloc`` and speed)."""

    def progressed(self, driver: Driver, job: Job, now: float) -> None:
        """``job``'s speed, ``busy_until`` or allocation changed (its predicted finish moved)."""


def lifecycle_steps(job: Job, kind: ActionKind, now: float) -> tuple[tuple[JobState, ...] | None,
                                                                     tuple[JobState, ...]]:
    """(stop steps or None, start steps) that ``kind`` walks from the job's state at ``now``.

    A start waits where a stop still in progress will leave the job (STANDBY).
    """
    lc = job.lifecycle
    if lc is None:
        raise DriverError(f"job {job.id}: an action before it arrived")
    state = lc.sync(now)  # what is due happened first (e.g. protection that expired)
    if kind is _START:
        end = lc.planned[-1][1] if lc.planned else state
        return None, start_steps(job.id, _STANDBY if end is _STANDBY else state)
    stop = stop_steps(job.id, state)
    return stop, (() if kind is _STOP else start_steps(job.id, _STANDBY))


class Driver:
    """Owns the active jobs and the current allocations; applies rounds and completions."""

    def __init__(
        self,
        cluster: Cluster,
        scheduler: Scheduler,
        model: ThroughputModel,
        backend: Backend,
        rng: np.random.Generator | None = None,
        check: bool = True,
        protect_factor: float = 3.0,
        strict: bool = False,
        full_check_every: int = 100,
        reasons: bool = True,
    ) -> None:
        scheduler.bind(model, strict)
        self.cluster = cluster
        self.scheduler = scheduler
        self.model = model
        self.backend = backend
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.check = check
        self.full_check_every = full_check_every
        self.reasons = reasons  # keep each waiting job's pending reason (job.reason) up to date
        self._since_full = 0
        self.protect_factor = protect_factor
        self.jobs: dict[str, Job] = {}  # active: arrived, not ended; in arrival order
        self.current: dict[str, Allocation] = {}
        self.free = FreeState(cluster)
        self.used = [0, 0, 0]  # GPUs (a group's once), cores, MB held
        self.holders: dict[int, set[str]] = {}  # GPU -> the jobs holding it
        self.tally = Tally()  # active jobs counted for the scheduler's shortcuts (policies/incremental.py)
        self.rounds = 0
        self._pending: set[str] = set()  # jobs whose lifecycle has planned transitions
        # what a round may skip (View.appended): changes other than admissions are counted, and
        # the count noted after a round that filled the cluster (Round.full) and planned no action
        # or whose actions were carried out exactly (apply: its state is then the plan's)
        self._stamp = 0
        self._quiet_at: int | None = None
        self._planned: tuple[list[Action], int] | None = None  # a full round's actions, and the count then
        self._admitted: list[Job] = []
        self._lent: weakref.ref[ActiveJobs] | None = None  # the jobs of the last view (see view)
        self._deleted = [0, 0]  # entries deleted from jobs and from current since each was compacted
        #: the jobs whose pending reason (``job.reason``) the last round set: every active job, or only
        #: those admitted since a round whose reasons still hold (``Round.reasons_of``)
        self.reasoned: Collection[Job] = ()
        self.listeners: list[Listener] = []  # told of admissions, allocation changes and ends
        # a queue stage's jobs per queue (policies/queue_book.py), and its round check's own sums
        for listener in (scheduler.queue.listener(self.tally), scheduler.queue.check_listener(self.tally)):
            if listener is not None:
                self.listeners.append(listener)
        model.bind(self.jobs)  # factors that look up co-runners (interleaving)

    # -- jobs -------------------------------------------------------------------------------
    def admit(self, job: Job, now: float, state: JobState = S.WAITING_FOR_INITIAL_RESOURCE) -> Job:
        """A job becomes active at ``now`` (lifecycle started in ``state`` unless it has one)."""
        jid = job.id
        jobs = self.jobs
        if jid in jobs:
            raise DriverError(f"job {jid} admitted twice")
        self._jobs_change()
        if job.lifecycle is None:
            job.arrive(now, self.protect_factor, state)
        jobs[jid] = job
        tally = self.tally
        tally.admitted(job)
        self._admitted.append(job)
        if jid not in self.current:
            tally.count_waiting(job, 1)
        else:
            self._stamp += 1
        for listener in self.listeners:
            listener.on_admit(job)
        return job

    def speed(self, job: Job, alloc: Allocation) -> float:
        """The job's speed on ``alloc``: the throughput model's answer, the same for both faces."""
        return self.model.speed(job, alloc)

    def sync(self, now: float) -> None:
        """Record the lifecycle transitions due by ``now`` of every job that has some planned."""
        done = []
        for jid in self._pending:
            job = self.jobs.get(jid)
            if job is None or job.lifecycle is None:
                done.append(jid)
                continue
            job.lifecycle.sync(now)
            if not job.lifecycle.planned:
                done.append(jid)
        self._pending.difference_update(done)

    def watch(self, job: Job) -> None:
        """Note that ``job``'s lifecycle has planned transitions (:meth:`sync` records them)."""
        lc = job.lifecycle
        if lc is not None and lc.planned:
            self._pending.add(job.id)

    # -- holding -----------------------------------------------------------------------------
    def hold(self, job: Job, alloc: Allocation | None, counted: bool = True) -> None:
        """Set ``job``'s allocation (None: it holds nothing), keeping ``current``, ``free`` and ``used``.

        ``counted`` False: the tally is left as it is (:meth:`apply` lets go of a job's old allocation
        and takes its new one in two calls, whose counts as a waiting job cancel out)."""
        # (both halves written out here, not in a helper called with a sign: Muri-L's plans make
        # about 200,000 of these calls on trace4)
        self._stamp += 1
        jid = job.id
        current = self.current
        used = self.used
        holders = self.holders
        old = current.pop(jid, None)
        if old is not None:
            self._deleted[1] += 1
            # a group's GPUs count once: only the first member in / the last member out moves them
            gpus = True
            for o in old.group:
                if o in current:
                    gpus = False
                    break
            if gpus:
                used[0] -= old.num_gpus
            used[1] -= old.cpus
            used[2] -= old.mem_mb
            if not old.key:
                self.tally.unkeyed -= 1
            parts = old.parts
            self.free.release(parts, 1, gpus)
            for p in parts:
                for g in p.gpus:
                    h = holders[g]
                    h.discard(jid)
                    if not h:
                        del holders[g]
        job.alloc = alloc
        if alloc is not None:
            gpus = True
            for o in alloc.group:
                if o in current:
                    gpus = False
                    break
            if gpus:
                used[0] += alloc.num_gpus
            used[1] += alloc.cpus
            used[2] += alloc.mem_mb
            if not alloc.key:
                self.tally.unkeyed += 1
            parts = alloc.parts
            self.free.take(parts, 1, gpus)
            for p in parts:
                for g in p.gpus:
                    had = holders.get(g)
                    if had is None:
                        holders[g] = {jid}
                    else:
                        had.add(jid)
            current[jid] = alloc
        if counted and (old is None) != (alloc is None) and jid in self.jobs:
            self.tally.count_waiting(job, 1 if alloc is None else -1)
        for listener in self.listeners:
            listener.on_hold(job, old, alloc)

    def _keep(self, job: Job, old: Allocation | None, new: Allocation | None) -> None:
        """:meth:`hold` of a job regrouped on the same parts, in :meth:`apply`'s two halves: letting go
        of ``old`` (``new`` None), then taking ``new``.  Its GPUs, cores and memory are held throughout
        (``free``, ``used`` and ``holders`` untouched), and it stays in ``current`` until it takes
        ``new``, so that every co-runner it had or gets, each listing it in its group, sees these GPUs
        held; its entry then moves to the end of ``current``, where :meth:`hold` puts it.  The rest
        (the job's ``alloc``, the tally, the listeners) is what :meth:`hold` does, in the same order,
        except that the job is not counted as waiting in between (the two halves' counts cancel out)."""
        self._stamp += 1
        jid = job.id
        tally = self.tally
        if new is None:
            assert old is not None
            if not old.key:
                tally.unkeyed -= 1
            job.alloc = None
        else:
            current = self.current
            del current[jid]
            self._deleted[1] += 1
            if not new.key:
                tally.unkeyed += 1
            job.alloc = new
            current[jid] = new
        for listener in self.listeners:
            listener.on_hold(job, old, new)

    # -- one round ---------------------------------------------------------------------------
    def view(self, now: float, appended: Sequence[Job] | None = None) -> View:
        """What the scheduler sees at ``now``.  Its jobs are read from :attr:`jobs` without a copy
        (:class:`~gpuloom.core.job.ActiveJobs`): they are frozen into a list before a job is
        admitted or ends while the view is still held (or another view is made)."""
        self._jobs_change()
        jobs = ActiveJobs(self.jobs)
        self._lent = weakref.ref(jobs)
        return View(now, self.cluster, jobs, self.current, self.model, self.rng, self.rounds,
                    free=self.free, by_id=self.jobs, tally=self.tally, appended=appended)

    def _jobs_change(self) -> None:
        """Before :attr:`jobs` changes: the last view's jobs, if still held, keep what they were."""
        lent = self._lent
        if lent is not None:
            held = lent()
            if held is not None:
                held.freeze()
            self._lent = None

    def plan(self, now: float) -> tuple[Round, list[Action]]:
        """The scheduler's round for the active jobs at ``now`` (checked), and its actions."""
        self.rounds += 1
        self.sync(now)
        deleted = self._deleted
        if deleted[0] > len(self.jobs) >> 1:  # (see the module notes: Compact dicts)
            self._jobs_change()
            self.jobs = dict(self.jobs)
            self.model.bind(self.jobs)
            deleted[0] = 0
        if deleted[1] > len(self.current) >> 1:
            self.current = dict(self.current)
            deleted[1] = 0
        view = self.view(now, self._admitted if self._quiet_at == self._stamp else None)
        rnd = self.scheduler.schedule(view, self.reasons)
        actions = diff(self.current, rnd.plan)
        self._admitted = []
        self._quiet_at = self._stamp if rnd.full and not actions else None
        self._planned = (actions, self._stamp) if rnd.full and actions else None
        if self.check:
            self._since_full += 1
            # the whole check costs O(jobs): done rarely enough that it costs a few µs per round
            if self._since_full >= max(self.full_check_every, (len(self.jobs) + len(self.current)) // 8):
                self._since_full = 0
                self.check_state()
                self.scheduler.check(rnd, view)
            else:
                self.scheduler.check_changes(rnd, view, actions, self.holders, self.jobs)
        if self.reasons:
            reasons = rnd.reasons
            # (a round that gave the reasons of its new jobs only: the others' are as they were)
            of = self.jobs.values() if rnd.reasons_of is None else rnd.reasons_of
            for job in of:
                job.reason = reasons.get(job.id)
            self.reasoned = of
        return rnd, actions

    def check_state(self) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` unless ``current`` is sound and the state kept
        for it incrementally (free resources, GPU holders, resources used) is what it gives."""
        check_plan(self.current, self.cluster)
        expect = FreeState.of(self.cluster, self.current)
        f = self.free
        for name in ("gpu_free", "node_gpus", "node_cpus", "node_mem"):
            if not (getattr(f, name) == getattr(expect, name)).all():
                raise PlanError(f"driver state: free {name} differs from what the running jobs leave")
        holders: dict[int, set[str]] = {}
        for jid, a in self.current.items():
            for g in a.gpu_ids:
                holders.setdefault(g, set()).add(jid)
        if holders != self.holders:
            raise PlanError("driver state: the jobs on each GPU differ from the running allocations")
        used = [int(expect.cluster.num_gpus - expect.free_gpus),
                sum(a.cpus for a in self.current.values()), sum(a.mem_mb for a in self.current.values())]
        if used != self.used:
            raise PlanError(f"driver state: resources used {self.used}, the running allocations hold {used}")
        for jid in self.current:
            if jid not in self.jobs:
                raise PlanError(f"driver state: job {jid} holds resources but is not active")
        # the tally, counted afresh (in bulk: the active jobs may be tens of thousands): comprehensions,
        # whose attribute reads the interpreter specialises (map with attrgetter reads generically:
        # 1.3x the time here), and the shapes each job was made with (Job.shape, shared tuples)
        mine, tally = self.tally, Tally()
        current = self.current
        active = list(self.jobs.values())
        tally.demand = sum([j.spec.gpus for j in active])
        tally.idle = {j.id: j for j in active if j.id not in current}
        tally.waiting = dict(Counter([j.shape for j in tally.idle.values()]))
        tally.unkeyed = sum(1 for a in current.values() if not a.key)
        # admitted in index order (earlier jobs may have left, so the driver's flag may be False alone)
        index = [j.index for j in active]
        tally.index_order = mine.index_order and all(map(lt, index, islice(index, 1, None)))
        if (mine.idle.keys() != tally.idle.keys() or mine.waiting != tally.waiting or mine.demand != tally.demand
                or mine.unkeyed != tally.unkeyed or mine.index_order != tally.index_order):
            raise PlanError(f"driver state: tally {mine.as_tuple()}, the active jobs give {tally.as_tuple()}")

    def round(self, now: float) -> list[Action]:
        """Plan and apply one round; returns its actions."""
        _, actions = self.plan(now)
        self.apply(actions, now)
        return actions

    def settled_until(self, now: float) -> float:
        """After a round at ``now`` that planned no action: until when a round would plan none
        either, if no job arrives or ends (:meth:`Scheduler.next_change`)."""
        return self.scheduler.next_change(self.view(now))

    def apply(self, actions: Sequence[Action], now: float) -> list[Job]:
        """Carry out ``actions`` at ``now`` (see the module notes); returns the jobs that failed to launch.

        When they are the last round's, that round filled the cluster (``Round.full``), nothing
        changed since, and every action was carried out, the state is now that round's plan: a
        round on it would plan no action (placement is a fixed point on its own plan, see
        :mod:`gpuloom.policies.incremental`), so the next round may only backfill the jobs admitted
        meanwhile (``View.appended``), as after a round that planned no action.
        """
        planned, self._planned = self._planned, None
        exact = planned is not None and planned[0] is actions and planned[1] == self._stamp
        # (every pass below runs once per action: Muri-L applies about 175,000 on trace4, so the
        # jobs are looked up once, and the lifecycle steps and the watch written out here)
        jobs = self.jobs
        hold = self.hold
        kept = False  # a regroup on the same parts (see _keep)
        steps: list[Step] = []
        stopping: list[Step] = []  # the steps with a stop half, in order
        # each job advanced and let go of its old allocation, and its lifecycle steps found, in one pass
        # (the lifecycle's sync reads nothing the others' holdings change).  A job that holds something
        # before and after (a move, resize or regroup) is not counted as waiting in between: the tally's
        # two changes would cancel out
        for act in actions:
            job = jobs[act.job_id]
            job.advance(now)
            old = act.old
            kind = act.kind
            if old is not None:
                if kind is _REGROUP and old.parts == act.new.parts:  # type: ignore[union-attr]
                    self._keep(job, old, None)
                    kept = True
                else:
                    hold(job, None, act.new is None)
            if kind is _REGROUP:
                steps.append(Step(job, act, None, ()))
                continue
            stop, start = lifecycle_steps(job, kind, now)
            st = Step(job, act, stop, start)
            steps.append(st)
            if stop is not None:
                stopping.append(st)
        backend = self.backend
        if stopping:
            backend.stop(self, stopping, now)
        for st in steps:
            job, act = st.job, st.action
            k = act.kind
            if k is _START:
                if job.first_start is None:
                    job.first_start = now
                job.last_start = now
            elif k is _STOP:
                job.speed = 0.0
                job.preemptions += 1
            elif k is _MOVE:
                job.migrations += 1
            elif k is _RESIZE:
                job.resizes += 1
            elif kept and k is _REGROUP and job.id in self.current:
                self._keep(job, None, act.new)
                continue
            if act.new is not None:
                hold(job, act.new, act.old is None)
        failed: list[Job] = []
        speed = self.speed
        for st in steps:
            job, act = st.job, st.action
            new = act.new
            if new is not None:
                try:
                    job.speed = speed(job, new)
                except Exception as e:  # the model cannot rate this job: it fails alone, before any launch
                    job.extra["failure"] = f"throughput model: {type(e).__name__}: {e}"
                    failed.append(job)
        skipped: list[Job] = []
        unrated = {j.id for j in failed}
        launch, progressed, regrouped = backend.launch, backend.progressed, backend.regrouped
        pending = self._pending
        for st in steps:
            job = st.job
            k = st.action.kind
            if unrated and job.id in unrated:
                pass
            elif k is _REGROUP:
                regrouped(self, job, now)
            elif k is not _STOP:
                try:
                    if not launch(self, st, now):
                        skipped.append(job)
                except LaunchFailed as e:
                    job.extra["failure"] = str(e)
                    failed.append(job)
            job.version += 1
            lc = job.lifecycle  # (self.watch(job), written out)
            if lc is not None and lc.planned:
                pending.add(job.id)
            progressed(self, job, now)
        for job in skipped:
            self._drop(job, now)
        for job in failed:
            self.finish(job, now, S.FAILED)
        if exact and not skipped and not failed:
            self._quiet_at = self._stamp
        return failed

    def set_back(self, job: Job, work: float, now: float) -> None:
        """``job`` keeps its allocation with ``work`` seconds of progress undone (a simulated overhead)."""
        job.advance(now)
        job.remaining += work
        job.version += 1
        self._stamp += 1  # (the next round plans from scratch: keys moved)
        self.backend.progressed(self, job, now)

    def _drop(self, job: Job, now: float) -> None:
        """Undo a start the backend did not carry out: the job holds nothing, its group shrinks."""
        alloc = job.alloc
        if alloc is None:
            return
        self.hold(job, None)
        job.speed = 0.0
        job.version += 1
        self._regroup_without(alloc.group, job.id, now)

    # -- endings ----------------------------------------------------------------------------
    def finish(self, job: Job, now: float, state: JobState = S.FINISHED) -> Allocation | None:
        """End ``job`` at ``now`` in ``state`` (FINISHED, FAILED or CANCELLED); returns what it held.

        A job that finishes while still launching (done before it reported
        progress) passes through RUNNING_PROTECTED.  Its co-runners are regrouped.
        """
        self._stamp += 1  # (a round after this one plans from scratch: View.appended)
        job.advance(now)
        jid = job.id
        jobs = self.jobs
        tally = self.tally
        alloc = job.alloc
        lc = job.lifecycle
        assert lc is not None  # a job that ends has arrived
        lc.sync(now)
        lc.planned.clear()
        if state is _FINISHED and lc.state is _LAUNCHING:
            lc.to(_PROTECTED, now)
        lc.to(state, now)  # (an illegal end raises here, before the driver's state changes)
        # out of the active jobs before it lets go, so that a running job is not counted as waiting
        # on its way out
        self._jobs_change()
        if jobs.pop(jid, None) is not None:
            self._deleted[0] += 1
            if alloc is None:
                tally.count_waiting(job, -1)
            tally.demand -= job.spec.gpus
        if alloc is not None:
            self.hold(job, None)
        job.finish = now
        job.speed = 0.0
        job.version += 1
        self._pending.discard(jid)
        for listener in self.listeners:
            listener.on_end(job)
        job.drop_caches()
        if alloc is not None and alloc.group:  # (co-runners to regroup: none without a group)
            self._regroup_without(alloc.group, jid, now)
        return alloc

    def _regroup_without(self, members: Sequence[str], gone: str, now: float) -> None:
        """Co-runners of ``gone`` keep their GPUs in a group without it, at a new speed."""
        for oid in members:
            other = self.jobs.get(oid)
            oa = None if other is None else other.alloc
            if other is None or oa is None:
                continue
            other.advance(now)
            na = Allocation(oa.job_id, oa.parts, tuple(x for x in oa.group if x != gone))
            self.hold(other, na)
            other.speed = self.speed(other, na)
            other.version += 1
            self.backend.regrouped(self, other, now)
            self.backend.progressed(self, other, now)
