"""The ``gpuloom`` command.  Each topic adds its commands in its own module,
imported at the bottom of this file (one line per module)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="gpuloom",
    help="A scheduler for shared GPU clusters: trace-driven simulator and real scheduler service.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"gpuloom {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """A scheduler for shared GPU clusters: trace-driven simulator and real scheduler service."""


def main() -> None:
    app()


from . import elastic  # noqa: E402,F401,I001  (registers elastic)
from . import sim  # noqa: E402,F401  (registers simulate, compare)
from . import topo  # noqa: E402,F401  (registers topo)
from . import service  # noqa: E402,F401  (registers serve, cancel, nodes, token)
from . import jobs  # noqa: E402,F401  (registers submit, queue, show, history, logs)
from . import inventory  # noqa: E402,F401  (registers inventory)
from . import reproduce  # noqa: E402,F401  (registers reproduce)
from . import validate  # noqa: E402,F401  (registers validate)
