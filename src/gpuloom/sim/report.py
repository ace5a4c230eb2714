"""Run outputs: CSV/JSON files, PNG plots, markdown reports and side-by-side tables.

One run (:func:`write_run`, :func:`~.plots.plot_run`, :func:`write_report`) writes::

    jobs.csv        one row per job (empty cells where a job never started/finished)
    series.csv      the piecewise-constant time series: value holds from t to the next t
    summary.json    {"label", "stages", "gpuloom_version", "trace", "seed", "summary", "config", ...}
    jct_cdf.png  utilisation.png  queue.png
    report.md       metrics table, what the run was made from, plots;  report.txt the same as plain text

Several runs (:func:`summary_table`, :func:`summary_rows`, :func:`~.plots.plot_compare`,
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

The parts: :mod:`.runinfo` (what a run was made from; exact CSV cells, strict JSON), :mod:`.runcsv`
(``jobs.csv`` and ``series.csv``, also from rows made ahead), :mod:`.seedstats` (means and confidence
intervals over seeds), :mod:`.tables` (the metric tables); this module writes a run's and a comparison's
files and reports from them, and re-exports their names.

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
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .metrics import RunResult
from .runconfig import RunConfig, run_many  # noqa: F401  (re-exported: the CLI calls report.run_many)
from .runcsv import (  # noqa: F401  (re-exported)
    CSV_BLOCK,
    HEAD_FIELDS,
    JOB_COLUMNS,
    SERIES_COLUMNS,
    JobRows,
    JobsRest,
    SeriesRows,
    job_fields,
    jobs_rest,
    series_points,
    write_jobs_csv,
    write_series_csv,
)
from .runinfo import (  # noqa: F401  (re-exported)
    Results,
    _cell,
    _dump_json,
    _subtitle,
    _version,
    _window_text,
    describe,
    jsonable,
    runs_of,
    slug,
)
from .seedstats import RANDOM_PLACES, aggregate, confidence, seed_notes  # noqa: F401  (re-exported)
from .tables import (  # noqa: F401  (re-exported)
    METRICS,
    _fmt,
    _time_unit,
    formatted,
    markdown_table,
    run_time_unit,
    summary_table,
    text_table,
    time_unit,
)

PLOT_POINTS = 1500  # time bins for long series
CDF_POINTS = 2000

#: bar-chart panels of :func:`plot_bars`: (summary key, title, kind)
BARS = (("mean_jct_s", "mean JCT", "time"), ("p99_jct_s", "p99 JCT", "time"),
        ("makespan_s", "makespan", "time"), ("gpu_util", "GPU utilisation", "pct"))


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


def write_summary(result: RunResult, out_dir: str | Path) -> Path:
    """Write ``summary.json`` (:func:`run_summary`) into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _dump_json(run_summary(result), out / "summary.json")
    return out / "summary.json"


def write_run(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``jobs.csv``, ``series.csv`` and ``summary.json`` into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {"jobs": write_jobs_csv(result, out / "jobs.csv"), "series": write_series_csv(result, out / "series.csv"),
            "summary": write_summary(result, out)}



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


def write_compare(results: Results, out_dir: str | Path, runs_dir: bool = True, plots: bool = True,
                  meta: Mapping[str, Any] | None = None, command_clock: Callable[[], float] | None = None
                  ) -> dict[str, Path]:
    """Everything ``gpuloom compare`` writes into ``out_dir``.

    ``command_clock`` gives the command's wall time so far; read once the plots are drawn, it goes into
    ``compare.json``'s ``meta`` (``command_wall_time_s``) and ``compare.md``.

    ``compare.csv`` (one row per run: configuration and seed), ``compare.json``
    (provenance, every run's summary, the per-configuration aggregate over seeds),
    ``compare.md`` (table, provenance, plots), the plots of :data:`COMPARE_PLOTS`,
    and with ``runs_dir`` each run's ``jobs.csv``, ``series.csv`` and
    ``summary.json`` under ``runs/<label>/`` (``runs/<label>/seed-<s>/`` with several seeds).
    """
    from .plots import COMPARE_PLOTS

    runs = runs_of(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"csv": write_rows_csv(summary_rows(runs), out / "compare.csv"),
                              "json": out / "compare.json", "report": out / "compare.md"}
    unit = time_unit(runs) if runs else (1.0, "s")
    if plots:
        for key, name, fn in COMPARE_PLOTS:
            paths[key] = fn(runs, out / name, unit)
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
        if first.window is not None:
            info.setdefault("measure_jobs", _window_text(first))
    info["seeds"] = sorted({r.config.get("seed") for rs in runs.values() for r in rs}, key=str)
    if command_clock is not None:
        info["command_wall_time_s"] = command_clock()
    _dump_json({"meta": info,
                "runs": [run_summary(r) | {"label": lb} for lb, rs in runs.items() for r in rs],
                "aggregate": aggregate(runs)}, paths["json"])
    md = ["# gpuloom comparison", ""]
    md += [f"- {k}: `{v}`" for k, v in info.items() if v not in (None, "", []) and k != "command_wall_time_s"]
    walls = [r.wall_time for rs in runs.values() for r in rs]
    if walls:
        sim = f"{sum(walls):.2f} s simulating ({len(walls)} runs)"
        cmd = info.get("command_wall_time_s")
        md.append(f"- wall time: {cmd:.2f} s for the command, {sim}" if isinstance(cmd, int | float)
                  else f"- wall time: {sim}")
    md += ["", markdown_table(runs), ""] + [f"Note: {n}." for n in seed_notes(runs)]
    md += ["", "## Configurations", "", "| label | stages | parameters |", "|---|---|---|"]
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
def _wall_text(result: RunResult) -> str:
    """``4.52 s for the command, 0.14 s simulating`` (the command's only where it was recorded)."""
    cmd = result.meta.get("command_wall_time_s")
    sim = f"{result.wall_time:.2f} s simulating"
    return f"{cmd:.2f} s for the command, {sim}" if isinstance(cmd, int | float) else sim


def _config_lines(result: RunResult) -> list[tuple[str, str]]:
    return [(k, json.dumps(jsonable(v)) if isinstance(v, Mapping | list | tuple) else str(v))
            for k, v in result.config.items()]


def write_report(result: RunResult, out_dir: str | Path, plots: Sequence[Path] | None = None) -> Path:
    """``report.md`` (provenance, metrics table, configuration, linked plots) and ``report.txt``;
    plots made if not given."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots is None:
        from .plots import plot_run

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
    if result.window is not None:
        from .window import describe as window_line

        prov.insert(4, ("measured", window_line(result.window, len(result.jobs))))
    md = [f"# gpuloom run: {title}", ""]
    md += [f"- {k}: `{v}`" for k, v in prov if v not in (None, "")]
    scale, unit = time_unit(one)
    md += [f"- cluster: {cluster}", f"- simulated time: {_fmt('time', result.end_time, scale, unit)} {unit}",
           f"- wall time: {_wall_text(result)}", ""]
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
    txt += [f"cluster: {cluster}", f"simulated time: {_fmt('time', result.end_time, scale, unit)} {unit}",
            f"wall time: {_wall_text(result)}", "", text_table(one), "", "configuration:"]
    txt += [f"  {k} = {v}" for k, v in _config_lines(result)]
    (out / "report.txt").write_text("\n".join(txt) + "\n")
    return path
