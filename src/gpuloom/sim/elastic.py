"""F-scheduling experiments and reports: the thesis scenario, phase breakdowns, utilisation CDFs.

* :func:`thesis_specs` builds the F-scheduling thesis workload: ResNet-50 and
  InceptionV3 training jobs of 2,000 steps arriving at 0, 100, 200, 300 s on
  one 6-GPU machine.  A job asks for 1 GPU.  As in the thesis a "step" is a
  *global* step of 90 samples split over the job's GPUs (strong scaling):
  each job carries its curve g(n) in global steps/s
  (:func:`~gpuloom.perf.scaling.strong_scaling_curve` of the built-in
  weak-scaling curve), so its reference duration is 2000 / g(1) s, and the
  hysteresis threshold (1 step/s in the thesis) is in global steps/s, the
  unit of ``iterations_per_second``.  ``step="gpu"`` keeps the older reading
  (one per-GPU mini-batch on the weak-scaling curve).
* :func:`compare_elastic_static` runs elastic sizing (F-scheduling) and the
  static-slot baseline on the same jobs in lifecycle mode and returns the
  results by name.
* :func:`phase_breakdown` gives, per job, seconds queued / launching
  (including checkpoint and stop, i.e. reallocating) / running, from the
  lifecycle; :func:`plot_phase_breakdown` draws them as stacked bars, one
  panel per configuration.
* :func:`utilisation_cdf` is the time-weighted CDF of a GPU-utilisation
  series between the first arrival and the end of the run.  Two series exist:
  GPUs *held* (allocated, whether launching, reallocating or running: the
  engine's own series) and GPUs *busy* (held by jobs making progress, i.e.
  RUNNING_PROTECTED or RUNNING), recorded by :class:`UsageRecorder`, an
  engine observer; :func:`plot_utilisation_cdf` draws both, one panel each.

matplotlib is imported lazily (Agg backend) so that the simulator never needs it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..perf.scaling import THESIS_SAMPLES_PER_STEP, WEAK_SCALING_BATCH, builtin_curve, strong_scaling_curve
from ..policies.base import STAGE_DEFAULTS
from ..scheduler import Scheduler
from .engine import LifecycleTimes, SimConfig, Simulator
from .metrics import RunResult

THESIS_ARRIVALS = ((0.0, "resnet50"), (100.0, "inception3"), (200.0, "resnet50"), (300.0, "inception3"))


def thesis_specs(steps: int = 2000, arrivals: Sequence[tuple[float, str]] = THESIS_ARRIVALS,
                 step: str = "global", samples_per_step: float = THESIS_SAMPLES_PER_STEP,
                 batch: float = WEAK_SCALING_BATCH, max_gpus: int = 6) -> list[JobSpec]:
    if step not in ("global", "gpu"):
        raise ValueError(f"step must be global or gpu, got {step!r}")
    out = []
    for i, (t, model) in enumerate(arrivals):
        c = builtin_curve(model)
        if c is None or c(1) <= 0:
            raise ValueError(f"no built-in throughput curve for {model!r} at 1 GPU")
        if step == "gpu":
            out.append(JobSpec.from_iterations(f"{i}-{model}", t, 1, steps, 1.0 / c(1), model=model))
            continue
        g = strong_scaling_curve(c, samples_per_step, batch, max_gpus)
        out.append(JobSpec.from_iterations(f"{i}-{model}", t, 1, steps, 1.0 / g[1], model=model,
                                           attrs={"throughput": g}))
    return out


class UsageRecorder:
    """Engine observer: GPUs held and GPUs busy (held by a job past its ``busy_until``) over time.

    Allocations change only in rounds and at completions, where the engine
    calls its observers; each job's (GPUs, busy_until) is compared with the
    previous call and closed intervals are kept as +/- steps.
    """

    def __init__(self) -> None:
        self._open: dict[str, tuple[float, int, float]] = {}  # job -> (since, gpus, busy_until)
        self._steps: list[tuple[float, int, int]] = []  # (time, d_held, d_busy)
        self.end = 0.0

    def _close(self, since: float, gpus: int, busy: float, now: float) -> None:
        self._steps += [(since, gpus, 0), (now, -gpus, 0)]
        b0 = max(since, busy)
        if now > b0:
            self._steps += [(b0, 0, gpus), (now, 0, -gpus)]

    def __call__(self, sim: Simulator, event: str) -> None:
        now = sim.now
        self.end = now
        seen = set()
        for jid, a in sim.current.items():
            seen.add(jid)
            job = sim.by_id[jid]
            key = (a.num_gpus, job.busy_until)
            old = self._open.get(jid)
            if old is not None and (old[1], old[2]) == key:
                continue
            if old is not None:
                self._close(old[0], old[1], old[2], now)
            self._open[jid] = (now, key[0], key[1])
        for jid in [j for j in self._open if j not in seen]:
            since, g, b = self._open.pop(jid)
            self._close(since, g, b, now)

    def series(self, end: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times, GPUs held, GPUs busy): value i holds on [t[i], t[i+1])."""
        end = self.end if end is None else end
        steps = list(self._steps)
        for since, g, b in self._open.values():
            steps += [(since, g, 0), (end, -g, 0)]
            if end > max(since, b):
                steps += [(max(since, b), 0, g), (end, 0, -g)]
        if not steps:
            return np.array([0.0]), np.array([0]), np.array([0])
        steps.sort(key=lambda x: x[0])
        t = np.array([x[0] for x in steps])
        held = np.cumsum([x[1] for x in steps])
        busy = np.cumsum([x[2] for x in steps])
        last = np.append(t[1:] != t[:-1], True)  # one value per distinct time
        return t[last], held[last], busy[last]


@dataclass
class ElasticRun:
    result: RunResult
    usage: UsageRecorder


def run_with_usage(
    cluster: Cluster, specs: Sequence[JobSpec], order: str, size: str, place: str,
    params: Mapping[str, object], config: SimConfig,
) -> ElasticRun:
    sched = Scheduler.from_names(order, "none", size, place, True, dict(params))
    rec = UsageRecorder()
    res = Simulator(cluster, specs, sched, None, config, observers=[rec]).run()
    return ElasticRun(res, rec)


def compare_elastic_static(
    specs: Sequence[JobSpec],
    cluster: Cluster,
    slots: Sequence[int] = (1, 2, 3, 6),
    elastic: Mapping[str, Mapping[str, object]] | None = None,
    lifecycle: LifecycleTimes | None = None,
    round_len: float = math.inf,
    order: str = STAGE_DEFAULTS["order"],
    place: str = STAGE_DEFAULTS["place"],
) -> dict[str, ElasticRun]:
    """Elastic configurations (name -> size params) and ``static n=…`` for each slot size.

    Every run: lifecycle mode, rounds on every arrival and completion (the
    thesis schedules on events; ``round_len`` adds periodic rounds), grouping
    off, invariant checks every round.
    """
    lt = lifecycle or LifecycleTimes()
    elastic = elastic if elastic is not None else {"elastic v<=0.5": {"v_bound": 0.5}}
    cfg = SimConfig(round_len=round_len, reschedule_on_arrival=True, reschedule_on_completion=True, lifecycle=lt)
    out: dict[str, ElasticRun] = {}
    for name, params in elastic.items():
        out[name] = run_with_usage(cluster, specs, order, "elastic", place, params, cfg)
    for n in slots:
        out[f"static n={n}"] = run_with_usage(cluster, specs, order, "static", "static", {"slot": n}, cfg)
    return out


def _result(r: ElasticRun | RunResult) -> RunResult:
    return r.result if isinstance(r, ElasticRun) else r


def phase_breakdown(result: RunResult) -> list[tuple[str, float, float, float]]:
    """``(job id, queued, launching, running)`` seconds per job (lifecycle-mode runs)."""
    rows = []
    for j in result.jobs:
        if j.phases is None:
            raise ValueError(f"job {j.id}: no lifecycle phases (run the simulation with SimConfig.lifecycle)")
        rows.append((j.id, j.phases["queued"], j.phases["launching"], j.phases["running"]))
    return rows


def _run_end(result: RunResult) -> float:
    finishes = [j.finish for j in result.jobs if j.finish is not None]
    return max([result.end_time, *finishes])


def utilisation_cdf(
    result: RunResult, busy: UsageRecorder | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(utilisation levels u, fraction of time with utilisation <= u), time-weighted.

    GPUs held (the engine's series), or GPUs busy when ``busy`` is the run's recorder.
    """
    end = _run_end(result)
    if busy is not None:
        t0, _, vals = busy.series(end)
        t_list, v_list = t0.tolist(), vals.tolist()
    else:
        t_list, v_list = list(result.series.t), list(result.series.gpus)
    if not t_list:
        return np.array([0.0]), np.array([1.0])
    first = min(j.arrival for j in result.jobs) if result.jobs else t_list[0]
    t = np.asarray(t_list + [end], dtype=float)
    u = np.asarray(v_list, dtype=float) / max(result.cluster_gpus, 1)
    lo = np.maximum(t[:-1], first)
    dt = np.clip(t[1:] - lo, 0.0, None)
    keep = dt > 0
    u, dt = u[keep], dt[keep]
    if dt.sum() <= 0:
        return np.array([0.0]), np.array([1.0])
    order = np.argsort(u, kind="stable")
    u, dt = u[order], dt[order]
    levels, idx = np.unique(u, return_index=True)
    cum = np.cumsum(dt) / dt.sum()
    last = np.append(idx[1:] - 1, len(u) - 1)
    return levels, cum[last]


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_phase_breakdown(results: Mapping[str, ElasticRun | RunResult], path: str | Path) -> Path:
    """Stacked bars (queued / launching+reallocating / running) per job, one panel per configuration."""
    plt = _plt()
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.6), sharey=True, squeeze=False)
    colours = ("#bbbbbb", "#e8a33d", "#3b7dd8")
    for ax, name in zip(axes[0], names, strict=True):
        rows = phase_breakdown(_result(results[name]))
        x = np.arange(len(rows))
        q = np.array([r[1] for r in rows])
        lch = np.array([r[2] for r in rows])
        run = np.array([r[3] for r in rows])
        ax.bar(x, q, color=colours[0], label="queued")
        ax.bar(x, lch, bottom=q, color=colours[1], label="launching / reallocating")
        ax.bar(x, run, bottom=q + lch, color=colours[2], label="running")
        ax.set_xticks(x, [r[0] for r in rows], rotation=45, ha="right", fontsize=7)
        s = _result(results[name]).summary()
        ax.set_title(f"{name}\nmakespan {s['makespan']:.0f} s", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("seconds since arrival")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_utilisation_cdf(results: Mapping[str, ElasticRun | RunResult], path: str | Path) -> Path:
    """CDF of the fraction of GPUs held, and (for runs with a recorder) busy, one panel each."""
    plt = _plt()
    with_busy = any(isinstance(r, ElasticRun) for r in results.values())
    fig, axes = plt.subplots(1, 2 if with_busy else 1, figsize=(9.5 if with_busy else 5, 3.6), squeeze=False)
    panels = [("GPUs held (launching, reallocating or running)", False)]
    if with_busy:
        panels.append(("GPUs busy (RUNNING_PROTECTED or RUNNING)", True))
    for ax, (title, busy) in zip(axes[0], panels, strict=True):
        for name, r in results.items():
            rec = r.usage if (busy and isinstance(r, ElasticRun)) else None
            if busy and rec is None:
                continue
            u, c = utilisation_cdf(_result(r), rec)
            ax.step(np.concatenate([[0.0], u, [1.0]]), np.concatenate([[0.0], c, [1.0]]), where="post", label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("fraction of GPUs")
        ax.set_ylabel("fraction of time")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def busy_fraction(run: ElasticRun) -> float:
    """Time-weighted mean fraction of GPUs busy (making progress) from the first arrival to the end."""
    r = run.result
    end = _run_end(r)
    t, _, busy = run.usage.series(end)
    first = min(j.arrival for j in r.jobs) if r.jobs else 0.0
    tt = np.append(np.maximum(t, first), end)
    dt = np.clip(np.diff(tt), 0.0, None)
    return float((busy * dt).sum() / ((end - first) * r.cluster_gpus)) if end > first else 0.0


def comparison_rows(results: Mapping[str, ElasticRun | RunResult]) -> list[dict[str, object]]:
    """One row per configuration: total completion time (makespan), mean JCT, GPU utilisation, reallocations."""
    rows = []
    for name, run in results.items():
        r = _result(run)
        s = r.summary()
        rows.append({
            "config": name,
            "makespan_s": s["makespan_s"],
            "mean_jct_s": s["mean_jct_s"],
            "gpu_held": s["gpu_util"],
            "gpu_busy": busy_fraction(run) if isinstance(run, ElasticRun) else float("nan"),
            "resizes": sum(j.resizes for j in r.jobs),
            "launching_s": sum((j.phases or {}).get("launching", 0.0) for j in r.jobs),
            "queued_s": sum((j.phases or {}).get("queued", 0.0) for j in r.jobs),
        })
    return rows
