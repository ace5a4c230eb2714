"""The ``gpuloom`` command.  Each topic adds its commands in its own module,
imported at the bottom of this file (one line per module).

:func:`main` runs the app and prints usage errors (unknown options, bad
values) as one line, ``error: ...`` with a "did you mean" where there is a
close name, instead of a boxed panel wrapped at the terminal width.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Annotated, Any

from .ahead import read_ahead_of_program

# the gpuloom program: simulate's trace read by a child while typer, rich and the commands' modules load
read_ahead_of_program()

import typer  # noqa: E402

try:  # recent typer vendors click; older ones use the click package
    from typer._click import exceptions as _cx
    from typer._click.core import Context
except ImportError:  # pragma: no cover
    from click import exceptions as _cx  # type: ignore[no-redef]
    from click.core import Context  # type: ignore[assignment]

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


def usage_error_line(e: _cx.ClickException) -> str:
    """One line for a click usage error: the message, a "did you mean", and where to find help."""
    if isinstance(e, _cx.NoSuchOption):
        msg = f"no such option: {e.option_name}"
        if e.possibilities:
            msg += "; did you mean " + " or ".join(sorted(e.possibilities)[:3]) + "?"
    else:
        msg = e.format_message()
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {msg}{hint}"


def tidy_help(cmd: Any) -> Any:
    """``cmd`` (and its subcommands) with no type shown after a flag in ``--help`` (typer 0.2x prints
    ``<bool>`` there, as if the flag took a value)."""
    # --help itself is made on demand (and kept) by the command
    params = [*getattr(cmd, "params", ()), cmd.get_help_option(Context(cmd))]
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
            p.metavar = ""
    for sub in getattr(cmd, "commands", {}).values():
        tidy_help(sub)
    return cmd


def command_for(argv: list[str]) -> Any:
    """The click command that runs ``argv``: when its first word names a command (or group) of ``app``, an app
    of that one alone (typer reads the signature of every command it builds); anything else (no command, an
    option, a misspelt name, shell completion) gets the whole app."""
    name = argv[1] if len(argv) > 1 else ""
    if name and not name.startswith("-") and not any(k.endswith("_COMPLETE") for k in os.environ):
        cmds = [c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(getattr(c.callback, "__name__", ""))) == name]
        groups = [g for g in app.registered_groups if g.name == name]
        if cmds or groups:
            one = copy.copy(app)  # (the root callback and settings shared; only the command lists differ)
            one.registered_commands, one.registered_groups = cmds, groups
            return typer.main.get_command(one)
    return typer.main.get_command(app)


def main() -> None:
    from .coercion import fast_coercion
    from .output import mark_process_start

    sim.read_ahead(sys.argv)  # (simulate's trace read in a child while the options are parsed)
    try:
        with mark_process_start():  # a command's wall time counts from the process's start
            rv = fast_coercion(tidy_help(command_for(sys.argv)))(standalone_mode=False, prog_name="gpuloom")
    except _cx.ClickException as e:
        print(usage_error_line(e), file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    finally:
        sim.drop_read_ahead()
    sys.exit(rv if isinstance(rv, int) else 0)


def entry() -> None:
    """The ``gpuloom`` program: :func:`main`; after a command that kept its objects for the process's end, the
    process ends without freeing them (:mod:`.ending`)."""
    from .ending import ends_without_teardown, exit_without_teardown

    try:
        main()
    except SystemExit as e:
        if ends_without_teardown() and (e.code is None or isinstance(e.code, int)):
            exit_without_teardown(e.code or 0)
        raise


from . import elastic  # noqa: E402,F401,I001  (registers elastic)
from . import sim  # noqa: E402,F401  (registers simulate, compare)
from . import topo  # noqa: E402,F401  (registers topo)
from . import service  # noqa: E402,F401  (registers serve, token)
from . import control  # noqa: E402,F401  (registers nodes, cancel, hold, release, requeue, update)
from . import jobs  # noqa: E402,F401  (registers submit, queue, show, history, logs)
from . import audit  # noqa: E402,F401  (registers audit)
from . import inventory  # noqa: E402,F401  (registers inventory)
from . import reproduce  # noqa: E402,F401  (registers reproduce)
from . import queues  # noqa: E402,F401  (registers queues; --queues for simulate and compare)
from . import validate  # noqa: E402,F401  (registers validate)
from . import generate  # noqa: E402,F401  (registers generate)
from . import reservation  # noqa: E402,F401  (registers reservation)
