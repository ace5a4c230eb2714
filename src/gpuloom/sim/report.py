"""Run outputs: CSV/JSON files, PNG plots, markdown reports and side-by-side tables.

One run (:func:`write_run`, :func:`plot_run`, :func:`write_report`) writes::

    jobs.csv        one row per job (empty cells where a job never started/finished)
    series.csv      the piecewise-constant time series: value holds from t to the next t
    summary.json    {"label", "stages", "gpuloom_version", "trace", "seed", "summary", "config", ...}
    jct_cdf.png  utilisation.png  queue.png
    report.md       metrics table, what the run was made from, plots;  report.txt the same as plain text

Several runs (:func:`summary_table`, :func:`summary_rows`, :func:`plot_compare`,
:func:`write_compare`) give one column per configuration.  Each configuration
may have been run with several seeds (``{label: [run, run, ...]}``): tables
then show the mean and a 95 % confidence interval over the seeds, bar charts
draw it as error bars, and CDFs pool the jobs of every seed.

Self-describing results.  Every file and plot says what it was made from: the
run's label and full stage pipeline (``srsf/muri/proportional/packed-sticky``),
the trace (or generated workload), the seed, the gpuloom version, and all
parameters.  These come from ``RunResult.config`` and ``RunResult.meta`` (which
``gpuloom simulate`` and ``compare`` fill with the trace path, workload and
command line).

Design notes.

* Numbers round-trip: floats are written with ``repr`` (shortest exact form),
  so reading the CSV back gives the very values the simulator computed.  JSON
  is strict: NaN and ±inf become ``null``.
* Plots use matplotlib's object API (``Figure`` + Agg canvas), imported only
  when plotting, so ``import gpuloom.sim`` stays fast and no global pyplot
  state is touched (safe in worker processes and threads).
* Long traces: a series with more points than the plot has pixels is reduced
  to fixed time bins holding the exact time-weighted mean (from the cumulative
  integral) and the min/max envelope (``reduceat``), drawn as a step line over
  a shaded band, so a 300,000-point series plots in well under a second and
  short spikes stay visible.  CDFs are drawn through at most 2,000 quantiles.
* One unit per table: every simulated-time row of a table uses the same unit
  (s, min or h), chosen from the median of the table's time values, so rows
  and columns compare at a glance; the best value of each lower-is-better row
  is bold.
* Confidence intervals: mean ± t(0.975, n−1) · s / √n over the n seeds of a
  configuration (Student's t; s the sample standard deviation).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .metrics import RunResult
from .runconfig import RunConfig, run_many  # noqa: F401  (re-exported: the CLI calls report.run_many)

if TYPE_CHECKING:
    from rich.table import Table

#: (summary key, title, kind); kind: time (seconds), ratio, pct (fraction), int, wall (seconds of CPU time)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("mean_jct", "mean JCT", "time"),
    ("median_jct", "median JCT", "time"),
    ("p95_jct", "p95 JCT", "time"),
    ("p99_jct", "p99 JCT", "time"),
    ("geomean_jct", "geomean JCT", "time"),
    ("mean_queueing_delay", "mean queueing delay", "time"),
    ("makespan", "makespan", "time"),
    ("mean_slowdown", "mean slowdown (JCT/duration)", "ratio"),
    ("max_slowdown", "max slowdown", "ratio"),
    ("mean_ftf_rho", "mean FTF ρ (Themis)", "ratio"),
    ("max_ftf_rho", "max FTF ρ (Themis)", "ratio"),
    ("gpu_util", "GPU utilisation", "pct"),
    ("cpu_util", "CPU utilisation", "pct"),
    ("mem_util", "memory utilisation", "pct"),
    ("jobs", "jobs", "int"),
    ("completed", "completed", "int"),
    ("unfinished", "unfinished", "int"),
    ("preemptions", "preemptions", "int"),
    ("migrations", "migrations", "int"),
    ("rounds", "rounds", "int"),
    ("wall_time_s", "wall time (s)", "wall"),
)
_LOWER_IS_BETTER = {"time", "ratio"}

JOB_COLUMNS = (
    "id", "model", "gpus", "arrival", "duration", "first_start", "finish", "jct", "queueing_delay",
    "preemptions", "migrations", "resizes", "run_time", "overhead_time", "queued_time", "slowdown",
    "contention", "ftf_rho",
)
SERIES_COLUMNS = ("t", "gpus", "cpus", "mem_mb", "running", "queued")
PLOT_POINTS = 1500  # time bins for long series
CDF_POINTS = 2000

#: bar-chart panels of :func:`plot_bars`: (summary key, title, kind)
BARS = (("mean_jct", "mean JCT", "time"), ("p99_jct", "p99 JCT", "time"),
        ("makespan", "makespan", "time"), ("gpu_util", "GPU utilisation", "pct"))

Results = Mapping[str, "RunResult | Sequence[RunResult]"]


def _version() -> str:
    from .. import __version__

    return __version__


def runs_of(results: Results) -> dict[str, list[RunResult]]:
    """``{label: [runs]}``: one run per seed (a bare ``RunResult`` is one seed)."""
    return {k: [v] if isinstance(v, RunResult) else list(v) for k, v in results.items()}


# -- plain values -------------------------------------------------------------
def _cell(v: Any) -> str:
    """CSV cell: exact floats, empty for None/NaN."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return str(v)


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/±inf → None, tuples → lists, numpy scalars → Python, other objects → str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset | np.ndarray):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _dump_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n")


def slug(label: str) -> str:
    """A folder name for a label: ``srtf/random-sticky/seed=3`` → ``srtf_random-sticky_seed=3``."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", label).strip("_") or "run"


# -- what a run was made from ----------------------------------------------------
def describe(result: RunResult) -> dict[str, Any]:
    """The run's provenance: label, stages, version, trace/workload, seed, parameters, cluster."""
    c, m = result.config, result.meta
    return {
        "label": result.label,
        "stages": result.stages,
        "gpuloom_version": m.get("gpuloom_version", _version()),
        "trace": m.get("trace"),
        "workload": m.get("workload"),
        "seed": c.get("seed"),
        "params": dict(c.get("params") or {}),
        "cluster": m.get("cluster"),
        "command": m.get("command"),
    }


def _subtitle(result: RunResult, *, label: bool = False) -> str:
    d = describe(result)
    bits = [d["label"]] if label else []
    if d["stages"] != d["label"]:
        bits.append(d["stages"])
    src = d["trace"] or d["workload"]
    if src:
        bits.append(Path(str(src)).name if d["trace"] else str(src))
    bits.append(f"seed {d['seed']}")
    if d["params"]:
        p = ", ".join(f"{k}={v}" for k, v in sorted(d["params"].items()))
        bits.append(p if len(p) < 60 else p[:57] + "...")
    bits.append(f"gpuloom {d['gpuloom_version']}")
    return " · ".join(bits)


# -- one run: files -----------------------------------------------------------
def write_jobs_csv(result: RunResult, path: Path) -> Path:
    """One row per job (:data:`JOB_COLUMNS`), plus ``phase_<name>`` seconds in lifecycle mode.

    ``slowdown`` is JCT / duration; ``contention`` the average number of jobs
    contending over the job's lifetime (N) and ``ftf_rho`` Themis' ρ (see
    :mod:`gpuloom.sim.metrics`)."""
    phase_names: list[str] = []
    for j in result.jobs:
        if j.phases:
            phase_names += [k for k in j.phases if k not in phase_names]
    contention, rho = result.themis()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS + tuple(f"phase_{k}" for k in phase_names))
        c = _cell
        for i, j in enumerate(result.jobs):
            fin = j.finish
            fs = j.first_start
            row = [
                j.id, j.model, j.gpus, c(j.arrival), c(j.duration), c(fs), c(fin),
                "" if fin is None else c(fin - j.arrival), "" if fs is None else c(fs - j.arrival),
                j.preemptions, j.migrations, j.resizes, c(j.run_time), c(j.overhead_time), c(j.queued_time),
                "" if fin is None else c((fin - j.arrival) / j.duration), c(float(contention[i])), c(float(rho[i])),
            ]
            if phase_names:
                ph = j.phases or {}
                row += [c(ph.get(k)) for k in phase_names]
            w.writerow(row)
    return path


def write_series_csv(result: RunResult, path: Path) -> Path:
    s = result.series
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SERIES_COLUMNS)
        w.writerows(zip(map(_cell, s.t), s.gpus, s.cpus, s.mem_mb, s.running, s.queued, strict=True))
    return path


def run_summary(result: RunResult) -> dict[str, Any]:
    """What ``summary.json`` holds (before NaN → null): provenance, summary, full config."""
    return {
        **describe(result),
        "summary": result.summary(),
        "config": result.config,
        "cluster": {"gpus": result.cluster_gpus, "cpus": result.cluster_cpus, "mem_mb": result.cluster_mem_mb,
                    **({"spec": result.meta["cluster"]} if result.meta.get("cluster") else {})},
        "end_time": result.end_time,
        "rounds_computed": result.rounds_computed,
        "impossible": result.impossible,
        "stalled": result.stalled,
        "meta": result.meta,
    }


def write_run(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``jobs.csv``, ``series.csv`` and ``summary.json`` into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "jobs": write_jobs_csv(result, out / "jobs.csv"),
        "series": write_series_csv(result, out / "series.csv"),
        "summary": out / "summary.json",
    }
    _dump_json(run_summary(result), paths["summary"])
    return paths


# -- plotting helpers ---------------------------------------------------------
def _time_unit(seconds: float) -> tuple[float, str]:
    if not math.isfinite(seconds) or seconds < 600:
        return 1.0, "s"
    if seconds < 36_000:
        return 60.0, "min"
    return 3600.0, "h"


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
              mark: float | None = None) -> None:
    finite = [c for c in curves.values() if len(c)]
    if not finite:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
        return
    lo = min(float(c.min()) for c in finite)
    hi = max(float(c.max()) for c in finite)
    scale, unit = _time_unit(hi) if time else (1.0, "")
    for label, vals in curves.items():
        if len(vals):
            x, y = cdf_points(vals)
            ax.plot(np.insert(x, 0, x[0]) / scale, np.insert(y, 0, 0.0), drawstyle="steps-post", lw=1.4,
                    label=f"{label} (n={len(vals)})")
    if lo > 0 and hi / lo > 100:
        ax.set_xscale("log")
    if mark is not None:
        ax.axvline(mark, color="0.4", lw=0.8, ls="--")
    ax.set_xlabel(f"{xlabel} ({unit})" if unit else xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


# -- one run: plots -----------------------------------------------------------
def plot_run(result: RunResult, out_dir: str | Path) -> list[Path]:
    """``jct_cdf.png``, ``utilisation.png`` (GPU; CPU and memory when the cluster has them), ``queue.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    label = result.label
    sub = _subtitle(result)

    fig, (ax,) = _figure(title_lines=2)
    _cdf_axes(ax, {label: result.jcts()})
    _title(ax, f"JCT CDF: {label}", sub)
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1])

    s = result.series.arrays()
    end = result.span_end
    scale, unit = _time_unit(end - (s["t"][0] if len(s["t"]) else 0.0))
    panels = [("gpus", result.cluster_gpus, "GPU")]
    if result.cluster_cpus > 0:
        panels.append(("cpus", result.cluster_cpus, "CPU"))
    if result.cluster_mem_mb > 0:
        panels.append(("mem_mb", result.cluster_mem_mb, "memory"))
    fig, axes = _figure(len(panels), height=2.4, title_lines=2)
    for ax, (name, cap, title) in zip(axes, panels, strict=True):
        e, m, lo, hi = binned_series(s["t"], s[name] / max(cap, 1), end)
        _step(ax, e, m, lo, hi, scale, title)
        ax.set_ylabel(f"{title} util.")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    _title(axes[0], f"Utilisation over time: {label}  (mean GPU {result.summary()['gpu_util']:.1%})", sub)
    axes[-1].set_xlabel(f"time ({unit})")
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1])

    fig, (ax,) = _figure(title_lines=2)
    for name, title in (("queued", "queued"), ("running", "running")):
        e, m, lo, hi = binned_series(s["t"], s[name], end)
        _step(ax, e, m, lo, hi, scale, title)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("jobs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    _title(ax, f"Queue length over time: {label}", sub)
    paths.append(out / "queue.png")
    fig.savefig(paths[-1])
    return paths


# -- statistics over seeds ------------------------------------------------------
def confidence(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """``(mean, half-width, n)`` of the finite values: mean ± t(1−α/2, n−1) · s/√n (NaN width if n < 2)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(x[0]), math.nan, 1
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return float(x.mean()), half, n


def aggregate(results: Results) -> dict[str, dict[str, dict[str, float]]]:
    """``{label: {metric: {"mean", "ci95", "low", "high", "n"}}}`` over each configuration's seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, runs in runs_of(results).items():
        sums = [r.summary() for r in runs]
        row = {}
        for key in sums[0]:
            vals = [s.get(key) for s in sums]
            if not all(isinstance(v, int | float) for v in vals if v is not None):
                continue
            m, h, n = confidence([float(v) for v in vals if v is not None])
            row[key] = {"mean": m, "ci95": h, "low": m - h, "high": m + h, "n": n}
        out[label] = row
    return out


# -- tables ---------------------------------------------------------------------
def _table_time_unit(values: Sequence[float]) -> tuple[float, str]:
    finite = sorted(abs(float(v)) for v in values if v is not None and math.isfinite(v))
    return _time_unit(finite[len(finite) // 2] if finite else 0.0)


def _fmt(kind: str, v: float | None, scale: float = 1.0, unit: str = "s") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if kind == "time":
        return ("{:,.2f}" if unit == "h" else "{:,.1f}").format(v / scale)
    if kind == "pct":
        return f"{100 * v:.1f}"
    if kind in ("ratio", "wall"):
        return f"{v:.2f}"
    return f"{v:,.1f}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v):,}"


def formatted(results: Results) -> tuple[list[str], list[tuple[str, list[str], int | None]]]:
    """``(labels, rows)``; each row is ``(title with unit, cells, index of the best cell or None)``.

    With several seeds per configuration a cell is ``mean ± half-width`` of the 95 % CI.
    """
    runs = runs_of(results)
    labels = list(runs)
    seeded = any(len(v) > 1 for v in runs.values())
    agg = aggregate(runs)
    mean = {lb: {k: v["mean"] for k, v in agg[lb].items()} for lb in labels}
    scale, unit = _table_time_unit([mean[lb].get(k, math.nan) for lb in labels for k, _, kind in METRICS
                                    if kind == "time"])
    rows = []
    for key, title, kind in METRICS:
        values = [mean[lb].get(key, math.nan) for lb in labels]
        cells = []
        for lb, v in zip(labels, values, strict=True):
            cell = _fmt(kind, v, scale, unit)
            h = agg[lb].get(key, {}).get("ci95", math.nan)
            if seeded and cell != "–" and math.isfinite(h) and kind != "wall":
                cell += " ± " + (f"{h:,.1f}" if kind == "int" else _fmt(kind, h, scale, unit))
            cells.append(cell)
        suffix = {"time": f" ({unit})", "pct": " (%)"}.get(kind, "")
        best = None
        if kind in _LOWER_IS_BETTER and len(labels) > 1:
            finite = [(v, i) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
            if finite:
                best = min(finite)[1]
        rows.append((title + suffix, cells, best))
    return labels, rows


def summary_table(results: Results, title: str | None = None) -> Table:
    """A rich table: one row per metric, one column per configuration (best JCTs in bold)."""
    from rich.table import Table

    labels, rows = formatted(results)
    table = Table(title=title, show_lines=False)
    table.add_column("metric", style="bold")
    for lb in labels:
        table.add_column(lb, justify="right")
    for name, cells, best in rows:
        table.add_row(name, *[f"[bold green]{c}[/]" if i == best else c for i, c in enumerate(cells)])
    return table


def markdown_table(results: Results) -> str:
    labels, rows = formatted(results)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, cells, best in rows:
        lines.append(f"| {name} | " + " | ".join(f"**{c}**" if i == best else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def text_table(results: Results) -> str:
    labels, rows = formatted(results)
    w0 = max(len("metric"), *(len(r[0]) for r in rows))
    widths = [max(len(lb), *(len(r[1][i]) for r in rows)) for i, lb in enumerate(labels)]
    lines = ["metric".ljust(w0) + "".join("  " + lb.rjust(w) for lb, w in zip(labels, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for name, cells, _ in rows:
        lines.append(name.ljust(w0) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)


_ROW_CONFIG_KEYS = ("order", "group", "size", "place", "preemptive", "round_len", "seed")


def summary_rows(results: Results) -> list[dict[str, Any]]:
    """One flat dict per run (per configuration and seed): label, the main config keys, then every summary value."""
    rows = []
    for label, runs in runs_of(results).items():
        for r in runs:
            row: dict[str, Any] = {"label": label, "stages": r.stages}
            row.update({k: r.config[k] for k in _ROW_CONFIG_KEYS if k in r.config})
            if r.config.get("params"):
                row["params"] = json.dumps(jsonable(r.config["params"]), sort_keys=True)
            row.update(r.summary())
            rows.append(row)
    return rows


def write_rows_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([_cell(r.get(k)) for k in cols])
    return path


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
            parts.append(np.array([j.slowdown for j in r.jobs if j.slowdown is not None], dtype=float))
        else:
            rho = r.themis()[1]
            parts.append(rho[~np.isnan(rho)])
    return np.concatenate(parts) if parts else np.zeros(0)


_CDF_KINDS = {
    "jct": ("JCT CDF", "JCT", True, None),
    "slowdown": ("Slowdown CDF (JCT / duration)", "slowdown", False, 1.0),
    "ftf": ("Finish-time fairness CDF (Themis ρ; ρ ≤ 1 is fair)", "FTF ρ", False, 1.0),
}


def plot_cdf_compare(results: Results, path: str | Path, what: str = "jct") -> Path:
    """Overlaid CDFs of ``what`` (``jct``, ``slowdown`` or ``ftf``) per configuration, seeds pooled."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    title, xlabel, time, mark = _CDF_KINDS[what]
    fig, (ax,) = _figure(height=4.2, title_lines=2)
    _cdf_axes(ax, {lb: _pooled(rs, what) for lb, rs in runs.items()}, xlabel, time, mark)
    _title(ax, title, _compare_subtitle(runs) if runs else "")
    fig.savefig(path)
    return path


def plot_compare(results: Results, path: str | Path) -> Path:
    """Overlaid JCT CDFs of every configuration, one PNG."""
    return plot_cdf_compare(results, path, "jct")


def plot_bars(results: Results, path: str | Path) -> Path:
    """One bar per configuration for mean JCT, p99 JCT, makespan and GPU utilisation; 95 % CI error bars
    over seeds where a configuration has several."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    agg = aggregate(runs)
    labels = list(runs)
    times = [agg[lb].get(k, {}).get("mean", math.nan) for lb in labels for k, _, kind in BARS if kind == "time"]
    scale, unit = _table_time_unit(times)
    fig, axes = _figure(2, height=2.6, cols=2, width=9.0, title_lines=2, sharex=False)
    colors = [f"C{i % 10}" for i in range(len(labels))]
    x = np.arange(len(labels))
    for ax, (key, title, kind) in zip(axes, BARS, strict=True):
        f = (1 / scale) if kind == "time" else 100.0
        m = np.array([agg[lb].get(key, {}).get("mean", math.nan) for lb in labels]) * f
        h = np.array([agg[lb].get(key, {}).get("ci95", math.nan) for lb in labels]) * f
        err = None if np.all(np.isnan(h)) else np.nan_to_num(h)
        ax.bar(x, np.nan_to_num(m), yerr=err, color=colors, capsize=4, width=0.7)
        ax.set_ylabel(f"{title} ({unit if kind == 'time' else '%'})", fontsize=8)
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


def plot_utilisation_compare(results: Results, path: str | Path, bins: int = 400) -> Path:
    """GPU utilisation over time, one line per configuration (mean over seeds on a common time grid)."""
    runs = runs_of(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    end = max((r.span_end for rs in runs.values() for r in rs), default=1.0)
    start = min((r.series.t[0] for rs in runs.values() for r in rs if r.series.t), default=0.0)
    edges = np.linspace(start, max(end, start + 1e-9), bins + 1)
    scale, unit = _time_unit(end - start)
    fig, (ax,) = _figure(height=3.8, title_lines=2)
    for label, rs in runs.items():
        curves = [mean_on_grid(np.asarray(r.series.t), np.asarray(r.series.gpus, dtype=float) / max(r.cluster_gpus, 1),
                               edges, r.span_end) for r in rs]
        m = np.mean(curves, axis=0)
        mean_util = float(np.mean([r.summary()["gpu_util"] for r in rs]))
        ax.plot(edges / scale, np.append(m, m[-1]), drawstyle="steps-post", lw=1.1,
                label=f"{label} (mean {mean_util:.1%})")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("GPU utilisation")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    seeded = max((len(v) for v in runs.values()), default=1)
    _title(ax, "GPU utilisation over time" + (f" (mean of {seeded} seeds)" if seeded > 1 else ""),
           _compare_subtitle(runs) if runs else "")
    fig.savefig(path)
    return path


#: plots written by :func:`write_compare`: (key, file name, function)
COMPARE_PLOTS = (
    ("plot", "jct_cdf_compare.png", plot_compare),
    ("bars", "bars_compare.png", plot_bars),
    ("slowdown_cdf", "slowdown_cdf_compare.png", lambda r, p: plot_cdf_compare(r, p, "slowdown")),
    ("ftf_cdf", "ftf_cdf_compare.png", lambda r, p: plot_cdf_compare(r, p, "ftf")),
    ("utilisation", "utilisation_compare.png", plot_utilisation_compare),
)


def write_compare(results: Results, out_dir: str | Path, runs_dir: bool = True, plots: bool = True,
                  meta: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Everything ``gpuloom compare`` writes into ``out_dir``.

    ``compare.csv`` (one row per run: configuration and seed), ``compare.json``
    (provenance, every run's summary, the per-configuration aggregate over seeds),
    ``compare.md`` (table, provenance, plots), the plots of :data:`COMPARE_PLOTS`,
    and with ``runs_dir`` each run's ``jobs.csv``, ``series.csv`` and
    ``summary.json`` under ``runs/<label>/`` (``runs/<label>/seed-<s>/`` with several seeds).
    """
    runs = runs_of(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"csv": write_rows_csv(summary_rows(runs), out / "compare.csv"),
                              "json": out / "compare.json", "report": out / "compare.md"}
    if plots:
        for key, name, fn in COMPARE_PLOTS:
            paths[key] = fn(runs, out / name)
    if runs_dir:
        for label, rs in runs.items():
            for r in rs:
                d = out / "runs" / slug(label)
                if len(rs) > 1:
                    d = d / f"seed-{r.config.get('seed')}"
                write_run(r, d)
        paths["runs"] = out / "runs"
    first = next(iter(runs.values()))[0] if runs else None
    info = dict(meta or {})
    if first is not None:
        desc = describe(first)
        for k in ("gpuloom_version", "trace", "workload", "cluster", "command"):
            info.setdefault(k, desc[k])
    info["seeds"] = sorted({r.config.get("seed") for rs in runs.values() for r in rs}, key=str)
    _dump_json({"meta": info,
                "runs": [run_summary(r) | {"label": lb} for lb, rs in runs.items() for r in rs],
                "aggregate": aggregate(runs)}, paths["json"])
    md = ["# gpuloom comparison", ""]
    md += [f"- {k}: `{v}`" for k, v in info.items() if v not in (None, "", [])]
    md += ["", markdown_table(runs), "", "## Configurations", "", "| label | stages | parameters |", "|---|---|---|"]
    for label, rs in runs.items():
        c = rs[0].config
        ps = ", ".join(f"{k}={v}" for k, v in sorted((c.get("params") or {}).items())) or "–"
        md.append(f"| {label} | {rs[0].stages} | {ps} |")
    if plots:
        md += ["", "## Plots", ""] + [f"![{name}]({name})" for _, name, _ in COMPARE_PLOTS]
    if runs_dir:
        md += ["", "Per-run files (`jobs.csv`, `series.csv`, `summary.json`) are under [runs/](runs/)."]
    paths["report"].write_text("\n".join(md) + "\n")
    return paths


# -- report -----------------------------------------------------------------------
def _config_lines(result: RunResult) -> list[tuple[str, str]]:
    return [(k, json.dumps(jsonable(v)) if isinstance(v, Mapping | list | tuple) else str(v))
            for k, v in result.config.items()]


def write_report(result: RunResult, out_dir: str | Path, plots: Sequence[Path] | None = None) -> Path:
    """``report.md`` (provenance, metrics table, configuration, linked plots) and ``report.txt``;
    plots made if not given."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots is None:
        plots = plot_run(result, out)
    one = {result.label: result}
    d = describe(result)
    cluster = f"{result.config.get('cluster_nodes', '?')} nodes, {result.cluster_gpus} GPUs, " \
              f"{result.cluster_cpus} CPU cores, {result.cluster_mem_mb / 1000:g} GB"
    if d["cluster"]:
        cluster = f"`{d['cluster']}`: {cluster}"
    title = result.label if d["stages"] == result.label else f"{result.label} ({d['stages']})"
    prov = [("stages (order/group/size/place)", d["stages"]), ("trace", d["trace"]), ("workload", d["workload"]),
            ("seed", d["seed"]), ("parameters", ", ".join(f"{k}={v}" for k, v in sorted(d["params"].items())) or None),
            ("gpuloom version", d["gpuloom_version"]), ("command", d["command"])]
    md = [f"# gpuloom run: {title}", ""]
    md += [f"- {k}: `{v}`" for k, v in prov if v not in (None, "")]
    md += [f"- cluster: {cluster}",
           f"- simulated time: {result.end_time:,.0f} s in {result.wall_time:.2f} s wall time", ""]
    if result.impossible:
        md += [f"{len(result.impossible)} job(s) can never run on this cluster and count as unfinished "
               f"(first: {next(iter(result.impossible))}: {next(iter(result.impossible.values()))}).", ""]
    if result.stalled:
        md += [f"The run stalled: {len(result.stalled)} job(s) waited with no way forward "
               f"({', '.join(result.stalled[:10])}{', ...' if len(result.stalled) > 10 else ''}).", ""]
    md += ["## Metrics", "", markdown_table(one), "", "## Configuration", "", "| key | value |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in _config_lines(result)]
    md += ["", "## Plots", ""]
    for p in plots:
        p = Path(p)
        rel = Path(os.path.relpath(p.resolve(), out.resolve())).as_posix()
        md += [f"![{p.stem}]({rel})", ""]
    md += ["Files: [jobs.csv](jobs.csv), [series.csv](series.csv), [summary.json](summary.json).", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    txt = [f"gpuloom run: {title}"] + [f"{k}: {v}" for k, v in prov if v not in (None, "")]
    txt += [f"cluster: {cluster}", "", text_table(one), "", "configuration:"]
    txt += [f"  {k} = {v}" for k, v in _config_lines(result)]
    (out / "report.txt").write_text("\n".join(txt) + "\n")
    return path
