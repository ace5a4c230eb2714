"""``gpuloom elastic``: F-scheduling (elastic sizing) against static GPU slots, with the job lifecycle.

Without ``--trace`` it runs the thesis scenario (one 6-GPU machine, ResNet-50 /
InceptionV3 jobs of 2,000 steps at 0, 100, 200, 300 s).  Writes
``elastic_breakdown.png`` (per-job queued / launching+reallocating / running),
``elastic_util_cdf.png`` (GPUs held and busy) and ``elastic.json`` to ``--out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from ..core.registry import STAGE_DEFAULTS
from . import app
from .common import console, user_errors
from .output import OUT_HELP, Output


@app.command()
def elastic(
    trace: Annotated[Path | None, typer.Option("--trace", "-t", help="Trace file; omit for the thesis scenario.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="Trace format (auto-detected by default).")] = "auto",
    cluster: Annotated[str, typer.Option("--cluster", "-C", help="NODESxGPUS or a cluster file.")] = "1x6",
    v_bound: Annotated[float, typer.Option(help="Bound on the variance of slowdowns.")] = 0.5,
    slowdown: Annotated[str, typer.Option(help="fraction: f(R)/f(U); factor: f(U)/f(R); both: run each.")] = "both",
    slots: Annotated[str, typer.Option(help="Static slot sizes to compare, comma-separated.")] = "1,2,3,6",
    hysteresis: Annotated[float, typer.Option(
        help="Min. total throughput gain to apply a new plan, in the jobs' iterations/s (thesis: global steps/s); <0: off.")] = 1.0,
    launch: Annotated[float, typer.Option(help="Launch time, s (an assumption: the thesis gives none).")] = 10.0,
    checkpoint: Annotated[float, typer.Option(help="Checkpoint time, s (an assumption).")] = 5.0,
    stop: Annotated[float, typer.Option(help="Stop time, s (an assumption).")] = 2.0,
    round_len: Annotated[float, typer.Option("--round", help="Also reschedule every this many s (default: on events only, as the thesis).")] = math.inf,
    step: Annotated[str, typer.Option(help="Thesis step: global (90 samples split over the GPUs) or gpu (per-GPU mini-batch).")] = "global",
    order: Annotated[str, typer.Option(help="Order policy.")] = STAGE_DEFAULTS["order"],
    place: Annotated[str, typer.Option(help="Place policy for the elastic runs.")] = STAGE_DEFAULTS["place"],
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP)] = None,
) -> None:
    """Compare elastic F-scheduling with static slots; write the breakdown chart and utilisation CDF."""
    from ..core.cluster import parse_cluster
    from ..sim.elastic import (
        compare_elastic_static,
        comparison_rows,
        plot_phase_breakdown,
        plot_utilisation_cdf,
        thesis_specs,
    )
    from ..sim.engine import LifecycleTimes

    with user_errors():
        cl = parse_cluster(cluster)
        try:
            slot_list = [int(x) for x in slots.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"--slots must be integers separated by commas, got {slots!r}") from None
        if slowdown not in ("fraction", "factor", "both"):
            raise typer.BadParameter("--slowdown must be fraction, factor or both")
        if trace is not None:
            from ..sim.traces import load_trace

            specs = load_trace(trace, fmt)
        else:
            specs = thesis_specs(step=step)
        try:
            lt = LifecycleTimes(launch, checkpoint, stop)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        h = None if hysteresis < 0 else hysteresis
        modes = ("fraction", "factor") if slowdown == "both" else (slowdown,)
        label = {"fraction": "f(R)/f(U)", "factor": "f(U)/f(R)"}
        configs = {
            f"F v<={v_bound:g} {label[m]}": {"v_bound": v_bound, "slowdown": m, "hysteresis": h} for m in modes
        }
        output = Output("elastic", out)
        runs = compare_elastic_static(specs, cl, slot_list, configs, lt, round_len, order, place)
    folder = output.create(trace.stem if trace is not None else "thesis")
    plot_phase_breakdown(runs, folder / "elastic_breakdown.png")
    plot_utilisation_cdf(runs, folder / "elastic_util_cdf.png")
    rows = comparison_rows(runs)
    (folder / "elastic.json").write_text(json.dumps(rows, indent=2, default=str))
    output.finish()
    from rich.table import Table

    t = Table(title=f"{len(specs)} jobs on {cl.num_nodes} node(s) / {cl.num_gpus} GPUs")
    for c in rows[0]:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*[(f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}") if isinstance(v, float) and not math.isnan(v)
                    else str(v) for v in r.values()])
    console.print(t)
    console.print(f"results: {folder}/ (elastic.json, elastic_breakdown.png, elastic_util_cdf.png)", highlight=False,
                  markup=False, soft_wrap=True)
