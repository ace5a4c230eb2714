"""Run results: per-job records, time series, and the summary statistics.

:class:`RunResult` is what :class:`~gpuloom.sim.engine.Simulator` returns and
what reports, CSV/JSON writers and ``gpuloom compare`` read.

Definitions (all times in seconds):

* JCT = finish − arrival; queueing delay = first start − arrival;
* FTF ρ = JCT / duration (Themis finish-time fairness; 1 = as if alone);
* makespan = last finish − first arrival;
* GPU utilisation = time-weighted mean of GPUs held / GPUs in the cluster over
  [first arrival, last event]; CPU and memory likewise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class JobRecord:
    id: str
    model: str
    gpus: int
    arrival: float
    duration: float
    first_start: float | None
    finish: float | None
    preemptions: int
    migrations: int
    resizes: int
    run_time: float  # wall seconds holding resources
    overhead_time: float  # of which launching/restarting
    queued_time: float  # wall seconds waiting after arrival
    phases: dict[str, float] | None = None  # lifecycle mode: queued / launching / running seconds

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.arrival

    @property
    def ftf_rho(self) -> float | None:
        jct = self.jct
        return None if jct is None else jct / self.duration

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["jct"] = self.jct
        d["queueing_delay"] = self.queueing_delay
        d["ftf_rho"] = self.ftf_rho
        return d


@dataclass(slots=True)
class TimeSeries:
    """Piecewise-constant series: value ``v[i]`` holds on ``[t[i], t[i+1])``."""

    t: list[float] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    mem_mb: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)

    def record(self, t: float, gpus: int, cpus: int, mem: int, running: int, queued: int) -> None:
        if self.t and self.t[-1] == t:
            self.gpus[-1], self.cpus[-1], self.mem_mb[-1] = gpus, cpus, mem
            self.running[-1], self.queued[-1] = running, queued
            return
        if self.t and (self.gpus[-1], self.cpus[-1], self.mem_mb[-1], self.running[-1], self.queued[-1]) == (
            gpus, cpus, mem, running, queued
        ):
            return
        self.t.append(t)
        self.gpus.append(gpus)
        self.cpus.append(cpus)
        self.mem_mb.append(mem)
        self.running.append(running)
        self.queued.append(queued)

    FIELDS = ("gpus", "cpus", "mem_mb", "running", "queued")

    def __len__(self) -> int:
        return len(self.t)

    def arrays(self) -> dict[str, np.ndarray]:
        """The series as numpy arrays (``t`` float, the rest int64)."""
        out = {"t": np.asarray(self.t, dtype=float)}
        for name in self.FIELDS:
            out[name] = np.asarray(getattr(self, name), dtype=np.int64)
        return out

    def mean(self, name: str, end: float) -> float:
        """Time-weighted mean of series ``name`` from its first point to ``end``."""
        if not self.t or end <= self.t[0]:
            return 0.0
        t = np.asarray(self.t + [end], dtype=float)
        v = np.asarray(getattr(self, name), dtype=float)
        dt = np.diff(t)
        return float((v * dt).sum() / (end - self.t[0]))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


@dataclass(slots=True)
class RunResult:
    config: dict[str, Any]
    jobs: list[JobRecord]
    series: TimeSeries
    cluster_gpus: int
    cluster_cpus: int
    cluster_mem_mb: int
    end_time: float
    wall_time: float = 0.0
    rounds: int = 0
    rounds_computed: int = 0
    #: what observers recorded, by topic (``"queues"``: :mod:`gpuloom.sim.queue_report`); plain values
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The configuration's label (set by :mod:`gpuloom.sim.runconfig`), else ``order/place``."""
        c = self.config
        return str(c.get("label") or f"{c.get('order', '?')}/{c.get('place', '?')}")

    @property
    def span_end(self) -> float:
        """The end of the observed period: the last event or the last finish."""
        last = max((j.finish for j in self.jobs if j.finish is not None), default=0.0)
        return max(self.end_time, last, self.series.t[-1] if self.series.t else 0.0)

    def jcts(self) -> np.ndarray:
        """JCTs of the finished jobs, in job order."""
        return np.fromiter((j.finish - j.arrival for j in self.jobs if j.finish is not None), dtype=float)

    @property
    def finished(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.finish is not None]

    def summary(self) -> dict[str, Any]:
        done = self.finished
        jcts = [j.jct for j in done if j.jct is not None]
        first = min((j.arrival for j in self.jobs), default=0.0)
        last = max((j.finish for j in done if j.finish is not None), default=first)
        end = max(self.end_time, last)
        geo = float(math.exp(np.mean(np.log(np.maximum(jcts, 1e-9))))) if jcts else math.nan
        s = {
            "jobs": len(self.jobs),
            "completed": len(done),
            "unfinished": len(self.jobs) - len(done),
            "mean_jct": float(np.mean(jcts)) if jcts else math.nan,
            "median_jct": percentile(jcts, 50),
            "p95_jct": percentile(jcts, 95),
            "p99_jct": percentile(jcts, 99),
            "geomean_jct": geo,
            "makespan": last - first,
            "mean_queueing_delay": float(np.mean([j.queueing_delay for j in done])) if done else math.nan,
            "mean_ftf_rho": float(np.mean([j.ftf_rho for j in done])) if done else math.nan,
            "max_ftf_rho": float(np.max([j.ftf_rho for j in done])) if done else math.nan,
            "preemptions": sum(j.preemptions for j in self.jobs),
            "migrations": sum(j.migrations for j in self.jobs),
            "gpu_util": self.series.mean("gpus", end) / self.cluster_gpus if self.cluster_gpus else 0.0,
            "cpu_util": self.series.mean("cpus", end) / self.cluster_cpus if self.cluster_cpus else 0.0,
            "mem_util": self.series.mean("mem_mb", end) / self.cluster_mem_mb if self.cluster_mem_mb else 0.0,
            "rounds": self.rounds,
            "wall_time_s": self.wall_time,
        }
        return s

    def job(self, job_id: str) -> JobRecord:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def jct(self, job_id: str) -> float | None:
        return self.job(job_id).jct
