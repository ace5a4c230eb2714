"""NVML readings attributed to jobs: per GPU now, per job over its life (stored), for metrics and views.

:meth:`JobGpus.observe` runs with each of telemetry's samples (on the loop, every ``sample_s`` at
most): it takes the executor's latest readings (:meth:`..exec.executor.Executor.gpu_readings`,
sampled off the loop), matches each GPU to the job whose allocation holds it, and folds them into
the job's totals: samples, mean and max utilisation of its GPUs, the most memory they held at
once, and the energy they drew (power x the service-time interval between two of its samples;
unknown as soon as a GPU has no power sensor).  The totals are stored (:mod:`..state.gpudb`) with
every sample, so ``history`` has them after the job ends and a restart continues them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..state import gpudb
from ..state.store import unavailable

if TYPE_CHECKING:
    from ..exec.gpustats import GpuReading

log = logging.getLogger("gpuloom.service")
RECENT_POINTS = 300  # per running job, for its chart: 10 minutes of 2 s samples (bounded memory)


@dataclass(slots=True)
class _Acc:
    samples: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    mem_max_mb: float = 0.0
    energy_j: float | None = 0.0
    last: float | None = None  # service time of the job's last sample (this incarnation)
    row: dict[str, Any] = field(default_factory=dict)

    def as_row(self, now: float) -> dict[str, Any]:
        return {"samples": self.samples, "util_sum": self.util_sum, "util_max": self.util_max,
                "mem_max_mb": self.mem_max_mb, "energy_j": self.energy_j, "updated": now}


class JobGpus:
    """The latest reading of each GPU with the job holding it, and each running job's totals."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        #: (node name, node-local GPU) -> (reading, job id holding it or None)
        self.gpus: dict[tuple[str, int], tuple[GpuReading, str | None]] = {}
        self._acc: dict[str, _Acc] = {}
        #: job id -> its recent (wall time, mean utilisation, memory MiB) points, for its page's chart
        self.recent: dict[str, deque[tuple[float, float, float]]] = {}
        self._stored: set[int] = set()

    def readings(self) -> dict[str, dict[int, GpuReading]]:
        try:
            return self.svc.executor.gpu_readings()
        except Exception as e:  # an executor that cannot answer now (a node gone): no readings this time
            log.debug("GPU readings unavailable: %s", e)
            return {}

    def observe(self, now: float) -> None:
        """Attribute the latest readings (``now``: service time, for energy) and store the jobs' totals."""
        got = self.readings()
        cl = self.svc.cluster
        holder: dict[tuple[str, int], str] = {}
        for jid, a in dict(self.svc.driver.current).items():
            for p in a.parts:
                for g in p.gpus:
                    holder[cl.nodes[p.node].name, cl.local_index(g)] = jid
        self.gpus = {(node, i): (r, holder.get((node, i))) for node, rs in got.items() for i, r in rs.items()}
        per_job: dict[str, list[GpuReading]] = {}
        for (node, i), jid in holder.items():
            r = got.get(node, {}).get(i)
            if r is not None:
                per_job.setdefault(jid, []).append(r)
        holding = set(holder.values())
        for jid in [j for j in self._acc if j not in holding]:  # ended or stopped: its totals are stored
            del self._acc[jid]
        for jid in [j for j in self.recent if j not in holding]:
            del self.recent[jid]
        if not per_job:
            return
        fresh = [int(j) for j in per_job if j not in self._acc]
        try:
            stored = gpudb.load_usage(self.svc.store, fresh)
        except Exception as e:
            if not unavailable(e):
                raise
            return  # the store cannot answer: this sample is not counted (totals stay consistent with it)
        for jid in map(str, fresh):
            acc = self._acc[jid] = _Acc()
            r0 = stored.get(int(jid))
            if r0 is not None:  # a restart, or a relaunch: continue its totals
                self._stored.add(int(jid))
                acc.samples, acc.util_sum, acc.util_max = int(r0["samples"]), r0["util_sum"], r0["util_max"]
                acc.mem_max_mb, acc.energy_j = r0["mem_max_mb"], r0["energy_j"]
        rows: dict[int, dict[str, Any]] = {}
        for jid, rs in per_job.items():
            acc = self._acc[jid]
            util = sum(r.util for r in rs) / len(rs)
            acc.samples += 1
            acc.util_sum += util
            acc.util_max = max(acc.util_max, max(r.util for r in rs))
            acc.mem_max_mb = max(acc.mem_max_mb, sum(r.mem_used_mb for r in rs))
            powers = [r.power_w for r in rs]
            if acc.energy_j is not None:
                if any(p is None for p in powers):
                    acc.energy_j = None
                elif acc.last is not None:
                    acc.energy_j += sum(p for p in powers if p is not None) * max(0.0, now - acc.last)
            acc.last = now
            self.recent.setdefault(jid, deque(maxlen=RECENT_POINTS)).append(
                (self.svc.clock.time(), util, sum(r.mem_used_mb for r in rs)))
            rows[int(jid)] = acc.as_row(self.svc.clock.time())
        try:
            gpudb.save_usage(self.svc.store, rows, self._stored)
            self._stored |= set(rows)
        except Exception as e:
            if not unavailable(e):
                raise
            log.debug("GPU usage not stored this time: %s", e)

    def util(self, node: str, gpu: int) -> float | None:
        """The GPU's utilisation at the last sample, or None where it is not sampled."""
        got = self.gpus.get((node, gpu))
        return None if got is None else got[0].util

    def job_now(self, jid: str) -> list[dict[str, Any]]:
        """The job's GPUs at the last sample: node, GPU, utilisation, memory, power, temperature."""
        return [{"node": node, "gpu": i, "util": r.util, "mem_used_mb": round(r.mem_used_mb, 1),
                 "mem_total_mb": round(r.mem_total_mb, 1), "power_w": r.power_w, "temp_c": r.temp_c}
                for (node, i), (r, j) in sorted(self.gpus.items()) if j == jid]


class GpuCollector(Collector):
    """DCGM-exporter-like gauges per GPU (labelled with the job holding it, "" when none) and per job."""

    def __init__(self, gpus: JobGpus) -> None:
        self.g = gpus

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lab = ["node", "gpu", "job", "user"]
        fams = {
            "util": GaugeMetricFamily("gpuloom_gpu_utilization", "GPU utilisation, percent (DCGM_FI_DEV_GPU_UTIL).",
                                      labels=lab),
            "mem": GaugeMetricFamily("gpuloom_gpu_memory_used_bytes", "GPU memory used (DCGM_FI_DEV_FB_USED, "
                                     "in bytes).", labels=lab),
            "total": GaugeMetricFamily("gpuloom_gpu_memory_total_bytes", "GPU memory in all.", labels=lab),
            "power": GaugeMetricFamily("gpuloom_gpu_power_watts", "GPU power draw (DCGM_FI_DEV_POWER_USAGE).",
                                       labels=lab),
            "temp": GaugeMetricFamily("gpuloom_gpu_temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
                                      labels=lab),
        }
        rows = dict(self.g.svc.mirror.rows)
        jobs: dict[str, list[GpuReading]] = {}
        for (node, i), (r, jid) in sorted(self.g.gpus.items()):
            row = rows.get(jid) if jid is not None else None
            labels = [node, str(i), jid or "", row.user if row is not None else ""]
            fams["util"].add_metric(labels, r.util)
            fams["mem"].add_metric(labels, r.mem_used_mb * 2**20)
            fams["total"].add_metric(labels, r.mem_total_mb * 2**20)
            if r.power_w is not None:
                fams["power"].add_metric(labels, r.power_w)
            if r.temp_c is not None:
                fams["temp"].add_metric(labels, r.temp_c)
            if jid is not None:
                jobs.setdefault(jid, []).append(r)
        yield from fams.values()
        ju = GaugeMetricFamily("gpuloom_job_gpu_utilization", "Mean utilisation of the job's GPUs, percent.",
                               labels=["job", "user"])
        jm = GaugeMetricFamily("gpuloom_job_gpu_memory_used_bytes", "GPU memory the job's GPUs use.",
                               labels=["job", "user"])
        for jid, rs in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            row = rows.get(jid)
            labels = [jid, row.user if row is not None else ""]
            ju.add_metric(labels, sum(r.util for r in rs) / len(rs))
            jm.add_metric(labels, sum(r.mem_used_mb for r in rs) * 2**20)
        yield ju
        yield jm
