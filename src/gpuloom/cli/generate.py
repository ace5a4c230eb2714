"""``gpuloom generate gavel``: write a generated workload as a trace ``simulate`` and ``compare`` read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import OptionError, user_errors

generate_app = typer.Typer(help="Write a generated workload as a trace file (gpuloom's own csv/jsonl).",
                           no_args_is_help=True)
app.add_typer(generate_app, name="generate")


@generate_app.command("gavel")
def gavel(
    out: Annotated[Path, typer.Argument(help="Trace file to write (.jsonl keeps every attribute; .csv)")],
    jobs: Annotated[int, typer.Option(help="Number of jobs.")] = 1000,
    rate: Annotated[float, typer.Option(help="Arrival rate, jobs/hour (Poisson).")] = 4.0,
    seed: Annotated[int, typer.Option(help="Gavel's seed: the same jobs as Gavel's simulator with this seed.")] = 0,
    multi_gpu: Annotated[bool, typer.Option("--multi-gpu", help="Continuous-multiple: 1/2/4/8 GPUs "
                                            "(default continuous-single: one GPU each).")] = False,
    data: Annotated[Path | None, typer.Option(help="Data folder (default $GPULOOM_DATA, else ../shared/data "
                                                   "beside the checkout).")] = None,
    throughputs: Annotated[Path | None, typer.Option(help="Gavel's throughput file (default the data folder's "
                                                          "gavel/throughputs/simulation_throughputs.json).")] = None,
) -> None:
    """Gavel's continuous-single (or --multi-gpu: continuous-multiple) workload, job for job as Gavel's simulator
    draws it; jobs carry their job type and throughput file, so the gpu_type factor gives their speed per type."""
    from ..perf.datadir import DataDirError, require_data_dir
    from ..sim.gavel_workload import THROUGHPUTS, gavel_workload
    from ..sim.traces import save_trace

    with user_errors():
        if jobs < 1:
            raise OptionError(f"--jobs must be >= 1, got {jobs}")
        if not rate > 0:
            raise OptionError(f"--rate must be > 0 jobs/hour, got {rate}")
        if out.suffix not in (".jsonl", ".csv"):
            raise OptionError(f"{out}: the trace is written as .jsonl or .csv")
        if throughputs is None:
            try:
                throughputs = require_data_dir(data) / THROUGHPUTS
            except DataDirError as e:
                raise OptionError(f"{e} (or give --throughputs FILE)") from None
        if not throughputs.is_file():
            raise OptionError(f"--throughputs: no file {throughputs}")
        specs = gavel_workload(jobs, rate, seed, multi_gpu, throughputs)
        save_trace(specs, out)
    kind = "continuous-multiple" if multi_gpu else "continuous-single"
    typer.echo(f"{out}: {len(specs)} jobs of Gavel's {kind} workload at {rate:g} jobs/h (seed {seed}), "
               f"last arrival {specs[-1].arrival / 3600:.1f} h")
