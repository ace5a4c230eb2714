"""Ordering policies: which jobs come first.

Every policy sorts by a key, ties broken by arrival order (``Job.index``, the
job's position in arrival order), so results are deterministic.  Keys read the
job's progress as of the round (``Job.remaining_at(view.now)`` and the like:
a round changes no job, so computing more rounds or fewer changes nothing).

========  =====================================================================
fifo      arrival time
sjf       total duration (known in advance)
srtf      remaining work
las       attained service (wall seconds held)
2d-las    Tiresias: discretised queues on attained GPU-time; inside a queue
          Tiresias' order (new and demoted jobs join the tail, running jobs
          stay ahead of waiting ones)
las-gpu   attained GPU-time (continuous 2D-LAS)
las-gpu-events
          attained GPU-time as of the last round at which a job arrived or
          ended (Muri-L's order: Muri's simulator re-sorts at those events only)
srsf      remaining work × GPUs
srsf-events
          remaining work × GPUs as of the last round at which a job arrived or
          ended (Muri-S's order: Muri's simulator re-sorts at those events only)
ftf       Themis finish-time fairness ρ = (elapsed + remaining) / duration,
          largest ρ first
========  =====================================================================

**When the order changes** (:meth:`~gpuloom.policies.base.Stage.next_change`).
FIFO and SJF never change between arrivals and completions.  The keys of the
others move linearly while nothing changes: a running job's remaining work
falls at its speed once its launch is over (``busy_until``), its attained
service grows while it holds GPUs, and FTF's ρ grows with the waiting time.
Each such order says how its key moves (:meth:`KeyOrder.slopes`: a rate until
a breakpoint and one after it), and the order can first change when two jobs
next to each other in it meet: the earliest crossing of neighbours, computed
over the order of the last round (less a margin for rounding).  2D-LAS
changes when a running job is demoted (its attained GPU-time reaches the next
queue's limit).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, KeysView, Sequence
from functools import partial
from operator import itemgetter
from typing import ClassVar

from ..core.job import ActiveJobs, Job
from .base import OrderPolicy, View, register

#: the change times computed from crossing keys are moved this much earlier (relative to the
#: keys' size over the rate at which they meet), so rounding in the jobs' progress never
#: lets the order change before the time given
_MARGIN = 1e-7

Slopes = tuple[float, float, float]


class KeyOrder(OrderPolicy):
    """Sort by ``key``, ties by arrival (``Job.index``); the last order is kept for :meth:`next_change`."""

    keyed: ClassVar[bool] = True

    def __init__(self) -> None:
        self._last: tuple[tuple[float, int, int], list[Job], list[float]] | None = None

    def key(self, job: Job, view: View) -> float:
        raise NotImplementedError

    def sort_key(self, job: Job, view: View) -> tuple[float, int]:
        """Where ``job`` stands in :meth:`order`: earlier for a smaller key."""
        return (self.key(job, view), job.index)

    def slopes(self, job: Job, now: float) -> Slopes | None:
        """How ``job``'s key moves from ``now`` while nothing changes: ``(rate, rate_after, b)``,
        the rate until time ``b`` and the rate after it; None if it stays put."""
        return None

    def keys(self, jobs: Sequence[Job], view: View) -> list[float]:
        """:meth:`key` of each of ``jobs``, in order (an order may compute them all in one expression)."""
        return [self.key(j, view) for j in jobs]

    def order(self, jobs: Sequence[Job], view: View) -> Sequence[Job]:
        keys = self.keys(jobs, view)
        dec = sorted(zip(keys, [j.index for j in jobs], jobs, strict=True), key=itemgetter(0, 1))
        ordered = [d[2] for d in dec]
        if self.dynamic:
            self._last = ((view.now, view.round_index, len(jobs)), ordered, [d[0] for d in dec])
        return ordered

    def next_change(self, view: View) -> float:
        """The earliest time two neighbours in the order can meet (see the module notes)."""
        if not self.dynamic:
            return math.inf
        now = view.now
        last = self._last
        if last is None or last[0] != (now, view.round_index, len(view.jobs)):
            self.order(view.jobs, view)
            last = self._last
            assert last is not None
        _, ordered, keys = last
        slopes = self.slopes
        best = math.inf
        prev = slopes(ordered[0], now) if ordered else None
        for i in range(1, len(ordered)):
            cur = slopes(ordered[i], now)
            if prev is not None or cur is not None:
                t = first_meeting(keys[i - 1], prev, keys[i], cur, now)
                if t < best:
                    best = t
                    if t <= now:
                        return now
            prev = cur
        return best


def first_meeting(ka: float, sa: Slopes | None, kb: float, sb: Slopes | None, now: float) -> float:
    """The first time ``t >= now`` at which key ``b`` (behind, ``kb >= ka``) falls to key ``a``,
    less the rounding margin; ``inf`` if it never does.  Keys move as :meth:`KeyOrder.slopes` says.

    (Called for every pair of neighbours after a quiet round: the breakpoints are ordered by
    comparisons and the maxima written out, not taken with ``max``, ``sorted`` and sets, which made
    it about 3x slower with the same arithmetic.)
    """
    ra1, ra2, ba = sa if sa is not None else (0.0, 0.0, now)
    rb1, rb2, bb = sb if sb is not None else (0.0, 0.0, now)
    if ba < now:
        ba = now
    if bb < now:
        bb = now
    inf = math.inf
    # the breakpoints after now, in time order, then never
    if ba == bb:
        stops: tuple[float, ...] = (inf,) if ba == now else (ba, inf)
    elif ba < bb:
        stops = (bb, inf) if ba == now else (ba, bb, inf)
    else:
        stops = (ba, inf) if bb == now else (bb, ba, inf)
    gap = kb - ka
    t0 = now
    for t1 in stops:
        slope = (rb1 if t0 < bb else rb2) - (ra1 if t0 < ba else ra2)
        if slope < 0:
            t = t0 + gap / -slope
            if t <= t1:
                t -= _MARGIN * (abs(ka) + abs(kb) + 1.0) / -slope
                return t if t > now else now
        if t1 == inf:
            break
        gap += slope * (t1 - t0)
        t0 = t1
    return inf



@register("order", "fifo")
class FIFO(KeyOrder):
    dynamic = False

    def key(self, job: Job, view: View) -> float:
        return job.spec.arrival

    #: the order is View.jobs' (Job.index increasing when jobs arrive in index order)
    follows_view = True

    def sort_key(self, job: Job, view: View) -> tuple[float, int]:
        return (0.0, job.index)  # the order of View.jobs when it is sorted by index

    def order(self, jobs: Sequence[Job], view: View) -> Sequence[Job]:
        # a View lists its jobs in arrival order (Job.index increasing) already:
        # no sort and no copy, which matters with tens of thousands of queued jobs
        return jobs if isinstance(jobs, (list, ActiveJobs)) else list(jobs)


@register("order", "sjf")
class SJF(KeyOrder):
    dynamic = False

    def key(self, job: Job, view: View) -> float:
        return job.spec.duration


@register("order", "srtf")
class SRTF(KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.remaining_at(view.now)

    def keys(self, jobs: Sequence[Job], view: View) -> list[float]:
        if type(self).key is not SRTF.key:
            return super().keys(jobs, view)
        now = view.now
        return [j.remaining_at(now) for j in jobs]

    def slopes(self, job: Job, now: float) -> Slopes | None:
        # remaining work falls at the job's speed once its launch is over
        return None if job.alloc is None or job.speed <= 0 else (0.0, -job.speed, job.busy_until)


@register("order", "las")
class LAS(KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.attained_at(view.now)

    def slopes(self, job: Job, now: float) -> Slopes | None:
        return None if job.alloc is None else (1.0, 1.0, now)


@register("order", "srsf")
class SRSF(KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.remaining_at(view.now) * job.spec.gpus

    def keys(self, jobs: Sequence[Job], view: View) -> list[float]:
        if type(self).key is not SRSF.key:
            return super().keys(jobs, view)
        now = view.now
        return [j.remaining_at(now) * j.spec.gpus for j in jobs]

    def slopes(self, job: Job, now: float) -> Slopes | None:
        if job.alloc is None or job.speed <= 0:
            return None
        return (0.0, -job.speed * job.spec.gpus, job.busy_until)


@register("order", "las-gpu")
class LASGPU(KeyOrder):
    """Least attained GPU-seconds first (2D-LAS without queues)."""

    def key(self, job: Job, view: View) -> float:
        return job.attained_gpu_at(view.now)

    def slopes(self, job: Job, now: float) -> Slopes | None:
        if job.alloc is None:
            return None
        g = float(job.alloc.num_gpus)
        return (g, g, now)


@register("order", "las-gpu-events")
class LASGPUEvents(KeyOrder):
    """Least attained GPU-seconds first, the keys taken at the last round at which the set of active
    jobs changed (an arrival or an end) and kept until the next such round.

    Muri-L's order as Muri's simulator runs it: it re-sorts by attained GPU-time at every arrival
    and completion and at no other time.  With rounds on events only it is ``las-gpu``; with
    periodic rounds as well, ``las-gpu`` re-sorts (and regroups) whenever two keys cross, and this
    order does not: it changes only with the jobs, so periodic rounds between events that change
    nothing are skipped.
    """

    dynamic = False

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[str, float] = {}
        self._seen: tuple[float, int] | None = None  # (now, round) of the last check
        # the last order and the keys it was sorted by: with the same keys and the same job objects
        # (the rounds between two events) it is the order again
        # (with the ids of its jobs' objects, made at the first round that could reuse the order, not at
        # every sort: most sorts, one per event, are followed by another event's)
        self._sorted: tuple[dict[str, float], list[Job], set[int] | None] | None = None
        # the keys just taken, in the order of the view's jobs they were taken from, with that view's
        # stamp and jobs' count: order() sorts these values instead of reading each job's key again
        self._fresh: tuple[dict[str, float], tuple[float, int], int] | None = None

    def _refresh(self, view: View) -> None:
        stamp = (view.now, view.round_index)
        if stamp == self._seen:
            return
        self._seen = stamp
        keys, jobs = self._keys, view.jobs
        if len(jobs) == len(keys):
            # the same jobs (as many, all known): the order stays (a driver's view compares its ids, the
            # keys of its jobs' dict, with the table's in C)
            if type(jobs) is ActiveJobs:
                ids = jobs.ids()
                same = keys.keys() == ids if isinstance(ids, KeysView) else all(map(keys.__contains__, ids))
            else:
                same = all(map(keys.__contains__, [j.id for j in jobs]))
            if same:
                return
        now, key_at = view.now, self.key_at
        if key_at is LASGPUEvents.key_at:  # (Job.attained_gpu_at written out: read for every job at each event)
            self._keys = {j.id: j.attained_gpu_time if (a := j.alloc) is None or not (dt := now - j.last_update) > 0
                          else j.attained_gpu_time + dt * a.num_gpus for j in jobs}
        else:
            self._keys = self.keys_at(jobs, now)
            if type(self).keys_at not in (LASGPUEvents.keys_at, SRSFEvents.keys_at):
                self._fresh = None  # (another keys_at may build its table in another order)
                return
        self._fresh = (self._keys, stamp, len(self._keys))

    @staticmethod
    def key_at(job: Job, now: float) -> float:
        """The key of ``job`` taken at ``now`` (an event): its attained GPU-seconds."""
        return job.attained_gpu_at(now)

    def keys_at(self, jobs: Iterable[Job], now: float) -> dict[str, float]:
        """:meth:`key_at` of every one of ``jobs``, by job id."""
        key_at = self.key_at
        return {j.id: key_at(j, now) for j in jobs}

    def key(self, job: Job, view: View) -> float:
        self._refresh(view)
        return self._keys[job.id]

    def order(self, jobs: Sequence[Job], view: View) -> Sequence[Job]:
        """:meth:`KeyOrder.order` (by key, then ``Job.index``), the keys read once; the last order
        again while the keys are the same table and ``jobs`` the same objects."""
        self._refresh(view)
        keys = self._keys
        last = self._sorted
        if last is not None and last[0] is keys and len(last[1]) == len(jobs):
            ids = last[2]
            if ids is None:
                ids = set(map(id, last[1]))
                self._sorted = (keys, last[1], ids)
            if ids.issuperset(map(id, jobs)):
                return list(last[1])
        tally = view.tally
        if jobs is view.jobs and tally is not None and tally.index_order:
            # the view's jobs are in Job.index order: a stable sort by key alone breaks ties by it
            seq = list(jobs)
            fresh = self._fresh
            if fresh is not None and fresh[0] is keys and fresh[1] == (view.now, view.round_index) \
                    and fresh[2] == len(seq):
                # the keys were taken from these jobs, in this order, at this round: sorted reads each
                # job's key once, in list order, so the key function hands out the next value
                # (next(it, job): the job is only a default, never reached with as many keys as jobs)
                ordered = sorted(seq, key=partial(next, iter(keys.values())))
            else:
                ks = [keys[j.id] for j in seq]
                ordered = [seq[i] for i in sorted(range(len(ks)), key=ks.__getitem__)]
        else:
            ordered = sorted(jobs, key=lambda j: (keys[j.id], j.index))
        self._sorted = (keys, ordered, None)
        return list(ordered)


@register("order", "srsf-events")
class SRSFEvents(LASGPUEvents):
    """``srsf`` (remaining work x GPUs), the keys taken at the last round at which the set of active
    jobs changed (an arrival or an end) and kept until the next such round.

    Muri-S's order as Muri's simulator runs it: it re-sorts at arrivals and completions only.  With
    rounds on events only it is ``srsf``; with periodic rounds as well, ``srsf`` re-sorts whenever a
    running job's remaining GPU-time falls to a neighbour's (two jobs sharing GPUs at different
    speeds, or running apart), and this order does not, so periodic rounds between events that change
    nothing are skipped.
    """

    @staticmethod
    def key_at(job: Job, now: float) -> float:
        """The key of ``job`` taken at ``now`` (an event): its remaining work x GPUs."""
        return job.remaining_at(now) * job.spec.gpus

    def keys_at(self, jobs: Iterable[Job], now: float) -> dict[str, float]:
        if type(self).key_at is not SRSFEvents.key_at:
            return super().keys_at(jobs, now)
        # (Job.remaining_at written out: read for every job at each event)
        out: dict[str, float] = {}
        for j in jobs:
            r = j.remaining
            if j.alloc is not None and now > (lu := j.last_update):
                b = j.busy_until
                start = lu if lu >= b else b
                if now > start:
                    r -= (now - start) * j.speed
                    if not r > 0.0:
                        r = 0.0
            out[j.id] = r * j.spec.gpus
        return out


@register("order", "2d-las", "tiresias")
class TwoDLAS(OrderPolicy):
    """Tiresias' discretised 2D-LAS: queue index from attained GPU-seconds.

    ``thresholds`` are the queue limits in GPU-seconds.  Tiresias' simulator
    (and Muri's, which is built on it) runs three queues with limits 3250 and
    7200 GPU-s (``jobs.py``: ``num_queue = 3``; its third limit, 18000, is never
    reached), our default.

    Inside a queue, Tiresias' rules (``run_sim.py``, ``dlas_sim_jobs``):

    * a new job joins the tail of queue 0; a demoted job the tail of its new
      queue (demotions in arrival order);
    * after every scheduling pass the jobs left waiting move behind the
      running ones, keeping their order: a running job is never preempted by
      a waiting job of its own queue.

    The policy keeps each queue's order from round to round; the second rule is
    applied at the start of the next round, from the allocations the last round
    left (``job.alloc``), before arrivals and demotions, exactly where Tiresias
    applies it.  ``queue_order="fifo"`` orders each queue by arrival instead.
    """

    def __init__(self, thresholds: Sequence[float] = (3250.0, 7200.0), queue_order: str = "tiresias") -> None:
        th = [float(t) for t in thresholds]
        if th != sorted(th) or any(t <= 0 for t in th):
            raise ValueError("2d-las thresholds must be positive and increasing")
        if queue_order not in ("tiresias", "fifo"):
            raise ValueError(f"queue_order must be tiresias or fifo, got {queue_order!r}")
        self.thresholds = th
        self.queue_order = queue_order
        self._queue: dict[str, int] = {}  # job id -> queue
        self._pos: dict[str, int] = {}  # job id -> position key inside its queue (smaller first)
        self._next = 0

    def key(self, job: Job, view: View) -> float:
        return bisect.bisect_right(self.thresholds, job.attained_gpu_at(view.now))

    def next_change(self, view: View) -> float:
        """The first demotion: a running job's attained GPU-time reaching its queue's limit.

        (Moving waiting jobs behind running ones changes nothing on a state the last
        round left unchanged: it already did.)
        """
        best = math.inf
        th = self.thresholds
        for job in view.jobs:
            a = job.alloc
            if a is None:
                continue
            att = job.attained_gpu_at(view.now)
            q = bisect.bisect_right(th, att)
            if q < len(th):
                t = view.now + (th[q] - att) / a.num_gpus
                best = min(best, max(view.now, t - _MARGIN * (th[q] + 1.0) / a.num_gpus))
        return best

    def order(self, jobs: Sequence[Job], view: View) -> list[Job]:
        if self.queue_order == "fifo":
            return sorted(jobs, key=lambda j: (self.key(j, view), j.index))
        queue, pos = self._queue, self._pos
        if len(queue) > len(jobs):  # forget finished jobs
            live = {j.id for j in jobs}
            for jid in [x for x in queue if x not in live]:
                del queue[jid], pos[jid]
        # waiting jobs (of the last pass) move behind the running ones, in their order
        waiting = sorted((j for j in jobs if j.id in queue and j.alloc is None), key=lambda j: pos[j.id])
        for j in waiting:
            pos[j.id] = self._next
            self._next += 1
        # arrivals join queue 0's tail, then demotions their new queue's tail (arrival order)
        for j in jobs:
            if j.id not in queue:
                queue[j.id] = 0
                pos[j.id] = self._next
                self._next += 1
        for j in jobs:
            q = self.key(j, view)
            if q > queue[j.id]:
                queue[j.id] = int(q)
                pos[j.id] = self._next
                self._next += 1
        return sorted(jobs, key=lambda j: (queue[j.id], pos[j.id]))


@register("order", "ftf", "themis")
class FTF(KeyOrder):
    """Themis finish-time fairness: ρ = T_shared / T_ideal, worst-off first.

    T_shared = time since arrival + remaining work at full speed; T_ideal =
    the job's duration alone on its requested GPUs.  ρ = 1 means the job is on
    track to finish as if it had the cluster to itself.
    """

    def key(self, job: Job, view: View) -> float:
        return -ftf_rho(job, view.now)

    def slopes(self, job: Job, now: float) -> Slopes:
        # -rho grows more negative with the time waited, less so while the job progresses
        d = job.spec.duration
        if job.alloc is None or job.speed <= 0:
            return (-1.0 / d, -1.0 / d, now)
        return (-1.0 / d, -(1.0 - job.speed) / d, job.busy_until)


def ftf_rho(job: Job, now: float) -> float:
    return ((now - job.spec.arrival) + job.remaining_at(now)) / job.spec.duration
