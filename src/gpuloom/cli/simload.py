"""The workload of ``gpuloom simulate`` and ``gpuloom compare``: the options that choose it and the cluster,
the workload itself (a trace, read ahead by a child where one was started, generated jobs, or the built-in
ones), and the checks of those options and of jobs that can never fit the cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from .ahead import _AHEAD
from .common import OptionError, err_console, parse_params, positive, warn

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
