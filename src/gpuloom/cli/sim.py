"""``gpuloom simulate`` (one configuration) and ``gpuloom compare`` (several, in parallel).

Policies are chosen by registry name (``--order srtf --place packed-sticky``);
policy parameters by ``-P name=value`` (each goes to whichever stage accepts
it).  With no arguments ``simulate`` runs the built-in scenario: a generated
workload on a 16x4 cluster, no files needed.

The workload is one of: a trace (``--trace``); ``--generate N`` jobs (Poisson
arrivals at ``--rate`` jobs/h, seeded by ``--seed``), drawn from the built-in
Philly-like mix, or from the trace's jobs when ``--trace`` is also given; or,
with neither, the built-in 200-job workload of ``--seed``.

Before anything runs, the command checks its inputs and says what is wrong in
one line: bad values (``--round 0``), unknown policy names and ``-P`` names
(with a "did you mean" and the accepted names), jobs that can never fit the
cluster (unless ``--drop-impossible``).  Options that are ignored or that
conflict get a one-line warning.  Results record where they came from (trace,
workload, seed, gpuloom version, command line): see :mod:`gpuloom.sim.report`.
"""

from __future__ import annotations

import functools
import gc
import json
import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ..core.registry import STAGE_DEFAULTS
from . import app
from .ahead import _AHEAD, drop_read_ahead, read_ahead  # noqa: F401  (drop_read_ahead, read_ahead: as before)
from .common import (
    OptionError,
    check_policies,
    choice,
    console,
    err_console,
    model_options,
    parse_params,
    positive,
    ray_connect,
    stack_params,
    user_errors,
    warn,
)
from .ending import keep_until_exit
from .output import OUT_HELP, Output, command_line, report_line
from .queues import QueuePolicyOpt, QueuesOpt, apply_queues, queue_outputs, queue_stage

if TYPE_CHECKING:
    from ..sim.background import Background, BackgroundError
    from ..sim.plots import RunFigures
    from ..sim.report import JobsRest

_R = TypeVar("_R")

TraceOpt = Annotated[Path | None, typer.Option("--trace", "-t", help="Trace file; omit for the built-in workload.")]
FormatOpt = Annotated[str | None, typer.Option("--format", "-f", help="Trace format (auto-detected by default).")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-C", help="NODESxGPUS (e.g. 16x4) or a TOML/YAML cluster file.")]
CpusPerNodeOpt = Annotated[int | None, typer.Option(help="Cores per node for NxG clusters (default 3 per GPU).")]
MemPerNodeOpt = Annotated[float | None, typer.Option(help="Memory per node in GB for NxG clusters.")]
TraceOptOpt = Annotated[
    list[str] | None, typer.Option("--trace-opt", "-T", help="Trace reader option name=value (e.g. pending=error).")
]
GenerateOpt = Annotated[int | None, typer.Option(
    help="Generate this many jobs (Poisson arrivals at --rate); with --trace, each drawn from the trace's jobs.")]
RateOpt = Annotated[float | None, typer.Option(help="Arrival rate of generated jobs, jobs/hour (default 20).")]
LimitOpt = Annotated[int | None, typer.Option(help="Use only the first N jobs by arrival.")]
DropOpt = Annotated[bool, typer.Option(help="Count jobs that can never fit the cluster as unfinished instead of failing.")]

MeasureOpt = Annotated[str | None, typer.Option(
    "--measure-jobs", metavar="A:B",
    help="Compute the summary over jobs A..B-1 by arrival order (every job still runs); jobs.csv marks them.")]

DEFAULT_RATE = 20.0


def measure_window(text: str | None, jobs: int | None = None) -> tuple[int, int] | None:
    """``--measure-jobs A:B`` as a window (None without it), checked against ``jobs`` when given; bad input is
    an :class:`OptionError` naming the option."""
    from ..sim.window import WindowError, check_window, parse_window

    if text is None:
        return None
    try:
        window = parse_window(text)
        return window if jobs is None else check_window(window, jobs)
    except WindowError as e:
        raise OptionError(str(e)) from None


def workload(trace: Path | None, fmt: str | None, generate: int | None, rate: float | None, seed: int,
             limit: int | None, trace_opts: list[str] | None = None) -> tuple[list, str]:
    """``(specs, description)``; the description says what the workload is, for reports."""
    from ..sim.generator import builtin_workload
    from ..sim.generator import generate as gen

    r = DEFAULT_RATE if rate is None else rate
    if trace is not None:
        from ..sim.traces import load_trace

        specs = _read_ahead(trace, fmt) if not trace_opts else None
        if specs is None:
            specs = load_trace(trace, fmt or "auto", **parse_params(trace_opts, "--trace-opt"))
        what = f"trace {trace}"
        _note_trace_options(trace, specs)
        if generate:
            specs = gen(num_jobs=generate, jobs_per_hour=r, seed=seed, sample_from=specs)
            what = f"{generate} jobs at {r:g}/h drawn from {trace} (seed {seed})"
    elif generate:
        specs = gen(num_jobs=generate, jobs_per_hour=r, seed=seed)
        what = f"{generate} generated jobs at {r:g}/h (seed {seed})"
    else:
        specs = builtin_workload(seed)
        what = f"built-in workload, 200 jobs at 20/h (seed {seed})"
    if limit is not None:
        specs = sorted(specs, key=lambda s: s.arrival)[:limit]
        what += f", first {limit} by arrival"
    return specs, what


def _read_ahead(trace: Path, fmt: str | None) -> list | None:
    """The jobs of ``trace`` as the child :func:`read_ahead` started read it; None where none read it (or it
    failed: reading it again here raises the reader's own error)."""
    from ..sim.background import BackgroundError
    from ..sim.traces.philly import philly_trace

    child = _AHEAD.pop((str(trace), fmt), None)
    if child is None:
        return None
    _import_ahead()
    try:
        read = child.result()
    except BackgroundError:
        return None
    return None if read is None else philly_trace(trace, read).jobs


def _import_ahead() -> None:
    """Import what the run imports later anyway (numpy's random generators, the progress display, the plots'
    figures): done while the child reading the trace may still be at work, where this process would wait."""
    import numpy.random  # noqa: F401

    from ..sim import plots  # noqa: F401
    from . import progress  # noqa: F401


_NOTED: set[str] = set()


def _note_trace_options(trace: Path, specs: Sequence[Any]) -> None:
    """Say once per trace which model options its jobs bring (options given on the command line win)."""
    from ..perf.assembly import trace_options

    opts = trace_options(specs)
    if opts and str(trace) not in _NOTED:
        _NOTED.add(str(trace))
        shown = ", ".join(f"{k}={v}" for k, v in opts.items())
        err_console.print(f"note: {trace.name} was simulated by its source with {shown}; these apply unless "
                          "given (e.g. --variability none, -P locality_rule=excess, -P backfill=true)", highlight=False,
                          markup=False, soft_wrap=True)


def check_workload_options(trace: Path | None, fmt: str | None, trace_opt: list[str] | None, generate: int | None,
                           rate: float | None, limit: int | None) -> None:
    """One-line errors for bad values, warnings for options that are ignored."""
    if generate is not None and generate < 1:
        raise OptionError(f"--generate must be a number of jobs >= 1, got {generate}")
    positive("--rate", rate)
    if limit is not None and limit < 1:
        raise OptionError(f"--limit must be >= 1, got {limit}")
    if trace is None:
        if fmt is not None:
            warn("--format is ignored without --trace")
        if trace_opt:
            warn("--trace-opt is ignored without --trace")
    if rate is not None and not generate:
        warn("--rate is ignored without --generate (it sets the arrival rate of generated jobs)")


def check_cluster_options(cluster: str, cpus_per_node: int | None, mem_gb_per_node: float | None) -> None:
    from ..core.cluster import _SPEC

    if cpus_per_node is not None and cpus_per_node < 0:
        raise OptionError(f"--cpus-per-node must be >= 0, got {cpus_per_node}")
    positive("--mem-gb-per-node", mem_gb_per_node, zero=True)
    if not _SPEC.match(cluster):
        for opt, v in (("--cpus-per-node", cpus_per_node), ("--mem-gb-per-node", mem_gb_per_node)):
            if v is not None:
                warn(f"{opt} is ignored with a cluster file ({cluster} gives each node's cores and memory)")


def check_impossible(specs: Sequence[Any], cl: Any, drop: bool) -> dict[str, str]:
    """Jobs that can never fit ``cl``: an error, or with ``drop`` a warning; ``{id: reason}``."""
    from ..core.fit import impossible_jobs, impossible_message

    bad = impossible_jobs(specs, cl)
    if bad and not drop:
        raise OptionError(impossible_message(bad, "--drop-impossible"))
    if bad:
        (first, why), = list(bad.items())[:1]
        warn(f"{len(bad)} of {len(specs)} jobs can never run on this cluster and count as unfinished "
             f"(first: {first}: {why})")
    return bad


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _meta(trace: Path | None, what: str, cluster: str) -> dict[str, Any]:
    from .. import __version__

    return {"gpuloom_version": __version__, "trace": str(trace) if trace is not None else None, "workload": what,
            "cluster": cluster, "command": command_line()}


def _stall_warning(result: Any) -> None:
    if result.stalled:
        ids = ", ".join(result.stalled[:10]) + (", ..." if len(result.stalled) > 10 else "")
        warn(f"{result.label}: the run stalled at t={result.end_time:,.0f} s: {len(result.stalled)} job(s) waited "
             f"with no job able to finish and none left to arrive, and count as unfinished: {ids}")


def no_cycle_collection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run the command with Python's cyclic garbage collector off, as the simulation itself runs
    (:meth:`~gpuloom.sim.engine.Simulator.run`): loading a trace and writing a run's results build hundreds
    of thousands of plain objects and no reference cycles but a plot's figures, and the collector would
    rescan them all every few thousand allocations.  Reference counting frees the rest.  Turned on again
    with what the command left in the oldest generation (``freeze``, ``unfreeze``): turned on as it is,
    its first allocation would start with a scan of every object the command made.  (A host process that
    froze objects of its own keeps them frozen: the collector is then just turned on.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kw)
        finally:
            if collecting and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.enable()
                gc.unfreeze()
            elif collecting:
                gc.enable()

    return wrapper


#: child processes the running command started (:func:`ends_children` ends those it did not collect)
_CHILDREN: list[Background[Any, Any]] = []


def ends_children(fn: Callable[..., Any]) -> Callable[..., Any]:
    """End (kill and reap) the child processes the command started and did not collect, however it ends:
    an error, an early exit, an interrupt."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        mark = len(_CHILDREN)
        try:
            return fn(*args, **kw)
        finally:
            while len(_CHILDREN) > mark:
                _CHILDREN.pop().cancel()

    return wrapper


def _child(what: str, fn: Callable[[Any], Any], prepare: Callable[[], object] | None = None,
           take: Callable[[Any], object] | None = None) -> Background[Any, Any]:
    """A child process forked now (:class:`~gpuloom.sim.background.Background`), ended with the command."""
    from ..sim.background import Background

    child: Background[Any, Any] = Background(what, fn, prepare, take=take)
    _CHILDREN.append(child)
    return child


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


@app.command()
@no_cycle_collection
@ends_children
@model_options
def simulate(
    model_opts: dict,
    trace: TraceOpt = None,
    fmt: FormatOpt = None,
    trace_opt: TraceOptOpt = None,
    cluster: ClusterOpt = "16x4",
    cpus_per_node: CpusPerNodeOpt = None,
    mem_gb_per_node: MemPerNodeOpt = None,
    order: Annotated[str, typer.Option(help="Order policy: fifo, sjf, srtf, las, 2d-las, srsf, ftf, ...")] = STAGE_DEFAULTS["order"],
    group: Annotated[str, typer.Option(help="Group policy: none, muri, ...")] = STAGE_DEFAULTS["group"],
    size: Annotated[str, typer.Option(help="Size policy: proportional, greedy, opt, tune, elastic, ...")] = STAGE_DEFAULTS["size"],
    place: Annotated[str, typer.Option(help="Place policy: packed-sticky, packed-non-sticky, random-sticky, ...")] = STAGE_DEFAULTS["place"],
    non_preemptive: Annotated[bool, typer.Option("--non-preemptive", help="Never preempt a running job.")] = False,
    queue_policy: QueuePolicyOpt = None,
    queues: QueuesOpt = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-P", help="Policy parameter (name or stage.name) or model option, name=value (repeatable).")] = None,
    reserve_depth: Annotated[int, typer.Option(
        "--reserve-depth", help="Backfill guarantee: reservations for the first N waiting jobs (0: none).")] = 0,
    reservations: Annotated[Path | None, typer.Option(
        "--reservations", help="Advance reservation calendar (CSV: name,start,duration,users,nodes,gpus; "
                               "docs/operations.md).")] = None,
    round_len: Annotated[float, typer.Option("--round", help="Round length in seconds.")] = 300.0,
    reschedule_on: Annotated[str, typer.Option(help="Also reschedule on: arrival, completion, both or none.")] = "none",
    restart_overhead: Annotated[float, typer.Option(help="Seconds lost per resume, migration or resize.")] = 10.0,
    launch_overhead: Annotated[float, typer.Option(help="Seconds lost on a job's first start.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for generated workloads, random placement and generated PM-scores.")] = 0,
    max_time: Annotated[float | None, typer.Option(help="Stop at this simulated time (s).")] = None,
    drop_impossible: DropOpt = False,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip per-round invariant checks (faster).")] = False,
    generate: GenerateOpt = None,
    rate: RateOpt = None,
    limit: LimitOpt = None,
    measure_jobs: MeasureOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP)] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Simulate one scheduler configuration on a trace (or the built-in workload)."""
    from ..core.cluster import parse_cluster
    from ..core.job import attr_keys_known
    from ..perf.model import DEFAULT_LOCALITY_PENALTY
    from ..sim.engine import SimConfig
    from ..sim.runconfig import RunConfig, run_config

    with user_errors(), ExitStack() as scope:
        penalty = model_opts.pop("locality_penalty", None)
        locality_penalty = DEFAULT_LOCALITY_PENALTY if penalty is None else float(penalty)
        positive("--round", round_len)
        positive("--restart-overhead", restart_overhead, zero=True)
        positive("--launch-overhead", launch_overhead, zero=True)
        positive("--max-time", max_time)
        if not (math.isfinite(locality_penalty) and locality_penalty >= 1):
            raise OptionError(f"--locality-penalty must be a number >= 1, got {locality_penalty:g}")
        reschedule_on = choice("--reschedule-on", reschedule_on, ("none", "arrival", "completion", "both"))
        check_workload_options(trace, fmt, trace_opt, generate, rate, limit)
        measure_window(measure_jobs)
        check_cluster_options(cluster, cpus_per_node, mem_gb_per_node)
        cl = parse_cluster(cluster, cpus_per_node, mem_gb_per_node)
        params = stack_params(param, model_opts)
        queue = queue_stage(queue_policy, queues)
        check_policies(order, group, size, place, list(params), queue)
        plotter = _plotter() if plots else None  # forked before the run, while this process is small
        rows = _rows_writer()  # (likewise)
        # the plots' child imports matplotlib (0.3 s of CPU) beside this process's work before the run, but not
        # beside a child still reading the trace (:func:`read_ahead`): three processes on two cores slow this one
        load_after = bool(_AHEAD)
        if plotter is not None and not load_after:
            plotter.send(("load", None))
        specs, what = workload(trace, fmt, generate, rate, seed, limit, trace_opt)
        # the keys of the jobs' attrs gathered once for the checks and the model's factors that look for theirs
        scope.enter_context(attr_keys_known(specs))
        if plotter is not None and load_after:
            plotter.send(("load", None))
        window = measure_window(measure_jobs, len(specs))
        if model_opts.get("variability_seed") is not None and model_opts.get("variability") is None:
            from ..perf.assembly import trace_options

            if "variability" not in trace_options(specs):
                warn("--variability-seed is ignored without --variability")
        impossible = check_impossible(specs, cl, drop_impossible)
        cfg = SimConfig(
            round_len=round_len,
            reschedule_on_arrival=reschedule_on in ("arrival", "both"),
            reschedule_on_completion=reschedule_on in ("completion", "both"),
            launch_overhead=launch_overhead,
            restart_overhead=restart_overhead,
            seed=seed,
            check=not no_check,
            max_time=max_time if max_time is not None else math.inf,
            drop_impossible=drop_impossible,
        )
        label = f"{order}/{group}/{size}/{place}" + (f"/{queue}" if queue != "none" else "")
        if reserve_depth < 0:
            raise OptionError(f"--reserve-depth must be >= 0, got {reserve_depth}")
        calendar = []
        if reservations is not None:
            from ..sim.reservations import load_calendar

            calendar = load_calendar(reservations, cl)
        rc = RunConfig(label, order, group, size, place, not non_preemptive, params, locality_penalty, cfg,
                       queue, reserve_depth, calendar).validate()
        tree = apply_queues([rc], queues, specs, cl)
        if tree is not None:
            tree.check_capacity(cl)  # what the run would find first: before --out is looked at
        output = Output("simulate", out)  # a refused --out costs no run time
        ran: list[Any] = []  # (the simulator)
        sender = _Sender(rows, plotter or rows, ran)
        result = _run_with_progress(lambda tick: run_config(rc, cl, specs, tick=tick, queues=tree, keep=ran,
                                                            impossible=impossible), sender)
    result.measure(window)
    result.meta.update(_meta(trace, what, cluster))
    _stall_warning(result)
    folder = output.create("-".join([order, *(v for v, d in ((group, STAGE_DEFAULTS["group"]), (size, STAGE_DEFAULTS["size"]),
                                                              (place, STAGE_DEFAULTS["place"])) if v != d)]))
    from ..sim import report

    # the run's files are written by three processes at once, each forked before the run, each sent the rest
    # of what it made during the run: the plots and series.csv by one (they take longest, so they go first; it
    # draws the JCT CDF in a child of its own), jobs.csv by another (and series.csv, without plots), the summary
    # and report here
    # (the plots need the summary's times, not Themis' figures: sent before those are computed)
    if plotter is not None:
        from dataclasses import replace

        from ..sim.metrics import TimeSeries
        from ..sim.plots import run_figures

        plotter.submit((replace(run_figures(result, report.run_time_unit(result)), series=TimeSeries()),
                        sender.last_points(result), folder))
    summary = result.summary()
    rows.submit((sender.jobs_rest(result, folder), None if plotter is not None else sender.last_points(result),
                 folder))
    per_queue = queue_outputs({result.label: result}, folder, plots)
    _, rows_failed = _collect(rows, None)
    drawn, plots_failed = _collect(plotter, [])
    if rows_failed is not None:  # (what a failed child may not have written)
        report.write_jobs_csv(result, folder / "jobs.csv")
    if plots_failed is not None or (rows_failed is not None and plotter is None):
        report.write_series_csv(result, folder / "series.csv")
    result.meta["command_wall_time_s"] = output.wall_s()
    report.write_summary(result, folder)
    report.write_report(result, folder, drawn)
    output.finish()
    keep_until_exit(result, specs, ran)  # (the program ends without freeing the run object by object)
    failures = [failed for failed in (rows_failed, plots_failed) if failed is not None]
    for failed in failures:  # (the files are all written, but for the plots a failed drawing did not draw)
        err_console.print(failed.child_traceback.rstrip(), markup=False, highlight=False)
        err_console.print(f"[bold red]error:[/] {escape(str(failed))}", highlight=False, soft_wrap=True)
    if failures:
        raise typer.Exit(1)
    if as_json:
        console.print_json(json.dumps(report.jsonable(summary)))
        return
    console.print(report.summary_table({result.label: result}))
    if per_queue is not None:
        console.print(per_queue)
    if window is not None:
        console.print(f"measured: jobs {window[0]}-{window[1] - 1} by arrival order (--measure-jobs); every job ran",
                      highlight=False)
    console.print(f"[dim]{len(specs)} jobs ({what}) on {cl.num_nodes} {_plural(cl.num_nodes, 'node')} / "
                  f"{cl.num_gpus} GPUs; simulated in {result.wall_time:.2f} s, "
                  f"{result.meta['command_wall_time_s']:.1f} s in all[/]", highlight=False)
    report_line(folder / "report.md")


def _run_with_progress(run, each=None):  # noqa: ANN001, ANN202
    """Run with progress: a bar on a terminal once the run takes over a second, else a line per interval;
    ``each()`` is also called at every tick."""
    from .progress import Progress

    with Progress("simulate") as prog:
        if each is None:
            return run(lambda done, n, now: prog.update(0, done, n, now))

        def tick(done: int, n: int, now: float) -> None:
            prog.update(0, done, n, now)
            each()

        return run(tick)


def parse_seeds(text: str | None, seed: int) -> list[int]:
    """``--seeds 5`` → five seeds from ``--seed``; ``--seeds 0,3,7`` → those seeds; none → ``[seed]``."""
    if text is None:
        return [seed]
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise OptionError(f"--seeds must be a count (5) or a list of seeds (0,3,7), got {text!r}") from None
    if not values:
        raise OptionError("--seeds is empty")
    if len(values) == 1 and "," not in text:
        if values[0] < 1:
            raise OptionError(f"--seeds must be a count >= 1, got {values[0]}")
        return list(range(seed, seed + values[0]))
    if len(set(values)) != len(values):
        raise OptionError(f"--seeds lists a seed twice: {text}")
    return values


@app.command()
@model_options
def compare(
    model_opts: dict,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="A run: 'order=srtf,place=pal,P.v_bound=0.5' (repeatable).")] = None,
    runs: Annotated[Path | None, typer.Option("--runs", help="TOML file with [[run]] tables.")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-P", help="Policy parameter or model option name=value for every configuration (repeatable).")] = None,
    trace: TraceOpt = None,
    fmt: FormatOpt = None,
    trace_opt: TraceOptOpt = None,
    cluster: ClusterOpt = "16x4",
    cpus_per_node: CpusPerNodeOpt = None,
    mem_gb_per_node: MemPerNodeOpt = None,
    generate: GenerateOpt = None,
    rate: RateOpt = None,
    limit: LimitOpt = None,
    measure_jobs: MeasureOpt = None,
    round_len: Annotated[float | None, typer.Option(
        "--round", help="Round length in seconds for every configuration (default 300; a config's round= wins).")] = None,
    reschedule_on: Annotated[str | None, typer.Option(
        help="Also reschedule on: arrival, completion, both or none, for every configuration.")] = None,
    seed: Annotated[int, typer.Option(help="Seed (or first seed with --seeds N).")] = 0,
    seeds: Annotated[str | None, typer.Option(
        help="Run every configuration with N seeds (from --seed) or with a list (0,3,7): mean and 95 % CI.")] = None,
    drop_impossible: DropOpt = False,
    queues: QueuesOpt = None,
    processes: Annotated[int | None, typer.Option("--processes", "-j", help="Parallel processes (default: CPU count).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray", help="Run the configurations as Ray tasks: auto (the cluster running here), local, or an address.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP)] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one summary row per run as JSON.")] = False,
) -> None:
    """Run several configurations on the same workload in parallel: one table, bar charts and overlaid CDFs.

    With --seeds, every configuration runs once per seed; the seed drives generated workloads
    (the built-in one, --generate), random placement and generated PM-scores.
    """
    from ..core.cluster import parse_cluster
    from ..sim import report
    from ..sim.engine import SimConfig
    from ..sim.runconfig import RunConfig, load_run_configs, parse_run_config, run_seeds
    from .progress import Progress

    with user_errors():
        check_workload_options(trace, fmt, trace_opt, generate, rate, limit)
        window = measure_window(measure_jobs)
        check_cluster_options(cluster, cpus_per_node, mem_gb_per_node)
        if processes is not None and processes < 1:
            raise OptionError(f"--processes must be >= 1, got {processes}")
        seed_list = parse_seeds(seeds, seed)
        cl = parse_cluster(cluster, cpus_per_node, mem_gb_per_node)
        positive("--round", round_len)
        sim_base: dict[str, Any] = {"seed": seed, "drop_impossible": drop_impossible}
        if round_len is not None:
            sim_base["round_len"] = round_len
        if reschedule_on is not None:
            reschedule_on = choice("--reschedule-on", reschedule_on, ("none", "arrival", "completion", "both"))
            sim_base["reschedule_on_arrival"] = reschedule_on in ("arrival", "both")
            sim_base["reschedule_on_completion"] = reschedule_on in ("completion", "both")
        from ..perf.model import DEFAULT_LOCALITY_PENALTY

        penalty = model_opts.pop("locality_penalty", None)
        base = RunConfig(sim=SimConfig(**sim_base), params=stack_params(param, model_opts),
                         locality_penalty=DEFAULT_LOCALITY_PENALTY if penalty is None else float(penalty))
        configs = [parse_run_config(c, base) for c in (config or [])]
        if runs is not None:
            configs += load_run_configs(runs, base)
        if not configs:
            configs = [parse_run_config(c, base) for c in ("order=fifo", "order=srtf", "order=las", "order=2d-las")]
        if seeds is not None:
            fixed = [rc.name for rc in configs if rc.sim.seed != seed]
            if fixed:
                warn(f"--seeds replaces the seed of {', '.join(fixed)}")
        seeded = trace is None or bool(generate)  # the workload changes with the seed
        cache: dict[int, tuple[list, str]] = {}

        def load(s: int) -> list:
            if s not in cache:
                cache[s] = workload(trace, fmt, generate, rate, s, limit, trace_opt)
            return cache[s][0]

        strict = any(not rc.sim.drop_impossible for rc in configs)
        for s in seed_list if seeded else seed_list[:1]:
            check_impossible(load(s), cl, drop=not strict)
            measure_window(measure_jobs, len(load(s)))  # the window within every seed's workload
        what = cache[seed_list[0]][1]
        if seeded and len(seed_list) > 1:
            what = what.replace(f"(seed {seed_list[0]})", "(one per seed)")
        n_jobs = sum(len(load(s)) for s in seed_list) if seeded else len(load(seed_list[0])) * len(seed_list)
        tree = apply_queues(configs, queues, load(seed_list[0]), cl)
        if tree is not None:
            tree.check_capacity(cl)  # what the runs would find first: before --out is looked at
        if ray_address is not None:
            ray_connect(ray_address)
        output = Output("compare", out)  # a refused --out costs no run time
        with Progress("compare", runs=len(configs) * len(seed_list), jobs=n_jobs * len(configs)) as prog:
            results = run_seeds(configs, cl, seed_list, load if seeded else load(seed_list[0]), processes,
                                on_progress=lambda p: prog.update(p.key, p.done, p.total, p.now, p.finished),
                                poll=prog.tick, queues=tree, ray=ray_address is not None)
    meta = _meta(trace, what, cluster)
    for rs in results.values():
        for r in rs:
            r.measure(window)
            r.meta.update(meta)
            _stall_warning(r)
    labels = list(results)
    folder = output.create("+".join(labels) if len("+".join(labels)) <= 40 else f"{len(labels)}-configs")
    report.write_compare(results, folder, plots=plots, meta=meta, command_clock=output.wall_s)
    per_queue = queue_outputs({label: rs[0] for label, rs in results.items()}, folder, False)  # the first seed's
    output.finish()
    if as_json:
        console.print_json(json.dumps(report.jsonable(report.summary_rows(results))))
        return
    console.print(report.summary_table(results))
    if per_queue is not None:
        console.print(per_queue)
    for note in report.seed_notes(results):
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if window is not None:
        console.print(f"measured: jobs {window[0]}-{window[1] - 1} by arrival order (--measure-jobs); every job ran",
                      highlight=False)
    n_jobs = len(next(iter(cache.values()))[0])  # per run
    seeds_txt = f"; {len(seed_list)} seeds: mean ± 95 % CI" if len(seed_list) > 1 else ""
    walls = sum(r.wall_time for rs in results.values() for r in rs)
    console.print(f"[dim]{n_jobs} jobs ({what}){seeds_txt}; simulated in {walls:.2f} s (all runs), "
                  f"{output.wall_s():.1f} s in all[/]", highlight=False)
    report_line(folder / "compare.md")
