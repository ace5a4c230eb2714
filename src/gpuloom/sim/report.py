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
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.lifecycle import PHASES
from .metrics import RunResult, TimeSeries
from .runconfig import RunConfig, run_many  # noqa: F401  (re-exported: the CLI calls report.run_many)

if TYPE_CHECKING:
    from rich.table import Table

    from ..core.job import Job

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

JOB_COLUMNS = (
    "id", "model", "gpus", "arrival", "duration", "first_start", "finish", "jct", "queueing_delay",
    "preemptions", "migrations", "resizes", "run_time", "overhead_time", "queued_time", "slowdown",
    "contention", "ftf_rho",
)
SERIES_COLUMNS = ("t", "gpus", "cpus", "mem_mb", "running", "queued")
PLOT_POINTS = 1500  # time bins for long series
CDF_POINTS = 2000

#: bar-chart panels of :func:`plot_bars`: (summary key, title, kind)
BARS = (("mean_jct_s", "mean JCT", "time"), ("p99_jct_s", "p99 JCT", "time"),
        ("makespan_s", "makespan", "time"), ("gpu_util", "GPU utilisation", "pct"))

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
        **({"measure_jobs": _window_text(result)} if result.window is not None else {}),
    }


def _window_text(result: RunResult) -> str:
    """``"4000:5000"``: the run's measurement window, as ``--measure-jobs`` takes it."""
    from .window import text

    return text(result.window) if result.window is not None else ""


def _subtitle(result: RunResult, *, label: bool = False) -> str:
    d = describe(result)
    bits = [d["label"]] if label else []
    if d["stages"] != d["label"]:
        bits.append(d["stages"])
    src = d["trace"] or d["workload"]
    if src:
        bits.append(Path(str(src)).name if d["trace"] else str(src))
    if not (src and not d["trace"] and f"seed {d['seed']})" in str(src)):  # a generated workload names its seed
        bits.append(f"seed {d['seed']}")
    if d["params"]:
        p = ", ".join(f"{k}={v}" for k, v in sorted(d["params"].items()))
        bits.append(p if len(p) < 60 else p[:57] + "...")
    if result.window is not None:
        bits.append(f"jobs {result.window[0]}-{result.window[1] - 1} measured")
    bits.append(f"gpuloom {d['gpuloom_version']}")
    return " · ".join(bits)


# -- one run: files -----------------------------------------------------------
#: jobs per block of rows :func:`write_jobs_csv` and :func:`write_series_csv` format at once (memory stays a few
#: tens of MB whatever the run's size)
CSV_BLOCK = 1 << 16
_BLANK = {"None": "", "nan": ""}  # repr of what _cell leaves empty
_NUMBERS = frozenset({float, int, type(None)})
_QUOTED = re.compile(r'[,"\r\n]')


def _cells(values: Sequence[Any]) -> list[str]:
    """:func:`_cell` of each value, in bulk: ``repr`` of floats and ints (``str`` of an int), empty for None
    and NaN; values of other types one by one."""
    kinds = set(map(type, values))
    if kinds <= _NUMBERS:
        r = list(map(repr, values))
        if type(None) in kinds or (float in kinds and "nan" in r):  # (else nothing to leave empty)
            return list(map(_BLANK.get, r, r))
        return r
    return [_cell(v) for v in values]


def _same_floats(a: list[Any], b: list[Any]) -> bool:
    """Whether columns ``a`` and ``b`` are the same floats, bit for bit (so their cells are the same: ``0.0 ==
    -0.0``, ``1 == 1.0``, but their text differs)."""
    if a != b or set(map(type, a)) != {float} or set(map(type, b)) != {float}:
        return False
    return array("d", a).tobytes() == array("d", b).tobytes()


def _text(values: Sequence[Any]) -> list[str]:
    """Cells as the csv module writes ``values`` (str of each, None empty), quoted where a cell holds a comma, a
    quote or a line break (its quotes doubled): the csv module's minimal quoting."""
    kinds = set(map(type, values))
    if kinds <= {int}:  # (digits and a sign: never quoted)
        distinct = set(values)
        if 4 * len(distinct) > len(values):
            return list(map(str, values))
        text = {v: str(v) for v in distinct}  # (counts repeat: each made once)
        return list(map(text.__getitem__, values))
    if kinds <= {str}:
        cells = list(values)
    else:
        cells = ["" if v is None else str(v) for v in values]
    if not _QUOTED.search("".join(cells)):  # (the common case: nothing to quote)
        return cells
    return [f'"{c.replace(chr(34), chr(34) * 2)}"' if _QUOTED.search(c) else c for c in cells]


def _write_columns(f: Any, columns: Sequence[Sequence[str]]) -> None:
    """Rows of already formatted cells, column by column, as csv.writer writes them (``\r\n`` after each)."""
    if columns and columns[0]:
        f.write("\r\n".join(map(",".join, zip(*columns, strict=True))))
        f.write("\r\n")


#: the fields of a job's record that jobs.csv's columns ``id`` to ``slowdown`` are made of, in order
HEAD_FIELDS = ("id", "model", "gpus", "arrival", "duration", "first_start", "finish", "preemptions", "migrations",
               "resizes", "run_time", "overhead_time", "queued_time")


def _head_columns(values: Sequence[list[Any]]) -> list[list[str]]:
    """The cells of jobs.csv's columns ``id`` to ``slowdown`` of the jobs whose :data:`HEAD_FIELDS` are ``values``
    (one list per field): a job's cells are made of its own record alone."""
    ids, models, gpus, arrival, dur, fs, fin, pre, mig, res, run, over, queued = values
    jct = [None if x is None else x - t for x, t in zip(fin, arrival, strict=True)]
    return [
        _text(ids), _text(models), _text(gpus), _cells(arrival), _cells(dur), _cells(fs), _cells(fin), _cells(jct),
        _cells([None if x is None else x - t for x, t in zip(fs, arrival, strict=True)]),
        _text(pre), _text(mig), _text(res), _cells(run), _cells(over), _cells(queued),
        _cells([None if x is None else x / d for x, d in zip(jct, dur, strict=True)]),
    ]


def _jobs_header(phase_names: Sequence[str], measured: bool) -> str:
    extra = ("measured",) if measured else ()
    return ",".join(_text(JOB_COLUMNS + tuple(f"phase_{k}" for k in phase_names) + extra)) + "\r\n"


def write_jobs_csv(result: RunResult, path: Path) -> Path:
    """One row per job (:data:`JOB_COLUMNS`), plus ``phase_<name>`` seconds in lifecycle mode, plus ``measured``
    (1 for a job of the measurement window, else 0) when the run has one.

    ``slowdown`` is JCT / duration; ``contention`` the average number of jobs
    contending over the job's lifetime (N) and ``ftf_rho`` Themis' ρ (see
    :mod:`gpuloom.sim.metrics`).  Written a column at a time, in blocks of :data:`CSV_BLOCK` jobs: the
    cells of one row each as :func:`_cell` and the csv module make them."""
    jobs = result.jobs
    phase_names = list(PHASES) if any(j.phase_s is not None for j in jobs) else []
    contention, rho = result.themis()
    measured = result.measured_mask().astype(int).tolist() if result.window is not None else None
    with open(path, "w", newline="") as f:
        f.write(_jobs_header(phase_names, measured is not None))
        for a in range(0, len(jobs), CSV_BLOCK):
            block = jobs[a:a + CSV_BLOCK]
            values = [list(map(attrgetter(name), block)) for name in HEAD_FIELDS]
            columns = _head_columns(values)
            columns += [_cells(contention[a:a + CSV_BLOCK].tolist()), _cells(rho[a:a + CSV_BLOCK].tolist())]
            # the phases' times are often the queued, launching and running times again: their cells, if so
            phases = list(map(attrgetter("phase_s"), block))
            for k, same in enumerate((12, 11, 10)[:len(phase_names)]):
                col = [None if p is None else p[k] for p in phases]
                columns.append(columns[same + 2] if _same_floats(col, values[same]) else _cells(col))
            if measured is not None:
                columns.append(_text(measured[a:a + CSV_BLOCK]))
            _write_columns(f, columns)
    return path


def job_fields(jobs: Sequence[Job]) -> list[list[Any]]:
    """:data:`HEAD_FIELDS` of the simulator's ``jobs``, one list per field: once a job has finished, what its
    record (:class:`~gpuloom.sim.metrics.JobRecord`) will hold."""
    return [[j.id for j in jobs], [j.spec.model for j in jobs], [j.spec.gpus for j in jobs],
            [j.spec.arrival for j in jobs], [j.spec.duration for j in jobs], [j.first_start for j in jobs],
            [j.finish for j in jobs], [j.preemptions for j in jobs], [j.migrations for j in jobs],
            [j.resizes for j in jobs], [j.attained_time for j in jobs], [j.overhead_time for j in jobs],
            [j.queued_time for j in jobs]]


@dataclass
class JobsRest:
    """What :meth:`JobRows.write` needs of a run besides the rows it was given (:func:`jobs_rest`): the
    :data:`HEAD_FIELDS` of the other jobs (``index``: their places), each job's Themis figures, phases and
    measurement flag."""

    path: Path
    n: int
    index: list[int]
    values: list[list[Any]]
    contention: np.ndarray
    rho: np.ndarray
    phases: list[tuple[float, float, float] | None] | None  # None: no phase columns
    measured: list[int] | None  # None: no measured column


def jobs_rest(result: RunResult, path: Path, given: set[int]) -> JobsRest:
    """What :meth:`JobRows.write` needs to write ``result``'s jobs.csv at ``path`` once it holds the rows of the
    jobs at the places ``given``."""
    jobs = result.jobs
    index = [i for i in range(len(jobs)) if i not in given]
    block = [jobs[i] for i in index]
    contention, rho = result.themis()
    return JobsRest(path, len(jobs), index, [list(map(attrgetter(name), block)) for name in HEAD_FIELDS],
                    contention, rho,
                    [j.phase_s for j in jobs] if any(j.phase_s is not None for j in jobs) else None,
                    result.measured_mask().astype(int).tolist() if result.window is not None else None)


class JobRows:
    """``jobs.csv`` from rows made ahead: :meth:`add` formats the columns ``id`` to ``slowdown`` of jobs that
    finished (a finished job's record no longer changes) while the run goes on, :meth:`write` the rest once it
    has ended.  The bytes are :func:`write_jobs_csv`'s."""

    def __init__(self) -> None:
        self.heads: dict[int, str] = {}  # a job's place in the run -> its row up to slowdown

    def add(self, part: tuple[list[int], list[list[Any]]]) -> None:
        """The rows of the jobs at places ``part[0]``, whose :data:`HEAD_FIELDS` are ``part[1]``."""
        index, values = part
        self.heads.update(zip(index, map(",".join, zip(*_head_columns(values), strict=True)), strict=True))

    def write(self, rest: JobsRest) -> Path:
        """Write the file: the rows added, those of ``rest``'s jobs, and every job's other columns."""
        if rest.index:
            self.add((rest.index, rest.values))
        heads, n, phases, measured = self.heads, rest.n, rest.phases, rest.measured
        with open(rest.path, "w", newline="") as f:
            f.write(_jobs_header(list(PHASES) if phases is not None else [], measured is not None))
            for a in range(0, n, CSV_BLOCK):
                b = min(a + CSV_BLOCK, n)
                columns = [list(map(heads.__getitem__, range(a, b))), _cells(rest.contention[a:b].tolist()),
                           _cells(rest.rho[a:b].tolist())]
                if phases is not None:
                    block = phases[a:b]
                    columns += [_cells([None if p is None else p[k] for p in block]) for k in range(len(PHASES))]
                if measured is not None:
                    columns.append(_text(measured[a:b]))
                _write_columns(f, columns)
        return rest.path


def write_series_csv(result: RunResult | TimeSeries, path: Path) -> Path:
    """The time series (:data:`SERIES_COLUMNS`) of a run (or the series itself), a column at a time, in blocks
    of :data:`CSV_BLOCK` points."""
    s = result if isinstance(result, TimeSeries) else result.series
    with open(path, "w", newline="") as f:
        f.write(",".join(SERIES_COLUMNS) + "\r\n")
        for a in range(0, len(s), CSV_BLOCK):
            b = slice(a, a + CSV_BLOCK)
            _write_columns(f, [_cells(s.t[b]), *(_text(getattr(s, name)[b]) for name in s.FIELDS)])
    return path


def series_points(s: TimeSeries, a: int, b: int) -> list[list[Any]]:
    """Points ``a`` to ``b - 1`` of ``s``, one list per column of series.csv (:data:`SERIES_COLUMNS`)."""
    return [s.t[a:b], *(getattr(s, name)[a:b] for name in s.FIELDS)]


class SeriesRows:
    """``series.csv`` from rows made ahead: :meth:`add` formats points the run will not change (all but its
    last: :meth:`TimeSeries.record` may replace it) while the run goes on, :meth:`write` the rest once it has
    ended.  The bytes are :func:`write_series_csv`'s."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def add(self, columns: list[list[Any]]) -> None:
        """The rows of the next points, whose columns are ``columns`` (:func:`series_points`)."""
        self.rows += map(",".join, zip(_cells(columns[0]), *map(_text, columns[1:]), strict=True))

    def write(self, columns: list[list[Any]], path: Path) -> Path:
        """Write the file: the rows added and those of the last points, whose columns are ``columns``."""
        self.add(columns)
        rows = self.rows
        with open(path, "w", newline="") as f:
            f.write(",".join(SERIES_COLUMNS) + "\r\n")
            for a in range(0, len(rows), CSV_BLOCK):
                f.write("\r\n".join(rows[a:a + CSV_BLOCK]))
                f.write("\r\n")
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


RANDOM_PLACES = ("random-sticky", "random-non-sticky")


def seed_notes(results: Results) -> list[str]:
    """Why a configuration run with several seeds shows ± 0: its seeds gave identical runs (every job's record
    equal).  Random placement still drew with each seed; it is said apart, since a reader expects it to vary."""
    same = [lb for lb, rs in runs_of(results).items() if len(rs) > 1 and all(r.jobs == rs[0].jobs for r in rs[1:])]
    if not same:
        return []
    rand = [lb for lb in same if runs_of(results)[lb][0].config.get("place") in RANDOM_PLACES]
    fixed = [lb for lb in same if lb not in rand]
    notes = []
    if fixed:
        notes.append(f"{', '.join(fixed)}: every seed gave the same run (nothing in {'it' if len(fixed) == 1 else 'them'} "
                     "depends on the seed: a trace's jobs, no random stage), hence ± 0")
    if rand:
        notes.append(f"{', '.join(rand)}: every seed gave the same run although each drew other GPUs at random: no job "
                     "ran faster or slower for the GPUs it drew (a job pays the same locality penalty however many "
                     "nodes beyond the fewest it spans, and no PM-scores tell GPUs apart), hence ± 0; the seed "
                     "matters with --variability generate (GPUs of unequal speed), or with smaller jobs on "
                     "larger nodes")
    return notes


# -- tables ---------------------------------------------------------------------
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
