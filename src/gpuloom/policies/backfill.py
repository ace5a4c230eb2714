"""The backfill guarantee: reservations for the first waiting jobs, as Slurm's backfill scheduler keeps them.

A plan hook (:class:`Backfill`) run after placement.  It walks the active jobs in the order policy's
order and keeps a profile of what holds resources when: each running job until its estimated end, each
job the plan starts until ``now`` plus its estimate, and each reservation.  The first ``depth`` jobs
the plan leaves waiting (and no stage holds back: a queue at its quota) each get a reservation: the
earliest time at which the place policy finds them room that stays free for their whole estimated run,
given everything ahead of them in the profile.  A job the plan starts that comes after a reservation
in the order keeps its start only if it does not push that reservation later (Slurm's ``bf`` rule): it
ends by the reserved start, or it leaves the reserved GPUs, cores and memory free; otherwise the hook
takes it out of the plan and it waits.

Estimates: a running job's predicted finish at its current speed (while its start-up's end is unknown:
its work estimate from when it took its resources, as a time limit counts); a job not running, ``now``
plus its remaining work at speed 1 (the service's work estimate is the job's time limit, or its default
when it has none).  Start-up overheads of jobs not running are not counted.  A job ahead of a reservation is never held back, so a
reserved job starts no later than its estimate unless something ahead of it runs past its estimate.

The hook records, for the last round, every reserved job's estimated start (:attr:`Backfill.starts`)
and every waiting job's position in the order, overall and within its queue (:attr:`Backfill.positions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.plan import Allocation, Part, Plan, drop_job
from .base import OrderPolicy, PlacePolicy, PolicyError, SizePolicy, Stage, View
from .free import FreeState

#: the ``JobSpec.attrs`` key of a job's queue (the queue stage's)
QUEUE_KEY = "queue"


@dataclass(slots=True)
class Slot:
    """A reservation: ``job`` may use ``alloc`` from ``start`` to ``end`` (estimated)."""

    job: Job
    alloc: Allocation
    start: float
    end: float


class Backfill:
    """Plan hook keeping reservations for the first ``depth`` waiting jobs (see the module notes)."""

    def __init__(self, order: OrderPolicy, size: SizePolicy, place: PlacePolicy, depth: int,
                 stages: Sequence[Stage] = ()) -> None:
        if depth < 1:
            raise PolicyError(f"reserve depth must be >= 1, got {depth}")
        self.order, self.size, self.place, self.depth = order, size, place, depth
        self.stages = tuple(stages)  # their pending reasons keep a job from a reservation
        #: the last round's reservations: job id -> estimated start (the round's clock)
        self.starts: dict[str, float] = {}
        #: the last round's waiting jobs: job id -> (position overall, position in its queue), from 1
        self.positions: dict[str, tuple[int, int]] = {}
        #: jobs the last round held back to keep a reservation
        self.held: list[str] = []

    def __call__(self, plan: Plan, view: View) -> Plan:
        now, current = view.now, view.current
        allocs = plan.allocations
        ordered = self.order.order(view.jobs, view)
        blocked: set[str] = set()
        for st in self.stages:
            blocked.update(st.pending_reasons(plan, view))
        # the profile: (allocation, start, end); running jobs the plan keeps first, whatever their rank
        busy: list[tuple[Allocation, float, float]] = []
        jobs = {j.id: j for j in ordered}
        for jid, ra in allocs.items():
            rj = jobs.get(jid)
            if rj is not None and jid in current:
                busy.append((ra, now, _end(rj, now)))
        slots: list[Slot] = []
        out: dict[str, Allocation] | None = None
        held: list[str] = []
        for j in ordered:
            a = allocs.get(j.id)
            if a is not None:
                if j.id in current:
                    continue  # running (kept, moved or resized): in the profile already
                end = now + j.remaining_at(now)
                if slots and not self._beside(a, now, end, slots, busy, view.cluster):
                    if out is None:
                        out = dict(allocs)
                    drop_job(out, j.id)
                    b = None if a.group else self._elsewhere(j, a, end, out, slots, view)
                    if b is None:
                        held.append(j.id)
                        continue
                    if not self._beside(b, now, end, slots, busy, view.cluster):
                        held.append(j.id)
                        continue
                    out[j.id] = a = b
                busy.append((a, now, end))
            elif len(slots) < self.depth and j.id not in blocked:
                slot = self._reserve(j, busy, view)
                if slot is not None:
                    slots.append(slot)
                    busy.append((slot.alloc, slot.start, slot.end))
        self.starts = {s.job.id: s.start for s in slots}
        self.held = held
        self._positions(ordered, allocs if out is None else out)
        return plan if out is None else Plan(out)

    def _positions(self, ordered: Sequence[Job], allocs: Mapping[str, Allocation]) -> None:
        pos: dict[str, tuple[int, int]] = {}
        per_queue: dict[str, int] = {}
        n = 0
        for j in ordered:
            if j.id in allocs:
                continue
            n += 1
            q = str(j.spec.attrs.get(QUEUE_KEY, "")) if j.spec.attrs else ""
            k = per_queue[q] = per_queue.get(q, 0) + 1
            pos[j.id] = (n, k)
        self.positions = pos

    def _reserve(self, job: Job, busy: list[tuple[Allocation, float, float]], view: View) -> Slot | None:
        """The earliest slot for ``job`` on what ``busy`` leaves free over its whole estimated run."""
        now = view.now
        d = job.remaining_at(now)
        req = self.size.request(job, view)
        times = sorted({now, *(e for _, _, e in busy if now < e < _INF)})
        for t in times:
            free = _free_of(view.cluster, (a for a, s, e in busy if s < t + d and e > t))
            parts = self.place.choose_for(req, free, view)
            if parts is not None:
                return Slot(job, Allocation(job.id, tuple(parts)), t, t + d)
        return None

    def _elsewhere(self, job: Job, a: Allocation, end: float, allocs: Mapping[str, Allocation],
                   slots: list[Slot], view: View) -> Allocation | None:
        """Another place for ``job`` (planned on ``a`` until ``end``) that keeps off the GPUs of the
        reservations it would overlap, or None."""
        req = self.size.request(job, view)
        if req.gpus != a.num_gpus:
            return None
        free = _free_of(view.cluster, allocs.values())
        gf = free.gpu_free
        for s in slots:
            if s.start < end:
                for p in s.alloc.parts:
                    mine = tuple(g for g in p.gpus if gf[g])
                    if mine:
                        free.take([Part(p.node, mine, 0, 0)])
        parts = self.place.choose_for(req, free, view)
        return None if parts is None else Allocation(job.id, tuple(parts), (), a.key)

    @staticmethod
    def _beside(a: Allocation, start: float, end: float, slots: list[Slot],
                busy: list[tuple[Allocation, float, float]], cluster: Cluster) -> bool:
        """Whether ``a`` held from ``start`` to ``end`` leaves every reservation it overlaps room."""
        gpus = set(a.gpu_ids)
        for s in slots:
            if s.start >= end or s.end <= start:
                continue
            if gpus.intersection(s.alloc.gpu_ids):
                return False
            others = [b for b, bs, be in busy if b is not s.alloc and bs < s.end and be > s.start]
            free = _free_of(cluster, [*others, a])
            if not free.fits(s.alloc.parts):
                return False
        return True


def _end(job: Job, now: float) -> float:
    """A running job's estimated end: at its current speed once its start-up is over; while the start-up's
    end is not known (the service's job that has not reported progress yet), ``now`` plus its work estimate
    less the time it has held its resources (a time limit counts the start-up too)."""
    r, sp = job.remaining_at(now), job.speed
    if job.alloc is None:
        return now + r
    b = job.busy_until
    if sp > 0 and b < _INF:
        return (b if b > now else now) + r / sp
    left = job.spec.duration - job.attained_at(now)
    return now + (left if left > 0 else 0.0)


_INF = float("inf")


def _free_of(cluster: Cluster, allocs: Iterable[Allocation]) -> FreeState:
    """What ``allocs`` leave free when they may hold their resources at once: a GPU any of them holds is
    taken (co-runners share theirs; intervals one after the other in a window may reuse one), cores and
    memory are summed (an over-count for intervals one after the other: never an under-count)."""
    free = FreeState(cluster)
    gf = free.gpu_free
    for a in allocs:
        for p in a.parts:
            mine = tuple(g for g in p.gpus if gf[g])
            free.take([Part(p.node, mine, p.cpus, p.mem_mb)])
    return free
