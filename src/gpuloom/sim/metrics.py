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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np

from ..core.lifecycle import PHASES

_T = TypeVar("_T")


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
        return self.means((name,), end)[name]

    def means(self, names: Sequence[str], end: float) -> dict[str, float]:
        """:meth:`mean` of each of ``names`` (the time steps computed once)."""
        if not self.t or end <= self.t[0]:
            return dict.fromkeys(names, 0.0)
        t = np.empty(len(self.t) + 1)
        t[:-1] = self.t
        t[-1] = end
        dt = np.diff(t)
        span = end - self.t[0]
        return {name: float((np.asarray(getattr(self, name), dtype=float) * dt).sum() / span) for name in names}

    def means_between(self, names: Sequence[str], start: float, end: float) -> dict[str, float]:
        """Time-weighted mean of each of ``names`` over ``[start, end]`` (0 before the first point; the
        value at ``start`` where ``end <= start``)."""
        if not self.t:
            return dict.fromkeys(names, 0.0)
        t = np.asarray(self.t, dtype=float)
        k = int(np.searchsorted(t, start, side="right")) - 1  # the point holding at start (-1: before the first)
        if end <= start:
            return {name: float(getattr(self, name)[k]) if k >= 0 else 0.0 for name in names}
        lo = np.clip(t, start, end)
        hi = np.clip(np.append(t[1:], np.inf), start, end)
        dt = hi - lo
        return {name: float((np.asarray(getattr(self, name), dtype=float) * dt).sum() / (end - start))
                for name in names}


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
    #: the measurement window (:mod:`gpuloom.sim.window`): jobs A..B-1 by arrival order, whose figures the
    #: summary reads; None: every job.  Set with :meth:`measure`.
    window: tuple[int, int] | None = None
    #: what :meth:`summary`, :meth:`themis` and the columns they read computed, each with its :meth:`_memo_key`
    _memo: dict[str, tuple[tuple, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

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
        """JCTs of the finished jobs (of the window, if one is set), in job order (from the columns the summary
        reads: each ``j.finish - j.arrival``, the same float subtracted by numpy)."""
        c = self._columns()
        keep = c["done"] if self.window is None else c["done"] & self.measured_mask()
        return c["finish"][keep] - c["arrival"][keep]

    def measure(self, window: tuple[int, int] | None) -> RunResult:
        """Set the measurement window (jobs A..B-1 by arrival order; None: every job) and return self; a
        :class:`~gpuloom.sim.window.WindowError` if it does not fit the run's jobs."""
        from .window import check_window

        self.window = None if window is None else check_window(window, len(self.jobs))
        return self

    def measured_mask(self) -> np.ndarray:
        """Per job, in job order: True if the job is in the window (every job without one)."""
        if self.window is None:
            return np.ones(len(self.jobs), dtype=bool)
        from .window import mask

        return mask(self._columns()["arrival"], self.window)

    @property
    def finished(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.finish is not None]

    def _memo_key(self) -> tuple:
        """What the figures of :meth:`summary` and :meth:`themis` are computed from, cheaply: a result whose
        jobs, series or counters are replaced or appended to gets new figures.  (A run's records are final:
        a record edited in place after the figures were read is not seen.)"""
        return (id(self.jobs), len(self.jobs), id(self.series), len(self.series), self.end_time, self.wall_time,
                self.rounds, self.cluster_gpus, self.cluster_cpus, self.cluster_mem_mb, len(self.impossible),
                len(self.stalled), self.window)

    def _memoised(self, name: str, compute: Callable[[], _T]) -> _T:
        key = self._memo_key()
        hit = self._memo.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = compute()
        self._memo[name] = (key, value)
        return value

    def summary(self) -> dict[str, Any]:
        """The run's figures (module docstring), computed once per result and reused by every report,
        table and plot (a new dict each call)."""
        return dict(self._memoised("summary", self._compute_summary))

    def summary_times(self) -> dict[str, Any]:
        """:meth:`summary` but Themis' figures (``mean_ftf_rho`` and ``max_ftf_rho`` None, in their places): what
        the time unit of a report and the plots read, known before :meth:`themis` is computed (a new dict each
        call; computed once per result, and :meth:`summary` adds Themis' figures to it)."""
        return dict(self._memoised("summary_times", self._compute_summary_times))

    def _compute_summary(self) -> dict[str, Any]:
        s = self.summary_times()
        s["mean_ftf_rho"], s["max_ftf_rho"] = self._ftf_figures()
        return s

    def _ftf_figures(self) -> tuple[float, float]:
        """The summary's ``mean_ftf_rho`` and ``max_ftf_rho``: Themis' ρ over the finished jobs (the window's, if
        one is set); NaN if none finished."""
        c = self._columns()
        if self.window is None:
            if not c["done"].any():
                return math.nan, math.nan
            rho = self.themis()[1]
            rho = rho[~np.isnan(rho)]
            return float(np.mean(rho)), float(np.max(rho))
        done = c["done"] & self.measured_mask()
        rho = self.themis()[1][done]
        if not done.any() or np.isnan(rho).all():
            return math.nan, math.nan
        return float(np.nanmean(rho)), float(np.nanmax(rho))

    def _compute_summary_times(self) -> dict[str, Any]:
        if self.window is not None:
            return self._compute_window_summary(self.window)
        jobs = self.jobs
        c = self._columns()
        done = c["done"]
        jct = c["finish"][done] - c["arrival"][done]  # each finished job's j.jct, in job order
        jcts = len(jct) > 0
        first = min(map(attrgetter("arrival"), jobs), default=0.0)  # (the records' own values and types)
        last = max((f for f in map(attrgetter("finish"), jobs) if f is not None), default=first)
        end = max(self.end_time, last)
        geo = float(math.exp(np.mean(np.log(np.maximum(jct, 1e-9))))) if jcts else math.nan
        slow = jct / c["duration"][done]
        util = self.series.means(("gpus", "cpus", "mem_mb"), end)
        s = {
            "jobs": len(jobs),
            "completed": len(jct),
            "unfinished": len(jobs) - len(jct),
            "mean_jct_s": float(np.mean(jct)) if jcts else math.nan,
            "median_jct_s": float(np.percentile(jct, 50)) if jcts else math.nan,
            "p95_jct_s": float(np.percentile(jct, 95)) if jcts else math.nan,
            "p99_jct_s": float(np.percentile(jct, 99)) if jcts else math.nan,
            "geomean_jct_s": geo,
            "makespan_s": last - first,
            "mean_queueing_delay_s": float(np.mean(c["first_start"][done] - c["arrival"][done])) if jcts else math.nan,
            "mean_slowdown": float(np.mean(slow)) if jcts else math.nan,
            "max_slowdown": float(np.max(slow)) if jcts else math.nan,
            "mean_ftf_rho": None,  # (Themis' figures: _compute_summary)
            "max_ftf_rho": None,
            "preemptions": sum(map(attrgetter("preemptions"), jobs)),
            "migrations": sum(map(attrgetter("migrations"), jobs)),
            "gpu_util": util["gpus"] / self.cluster_gpus if self.cluster_gpus else 0.0,
            "cpu_util": util["cpus"] / self.cluster_cpus if self.cluster_cpus else 0.0,
            "mem_util": util["mem_mb"] / self.cluster_mem_mb if self.cluster_mem_mb else 0.0,
            "rounds": self.rounds,
            "impossible": len(self.impossible),
            "stalled": len(self.stalled),
            "wall_time_s": self.wall_time,
        }
        s.update({old: s[new] for old, new in DEPRECATED_KEYS.items()})
        return s

    def _compute_window_summary(self, window: tuple[int, int]) -> dict[str, Any]:
        """:meth:`_compute_summary_times` over the window's jobs: the same keys, plus ``measure_jobs`` (``"A:B"``).
        Makespan is the window's last finish minus its first arrival; utilisation is averaged over the window's
        span (its first arrival to its last finish, or to the end of the run if one of its jobs is unfinished);
        ``rounds`` and ``wall_time_s`` are the whole run's."""
        from .window import text

        c = self._columns()
        inw = self.measured_mask()
        done = c["done"] & inw
        jct = c["finish"][done] - c["arrival"][done]
        jcts = len(jct) > 0
        arrivals = c["arrival"][inw]
        first = float(arrivals.min())
        last = float(c["finish"][done].max()) if jcts else first
        end = max(self.end_time, last)
        span_end = last if done.sum() == inw.sum() else end
        slow = jct / c["duration"][done]
        util = self.series.means_between(("gpus", "cpus", "mem_mb"), first, span_end)
        ids = {self.jobs[i].id for i in np.flatnonzero(inw)}
        s = {
            "jobs": int(inw.sum()),
            "completed": len(jct),
            "unfinished": int(inw.sum()) - len(jct),
            "mean_jct_s": float(np.mean(jct)) if jcts else math.nan,
            "median_jct_s": float(np.percentile(jct, 50)) if jcts else math.nan,
            "p95_jct_s": float(np.percentile(jct, 95)) if jcts else math.nan,
            "p99_jct_s": float(np.percentile(jct, 99)) if jcts else math.nan,
            "geomean_jct_s": float(math.exp(np.mean(np.log(np.maximum(jct, 1e-9))))) if jcts else math.nan,
            "makespan_s": last - first,
            "mean_queueing_delay_s": float(np.mean(c["first_start"][done] - c["arrival"][done])) if jcts else math.nan,
            "mean_slowdown": float(np.mean(slow)) if jcts else math.nan,
            "max_slowdown": float(np.max(slow)) if jcts else math.nan,
            "mean_ftf_rho": None,  # (Themis' figures: _compute_summary)
            "max_ftf_rho": None,
            "preemptions": sum(self.jobs[i].preemptions for i in np.flatnonzero(inw)),
            "migrations": sum(self.jobs[i].migrations for i in np.flatnonzero(inw)),
            "gpu_util": util["gpus"] / self.cluster_gpus if self.cluster_gpus else 0.0,
            "cpu_util": util["cpus"] / self.cluster_cpus if self.cluster_cpus else 0.0,
            "mem_util": util["mem_mb"] / self.cluster_mem_mb if self.cluster_mem_mb else 0.0,
            "rounds": self.rounds,
            "impossible": sum(1 for i in self.impossible if i in ids),
            "stalled": sum(1 for i in self.stalled if i in ids),
            "wall_time_s": self.wall_time,
            "measure_jobs": text(window),
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
        job's lifetime and Themis' finish-time fairness (module docstring); NaN if unfinished.
        Computed once per result (:meth:`summary`); the arrays are read-only."""
        return self._memoised("themis", self._compute_themis)

    def _compute_themis(self) -> tuple[np.ndarray, np.ndarray]:
        N, rho = self._themis_arrays()
        N.flags.writeable = False
        rho.flags.writeable = False
        return N, rho

    def _columns(self) -> dict[str, np.ndarray]:
        """Per job, in job order, what the figures read, as float arrays: ``arrival``, ``finish``,
        ``first_start`` (NaN where None), ``duration``, ``gpus``; and ``done`` (finished), a boolean mask."""
        return self._memoised("columns", self._compute_columns)

    def _compute_columns(self) -> dict[str, np.ndarray]:
        jobs = self.jobs

        def floats(name: str) -> np.ndarray:
            return np.array(list(map(attrgetter(name), jobs)), dtype=float) if jobs else np.zeros(0)  # (None: NaN)

        c = {name: floats(name) for name in ("arrival", "finish", "first_start", "duration", "gpus")}
        c["done"] = ~np.isnan(c["finish"])
        return c

    def _themis_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.jobs)
        N = np.full(n, math.nan)
        rho = np.full(n, math.nan)
        c = self._columns()
        idx = np.flatnonzero(c["done"] & (c["finish"] > c["arrival"]))
        if not len(idx) or not self.series.t:
            return N, rho
        t, active, F = self.active_integral()
        arr = c["arrival"][idx]
        fin = c["finish"][idx]

        def integral(x: np.ndarray) -> np.ndarray:  # ∫ active from t[0] to x (0 before t[0])
            k = np.searchsorted(t, x, side="right") - 1
            kk = np.clip(k, 0, len(t) - 1)
            return np.where(k < 0, 0.0, F[kk] + active[kk] * (x - t[kk]))

        jct = fin - arr
        n_avg = np.maximum((integral(fin) - integral(arr)) / jct, 1.0)  # the job itself contends
        g = c["gpus"][idx]
        dur = c["duration"][idx]
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
