"""The backfill guarantee: reservations for the first waiting jobs, as Slurm's backfill scheduler keeps them.

A plan hook (:class:`Backfill`) run after placement.  It walks the active jobs in the order policy's
order and keeps a profile of what holds resources when: each running job until its estimated end, each
job the plan starts until ``now`` plus its estimate, and each reservation.  The first ``depth`` jobs
the plan leaves waiting (and no stage holds back but for its queue's quota) each get a reservation: the
earliest time at which the place policy finds them room that stays free for their whole estimated run,
given everything ahead of them in the profile.  When a queue stage caps some queue, the profile also
keeps each job's room under its queue's caps (:mod:`.quota_room`): a reservation starts no earlier than
the job fits under them, and a later job starts only if it leaves every reserved job that room.  A job the plan starts that comes after a reservation
in the order keeps its start only if it does not push that reservation later (Slurm's ``bf`` rule): it
ends by the reserved start, or it leaves the reserved GPUs, cores and memory free; otherwise the hook
takes it out of the plan and it waits.

Estimates: a running job's predicted finish at its current speed (while its start-up's end is unknown:
its work estimate from when it took its resources, as a time limit counts); a job not running, ``now``
plus its remaining work at speed 1 (the service's work estimate is the job's time limit, or its default
when it has none).  Start-up overheads of jobs not running are not counted.  A job ahead of a
reservation is never held back, so a reserved job starts no later than its estimate unless something
ahead of it runs past its estimate.

Advance reservations (:attr:`Backfill.reservations`, :mod:`gpuloom.core.reservations`) enter the profile
first, for every job but those of their users: a job of another user is kept off what they keep inside
their window (placed elsewhere, or held), and one still holding it when the window begins is taken out
of the plan (stopped).  A job submitted to an advance reservation (``attrs["reservation"]``) runs only
inside it: once it has begun, on the resources it keeps, and only if its estimate ends by its end.  When
jobs were held back, waiting jobs the plan left out are tried on what they left free (at most
:data:`MAX_TRIES` a round).

The hook records, for the last round, every reserved job's estimated start (:attr:`Backfill.starts`)
and every waiting job's position in the order, overall and within its queue (:attr:`Backfill.positions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.cluster import Cluster
from ..core.job import Job, JobSpec
from ..core.plan import Allocation, Part, Plan, drop_job
from ..core.reservations import Reservation
from .base import OrderPolicy, PlacePolicy, PolicyError, Request, SizePolicy, Stage, View
from .free import FreeState
from .quota_room import QUEUE_AT_QUOTA, QuotaRoom

#: the ``JobSpec.attrs`` key of a job's queue (the queue stage's)
QUEUE_KEY = "queue"
#: the ``JobSpec.attrs`` key of the advance reservation a job was submitted to (it runs only inside it)
RESERVATION_KEY = "reservation"
#: waiting jobs a round tries to start on what the jobs it held back left free (as Slurm's bf_max_job_test)
MAX_TRIES = 100


@dataclass(slots=True)
class Slot:
    """Resources kept from ``start`` to ``end``: for ``job`` (its reservation, estimated), or for the jobs
    of ``users`` (an advance reservation; ``nodes``: whole nodes, none of their resources for others)."""

    job: Job | None
    alloc: Allocation
    start: float
    end: float
    users: frozenset[str] | None = None
    nodes: frozenset[int] = frozenset()

    def admits(self, user: str) -> bool:
        """Whether a job of ``user`` may use what this slot keeps."""
        return self.users is not None and user in self.users


#: the profile: (what is held, from, until, the job's user or "", the users an advance reservation admits)
Entry = tuple[Allocation, float, float, str, frozenset[str] | None]


class Backfill:
    """Plan hook keeping reservations for the first ``depth`` waiting jobs, and the advance reservations
    in :attr:`reservations` (see the module notes)."""

    def __init__(self, order: OrderPolicy, size: SizePolicy, place: PlacePolicy, depth: int,
                 stages: Sequence[Stage] = ()) -> None:
        if depth < 0:
            raise PolicyError(f"reserve depth must be >= 0, got {depth}")
        self.order, self.size, self.place, self.depth = order, size, place, depth
        self.stages = tuple(stages)  # their pending reasons keep a job from a reservation
        #: advance reservations (:mod:`gpuloom.core.reservations`), in the round's clock; set by the caller
        self.reservations: list[Reservation] = []
        #: the last round's reservations: job id -> estimated start (the round's clock)
        self.starts: dict[str, float] = {}
        #: the last round's waiting jobs: job id -> (position overall, position in its queue), from 1
        self.positions: dict[str, tuple[int, int]] = {}
        #: jobs the last round held back (or stopped) to keep a reservation
        self.held: list[str] = []
        #: the last round's advance reservations: name -> the global GPU ids they keep (empty: none found)
        self.kept: dict[str, tuple[int, ...]] = {}
        #: the last round's queue room (:mod:`.quota_room`), None when no queue has a cap
        self.room: QuotaRoom | None = None

    def __call__(self, plan: Plan, view: View) -> Plan:
        now, current, cluster = view.now, view.current, view.cluster
        allocs = plan.allocations
        ordered = self.order.order(view.jobs, view)
        blocked: dict[str, str] = {}
        for st in self.stages:
            blocked.update(st.pending_reasons(plan, view))
        room = self.room = QuotaRoom.of(self.stages, view)
        busy: list[Entry] = []
        jobs = {j.id: j for j in ordered}
        out: dict[str, Allocation] | None = None
        held: list[str] = []
        slots: list[Slot] = []
        # running jobs the plan keeps, whatever their rank
        for jid, ra in allocs.items():
            rj = jobs.get(jid)
            if rj is not None and jid in current:
                busy.append((ra, now, _end(rj, now), rj.spec.user, None))
                if room is not None:
                    room.add(rj, now, busy[-1][2])
        # advance reservations; a job of another user still on one that has begun is stopped
        kept: dict[str, tuple[int, ...]] = {}
        for r in sorted((r for r in self.reservations if r.end > now), key=lambda r: (r.start, r.name)):
            slot = self._advance(r, busy, view)
            kept[r.name] = () if slot is None else slot.alloc.gpu_ids
            if slot is None:
                continue
            slots.append(slot)
            if slot.start <= now:
                for b, _, _, owner, _ in list(busy):
                    if b.job_id in allocs and not slot.admits(owner) and _touches(b, slot):
                        if out is None:
                            out = dict(allocs)
                        if b.job_id in out:
                            drop_job(out, b.job_id)
                            held.append(b.job_id)
                busy[:] = [x for x in busy if out is None or x[0].job_id in out or x[4] is not None]
            busy.append((slot.alloc, slot.start, slot.end, "", slot.users))
        self.kept = kept
        reserved = 0
        failed: dict[tuple, float] = {(): float(MAX_TRIES)}  # what could not start now (see _now)

        def reserve(j: Job) -> None:
            nonlocal reserved
            at_quota = room is not None and blocked.get(j.id) == QUEUE_AT_QUOTA
            if reserved < self.depth and (j.id not in blocked or at_quota):
                slot = self._reserve(j, busy, view) if room is None else self._reserve_room(j, busy, view, room)
                if slot is not None:
                    reserved += 1
                    slots.append(slot)
                    busy.append((slot.alloc, slot.start, slot.end, j.spec.user, None))
                    if room is not None:
                        room.add(j, slot.start, slot.end)

        by_name = {s.alloc.job_id.removeprefix("reservation:"): s for s in slots}
        for j in ordered:
            a = allocs.get(j.id)
            inside = j.spec.attrs.get(RESERVATION_KEY) if j.spec.attrs else None
            if inside is not None and j.id not in current:
                if out is None:
                    out = dict(allocs)
                if not self._inside(j, by_name.get(str(inside)), out, busy, view):
                    held.append(j.id)
                elif room is not None:
                    room.add(j, now, busy[-1][2])
                continue
            if a is not None:
                if j.id in current:
                    continue  # running (kept, moved or resized): in the profile already
                end = now + j.remaining_at(now)
                user = j.spec.user
                if room is not None and not room.fits(j, now, end, False):  # it keeps a reserved job's room
                    if out is None:
                        out = dict(allocs)
                    drop_job(out, j.id)
                    held.append(j.id)
                    reserve(j)
                    continue
                if slots and not self._beside(a, user, now, end, slots, busy, cluster):
                    if out is None:
                        out = dict(allocs)
                    drop_job(out, j.id)
                    moved = None if a.group else self._elsewhere(j, a, end, out, slots, view)
                    if moved is None or not self._beside(moved, user, now, end, slots, busy, cluster):
                        held.append(j.id)
                        reserve(j)  # (it waits: it may have a reservation of its own)
                        continue
                    out[j.id] = a = moved
                busy.append((a, now, end, user, None))
                if room is not None:
                    room.add(j, now, end)
            elif j.id in blocked:
                if blocked[j.id] == QUEUE_AT_QUOTA:
                    reserve(j)  # (the room under its queue's cap, when that frees, and GPUs then)
                continue
            elif out is not None and self.place.backfill and self._now(j, out, slots, busy, view, failed):
                continue  # placed on what the jobs held back left free
            else:
                reserve(j)
        self.starts = {s.job.id: s.start for s in slots if s.job is not None}
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

    def _advance(self, r: Reservation, busy: list[Entry], view: View) -> Slot | None:
        """The slot of an advance reservation: its nodes whole; or ``r.gpus`` GPUs placed on what the jobs
        (but those of its users) and the other reservations leave over its window, else on what the other
        reservations leave (the jobs there are stopped when it begins); None if neither has room."""
        cluster = view.cluster
        if r.nodes:
            idx = {n.name: i for i, n in enumerate(cluster.nodes)}
            off = cluster.gpu_offset
            whole: list[Part] = []
            for name in r.nodes:
                i = idx.get(name)
                if i is None:
                    return None  # (a node gone from the inventory: nothing of it to keep)
                node = cluster.nodes[i]
                whole.append(Part(i, tuple(range(int(off[i]), int(off[i + 1]))), node.cpus, node.mem_mb))
            return Slot(None, Allocation(f"reservation:{r.name}", tuple(whole)), r.start, r.end, r.users,
                        frozenset(p.node for p in whole))
        holder = Job(JobSpec(f"reservation:{r.name}", 0.0, r.gpus, r.end - r.start))
        req = Request((holder,), r.gpus)
        for keep in (lambda e: e[4] is not None or e[3] not in r.users, lambda e: e[4] is not None):
            free = _free_of(cluster, (e[0] for e in busy if keep(e) and e[1] < r.end and e[2] > r.start))
            parts = self.place.choose_for(req, free, view)
            if parts is not None:
                return Slot(None, Allocation(holder.id, tuple(parts)), r.start, r.end, r.users)
        return None

    def _reserve_room(self, job: Job, busy: list[Entry], view: View, room: QuotaRoom) -> Slot | None:
        """The earliest slot for ``job`` that has both GPUs (:meth:`_reserve`) and room under its queue's caps
        for its whole estimated run, or None."""
        d = job.remaining_at(view.now)
        after = view.now
        for _ in range(_ROOM_TRIES):
            t = room.earliest(job, after, d)
            if t is None:
                return None
            slot = self._reserve(job, busy, view, t)
            if slot is None or room.fits(job, slot.start, slot.end):
                return slot
            after = slot.start
        return None

    def _reserve(self, job: Job, busy: list[Entry], view: View, after: float | None = None) -> Slot | None:
        """The earliest slot for ``job`` from ``after`` (default: now) on what ``busy`` leaves free over its
        whole estimated run (the advance reservations that admit its user left out)."""
        first = view.now if after is None else after
        d = job.remaining_at(view.now)
        req = self.size.request(job, view)
        user = job.spec.user
        mine = [e for e in busy if e[4] is None or user not in e[4]]
        times = sorted({first, *(e[2] for e in mine if first < e[2] < _INF)})
        for t in times:
            free = _free_of(view.cluster, (e[0] for e in mine if e[1] < t + d and e[2] > t))
            parts = self.place.choose_for(req, free, view)
            if parts is not None:
                return Slot(job, Allocation(job.id, tuple(parts)), t, t + d)
        return None

    def _inside(self, job: Job, slot: Slot | None, out: dict[str, Allocation], busy: list[Entry],
                view: View) -> bool:
        """Place ``job``, submitted to the advance reservation ``slot``, on what it keeps, if it has begun and
        the job's estimate ends within it (where the plan put it, when that is inside); whether it runs."""
        now = view.now
        a = out.pop(job.id, None)
        end = now + job.remaining_at(now)
        if slot is None or slot.start > now or end > slot.end:
            return False
        mine = set(slot.alloc.gpu_ids)
        if a is None or not mine.issuperset(a.gpu_ids):
            free = _free_of(view.cluster, out.values())
            for node in range(len(view.cluster.nodes)):
                outside = tuple(g for g in free.free_on(node) if g not in mine)
                if outside:
                    free.take([Part(node, outside, 0, 0)])
            req = self.size.request(job, view)
            parts = self.place.choose_for(req, free, view)
            if parts is None:
                return False
            a = Allocation(job.id, tuple(parts), (), req.key)
        out[job.id] = a
        busy.append((a, now, end, job.spec.user, None))
        return True

    def _now(self, job: Job, out: dict[str, Allocation], slots: list[Slot], busy: list[Entry],
             view: View, failed: dict[tuple, float]) -> bool:
        """Start the waiting ``job`` now if it fits beside every reservation (the plan left it waiting, and
        jobs held back since left room); whether it did.  ``failed``: per (shape, user), the earliest end
        that did not fit this round (a job of that shape and user ending later cannot fit either: it
        overlaps more), and the tries left (key ``()``)."""
        now = view.now
        end = now + job.remaining_at(now)
        key = (job.shape, job.spec.user)
        if end >= failed.get(key, _INF) or failed[()] <= 0:
            return False
        req = self.size.request(job, view)
        free_gpus = view.cluster.num_gpus - len({g for a in out.values() for g in a.gpu_ids})
        if req.gpus > free_gpus:
            return False
        room = self.room
        if room is not None and not room.fits(job, now, end, False):
            return False
        failed[()] -= 1
        a = self._place_off(job, req, req.key, end, out, slots, view)
        if a is None or not self._beside(a, job.spec.user, now, end, slots, busy, view.cluster):
            failed[key] = min(end, failed.get(key, _INF))
            return False
        out[job.id] = a
        busy.append((a, now, end, job.spec.user, None))
        if room is not None:
            room.add(job, now, end)
        return True

    def _elsewhere(self, job: Job, a: Allocation, end: float, allocs: Mapping[str, Allocation],
                   slots: list[Slot], view: View) -> Allocation | None:
        """Another place for ``job`` (planned on ``a`` until ``end``) that keeps off the GPUs (and whole
        nodes) of the reservations it would overlap, or None."""
        req = self.size.request(job, view)
        if req.gpus != a.num_gpus:
            return None
        return self._place_off(job, req, a.key, end, allocs, slots, view)

    def _place_off(self, job: Job, req: Request, key: tuple, end: float, allocs: Mapping[str, Allocation],
                   slots: list[Slot], view: View) -> Allocation | None:
        """A place for ``job`` now, beside ``allocs``, off what the reservations that ``end`` overlaps keep
        (those that admit its user aside), or None."""
        free = _free_of(view.cluster, allocs.values())
        gf = free.gpu_free
        user = job.spec.user
        for s in slots:
            if s.start < end and not s.admits(user):
                for p in s.alloc.parts:
                    mine = tuple(g for g in p.gpus if gf[g])
                    if mine:
                        free.take([Part(p.node, mine, 0, 0)])
                    if s.nodes:  # (a whole node: its cores and memory too)
                        free.take([Part(p.node, (), free.cpu_counts[p.node], free.mem_counts[p.node])])
        parts = self.place.choose_for(req, free, view)
        return None if parts is None else Allocation(job.id, tuple(parts), (), key)

    @staticmethod
    def _beside(a: Allocation, user: str, start: float, end: float, slots: list[Slot], busy: list[Entry],
                cluster: Cluster) -> bool:
        """Whether a job of ``user`` holding ``a`` from ``start`` to ``end`` leaves every reservation it
        overlaps (but those that admit it) its room."""
        gpus = set(a.gpu_ids)
        for s in slots:
            if s.start >= end or s.end <= start or s.admits(user):
                continue
            if gpus.intersection(s.alloc.gpu_ids):
                return False
            if s.job is None:  # an advance reservation: only its own GPUs (or nodes) are kept
                if s.nodes and not s.nodes.isdisjoint(a.nodes):
                    return False
                continue
            theirs = s.job.spec.user
            others = [e[0] for e in busy if e[0] is not s.alloc and e[1] < s.end and e[2] > s.start
                      and (e[4] is None or theirs not in e[4])]
            free = _free_of(cluster, [*others, a])
            if not free.fits(s.alloc.parts):
                return False
        return True


def _touches(a: Allocation, s: Slot) -> bool:
    """Whether ``a`` holds any of what the advance reservation ``s`` keeps."""
    return not set(a.gpu_ids).isdisjoint(s.alloc.gpu_ids) or (bool(s.nodes) and not s.nodes.isdisjoint(a.nodes))


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
#: rounds of "room under the caps, then GPUs from then" a queue-room reservation tries before giving up
_ROOM_TRIES = 8


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
