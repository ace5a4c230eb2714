"""The files of a ``gpuloom simulate`` run written by child processes forked before the run: the rows the run
will not change sent to them during it (:class:`_Sender`), jobs.csv and series.csv written and the plots drawn
there (:class:`_Made`), and what each child returned or how it failed (:func:`_collect`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .simproc import _child

if TYPE_CHECKING:
    from ..sim.background import Background, BackgroundError
    from ..sim.plots import RunFigures
    from ..sim.report import JobsRest

_R = TypeVar("_R")


#: finished jobs per part sent to the child writing jobs.csv during the run
ROWS_PART = 1024


class _Made:
    """What a child writing a run's files makes of the rows sent during the run (:class:`_Sender`): jobs.csv's
    (:class:`~gpuloom.sim.report.JobRows`), series.csv's (:class:`~gpuloom.sim.report.SeriesRows`) and the
    series' points themselves, for the plots."""

    def __init__(self) -> None:
        from ..sim.report import SERIES_COLUMNS, JobRows, SeriesRows

        self.jobs, self.series = JobRows(), SeriesRows()
        self.points: list[list[Any]] = [[] for _ in SERIES_COLUMNS]

    def add(self, part: tuple[str, Any]) -> None:
        """``("jobs", (places, fields))``: finished jobs' rows; ``("series", columns)``: the series' next points;
        ``("load", None)``: import matplotlib now (:func:`~gpuloom.sim.plots.load_matplotlib`)."""
        kind, value = part
        if kind == "jobs":
            self.jobs.add(value)
            return
        if kind == "load":
            from ..sim.plots import load_matplotlib

            load_matplotlib(math=True)
            return
        self.series.add(value)
        for have, new in zip(self.points, value, strict=True):
            have += new

    def write(self, rest: tuple[JobsRest, list[list[Any]] | None, Path]) -> None:
        """jobs.csv (``rest[0]``: what the run's end left of it) and, given the series' last points
        (``rest[1]``), series.csv in folder ``rest[2]``."""
        jobs, points, folder = rest
        self.jobs.write(jobs)
        if points is not None:
            self.series.write(points, folder / "series.csv")

    def draw(self, job: tuple[RunFigures, list[list[Any]], Path]) -> list[Path]:
        """series.csv and the plots in folder ``job[2]``: ``job[0]`` the figures but their series, ``job[1]``
        the series' last points.  The JCT CDF (the plot that takes longest to draw) is drawn by a child of this
        process forked now, with matplotlib imported, beside series.csv and the series' plots drawn here."""
        from dataclasses import replace

        from ..sim.background import Background
        from ..sim.metrics import TimeSeries
        from ..sim.plots import draw_jct_cdf, draw_series

        figures, points, folder = job
        cdf: Background[None, Path] = Background("drawing the JCT CDF", lambda _: draw_jct_cdf(figures, folder))
        cdf.submit(None)
        try:
            self.series.write(points, folder / "series.csv")
            for have, new in zip(self.points, points, strict=True):
                have += new
            drawn = draw_series(replace(figures, series=TimeSeries(*self.points)), folder)
        finally:
            first = cdf.result()  # (waited for, or its failure raised, however the others went)
        return [first, *drawn]


def _plotter() -> Background[tuple[RunFigures, list[list[Any]], Path], list[Path]]:
    """A child process, forked now, that imports matplotlib once sent ``("load", None)`` (:meth:`_Made.add`), makes
    series.csv's rows it is sent during the run (:class:`_Sender`), then writes series.csv and draws the plots of
    the run it is sent (:meth:`_Made.draw`)."""
    made = _Made()
    return _child("drawing the plots", made.draw, take=made.add)


def _rows_writer() -> Background[tuple[JobsRest, list[list[Any]] | None, Path], None]:
    """A child process, forked now, that makes jobs.csv's rows (and series.csv's, where no plots are drawn) it
    is sent during the run (:class:`_Sender`), then writes the file(s) once sent the rest (:meth:`_Made.write`)."""
    made = _Made()
    return _child("writing jobs.csv", made.write, take=made.add)


class _Sender:
    """Sends the children the rows the run will not change, whenever at least :data:`ROWS_PART` more jobs have
    finished (called at the run's progress ticks): the finished jobs' to ``rows``, the series' points but its
    last (:meth:`~gpuloom.sim.metrics.TimeSeries.record` may replace it) to ``series``; ``ran`` will hold the
    simulator."""

    def __init__(self, rows: Background[Any, Any], series: Background[Any, Any], ran: list[Any]) -> None:
        self.rows, self.series, self.ran = rows, series, ran
        self.jobs = self.points = 0  # how many were sent

    def __call__(self) -> None:
        if not self.ran:
            return
        sim = self.ran[0]
        done = sim.completed
        if len(done) - self.jobs >= ROWS_PART:
            from ..sim.report import job_fields, series_points

            part = done[self.jobs:]
            points = max(self.points, len(sim.series) - 1)
            self.rows.send(("jobs", ([j.index for j in part], job_fields(part))))
            self.series.send(("series", series_points(sim.series, self.points, points)))
            self.jobs, self.points = len(done), points

    def jobs_rest(self, result: Any, folder: Path) -> JobsRest:
        """What the rows' child needs to write ``result``'s (the run's) jobs.csv into ``folder``."""
        from ..sim.report import jobs_rest

        return jobs_rest(result, folder / "jobs.csv",
                         {j.index for j in self.ran[0].completed[:self.jobs]} if self.ran else set())

    def last_points(self, result: Any) -> list[list[Any]]:
        """The series' points not sent."""
        from ..sim.report import series_points

        return series_points(result.series, self.points, len(result.series))


def _collect(child: Background[Any, _R] | None, default: _R) -> tuple[_R, BackgroundError | None]:
    """``(what the child returned, None)``, or ``(default, error)`` when it failed (or ``default`` without one)."""
    from ..sim.background import BackgroundError

    if child is None:
        return default, None
    try:
        return child.result(), None
    except BackgroundError as e:
        return default, e
