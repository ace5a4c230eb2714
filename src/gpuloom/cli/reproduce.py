"""``gpuloom reproduce muri|synergy|pal|fsched|gavel|all``: published figures beside gpuloom's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import OptionError, console, user_errors
from .output import OUT_HELP, Output, report_line
from .sim import measure_window


@app.command()
def reproduce(
    which: Annotated[str, typer.Argument(help="muri, synergy, pal, fsched, gavel or all.")] = "all",
    data: Annotated[Path | None, typer.Option(help="Data folder (default $GPULOOM_DATA, else ../shared/data "
                                                   "beside the checkout).")] = None,
    preset: Annotated[str, typer.Option(help="paper or artifact (where a paper and its artifact differ).")] = "paper",
    seeds: Annotated[int | None, typer.Option(help="Seeds where randomness enters (default 3 for synergy, pal; 1 for gavel).")] = None,
    limit: Annotated[int | None, typer.Option(help="Reduced input: the first N jobs (a quick check).")] = None,
    measure_jobs: Annotated[str | None, typer.Option(
        "--measure-jobs", metavar="A:B",
        help="synergy, gavel: measure jobs A..B-1 by arrival instead of the source's window (4000:5000).")] = None,
    trace: Annotated[str | None, typer.Option(help="muri only: trace1, trace2, trace3 (default), trace4, testbed "
                                                   "or a Muri-format file.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Run each source's headline experiment and print its published figures beside gpuloom's."""
    from ..sim.reproduce import ReproduceError, data_dir, run, table, write

    with user_errors():
        output = Output("reproduce", out)
        try:
            data_dir(data)  # no data: an error before any folder is made
            window = measure_window(measure_jobs)
            results = run(which, data, preset, seeds, None, limit, measure=window, trace=trace)
        except ReproduceError as e:
            raise OptionError(str(e)) from None
    path = write(results, output.create(which))
    output.finish()
    if as_json:
        console.print_json(json.dumps([r.as_dict() for r in results]))
        return
    print(table(results))
    report_line(path)
