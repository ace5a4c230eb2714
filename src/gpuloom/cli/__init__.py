"""The ``gpuloom`` command.  Each topic adds its commands in its own module,
imported at the bottom of this file (one line per module)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpuloom",
    help="A scheduler for shared GPU clusters: trace-driven simulator and real scheduler service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()


from . import elastic  # noqa: E402,F401,I001  (registers elastic)
from . import sim  # noqa: E402,F401  (registers simulate, compare)
from . import topo  # noqa: E402,F401  (registers topo)
from . import service  # noqa: E402,F401  (registers serve, submit, queue, cancel, nodes, logs, token)
from . import inventory  # noqa: E402,F401  (registers inventory)
from . import reproduce  # noqa: E402,F401  (registers reproduce)
from . import queues  # noqa: E402,F401  (registers queues; --queues for simulate and compare)
