"""``gpuloom simulate``'s trace read ahead, in a child process, while the command's options are parsed (and, where
this process is the ``gpuloom`` program, while its commands' modules are imported): this module imports nothing
but the standard library until it starts the child, so :mod:`gpuloom.cli` can start it before typer, rich and
the commands' modules (:func:`read_ahead_of_program`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sim.background import Background

#: ``gpuloom simulate``'s trace being read by a child (:func:`read_ahead`), by the path and format the command
#: line gave
_AHEAD: dict[tuple[str, str | None], Background[tuple[str, str | None], Any]] = {}


def read_ahead(argv: Sequence[str]) -> None:
    """Start reading the trace of ``argv`` (``gpuloom simulate ... --trace FILE``) in a child process, before the
    options are parsed: the parse and the read, about 0.1 s and 0.2 s of CPU on Philly, go on side by side.
    Only a Philly list is read ahead (its columns come back as plain lists, cheap to send: the command makes the
    jobs, :func:`~gpuloom.cli.simload._read_ahead`); nothing is started where the command line gives trace options, is
    not ``simulate``'s, or a child cannot be forked, nor again for a trace already being read.  What the options
    turn out to ask is what :func:`~gpuloom.cli.simload.workload` reads: a child whose path or format they do not ask
    is ended unused (:func:`drop_read_ahead`)."""
    from ..sim.background import Background, can_fork

    if len(argv) < 3 or argv[1] != "simulate" or not can_fork():
        return
    got: dict[str, str | None] = {}
    args = list(argv[2:])
    for k, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("-T", "--trace-opt", "--help") or arg.startswith(("-T", "--trace-opt=")):
            return
        for long, short in (("--trace", "-t"), ("--format", "-f")):
            if arg in (long, short):
                got[long] = args[k + 1] if k + 1 < len(args) else None
            elif arg.startswith(long + "="):
                got[long] = arg[len(long) + 1:]
    trace, fmt = got.get("--trace"), got.get("--format")
    if trace is None or fmt not in (None, "auto", "philly") or not Path(trace).is_file():
        return
    key = (str(Path(trace)), fmt)
    if key in _AHEAD:  # (started as the program's modules were imported: :func:`read_ahead_of_program`)
        return
    from ..sim.traces import philly  # noqa: F401  (imported here, where the command reads it, not in the child)

    child: Background[tuple[str, str | None], Any] = Background("reading the trace", _philly_columns, fork=True)
    child.submit(key)
    _AHEAD[key] = child


def _philly_columns(key: tuple[str, str | None]) -> Any:
    """The columns of the Philly list ``key[0]`` (``key[1]``: its format, None or ``auto`` to detect it), or
    None where it is not one."""
    from ..sim.traces.detect import detect_format
    from ..sim.traces.philly import philly_columns

    path, fmt = Path(key[0]), key[1]
    if fmt in (None, "auto") and detect_format(path) != "philly":
        return None
    return philly_columns(path)


def drop_read_ahead() -> None:
    """End the children :func:`read_ahead` started that no command took."""
    while _AHEAD:
        _AHEAD.popitem()[1].cancel()


def read_ahead_of_program() -> None:
    """:func:`read_ahead` of this process's command line where this process is the ``gpuloom`` program (its
    ``argv[0]`` is named ``gpuloom``): called as :mod:`gpuloom.cli` starts to load, so that the child reads the
    trace while the commands' modules are imported too.  (A command run otherwise, by a test or another program,
    starts it in :func:`gpuloom.cli.main`, as before.)"""
    if sys.argv and Path(sys.argv[0]).name == "gpuloom":
        read_ahead(sys.argv)
