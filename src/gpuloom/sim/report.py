"""Run outputs: CSV/JSON files, PNG plots, markdown reports and side-by-side tables.

One run (:func:`write_run`, :func:`plot_run`, :func:`write_report`) writes::

    jobs.csv        one row per job (empty cells where a job never started/finished)
    series.csv      the piecewise-constant time series: value holds from t to the next t
    summary.json    {"label", "summary", "config", "cluster", "end_time", ...}
    jct_cdf.png  utilisation.png  queue.png
    report.md       metrics table, configuration, plots;  report.txt the same as plain text

Several runs (:func:`summary_table`, :func:`summary_rows`, :func:`plot_compare`,
:func:`write_compare`) give one column per configuration.

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
  short spikes stay visible.  The JCT CDF is drawn through at most 2,000
  quantiles.
* Table cells share a unit per row (s, min or h, chosen from the row's
  largest value) so columns compare at a glance; the best JCT in a row is bold.
"""

from __future__ import annotations

import csv
import json
import math
import os
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
    ("mean_ftf_rho", "mean FTF ρ", "ratio"),
    ("max_ftf_rho", "max FTF ρ", "ratio"),
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
    "preemptions", "migrations", "resizes", "run_time", "overhead_time", "queued_time", "ftf_rho",
)
SERIES_COLUMNS = ("t", "gpus", "cpus", "mem_mb", "running", "queued")
PLOT_POINTS = 1500  # time bins for long series
CDF_POINTS = 2000


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


# -- one run: files -----------------------------------------------------------
def write_jobs_csv(result: RunResult, path: Path) -> Path:
    """One row per job (:data:`JOB_COLUMNS`), plus ``phase_<name>`` seconds in lifecycle mode."""
    phase_names: list[str] = []
    for j in result.jobs:
        if j.phases:
            phase_names += [k for k in j.phases if k not in phase_names]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS + tuple(f"phase_{k}" for k in phase_names))
        c = _cell
        for j in result.jobs:
            fin = j.finish
            fs = j.first_start
            row = [
                j.id, j.model, j.gpus, c(j.arrival), c(j.duration), c(fs), c(fin),
                "" if fin is None else c(fin - j.arrival), "" if fs is None else c(fs - j.arrival),
                j.preemptions, j.migrations, j.resizes, c(j.run_time), c(j.overhead_time), c(j.queued_time),
                "" if fin is None else c((fin - j.arrival) / j.duration),
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
    """What ``summary.json`` holds (before NaN → null)."""
    return {
        "label": result.label,
        "summary": result.summary(),
        "config": result.config,
        "cluster": {"gpus": result.cluster_gpus, "cpus": result.cluster_cpus, "mem_mb": result.cluster_mem_mb},
        "end_time": result.end_time,
        "rounds_computed": result.rounds_computed,
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


def _figure(rows: int = 1, height: float = 3.6) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h = height * rows if rows > 1 else height
    fig = Figure(figsize=(8, h), dpi=100)
    FigureCanvasAgg(fig)
    # fixed margins in inches: automatic layout engines cost more than drawing the data
    fig.subplots_adjust(left=0.9 / 8, right=1 - 0.25 / 8, bottom=0.6 / h, top=1 - 0.4 / h, hspace=0.15)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


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


def _cdf_axes(ax: Any, curves: Mapping[str, np.ndarray]) -> None:
    finite = [c for c in curves.values() if len(c)]
    if not finite:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
        return
    lo = min(float(c.min()) for c in finite)
    hi = max(float(c.max()) for c in finite)
    scale, unit = _time_unit(hi)
    for label, jcts in curves.items():
        if len(jcts):
            x, y = cdf_points(jcts)
            ax.plot(np.insert(x, 0, x[0]) / scale, np.insert(y, 0, 0.0), drawstyle="steps-post", lw=1.4, label=f"{label} (n={len(jcts)})")
    if lo > 0 and hi / lo > 100:
        ax.set_xscale("log")
    ax.set_xlabel(f"JCT ({unit})")
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

    fig, (ax,) = _figure()
    _cdf_axes(ax, {label: result.jcts()})
    ax.set_title(f"JCT CDF: {label}")
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
    fig, axes = _figure(len(panels), height=2.4)
    for ax, (name, cap, title) in zip(axes, panels, strict=True):
        e, m, lo, hi = binned_series(s["t"], s[name] / max(cap, 1), end)
        _step(ax, e, m, lo, hi, scale, title)
        ax.set_ylabel(f"{title} util.")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_title(f"Utilisation over time: {label}  (mean GPU {result.summary()['gpu_util']:.1%})")
    axes[-1].set_xlabel(f"time ({unit})")
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1])

    fig, (ax,) = _figure()
    for name, title in (("queued", "queued"), ("running", "running")):
        e, m, lo, hi = binned_series(s["t"], s[name], end)
        _step(ax, e, m, lo, hi, scale, title)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("jobs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"Queue length over time: {label}")
    paths.append(out / "queue.png")
    fig.savefig(paths[-1])
    return paths


# -- tables ---------------------------------------------------------------------
def _format_row(kind: str, values: Sequence[float]) -> tuple[str, list[str]]:
    """The row's unit suffix and formatted cells."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if kind == "time":
        scale, unit = _time_unit(max((abs(v) for v in finite), default=0.0))
        fmt = "{:,.2f}" if unit == "h" else "{:,.1f}"
        return f" ({unit})", ["–" if v is None or not math.isfinite(v) else fmt.format(v / scale) for v in values]
    if kind == "pct":
        return " (%)", ["–" if v is None or not math.isfinite(v) else f"{100 * v:.1f}" for v in values]
    if kind == "ratio":
        return "", ["–" if v is None or not math.isfinite(v) else f"{v:.2f}" for v in values]
    if kind == "wall":
        return "", ["–" if v is None or not math.isfinite(v) else f"{v:.2f}" for v in values]
    return "", [f"{int(v):,}" for v in values]


def formatted(results: Mapping[str, RunResult]) -> tuple[list[str], list[tuple[str, list[str], int | None]]]:
    """``(labels, rows)``; each row is ``(title with unit, cells, index of the best cell or None)``."""
    labels = list(results)
    sums = [results[k].summary() for k in labels]
    rows = []
    for key, title, kind in METRICS:
        values = [s.get(key, math.nan) for s in sums]
        unit, cells = _format_row(kind, values)
        best = None
        if kind in _LOWER_IS_BETTER and len(labels) > 1:
            finite = [(v, i) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
            if finite:
                best = min(finite)[1]
        rows.append((title + unit, cells, best))
    return labels, rows


def summary_table(results: Mapping[str, RunResult], title: str | None = None) -> Table:
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


def markdown_table(results: Mapping[str, RunResult]) -> str:
    labels, rows = formatted(results)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, cells, best in rows:
        lines.append(f"| {name} | " + " | ".join(f"**{c}**" if i == best else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def text_table(results: Mapping[str, RunResult]) -> str:
    labels, rows = formatted(results)
    w0 = max(len("metric"), *(len(r[0]) for r in rows))
    widths = [max(len(lb), *(len(r[1][i]) for r in rows)) for i, lb in enumerate(labels)]
    lines = ["metric".ljust(w0) + "".join("  " + lb.rjust(w) for lb, w in zip(labels, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for name, cells, _ in rows:
        lines.append(name.ljust(w0) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)


_ROW_CONFIG_KEYS = ("order", "group", "size", "place", "preemptive", "round_len", "seed")


def summary_rows(results: Mapping[str, RunResult]) -> list[dict[str, Any]]:
    """One flat dict per configuration: label, the main config keys, then every summary value."""
    rows = []
    for label, r in results.items():
        row: dict[str, Any] = {"label": label}
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


# -- several runs -----------------------------------------------------------------
def plot_compare(results: Mapping[str, RunResult], path: str | Path) -> Path:
    """Overlaid JCT CDFs of every configuration, one PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax,) = _figure(height=4.2)
    _cdf_axes(ax, {lb: r.jcts() for lb, r in results.items()})
    ax.set_title("JCT CDF")
    fig.savefig(path)
    return path


def write_compare(results: Mapping[str, RunResult], out_dir: str | Path) -> dict[str, Path]:
    """``compare.csv``, ``compare.json``, ``compare.md`` (table + plot) and ``jct_cdf_compare.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": write_rows_csv(summary_rows(results), out / "compare.csv"),
        "json": out / "compare.json",
        "plot": plot_compare(results, out / "jct_cdf_compare.png"),
        "report": out / "compare.md",
    }
    _dump_json({"runs": [run_summary(r) | {"label": lb} for lb, r in results.items()]}, paths["json"])
    paths["report"].write_text(
        "# gpuloom comparison\n\n" + markdown_table(results) + "\n\n![JCT CDF](jct_cdf_compare.png)\n"
    )
    return paths


# -- report -----------------------------------------------------------------------
def _config_lines(result: RunResult) -> list[tuple[str, str]]:
    return [(k, json.dumps(jsonable(v)) if isinstance(v, Mapping | list | tuple) else str(v))
            for k, v in result.config.items()]


def write_report(result: RunResult, out_dir: str | Path, plots: Sequence[Path] | None = None) -> Path:
    """``report.md`` (metrics table, configuration, linked plots) and ``report.txt``; plots made if not given."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots is None:
        plots = plot_run(result, out)
    one = {result.label: result}
    cluster = f"{result.config.get('cluster_nodes', '?')} nodes, {result.cluster_gpus} GPUs, " \
              f"{result.cluster_cpus} CPU cores, {result.cluster_mem_mb / 1000:g} GB"
    md = [f"# gpuloom run: {result.label}", "", f"Cluster: {cluster}.  Simulated time: "
          f"{result.end_time:,.0f} s in {result.wall_time:.2f} s wall time.", "",
          "## Metrics", "", markdown_table(one), "", "## Configuration", "", "| key | value |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in _config_lines(result)]
    md += ["", "## Plots", ""]
    for p in plots:
        p = Path(p)
        rel = Path(os.path.relpath(p.resolve(), out.resolve())).as_posix()
        md += [f"![{p.stem}]({rel})", ""]
    md += ["Files: [jobs.csv](jobs.csv), [series.csv](series.csv), [summary.json](summary.json).", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    txt = [f"gpuloom run: {result.label}", f"cluster: {cluster}", "", text_table(one), "", "configuration:"]
    txt += [f"  {k} = {v}" for k, v in _config_lines(result)]
    (out / "report.txt").write_text("\n".join(txt) + "\n")
    return path
