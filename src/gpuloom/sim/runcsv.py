"""A run's ``jobs.csv`` and ``series.csv``: written a column at a time, in blocks, or from rows made ahead
while the run goes on; the bytes are those the csv module writes row by row."""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.lifecycle import PHASES
from .metrics import RunResult, TimeSeries
from .runinfo import _cell

if TYPE_CHECKING:
    import numpy as np

    from ..core.job import Job

JOB_COLUMNS = (
    "id", "model", "gpus", "arrival", "duration", "first_start", "finish", "jct", "queueing_delay",
    "preemptions", "migrations", "resizes", "run_time", "overhead_time", "queued_time", "slowdown",
    "contention", "ftf_rho",
)
SERIES_COLUMNS = ("t", "gpus", "cpus", "mem_mb", "running", "queued")

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
