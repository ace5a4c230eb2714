"""The plots of a run and of a comparison (matplotlib's object API, imported only when plotting).

One run: ``jct_cdf.png``, ``utilisation.png``, ``queue.png`` (:func:`plot_run`); a comparison:
the overlaid JCT, slowdown and FTF CDFs, per-policy bar charts and the utilisation overlay
(:data:`COMPARE_PLOTS`).  Titles carry what :mod:`.report` says a run was made from; long
series are reduced to time bins holding the exact time-weighted mean and the min/max envelope
(:func:`binned_series`), CDFs are drawn through at most :data:`~.report.CDF_POINTS` quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import RunResult, TimeSeries
from .report import (
    BARS,
    CDF_POINTS,
    PLOT_POINTS,
    Results,
    _subtitle,
    _time_unit,
    aggregate,
    describe,
    runs_of,
    time_unit,
)

#: ``(seconds per unit, unit name)``: the time unit of a report's plots (:func:`~.report.time_unit`)
Unit = tuple[float, str]


# -- plotting helpers ---------------------------------------------------------
def binned_series(t: np.ndarray, v: np.ndarray, end: float, bins: int = PLOT_POINTS
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Reduce a piecewise-constant series to ``bins`` equal time bins over ``[t[0], end]``.

    Returns ``(edges, mean, lo, hi)``: ``mean[k]`` is the exact time-weighted
    mean over bin ``k``, ``lo``/``hi`` the smallest/largest value held in it.
    Series with at most ``bins`` points come back unreduced (edges = t + [end]).
    """
    t = np.asarray(t, dtype=float)
    v = np.asarray(v, dtype=float)
    if len(t) == 0:
        z = np.zeros(0)
        return z, z, z, z
    end = max(end, t[-1])
    if len(t) <= bins or end <= t[0]:
        edges = np.append(t, end if end > t[-1] else t[-1])
        return edges, v, v, v
    keep = t < end  # points at ``end`` hold for no time
    t, v = t[keep], v[keep]
    edges = np.linspace(t[0], end, bins + 1)
    cum = np.concatenate([[0.0], np.cumsum(v * np.diff(np.append(t, end)))])
    i = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
    integral = cum[i] + v[i] * (edges - t[i])
    mean = np.diff(integral) / np.diff(edges)
    # bin k holds v[i_k] .. v[i_{k+1}]; the last of these only if it starts before the bin's end
    start, nxt = i[:-1], i[1:]
    inside = t[nxt] < edges[1:]
    hi = np.maximum.reduceat(v, start)
    lo = np.minimum.reduceat(v, start)
    hi = np.where(inside, np.maximum(hi, v[nxt]), hi)
    lo = np.where(inside, np.minimum(lo, v[nxt]), lo)
    return edges, mean, lo, hi


def mean_on_grid(t: np.ndarray, v: np.ndarray, edges: np.ndarray, end: float) -> np.ndarray:
    """Exact time-weighted mean of a step series (``v[i]`` on ``[t[i], t[i+1])``, the last value up to
    ``end``, 0 outside ``[t[0], end]``) over each bin of ``edges``."""
    t = np.asarray(t, dtype=float)
    v = np.asarray(v, dtype=float)
    if len(t) == 0:
        return np.zeros(len(edges) - 1)
    tt = np.append(t, max(end, t[-1]))
    vv = np.append(v, 0.0)  # nothing held after the end
    cum = np.concatenate([[0.0], np.cumsum(vv[:-1] * np.diff(tt))])

    def F(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(tt, x, side="right") - 1
        kk = np.clip(k, 0, len(tt) - 1)
        return np.where(k < 0, 0.0, cum[kk] + vv[kk] * (np.minimum(x, tt[-1]) - tt[kk]).clip(min=0))

    return np.diff(F(edges)) / np.diff(edges)


def _figure(rows: int = 1, height: float = 3.6, cols: int = 1, width: float = 8.0, title_lines: int = 1,
            sharex: bool = True) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h = height * rows if rows > 1 else height
    fig = Figure(figsize=(width, h), dpi=100)
    FigureCanvasAgg(fig)
    # fixed margins in inches: automatic layout engines cost more than drawing the data
    top = 0.25 + 0.18 * title_lines
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.25 / width, bottom=0.6 / h, top=1 - top / h,
                        hspace=0.15 if sharex else 0.45, wspace=0.3)
    axes = fig.subplots(rows, cols, sharex=sharex, squeeze=False)
    return fig, list(axes.ravel())


def _title(ax: Any, main: str, sub: str) -> None:
    ax.set_title(f"{main}\n{sub}" if sub else main, fontsize=9 if sub else 10, loc="left")


def _step(ax: Any, edges: np.ndarray, mean: np.ndarray, lo: np.ndarray, hi: np.ndarray, scale: float,
          label: str, color: str | None = None) -> None:
    if len(mean) == 0:
        return
    x = edges / scale
    y = np.append(mean, mean[-1])
    (line,) = ax.plot(x, y, drawstyle="steps-post", lw=1.0, label=label, color=color)
    if lo is not mean:
        ax.fill_between(x, np.append(lo, lo[-1]), np.append(hi, hi[-1]), step="post", alpha=0.25, lw=0,
                        color=line.get_color())


def cdf_points(values: np.ndarray, max_points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF ``(x, F(x))`` through at most ``max_points`` order statistics (max included)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return x, x
    idx = np.arange(n) if n <= max_points else np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
    return x[idx], (idx + 1) / n


def _cdf_axes(ax: Any, curves: Mapping[str, np.ndarray], xlabel: str = "JCT", time: bool = True,
              mark: float | None = None, unit: Unit | None = None) -> None:
    finite = [c for c in curves.values() if len(c)]
    if not finite:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
        return
    lo = min(float(c.min()) for c in finite)
    hi = max(float(c.max()) for c in finite)
    scale, name = (unit or _time_unit(hi)) if time else (1.0, "")
    for label, vals in curves.items():
        if len(vals):
            x, y = cdf_points(vals)
            ax.plot(np.insert(x, 0, x[0]) / scale, np.insert(y, 0, 0.0), drawstyle="steps-post", lw=1.4,
                    label=f"{label} (n={len(vals)})")
    if lo > 0 and hi / lo > 100:
        ax.set_xscale("log")
    if mark is not None:
        ax.axvline(mark, color="0.4", lw=0.8, ls="--")
    ax.set_xlabel(f"{xlabel} ({name})" if name else xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


# -- one run: plots -----------------------------------------------------------
def modelled_panels(result: RunResult) -> list[tuple[str, int, str]]:
    """The utilisation panels worth drawing, ``(series, capacity, title)``: GPU, and CPU and memory only where
    the run gave them out other than in proportion to GPUs (else their panel repeats the GPU one)."""
    return _panels(result.series.arrays(), (result.cluster_gpus, result.cluster_cpus, result.cluster_mem_mb))


def _panels(s: Mapping[str, np.ndarray], capacity: tuple[int, int, int]) -> list[tuple[str, int, str]]:
    gpus = capacity[0]
    panels = [("gpus", gpus, "GPU")]
    for name, cap, title in (("cpus", capacity[1], "CPU"), ("mem_mb", capacity[2], "memory")):
        # exact, in integers: held / capacity == GPUs held / GPUs, at every point
        if cap > 0 and np.any(s[name] * gpus != s["gpus"] * cap):
            panels.append((name, cap, title))
    return panels


@dataclass(slots=True)
class RunFigures:
    """What :func:`plot_run` draws of a run, as strings, numbers and arrays: cheap to send to another process
    (:func:`run_figures` takes them from the run, :func:`draw_run` draws them)."""

    label: str
    subtitle: str
    unit: Unit
    jcts: np.ndarray  # of the finished jobs
    series: TimeSeries
    end: float  # RunResult.span_end
    capacity: tuple[int, int, int]  # the cluster's GPUs, CPU cores, memory (MB)
    gpu_util: float


def run_figures(result: RunResult, unit: Unit | None = None) -> RunFigures:
    """What :func:`plot_run` draws of ``result`` (times in ``unit``; default: the run's report unit)."""
    return RunFigures(result.label, _subtitle(result), unit or time_unit({result.label: result}), result.jcts(),
                      result.series, result.span_end, (result.cluster_gpus, result.cluster_cpus, result.cluster_mem_mb),
                      result.summary_times()["gpu_util"])


def load_matplotlib(math: bool = False) -> None:
    """Import what :func:`draw_run` draws with (a process that will draw can do it ahead); ``math``: also have
    matplotlib build its mathtext parser, which it builds once per process on the first label it typesets (a log
    axis's ticks, ``10^k``: the JCT CDF's)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401

    if math:
        from matplotlib.mathtext import MathTextParser

        MathTextParser("path").parse(r"$\mathdefault{10^{0}}$")


def plot_run(result: RunResult, out_dir: str | Path, unit: Unit | None = None) -> list[Path]:
    """``jct_cdf.png``, ``utilisation.png`` (GPU; CPU and memory where :func:`modelled_panels` says), ``queue.png``;
    times in ``unit`` (default: the run's report unit, :func:`~.report.time_unit`)."""
    return draw_run(run_figures(result, unit), out_dir)


def draw_run(f: RunFigures, out_dir: str | Path) -> list[Path]:
    """:func:`plot_run`'s files, from what :func:`run_figures` took of the run."""
    return [draw_jct_cdf(f, out_dir), *draw_series(f, out_dir)]


def draw_jct_cdf(f: RunFigures, out_dir: str | Path) -> Path:
    """``jct_cdf.png`` of :func:`draw_run` (of ``f`` it reads all but the series)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (ax,) = _figure(title_lines=2)
    _cdf_axes(ax, {f.label: f.jcts}, unit=f.unit)
    _title(ax, f"JCT CDF: {f.label}", f.subtitle)
    path = out / "jct_cdf.png"
    fig.savefig(path)
    return path


def draw_series(f: RunFigures, out_dir: str | Path) -> list[Path]:
    """``utilisation.png`` and ``queue.png`` of :func:`draw_run` (of ``f`` it reads all but the JCTs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    label, sub = f.label, f.subtitle
    s = f.series.arrays()
    end = f.end
    scale, uname = f.unit
    panels = _panels(s, f.capacity)
    fig, axes = _figure(len(panels), height=2.4, title_lines=2)
    for ax, (name, cap, title) in zip(axes, panels, strict=True):
        e, m, lo, hi = binned_series(s["t"], s[name] / max(cap, 1), end)
        _step(ax, e, m, lo, hi, scale, title)
        ax.set_ylabel(f"{title} util.")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    _title(axes[0], f"Utilisation over time: {label}  (mean GPU {f.gpu_util:.1%})", sub)
    axes[-1].set_xlabel(f"time ({uname})")
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1])

    fig, (ax,) = _figure(title_lines=2)
    for name, title in (("queued", "queued"), ("running", "running")):
        e, m, lo, hi = binned_series(s["t"], s[name], end)
        _step(ax, e, m, lo, hi, scale, title)
    ax.set_xlabel(f"time ({uname})")
    ax.set_ylabel("jobs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    _title(ax, f"Queue length over time: {label}", sub)
    paths.append(out / "queue.png")
    fig.savefig(paths[-1])
    return paths


# -- several runs: plots -------------------------------------------------------------
def _compare_subtitle(runs: Mapping[str, Sequence[RunResult]]) -> str:
    first = next(iter(runs.values()))[0]
    d = describe(first)
    seeds = sorted({r.config.get("seed") for rs in runs.values() for r in rs}, key=str)
    bits = []
    src = d["trace"] or d["workload"]
    if src:
        bits.append(Path(str(src)).name if d["trace"] else str(src))
    if d["cluster"]:
        bits.append(f"cluster {d['cluster']}")
    bits.append(f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds ({seeds[0]}–{seeds[-1]})")
    bits.append(f"gpuloom {d['gpuloom_version']}")
    return " · ".join(bits)


def _pooled(runs: Sequence[RunResult], what: str) -> np.ndarray:
    parts = []
    for r in runs:
        if what == "jct":
            parts.append(r.jcts())
        elif what == "slowdown":
            inw = r.measured_mask()  # the measurement window's jobs (every job without one)
            parts.append(np.array([j.slowdown for j, m in zip(r.jobs, inw, strict=True)
                                   if m and j.slowdown is not None], dtype=float))
        else:
            rho = r.themis()[1][r.measured_mask()]
            parts.append(rho[~np.isnan(rho)])
    return np.concatenate(parts) if parts else np.zeros(0)


_CDF_KINDS = {
    "jct": ("JCT CDF", "JCT", True, None),
    "slowdown": ("Slowdown CDF (JCT / duration)", "slowdown", False, 1.0),
    "ftf": ("Finish-time fairness CDF (Themis ρ; ρ ≤ 1 is fair)", "FTF ρ", False, 1.0),
}


def plot_cdf_compare(results: Results, path: str | Path, what: str = "jct", unit: Unit | None = None) -> Path:
    """Overlaid CDFs of ``what`` (``jct``, ``slowdown`` or ``ftf``) per configuration, seeds pooled; times in
    ``unit`` (default: the report's, :func:`~.report.time_unit`)."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    title, xlabel, time, mark = _CDF_KINDS[what]
    fig, (ax,) = _figure(height=4.2, title_lines=2)
    unit = (unit or time_unit(runs)) if time and runs else None
    _cdf_axes(ax, {lb: _pooled(rs, what) for lb, rs in runs.items()}, xlabel, time, mark, unit)
    _title(ax, title, _compare_subtitle(runs) if runs else "")
    fig.savefig(path)
    return path


def plot_compare(results: Results, path: str | Path, unit: Unit | None = None) -> Path:
    """Overlaid JCT CDFs of every configuration, one PNG."""
    return plot_cdf_compare(results, path, "jct", unit)


def plot_bars(results: Results, path: str | Path, unit: Unit | None = None) -> Path:
    """One bar per configuration for mean JCT, p99 JCT, makespan and GPU utilisation; 95 % CI error bars
    over seeds where a configuration has several; times in ``unit`` (default: the report's)."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    agg = aggregate(runs)
    labels = list(runs)
    scale, unit_name = unit or time_unit(runs)
    fig, axes = _figure(2, height=2.6, cols=2, width=9.0, title_lines=2, sharex=False)
    colors = [f"C{i % 10}" for i in range(len(labels))]
    x = np.arange(len(labels))
    for ax, (key, title, kind) in zip(axes, BARS, strict=True):
        f = (1 / scale) if kind == "time" else 100.0
        m = np.array([agg[lb].get(key, {}).get("mean", math.nan) for lb in labels]) * f
        h = np.array([agg[lb].get(key, {}).get("ci95", math.nan) for lb in labels]) * f
        err = None if np.all(np.isnan(h)) else np.nan_to_num(h)
        ax.bar(x, np.nan_to_num(m), yerr=err, color=colors, capsize=4, width=0.7)
        ax.set_ylabel(f"{title} ({unit_name if kind == 'time' else '%'})", fontsize=8)
        ax.set_xticks(x, labels, fontsize=7, rotation=15 if len(labels) > 3 else 0, ha="right" if len(labels) > 3
                      else "center")
        ax.grid(axis="y", alpha=0.3)
        if kind == "pct":
            ax.set_ylim(0, 105)
    seeded = max(len(v) for v in runs.values()) if runs else 1
    main = "Per-configuration results" + (f" (mean of {seeded} seeds, 95 % CI)" if seeded > 1 else "")
    fig.suptitle(f"{main}\n{_compare_subtitle(runs) if runs else ''}", fontsize=9, x=0.1 / 9 + 0.01, ha="left")
    fig.savefig(path)
    return path


def plot_utilisation_compare(results: Results, path: str | Path, bins: int = 400, unit: Unit | None = None) -> Path:
    """GPU utilisation over time, one line per configuration (mean over seeds on a common time grid); times in
    ``unit`` (default: the report's)."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    end = max((r.span_end for rs in runs.values() for r in rs), default=1.0)
    start = min((r.series.t[0] for rs in runs.values() for r in rs if r.series.t), default=0.0)
    edges = np.linspace(start, max(end, start + 1e-9), bins + 1)
    scale, unit_name = unit or (time_unit(runs) if runs else _time_unit(end - start))
    fig, (ax,) = _figure(height=3.8, title_lines=2)
    for label, rs in runs.items():
        curves = [mean_on_grid(np.asarray(r.series.t), np.asarray(r.series.gpus, dtype=float) / max(r.cluster_gpus, 1),
                               edges, r.span_end) for r in rs]
        m = np.mean(curves, axis=0)
        mean_util = float(np.mean([r.summary()["gpu_util"] for r in rs]))
        ax.plot(edges / scale, np.append(m, m[-1]), drawstyle="steps-post", lw=1.1,
                label=f"{label} (mean {mean_util:.1%})")
    ax.set_xlabel(f"time ({unit_name})")
    ax.set_ylabel("GPU utilisation")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    seeded = max((len(v) for v in runs.values()), default=1)
    _title(ax, "GPU utilisation over time" + (f" (mean of {seeded} seeds)" if seeded > 1 else ""),
           _compare_subtitle(runs) if runs else "")
    fig.savefig(path)
    return path


#: plots written by :func:`write_compare`: (key, file name, function of (results, path, unit))
COMPARE_PLOTS = (
    ("plot", "jct_cdf_compare.png", plot_compare),
    ("bars", "bars_compare.png", plot_bars),
    ("slowdown_cdf", "slowdown_cdf_compare.png", lambda r, p, u=None: plot_cdf_compare(r, p, "slowdown", u)),
    ("ftf_cdf", "ftf_cdf_compare.png", lambda r, p, u=None: plot_cdf_compare(r, p, "ftf", u)),
    ("utilisation", "utilisation_compare.png", lambda r, p, u=None: plot_utilisation_compare(r, p, unit=u)),
)
