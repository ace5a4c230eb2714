"""Option values typer would hand back unchanged, without pydantic.

typer converts every option's value (those not given too: their defaults) through a pydantic
``TypeAdapter`` built on first use: pydantic is imported and an adapter built per option before a
command starts (docs/performance.md).  :func:`fast_coercion`
gives each option of a command a converter that returns, without an adapter, the values whose
conversion is the identity (or ``Path(text)`` for a path) and hands every other value to typer's
own converter, built then: errors, messages and every other conversion are typer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_TyperParameter: Any = None
try:  # typer's converters (0.2x); where they are not there, options are converted as typer does
    from typer._coercion import build_runtime_param
    from typer._param_types import coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover
    pass

#: annotations whose value of that exact type the adapter returns as it is (no bounds: see :meth:`_Fast.coerce`)
_SAME = (str, int, float)


class _Fast:
    """An option's converter (the ``coerce`` of typer's ``RuntimeParam``): None (or ``()`` for a repeatable
    option) for no value, as typer's; a ``str``, ``int`` or ``float`` of its option's own type as it is (the
    adapter's result, where the option sets no parser, bounds or file); a path's text as ``Path(text)`` through
    typer's path checks (pydantic's path from text is ``Path(text)``); anything else by typer's converter."""

    __slots__ = ("real",)

    def __init__(self) -> None:
        self.real: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        d = param.type_descriptor
        ann, info = d.annotation, d.parameter_info
        if d.file_annotation is None and info.parser is None:
            if type(value) is ann and ann in _SAME and info.min is None and info.max is None:
                return value
            if ann is Path and type(value) is str and info.path_type in (None, Path):
                return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        if self.real is None:
            self.real = build_runtime_param(d)
        return self.real.coerce(value, param=param, ctx=ctx)


def fast_coercion(cmd: Any) -> Any:
    """``cmd`` (and its subcommands) with :class:`_Fast` converters on its typer options not converted yet."""
    if _TyperParameter is None:  # pragma: no cover
        return cmd
    # (--help: made on demand and kept, as :func:`~gpuloom.cli.tidy_help` has it made)
    for p in [*getattr(cmd, "params", ()), getattr(cmd, "_help_option", None)]:
        if isinstance(p, _TyperParameter) and getattr(p, "_runtime_param", False) is None:
            p._runtime_param = _Fast()  # (a RuntimeParam by its coerce)
    for sub in getattr(cmd, "commands", {}).values():
        fast_coercion(sub)
    return cmd
