"""Ordering policies: which jobs come first.

Every policy sorts by a key, ties broken by arrival order (``Job.index``, the
job's position in arrival order), so results are deterministic.  Keys read the job's state as of the round (the
simulator advances every running job to ``now`` first).

========  =====================================================================
fifo      arrival time
sjf       total duration (known in advance)
srtf      remaining work
las       attained service (wall seconds held)
2d-las    Tiresias: discretised queues on attained GPU-time; inside a queue
          Tiresias' order (new and demoted jobs join the tail, running jobs
          stay ahead of waiting ones)
las-gpu   attained GPU-time (continuous 2D-LAS; Muri-L's order in Muri's simulator)
srsf      remaining work × GPUs
ftf       Themis finish-time fairness ρ = (elapsed + remaining) / duration,
          largest ρ first
========  =====================================================================
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..core.job import Job
from .base import OrderPolicy, View, register


class _KeyOrder(OrderPolicy):
    def key(self, job: Job, view: View) -> float:
        raise NotImplementedError

    def order(self, jobs: Sequence[Job], view: View) -> list[Job]:
        return sorted(jobs, key=lambda j: (self.key(j, view), j.index))


@register("order", "fifo")
class FIFO(_KeyOrder):
    dynamic = False

    def key(self, job: Job, view: View) -> float:
        return job.spec.arrival

    def order(self, jobs: Sequence[Job], view: View) -> list[Job]:
        # a View lists its jobs in arrival order (Job.index increasing) already:
        # no sort and no copy, which matters with tens of thousands of queued jobs
        return jobs if isinstance(jobs, list) else list(jobs)


@register("order", "sjf")
class SJF(_KeyOrder):
    dynamic = False

    def key(self, job: Job, view: View) -> float:
        return job.spec.duration


@register("order", "srtf")
class SRTF(_KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.remaining


@register("order", "las")
class LAS(_KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.attained_time


@register("order", "srsf")
class SRSF(_KeyOrder):
    def key(self, job: Job, view: View) -> float:
        return job.remaining * job.spec.gpus


@register("order", "las-gpu")
class LASGPU(_KeyOrder):
    """Least attained GPU-seconds first (2D-LAS without queues)."""

    def key(self, job: Job, view: View) -> float:
        return job.attained_gpu_time


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
        return bisect.bisect_right(self.thresholds, job.attained_gpu_time)

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
class FTF(_KeyOrder):
    """Themis finish-time fairness: ρ = T_shared / T_ideal, worst-off first.

    T_shared = time since arrival + remaining work at full speed; T_ideal =
    the job's duration alone on its requested GPUs.  ρ = 1 means the job is on
    track to finish as if it had the cluster to itself.
    """

    def key(self, job: Job, view: View) -> float:
        return -ftf_rho(job, view.now)


def ftf_rho(job: Job, now: float) -> float:
    return ((now - job.spec.arrival) + job.remaining) / job.spec.duration
