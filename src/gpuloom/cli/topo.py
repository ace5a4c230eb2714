"""``gpuloom topo FILE``: parse ``nvidia-smi topo -m`` output, print the matrix and the PACK/SPREAD sets."""

from __future__ import annotations

from pathlib import Path

import typer

from ..perf.topology import PACK, SPREAD, TopologyError, load_topology
from . import app


@app.command()
def topo(
    file: Path = typer.Argument(..., help="output of `nvidia-smi topo -m` saved to a file"),
) -> None:
    """Show a node's GPU links and the best PACK and SPREAD GPU sets for every set size."""
    try:
        t = load_topology(file)
    except TopologyError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{file}: {t.num_gpus} GPUs, {len(t.nics)} NICs")
    typer.echo(t.render())
    typer.echo("")
    typer.echo("link costs: NV<n> = 100/n, PIX 200, PXB 300, PHB 400, NODE 500, SYS/SOC 600; set cost = sum of pairs")
    w = max(12, 3 * t.num_gpus)
    typer.echo(f"{'GPUs':>4}  {'PACK set':<{w}} {'cost':>8}  {'SPREAD set':<{w}} {'cost':>8}")
    for k in range(2, t.num_gpus + 1):
        ps, pc = t.best_set(k, PACK)
        ss, sc = t.best_set(k, SPREAD)
        typer.echo(f"{k:>4}  {','.join(map(str, ps)):<{w}} {pc:>8.1f}  {','.join(map(str, ss)):<{w}} {sc:>8.1f}")
