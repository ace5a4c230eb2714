"""Run results: per-job records, time series, and the summary statistics.

:class:`RunResult` is what :class:`~gpuloom.sim.engine.Simulator` returns and
what reports, CSV/JSON writers and ``gpuloom compare`` read.

Definitions (all times in seconds):

* JCT = finish − arrival; queueing delay = first start − arrival;
* slowdown = JCT / duration (1 = ran at full speed from its arrival, as if alone
  on a cluster big enough for it);
* FTF ρ, Themis' finish-time fairness (Mahajan et al., NSDI'20): ρ = T_sh / T_id,
  where T_sh is the job's time in the shared cluster (its JCT) and T_id the time
  it would take in an independent 1/N share of the cluster, N being the number
  of contending jobs averaged over its lifetime.  Here, exactly:

  - N = (1 / JCT) ∫ active(t) dt over [arrival, finish], where active(t) counts
    the jobs that have arrived and not finished (running or queued, the job
    itself included), read from the run's time series;
  - a 1/N share of a cluster of G GPUs is G / N GPUs.  A rigid job asking for
    g GPUs can use them a fraction min(1, G / (N g)) of the time, so
    T_id = duration × max(1, N g / G).

  ρ < 1: the job did better than its fair share would have given it; ρ > 1:
  worse.  A job alone on a cluster that holds it has N = 1 and ρ = slowdown = 1.
  This is the rigid-job reading of Gavel's "isolated" allocation (each of N
  jobs gets G/N of the cluster, time-shared when it needs more GPUs).
* makespan = last finish − first arrival;
* GPU utilisation = time-weighted mean of GPUs held / GPUs in the cluster over
  [first arrival, last event]; CPU and memory likewise.

:meth:`RunResult.summary` names each time with its unit (``mean_jct_s``, ``makespan_s``, ...; seconds);
utilisations are fractions (0 to 1).  The names without a unit (``mean_jct``, ...:
:data:`DEPRECATED_KEYS`) are kept beside them for one release.

Unfinished jobs have no JCT, slowdown or ρ (``None`` / NaN) and are left out of
the statistics; ``unfinished`` counts them, ``impossible`` lists those that
could never run on the cluster and ``stalled`` those the stall guard found
waiting with no way forward.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core.lifecycle import PHASES


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
    #: queued / launching / running seconds (:data:`~gpuloom.core.lifecycle.PHASES`); a tuple, not a
    #: dict, because a run of a million jobs keeps a million of them
    phase_s: tuple[float, float, float] | None = None

    @property
    def phases(self) -> dict[str, float] | None:
        """Seconds queued, launching and running, by name (None for a job that never arrived)."""
        return None if self.phase_s is None else dict(zip(PHASES, self.phase_s, strict=True))

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.arrival

    @property
    def slowdown(self) -> float | None:
        """JCT / duration (not Themis' ρ: see :meth:`RunResult.themis`)."""
        jct = self.jct
        return None if jct is None else jct / self.duration

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["phase_s"]
        d["phases"] = self.phases
        d["jct"] = self.jct
        d["queueing_delay"] = self.queueing_delay
        d["slowdown"] = self.slowdown
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
        ts = self.t
        if ts:
            if ts[-1] == t:
                self.gpus[-1], self.cpus[-1], self.mem_mb[-1] = gpus, cpus, mem
                self.running[-1], self.queued[-1] = running, queued
                return
            # nothing changed: no new point (compared one by one, cheapest first, without tuples)
            if (self.running[-1] == running and self.queued[-1] == queued and self.gpus[-1] == gpus
                    and self.cpus[-1] == cpus and self.mem_mb[-1] == mem):
                return
        ts.append(t)
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


#: summary keys renamed to carry their unit, old name -> new; the old names stay (same values) for one
#: release: 0.2 drops them
DEPRECATED_KEYS = {
    "mean_jct": "mean_jct_s", "median_jct": "median_jct_s", "p95_jct": "p95_jct_s", "p99_jct": "p99_jct_s",
    "geomean_jct": "geomean_jct_s", "makespan": "makespan_s", "mean_queueing_delay": "mean_queueing_delay_s",
}


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
    impossible: dict[str, str] = field(default_factory=dict)  # job id -> why it can never run here
    stalled: list[str] = field(default_factory=list)  # jobs waiting when the stall guard stopped the run
    meta: dict[str, Any] = field(default_factory=dict)  # what the run was made from: trace, version, ...
    #: what observers recorded, by topic (``"queues"``: :mod:`gpuloom.sim.queue_report`); plain values
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The configuration's label (set by :mod:`gpuloom.sim.runconfig`), else :attr:`stages`."""
        return str(self.config.get("label") or self.stages)

    @property
    def stages(self) -> str:
        """The full pipeline: ``order/group/size/place`` (``srsf/muri/proportional/packed-sticky``)."""
        c = self.config
        return "/".join(str(c.get(k, "?")) for k in ("order", "group", "size", "place"))

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
        slow = [float(j.slowdown) for j in done if j.slowdown is not None]
        rho = self.themis()[1]
        rho = rho[~np.isnan(rho)]
        s = {
            "jobs": len(self.jobs),
            "completed": len(done),
            "unfinished": len(self.jobs) - len(done),
            "mean_jct_s": float(np.mean(jcts)) if jcts else math.nan,
            "median_jct_s": percentile(jcts, 50),
            "p95_jct_s": percentile(jcts, 95),
            "p99_jct_s": percentile(jcts, 99),
            "geomean_jct_s": geo,
            "makespan_s": last - first,
            "mean_queueing_delay_s": float(np.mean([j.queueing_delay for j in done])) if done else math.nan,
            "mean_slowdown": float(np.mean(slow)) if done else math.nan,
            "max_slowdown": float(np.max(slow)) if done else math.nan,
            "mean_ftf_rho": float(np.mean(rho)) if done else math.nan,
            "max_ftf_rho": float(np.max(rho)) if done else math.nan,
            "preemptions": sum(j.preemptions for j in self.jobs),
            "migrations": sum(j.migrations for j in self.jobs),
            "gpu_util": self.series.mean("gpus", end) / self.cluster_gpus if self.cluster_gpus else 0.0,
            "cpu_util": self.series.mean("cpus", end) / self.cluster_cpus if self.cluster_cpus else 0.0,
            "mem_util": self.series.mean("mem_mb", end) / self.cluster_mem_mb if self.cluster_mem_mb else 0.0,
            "rounds": self.rounds,
            "impossible": len(self.impossible),
            "stalled": len(self.stalled),
            "wall_time_s": self.wall_time,
        }
        s.update({old: s[new] for old, new in DEPRECATED_KEYS.items()})
        return s

    def active_integral(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t, active, F)``: the active-job count (running + queued) as a step function and
        its integral ``F[i] = ∫ active dt`` from ``t[0]`` to ``t[i]``."""
        s = self.series
        t = np.asarray(s.t, dtype=float)
        active = np.asarray(s.running, dtype=float) + np.asarray(s.queued, dtype=float)
        F = np.concatenate([[0.0], np.cumsum(active[:-1] * np.diff(t))]) if len(t) else t
        return t, active, F

    def themis(self) -> tuple[np.ndarray, np.ndarray]:
        """Per job, in job order: ``(N, ρ)``, the average number of contending jobs over the
        job's lifetime and Themis' finish-time fairness (module docstring); NaN if unfinished."""
        n = len(self.jobs)
        N = np.full(n, math.nan)
        rho = np.full(n, math.nan)
        idx = [i for i, j in enumerate(self.jobs) if j.finish is not None and j.finish > j.arrival]
        if not idx or not self.series.t:
            return N, rho
        t, active, F = self.active_integral()
        arr = np.array([self.jobs[i].arrival for i in idx])
        fin = np.array([self.jobs[i].finish for i in idx], dtype=float)

        def integral(x: np.ndarray) -> np.ndarray:  # ∫ active from t[0] to x (0 before t[0])
            k = np.searchsorted(t, x, side="right") - 1
            kk = np.clip(k, 0, len(t) - 1)
            return np.where(k < 0, 0.0, F[kk] + active[kk] * (x - t[kk]))

        jct = fin - arr
        n_avg = np.maximum((integral(fin) - integral(arr)) / jct, 1.0)  # the job itself contends
        g = np.array([self.jobs[i].gpus for i in idx], dtype=float)
        dur = np.array([self.jobs[i].duration for i in idx], dtype=float)
        t_id = dur * np.maximum(1.0, n_avg * g / max(self.cluster_gpus, 1))
        N[idx] = n_avg
        rho[idx] = jct / t_id
        return N, rho

    def job(self, job_id: str) -> JobRecord:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def jct(self, job_id: str) -> float | None:
        return self.job(job_id).jct
