"""``gpuloom simulate`` (one configuration) and ``gpuloom compare`` (several, in parallel).

Policies are chosen by registry name (``--order srtf --place packed-sticky``);
policy parameters by ``-P name=value`` (each goes to whichever stage accepts
it).  With no arguments ``simulate`` runs the built-in scenario: a generated
workload on a 16x4 cluster, no files needed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from . import app
from .common import console, model_options, out_dir, parse_params, ray_connect, stack_params, user_errors

TraceOpt = Annotated[Path | None, typer.Option("--trace", "-t", help="Trace file; omit for the built-in workload.")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="Trace format (auto-detected by default).")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-C", help="NODESxGPUS (e.g. 16x4) or a TOML/YAML cluster file.")]


TraceOptOpt = Annotated[
    list[str] | None, typer.Option("--trace-opt", "-T", help="Trace reader option name=value (e.g. pending=error).")
]


def load_workload(trace: Path | None, fmt: str, generate: int | None, rate: float, seed: int, limit: int | None,
                  trace_opts: list[str] | None = None):  # noqa: ANN201
    from ..sim.generator import builtin_workload
    from ..sim.generator import generate as gen

    if trace is not None:
        from ..sim.traces import load_trace

        specs = load_trace(trace, fmt, **parse_params(trace_opts))
    elif generate:
        specs = gen(num_jobs=generate, jobs_per_hour=rate, seed=seed)
    else:
        specs = builtin_workload(seed)
    if limit is not None:
        specs = sorted(specs, key=lambda s: s.arrival)[:limit]
    return specs


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


@app.command()
@model_options
def simulate(
    model_opts: dict,
    trace: TraceOpt = None,
    fmt: FormatOpt = "auto",
    trace_opt: TraceOptOpt = None,
    cluster: ClusterOpt = "16x4",
    cpus_per_node: Annotated[int | None, typer.Option(help="Cores per node for NxG clusters (default 3 per GPU).")] = None,
    mem_gb_per_node: Annotated[float | None, typer.Option(help="Memory per node in GB for NxG clusters.")] = None,
    order: Annotated[str, typer.Option(help="Order policy: fifo, sjf, srtf, las, 2d-las, srsf, ftf, ...")] = "fifo",
    group: Annotated[str, typer.Option(help="Group policy: none, muri, ...")] = "none",
    size: Annotated[str, typer.Option(help="Size policy: proportional, greedy, opt, tune, elastic, ...")] = "proportional",
    place: Annotated[str, typer.Option(help="Place policy: packed-sticky, packed-non-sticky, random-sticky, ...")] = "packed-sticky",
    non_preemptive: Annotated[bool, typer.Option("--non-preemptive", help="Never preempt a running job.")] = False,
    param: Annotated[list[str] | None, typer.Option("--param", "-P", help="Policy parameter (name or stage.name) or model option, name=value (repeatable).")] = None,
    round_len: Annotated[float, typer.Option("--round", help="Round length in seconds.")] = 300.0,
    reschedule_on: Annotated[str, typer.Option(help="Also reschedule on: arrival, completion, both or none.")] = "none",
    restart_overhead: Annotated[float, typer.Option(help="Seconds lost per resume, migration or resize.")] = 10.0,
    launch_overhead: Annotated[float, typer.Option(help="Seconds lost on a job's first start.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for random placement and generators.")] = 0,
    max_time: Annotated[float | None, typer.Option(help="Stop at this simulated time (s).")] = None,
    drop_impossible: Annotated[bool, typer.Option(help="Count jobs larger than the cluster as unfinished instead of failing.")] = False,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip per-round invariant checks (faster).")] = False,
    generate: Annotated[int | None, typer.Option(help="Generate this many jobs instead of reading a trace.")] = None,
    rate: Annotated[float, typer.Option(help="Generated arrival rate, jobs/hour.")] = 20.0,
    limit: Annotated[int | None, typer.Option(help="Use only the first N jobs by arrival.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (default gpuloom-out).")] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots and report.md.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Simulate one scheduler configuration on a trace (or the built-in workload)."""
    from ..core.cluster import parse_cluster
    from ..perf.model import DEFAULT_LOCALITY_PENALTY
    from ..sim.engine import SimConfig
    from ..sim.runconfig import RunConfig, run_config

    with user_errors():
        cl = parse_cluster(cluster, cpus_per_node, mem_gb_per_node)
        penalty = model_opts.pop("locality_penalty", None)
        if reschedule_on not in ("none", "arrival", "completion", "both"):
            raise typer.BadParameter("--reschedule-on must be none, arrival, completion or both")
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
        rc = RunConfig("", order, group, size, place, not non_preemptive, stack_params(param, model_opts),
                       DEFAULT_LOCALITY_PENALTY if penalty is None else float(penalty), cfg).validate()
        specs = load_workload(trace, fmt, generate, rate, seed, limit, trace_opt)
        result = _run_with_progress(lambda cb: run_config(rc, cl, specs, progress=cb), len(specs))
    summary = result.summary()
    folder = out_dir(out)
    from ..sim import report

    report.write_run(result, folder)
    if plots:
        report.plot_run(result, folder)
        report.write_report(result, folder)
    if as_json:
        console.print_json(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}))
        return
    console.print(report.summary_table({rc.stack.label: result}))
    console.print(f"[dim]{len(specs)} jobs on {cl.num_nodes} nodes / {cl.num_gpus} GPUs; results in {folder}/[/]")


def _run_with_progress(run, total: int):  # noqa: ANN001, ANN202
    """Run, showing a rich progress bar once the run has taken more than a second."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    start = time.perf_counter()
    state: dict[str, Any] = {"bar": None, "task": None}

    def cb(done: int, n: int) -> None:
        if state["bar"] is None:
            if time.perf_counter() - start < 1.0:
                return
            bar = Progress("simulating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=console, transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("sim", total=n)
        state["bar"].update(state["task"], completed=done)

    try:
        return run(cb)
    finally:
        if state["bar"] is not None:
            state["bar"].stop()


@app.command()
@model_options
def compare(
    model_opts: dict,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="A run: 'order=srtf,place=pal,P.v_bound=0.5' (repeatable).")] = None,
    runs: Annotated[Path | None, typer.Option("--runs", help="TOML file with [[run]] tables.")] = None,
    trace: TraceOpt = None,
    fmt: FormatOpt = "auto",
    trace_opt: TraceOptOpt = None,
    cluster: ClusterOpt = "16x4",
    cpus_per_node: Annotated[int | None, typer.Option()] = None,
    mem_gb_per_node: Annotated[float | None, typer.Option()] = None,
    generate: Annotated[int | None, typer.Option(help="Generate this many jobs instead of reading a trace.")] = None,
    rate: Annotated[float, typer.Option(help="Generated arrival rate, jobs/hour.")] = 20.0,
    limit: Annotated[int | None, typer.Option(help="Use only the first N jobs by arrival.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    param: Annotated[list[str] | None, typer.Option("--param", "-P", help="Parameter or model option for every run, name=value (repeatable).")] = None,
    processes: Annotated[int | None, typer.Option("--processes", "-j", help="Parallel processes (default: CPU count).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray", help="Run the configurations as Ray tasks: auto (the cluster running here), local, or an address.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Run several configurations on the same trace in parallel; one table, one overlaid CDF."""
    from ..core.cluster import parse_cluster
    from ..sim import report
    from ..sim.engine import SimConfig
    from ..sim.runconfig import RunConfig, load_run_configs, parse_run_config

    with user_errors():
        cl = parse_cluster(cluster, cpus_per_node, mem_gb_per_node)
        from ..perf.model import DEFAULT_LOCALITY_PENALTY

        penalty = model_opts.pop("locality_penalty", None)
        base = RunConfig(params=stack_params(param, model_opts), sim=SimConfig(seed=seed),
                         locality_penalty=DEFAULT_LOCALITY_PENALTY if penalty is None else float(penalty))
        configs = [parse_run_config(c, base) for c in (config or [])]
        if runs is not None:
            configs += load_run_configs(runs, base)
        if not configs:
            configs = [parse_run_config(c, base) for c in ("order=fifo", "order=srtf", "order=las", "order=2d-las")]
        specs = load_workload(trace, fmt, generate, rate, seed, limit, trace_opt)
        if ray_address is not None:
            ray_connect(ray_address)
        results = report.run_many(configs, cl, specs, processes=processes, ray=ray_address is not None)
    folder = out_dir(out)
    report.write_compare(results, folder)
    rows = report.summary_rows(results)
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    console.print(report.summary_table(results))
    console.print(f"[dim]{len(specs)} jobs; results in {folder}/[/]")
