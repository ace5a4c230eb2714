"""The tables of a report: one row per metric, one column per configuration, in one time unit, the best
value of each lower-is-better row marked (rich, markdown and plain text)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .metrics import RunResult
from .runinfo import Results, runs_of
from .seedstats import aggregate

if TYPE_CHECKING:
    from rich.table import Table

#: (summary key, title, kind); kind: time (simulated seconds), ratio, pct (fraction), int, wall (seconds of
#: real time the simulation took)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("mean_jct_s", "mean JCT", "time"),
    ("median_jct_s", "median JCT", "time"),
    ("p95_jct_s", "p95 JCT", "time"),
    ("p99_jct_s", "p99 JCT", "time"),
    ("geomean_jct_s", "geomean JCT", "time"),
    ("mean_queueing_delay_s", "mean queueing delay", "time"),
    ("makespan_s", "makespan", "time"),
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
    ("wall_time_s", "simulation wall time (s)", "wall"),
)
_LOWER_IS_BETTER = {"time", "ratio"}


def _time_unit(seconds: float) -> tuple[float, str]:
    if not math.isfinite(seconds) or seconds < 600:
        return 1.0, "s"
    if seconds < 36_000:
        return 60.0, "min"
    return 3600.0, "h"


def _table_time_unit(values: Sequence[float]) -> tuple[float, str]:
    finite = sorted(abs(float(v)) for v in values if v is not None and math.isfinite(v))
    return _time_unit(finite[len(finite) // 2] if finite else 0.0)


def time_unit(results: Results) -> tuple[float, str]:
    """``(seconds per unit, unit)``: the one time unit of a report on ``results`` (s, min or h), from the
    median of its table's time values (each configuration's mean over seeds); every table and plot of the
    report uses it."""
    agg = aggregate(runs_of(results))
    return _table_time_unit([row.get(k, {}).get("mean", math.nan) for row in agg.values()
                             for k, _, kind in METRICS if kind == "time"])


def run_time_unit(result: RunResult) -> tuple[float, str]:
    """:func:`time_unit` of one run (``{result.label: result}``), from the summary's times
    (:meth:`~.metrics.RunResult.summary_times`): known before Themis' figures are computed."""
    s = result.summary_times()
    return _table_time_unit([s[k] for k, _, kind in METRICS if kind == "time"])


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
    scale, unit = time_unit(runs)
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

