"""``gpuloom validate``: how well the simulator predicts the real service, in one command.

For each policy stack: a time-scaled slice of a real trace runs through a real
``gpuloom serve`` on a declared fake-GPU cluster, jobs being real processes
(:mod:`.testbed`); the service's history is exported as a trace
(:mod:`gpuloom.runtime.state.export`); the same workload is simulated with the same
stack four ways, which splits the error (:mod:`gpuloom.sim.validate`):

* ``model``: what the simulator predicts from the workload alone (the model's
  speeds, no launch or stop overheads, a round's launches at the decision);
* ``+overheads``: the same with each job's launch, exit and stop times as the
  service measured them (``LifecycleTimes`` per job);
* ``+round timing``: and a round's launches once its stops are done, as the
  service carries a round out (``SimConfig.starts_wait_for_stops``): the
  calibrated simulator;
* ``replay``: the exported trace itself (measured speeds) with those times.

model -> +overheads is what launch and stop overheads explain, -> +round timing
what the service's round structure explains, -> replay what the speed model
gets wrong; what replay still misses is event latency and the order of
near-simultaneous events.  Each allocation's measured speed is also checked
against the model directly (solo, other cores, shared GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer

from . import app
from .common import OptionError, console, err_console, parse_params, user_errors
from .output import OUT_HELP, Output, report_line

#: the simulations of each stack, from the workload alone to the service's measurements
VARIANTS = ("model", "+overheads", "+round timing", "replay")


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")


def _stacks(names: list[str] | None, params: dict[str, Any]) -> dict[str, Any]:
    from ..driver import STAGE_DEFAULTS, Stack
    from ..sim.validate import STACKS

    out: dict[str, Stack] = {}
    for name in names or list(STACKS):
        if name in STACKS:
            base = STACKS[name]
            st = Stack(base.order, base.group, base.size, base.place, base.preemptive, dict(base.params))
        else:
            kv = parse_params([x for x in name.split(",") if x.strip()])
            extra = {k[2:]: v for k, v in kv.items() if k.startswith("P.")}
            unknown = set(kv) - {"order", "group", "size", "place"} - {"P." + k for k in extra}
            if unknown:
                raise typer.BadParameter(f"--stack {name!r}: one of {', '.join(STACKS)} or order=..,group=..,"
                                         f"size=..,place=..,P.name=value (unknown: {', '.join(sorted(unknown))})")
            stage = {k: str(v) for k, v in kv.items() if not k.startswith("P.")}
            order, group, size, place = (stage.get(s, STAGE_DEFAULTS[s]) for s in ("order", "group", "size", "place"))
            st = Stack(order, group, size, place, params=extra)
        st.params.update(params)
        st.scheduler()  # bad names and parameters fail now, before any server starts
        out[name] = st
    return out


def run_stack(label: str, stack: Any, jobs: list[Any], cluster: Any, round_s: float,
              workdir: Path, script: Path | None, timeout: float) -> dict[str, Any]:
    """One stack: the service, the three simulations, the comparisons (see the module notes)."""
    from ..sim.traces.own import read_jsonl
    from ..sim.validate import SimSetup, compare, lifecycle_attrs, outcomes_of, simulate, speed_errors, with_attrs
    from .export import cluster_path, cluster_toml
    from .testbed import Testbed

    wd = workdir / _slug(label)
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    run = Testbed(wd, cluster, stack, round_s=round_s, script=script).run(jobs, timeout)
    trace_file = workdir / f"{_slug(label)}.trace.jsonl"
    trace_file.write_text("".join(json.dumps(r) + "\n" for r in run.trace))
    node = cluster.nodes[0]  # the cluster beside it, as gpuloom history --as-trace writes it
    cluster_path(trace_file).write_text(cluster_toml([{"gpus": node.gpus, "cpus": node.cpus, "mem_mb": node.mem_mb,
                                                       "gpu_type": node.gpu_type}]))
    ids = {str(r["id"]): str(r["attrs"]["name"])[1:] for r in run.trace}  # service id -> workload id ("v<id>")
    arrivals = {jid: o.arrival for jid, o in run.outcomes.items()}
    specs = [j.spec(cluster, arrival=arrivals.get(j.id, j.arrival)) for j in jobs]
    measured = {ids[str(r["id"])]: lifecycle_attrs(r) for r in run.trace}
    naive, rounds = SimSetup(round_s=round_s, starts_wait_for_stops=False), SimSetup(round_s=round_s)
    calibrated = with_attrs(specs, measured)
    by_sid = {str(r["id"]): r for r in run.trace}
    replay_specs = with_attrs(read_jsonl(trace_file).jobs, {sid: lifecycle_attrs(by_sid[sid]) for sid in by_sid})
    res_replay = simulate(replay_specs, cluster, stack, rounds)
    runs = {"model": (simulate(specs, cluster, stack, naive), None),
            "+overheads": (simulate(calibrated, cluster, stack, naive), None),
            "+round timing": (simulate(calibrated, cluster, stack, rounds), None),
            "replay": (res_replay, {ids[k]: v for k, v in outcomes_of(res_replay).items() if k in ids})}
    out: dict[str, Any] = {"stack": stack.names | {"params": stack.params}, "service_wall_s": round(run.wall_s, 1),
                           "states": run.states, "trace": str(trace_file)}
    for name, (res, sim_out) in runs.items():
        out[name] = compare(run.outcomes, sim_out if sim_out is not None else outcomes_of(res), run.util,
                            res.summary()["gpu_util"])
        # every stop (a preemption, or the stop half of a move or resize), as the service counts them
        out[name]["stops_sim"] = sum(j.preemptions + j.migrations + j.resizes for j in res.jobs)
    out["stops_real"] = sum(int(r["attrs"].get("preemptions", 0)) for r in run.trace)
    errs = speed_errors(run.trace, {s.id: s for s in specs}, cluster, stack, ids)
    out["speed_err"] = {k: {"n": len(v), "median_abs": statistics.median(abs(x) for x in v) if v else None,
                            "mean": statistics.fmean(v) if v else None} for k, v in errs.items()}
    lt = [a["launch_time"] for a in measured.values() if "launch_time" in a]
    ct = [a["checkpoint_time"] for a in measured.values() if "checkpoint_time" in a]
    out["overheads"] = {"launch_mean_s": statistics.fmean(lt) if lt else None,
                        "stop_mean_s": statistics.fmean(ct) if ct else None,
                        "exit_mean_s": statistics.fmean(float(r["attrs"].get("exit_s") or 0) for r in run.trace)}
    return out


def budget_table(results: dict[str, dict[str, Any]]) -> str:
    """The error budget: mean-JCT error and median per-job error of each simulation, by stack."""
    from ..sim.validate import fmt_pct

    head = ("| stack | model | +overheads | +round timing | replay (measured speeds) | launch / exit / stop (s) "
            "| stops real / sim | speed err solo / cores / shared |\n|---|---|---|---|---|---|---|---|\n")
    lines = []
    for label, r in results.items():
        cells = [f"{fmt_pct(r[k]['mean_jct_err'])} (med {100 * r[k]['jct_err_median']:.1f}%)"
                 for k in VARIANTS]
        cells.append(f"{r['stops_real']} / {r['+round timing']['stops_sim']}")
        o = r["overheads"]
        ov = " / ".join("-" if o[k] is None else f"{o[k]:.2f}" for k in ("launch_mean_s", "exit_mean_s", "stop_mean_s"))
        sp = " / ".join("-" if v["median_abs"] is None else f"{100 * v['median_abs']:.1f}% (n={v['n']})"
                        for v in r["speed_err"].values())
        lines.append(f"| {label} | " + " | ".join(cells[:4]) + f" | {ov} | {cells[4]} | {sp} |")
    return head + "\n".join(lines) + "\n"


@app.command()
def validate(
    trace: Annotated[Path | None, typer.Option(help="Trace to slice (default: Muri's testbed trace in the data folder).")] = None,
    data: Annotated[Path | None, typer.Option(help="Data folder (default $GPULOOM_DATA, else ../shared/data beside the checkout).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="Trace format (auto-detected by default).")] = "auto",
    jobs: Annotated[int, typer.Option("--jobs", "-n", help="Jobs in the slice.")] = 30,
    start: Annotated[int, typer.Option(help="First job of the slice (index in arrival order).")] = 0,
    gpu_div: Annotated[int, typer.Option(help="Divide each job's GPUs by this (capped at a node).")] = 8,
    step: Annotated[float, typer.Option(help="Seconds of the slice's median iteration.")] = 0.25,
    median: Annotated[float, typer.Option(help="Seconds the median job runs alone.")] = 20.0,
    lo: Annotated[float, typer.Option(help="Shortest job, seconds alone.")] = 5.0,
    hi: Annotated[float, typer.Option(help="Longest job, seconds alone.")] = 90.0,
    span: Annotated[float, typer.Option(help="Seconds over which the slice's jobs arrive.")] = 90.0,
    cluster: Annotated[str, typer.Option("--cluster", "-C", help="Declared fake-GPU cluster (NODESxGPUS; one node: the local executor).")] = "1x4",
    cpus_per_node: Annotated[int, typer.Option(help="Declared cores per node (default: Muri's testbed, 92 per 8 GPUs).")] = 46,
    mem_gb_per_node: Annotated[float | None, typer.Option(help="Declared memory per node, GB (default 64 per GPU).")] = None,
    round_s: Annotated[float, typer.Option("--round", help="Seconds between scheduling rounds (both faces).")] = 2.0,
    stack: Annotated[list[str] | None, typer.Option("--stack", "-s", help="A stack: fifo/proportional/packed, srtf/tune, srsf+muri (default: all three) or order=..,group=..,size=..,place=..,P.name=value (repeatable).")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-P", help="Policy parameter or model option for every stack, both faces.")] = None,
    job_script: Annotated[Path | None, typer.Option(help="The job (default examples/sleepy_train.py of this checkout).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one stack's service run may take.")] = 1800.0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Run a trace slice through a real service and the simulator under the same stacks; report the errors."""
    from ..core.cluster import parse_cluster
    from ..sim.reproduce.common import ReproduceError, data_dir
    from ..sim.traces import load_trace
    from ..sim.validate import scale_workload, table

    with user_errors():
        cl = parse_cluster(cluster, cpus_per_node, mem_gb_per_node)
        if cl.num_nodes != 1:
            raise typer.BadParameter("--cluster: the testbed runs one node (the local executor), e.g. 1x4")
        if trace is None:
            try:
                trace = data_dir(data) / "muri" / "testbed_trace" / "cluster_trace.csv"
            except ReproduceError as e:
                raise OptionError(f"{e}, or --trace FILE") from None
        stacks = _stacks(stack, parse_params(param))
        workload = scale_workload(load_trace(trace, fmt), cl, jobs, start, gpu_div, step, median, lo, hi, span)
        output = Output("validate", out)
    folder = output.create("+".join(stacks))
    (folder / "workload.json").write_text(json.dumps([dataclasses.asdict(j) for j in workload], indent=1))
    results: dict[str, dict[str, Any]] = {}
    for label, st in stacks.items():
        console.print(f"[dim]{label}: running {len(workload)} jobs through gpuloom serve ...[/]", highlight=False)
        try:
            results[label] = run_stack(label, st, workload, cl, round_s, folder, job_script, timeout)
        except (RuntimeError, TimeoutError, OSError) as e:  # the service's run failed: nothing to compare
            err_console.print(f"[bold red]error:[/] {label}: {e}", highlight=False)
            raise typer.Exit(1) from None
    doc = {"trace": str(trace), "jobs": len(workload), "cluster": cluster, "cpus_per_node": cpus_per_node,
           "round_s": round_s, "results": results}
    (folder / "validation.json").write_text(json.dumps(doc, indent=1, default=str))
    md = ("## Simulator vs service: the simulator calibrated with the service's launch, exit and stop times\n\n"
          + table({k: v["+round timing"] for k, v in results.items()})
          + "\n## The simulator from the workload alone (no overheads)\n\n"
          + table({k: v["model"] for k, v in results.items()})
          + "\n## Error budget (mean JCT error, median per-job JCT error)\n\n" + budget_table(results))
    (folder / "validation.md").write_text(md)
    output.finish()
    if as_json:
        console.print_json(json.dumps(doc, default=str))
        return
    print(md)
    console.print(f"[dim]validation.json, validation.md and the exported traces in {folder}/[/]", highlight=False)
    report_line(folder / "validation.md")
