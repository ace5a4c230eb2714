"""Operator metrics beside :mod:`.telemetry`'s: build info, the process, and per-queue quotas like Kueue's.

* ``gpuloom_build_info{version,python,platform}`` (always 1), and prometheus_client's
  process (``process_*``: CPU seconds, resident memory, open files) and platform
  (``python_info``) collectors, on the service's own registry;
* per queue of the stored tree (``GET /queues``'s figures, read at scrape time):
  ``gpuloom_queue_gpus_used`` (GPUs its running jobs hold, summed up the tree),
  ``gpuloom_queue_gpus_nominal`` (its guarantee), ``gpuloom_queue_gpus_limit`` (its limit,
  left out where it has none), ``gpuloom_queue_pending_jobs`` and
  ``gpuloom_queue_admitted_jobs``; the names follow Kueue's
  ``kueue_cluster_queue_{resource_usage,nominal_quota,borrowing_limit,pending_workloads,admitted_active_workloads}``.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ... import __version__

if TYPE_CHECKING:
    from .queues import QueueAdmin


class QueueHost(Protocol):
    """What the per-queue gauges read of the service: its queue tree."""

    @property
    def queues(self) -> QueueAdmin: ...


class _Build(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily("gpuloom_build_info", "gpuloom's version, and the Python it runs on (always 1).",
                                labels=["version", "python", "platform"])
        fam.add_metric([__version__, platform.python_version(), sys.platform], 1.0)
        yield fam


class _Queues(Collector):
    """Per-queue usage against guarantee and limit, pending and admitted jobs (empty without a queue tree).

    Pending counts the jobs the gate still holds (dependencies, array limits) too (``held``)."""

    def __init__(self, svc: QueueHost) -> None:
        self.svc = svc  # read at scrape time: the service makes its queues after its telemetry

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queues = getattr(self.svc, "queues", None)
        rows = queues.usage()["queues"] if queues is not None else []
        if not rows:
            return
        fams = {
            "used": GaugeMetricFamily("gpuloom_queue_gpus_used", "GPUs the queue's running jobs hold (with its "
                                      "sub-queues').", labels=["queue", "parent"]),
            "nominal": GaugeMetricFamily("gpuloom_queue_gpus_nominal", "GPUs guaranteed to the queue.",
                                         labels=["queue", "parent"]),
            "limit": GaugeMetricFamily("gpuloom_queue_gpus_limit", "Most GPUs the queue may hold (queues "
                                       "without a limit are left out).", labels=["queue", "parent"]),
            "pending": GaugeMetricFamily("gpuloom_queue_pending_jobs", "Jobs waiting in the queue (with its "
                                         "sub-queues'), held ones included.", labels=["queue", "parent"]),
            "admitted": GaugeMetricFamily("gpuloom_queue_admitted_jobs", "Jobs of the queue holding an "
                                          "allocation (with its sub-queues').", labels=["queue", "parent"]),
        }
        for r in rows:
            lab = [r["name"], r["parent"] or ""]
            fams["used"].add_metric(lab, float(r["used"]["gpus"]))
            fams["nominal"].add_metric(lab, float(r["guarantee"]["gpus"]))
            if "gpus" in r["limit"]:
                fams["limit"].add_metric(lab, float(r["limit"]["gpus"]))
            fams["pending"].add_metric(lab, float(r["pending"] + r["held"]))
            fams["admitted"].add_metric(lab, float(r["running"]))
        yield from fams.values()


def register(registry: CollectorRegistry, svc: QueueHost) -> None:
    """Add build info, the process and platform collectors and the per-queue gauges to ``registry``."""
    registry.register(_Build())
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(_Queues(svc))
