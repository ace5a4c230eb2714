"""Ordering policies: which jobs come first.

Every policy sorts by a key, ties broken by arrival order (``Job.index``, the
job's position in arrival order), so results are deterministic.  Keys read the job's state as of the round (the
simulator advances every running job to ``now`` first).

========  =====================================================================
fifo      arrival time
sjf       total duration (known in advance)
srtf      remaining work
las       attained service (wall seconds held)
2d-las    Tiresias: discretised queues on attained GPU-time, FIFO inside a queue
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


@register("order", "2d-las", "tiresias")
class TwoDLAS(_KeyOrder):
    """Tiresias' discretised 2D-LAS: queue index from attained GPU-seconds.

    ``thresholds`` are the queue limits in GPU-seconds (Tiresias' defaults
    3250, 7200, 18000 split four queues); inside a queue, FIFO.
    """

    def __init__(self, thresholds: Sequence[float] = (3250.0, 7200.0, 18000.0)) -> None:
        th = [float(t) for t in thresholds]
        if th != sorted(th) or any(t <= 0 for t in th):
            raise ValueError("2d-las thresholds must be positive and increasing")
        self.thresholds = th

    def key(self, job: Job, view: View) -> float:
        return bisect.bisect_right(self.thresholds, job.attained_gpu_time)


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
