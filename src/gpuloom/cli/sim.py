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

The parts: :mod:`.simload` reads and checks the workload, :mod:`.simproc` runs the command's process (the
garbage collector, the children it starts), :mod:`.simfiles` writes a run's files in children during the run;
here are the two commands.
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

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
    positive,
    ray_connect,
    stack_params,
    user_errors,
    warn,
)
from .ending import keep_until_exit
from .output import OUT_HELP, Output, command_line, report_line
from .queues import QueuePolicyOpt, QueuesOpt, apply_queues, queue_outputs, queue_stage
from .simfiles import _collect, _plotter, _rows_writer, _Sender
from .simload import (  # noqa: F401  (_read_ahead, DEFAULT_RATE: as before)
    DEFAULT_RATE,
    ClusterOpt,
    CpusPerNodeOpt,
    DropOpt,
    FormatOpt,
    GenerateOpt,
    LimitOpt,
    MeasureOpt,
    MemPerNodeOpt,
    RateOpt,
    TraceOpt,
    TraceOptOpt,
    _read_ahead,
    check_cluster_options,
    check_impossible,
    check_workload_options,
    measure_window,
    workload,
)
from .simproc import ends_children, no_cycle_collection


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
