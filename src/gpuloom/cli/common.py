"""Helpers shared by CLI commands: parameter parsing, clusters, workloads, errors and warnings.

Errors a user can fix are one line on stderr, ``error: ...``, and exit code 2;
warnings (an option that is ignored, a combination that is rarely meant, a
library warning) are one line each, ``warning: ...``.  Neither is wrapped at
the terminal width, so a log or a CI transcript shows each on one line.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..core.parse import bool_literal


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    # not a terminal: no hard wrapping at 80 columns; tables may be as wide as they need
    return Console(stderr=stderr, soft_wrap=True, width=None if tty else 200)


console = _console(False)
err_console = _console(True)


class OptionError(ValueError):
    """A bad command-line value or combination; the message names the option."""


def warn(message: str) -> None:
    """One line on stderr: ``warning: message``."""
    err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)


def _showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    warn(str(message))


_CONTROL = {c: "?" for c in [*range(0, 32), *range(127, 160)]}
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def plain(value: Any) -> str:
    """``value`` as text with control characters (terminal escape sequences) shown as ``?``."""
    return str(value).translate(_CONTROL)


def cell(value: Any) -> Text:
    """A table cell that shows ``value`` as it is: never read as Rich markup (a job named ``[/]``), with
    control characters (terminal escape sequences) shown as ``?``."""
    return Text(str(value).translate(_CONTROL))


class SafeTable(Table):
    """A Rich table whose text cells show their text as it is (:func:`cell`): names, users, reasons and
    paths come from users, and must neither be read as markup nor reach the terminal as escapes."""

    def add_row(self, *renderables: Any, **kw: Any) -> None:
        super().add_row(*(cell(r) if isinstance(r, str) else r for r in renderables), **kw)


#: a listing with more rows than this is written as plain lines even on a terminal (Rich lays out a
#: table at ~1 ms a row: 10 s for 10,000 jobs)
RICH_ROWS = 200


class PlainTable:
    """A table of text cells, written as Rich writes a table without box (``box=None``) into a pipe: each
    cell between two spaces, left-aligned to its column's widest cell.  Cells show their text as it is
    (:func:`plain`: control characters as ``?``).  :func:`print_table` writes it; only a small one on a
    terminal goes through Rich (fitted to the terminal's width)."""

    def __init__(self, *headers: str) -> None:
        self.headers = [plain(h) for h in headers]
        self.rows: list[list[str]] = []

    def add_row(self, *cells: Any) -> None:
        r = [str(c) for c in cells]
        if _CONTROL_RE.search("".join(r)):  # (rare: one search a row instead of a translation a cell)
            r = [c.translate(_CONTROL) for c in r]
        self.rows.append(r)

    def add_rows(self, rows: list[list[str]]) -> None:
        """Rows of text cells (as :meth:`add_row`, with one search for control characters in all of them)."""
        if _CONTROL_RE.search("".join(map("".join, rows))):
            rows = [[c.translate(_CONTROL) for c in r] for r in rows]
        self.rows += rows

    def lines(self) -> list[str]:
        from rich.cells import cell_len

        rows = [self.headers, *self.rows]
        wide = [r for r in rows if not "".join(r).isascii()]  # (an ASCII cell's width is its length)
        widths = [max(map(len, col)) for col in zip(*rows, strict=True)]
        for r in wide:
            widths = [max(w, cell_len(c)) for w, c in zip(widths, r, strict=True)]
        fmt = "".join(f" {{:<{w}}} " for w in widths)
        out = [fmt.format(*r) for r in rows]
        if wide:  # str.format pads by length: pad those by their width on the terminal
            at = {id(r) for r in wide}
            out = [("".join(f" {c}{' ' * (w - cell_len(c))} " for c, w in zip(r, widths, strict=True))
                    if id(r) in at else line) for r, line in zip(rows, out, strict=True)]
        return out

    def rich(self) -> Table:
        t = SafeTable(*self.headers, box=None)
        for r in self.rows:
            t.add_row(*r)
        return t


def print_table(t: PlainTable) -> None:
    """A table on a terminal (up to :data:`RICH_ROWS` rows) fits its width; otherwise, and into a pipe or
    file, it is written whole as plain lines (like squeue/sacct)."""
    if console.is_terminal and len(t.rows) <= RICH_ROWS:
        console.print(t.rich())
    else:
        sys.stdout.write("\n".join(t.lines()) + "\n")
        sys.stdout.flush()


_C1 = re.compile("[\x7f-\x9f]")
#: JSON this long or longer is written as it is even on a terminal (Rich colours it at ~0.4 s a megabyte)
RICH_JSON = 64 << 10


def print_json(obj: Any) -> None:
    """``obj`` as JSON, indented by 2 (as Rich's ``print_json`` writes it into a pipe; numbers may take
    another form, ``1e-7`` for ``1e-07``); a small one on a terminal in Rich's colours.  Characters a
    terminal may read as controls are escaped everywhere (``\\u009b``: the same JSON value)."""
    from pydantic_core import to_json  # (json.dumps indents in Python: 10,000 jobs in 0.23 s; this 0.05 s)

    data = to_json(obj, indent=2)
    text = data.decode()
    if (b"\x7f" in data or b"\xc2" in data) and _C1.search(text):  # (U+0080-U+009F are C2 80-9F in UTF-8)
        text = _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    if console.is_terminal and len(text) < RICH_JSON:
        console.print_json(text)
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def parse_value(text: str) -> Any:
    """``"0.5"`` → 0.5, ``"true"`` → True, ``"1,2,3"`` → [1, 2, 3], JSON as JSON, else the string."""
    flag = bool_literal(text)
    if flag is not None:
        return flag
    try:
        return json.loads(text)
    except ValueError:
        pass
    if "," in text:
        return [parse_value(x) for x in text.split(",") if x.strip()]
    return text


def parse_params(items: Sequence[str] | None, option: str = "-P") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise OptionError(f"{option} {item!r} must look like name=value")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if not k:
            raise OptionError(f"{option} {item!r} has an empty name")
        out[k] = parse_value(v)
    return out


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command one flag per model option declared in :mod:`gpuloom.perf.assembly`.

    The command takes a ``model_opts: dict`` parameter instead: the flags given
    (``None`` for those not given).  ``simulate``, ``compare`` and ``serve`` use
    it, so a factor's options reach all three from its declaration.
    """
    from ..perf.assembly import FLAG_OPTIONS

    sig = inspect.signature(fn, eval_str=True)
    params = [p for p in sig.parameters.values() if p.name != "model_opts"]
    extra = [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[o.cli_type | None,
                                               typer.Option(o.cli, help=o.help, metavar=o.metavar or None,
                                                            rich_help_panel="Throughput model")])
        for o in FLAG_OPTIONS
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        opts = {o.name: kw.pop(o.name, None) for o in FLAG_OPTIONS}
        return fn(*args, model_opts=opts, **kw)

    # typer reads the signature it shows from ``__signature__``, an attribute functions lack in the type system
    wrapper.__signature__ = sig.replace(parameters=params + extra)  # type: ignore[attr-defined]
    return wrapper


def stack_params(param: Sequence[str] | None, model_opts: dict[str, Any]) -> dict[str, Any]:
    """``-P`` items plus model flags as one parameter mapping (what a :class:`~gpuloom.driver.Stack`
    or a run configuration takes); a model option given both ways is an error."""
    params = parse_params(param)
    for name, value in model_opts.items():
        if value is None:
            continue
        if name in params:
            raise typer.BadParameter(f"model option {name} given both as --{name.replace('_', '-')} and -P {name}=")
        params[name] = str(value) if isinstance(value, Path) else value
    return params


def check_policies(order: str, group: str, size: str, place: str, params: Sequence[str], queue: str = "none") -> None:
    """Policy names and ``-P`` names, with "did you mean" and the accepted names; warn about odd pairs."""
    from ..perf.assembly import MODEL_OPTIONS
    from ..policies.check import check_names, conflicts, route_params

    stages = {"order": order, "group": group, "size": size, "place": place}
    if queue != "none":
        stages["queue"] = queue
    check_names(stages)
    route_params(stages, {p: None for p in params if p not in MODEL_OPTIONS})
    for msg in conflicts(stages):
        warn(msg)


def choice(option: str, value: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a one-line error with a "did you mean"."""
    if value in choices:
        return value
    from ..policies.check import did_you_mean

    raise OptionError(f"{option} must be one of {', '.join(choices)}, got {value!r}{did_you_mean(value, choices)}")


def positive(option: str, value: float | None, *, zero: bool = False) -> None:
    """A one-line error unless ``value`` is a finite number > 0 (>= 0 with ``zero``)."""
    import math

    if value is None:
        return
    ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise OptionError(f"{option} must be a number {'>= 0' if zero else '> 0'}, got {value:g}")


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's input errors into one clear line and exit code 2; library warnings into
    one ``warning:`` line each."""
    from ..core.cluster import ClusterError
    from ..core.job import JobError
    from ..core.queues import QueueError
    from ..core.registry import RegistryError
    from ..core.reservations import ReservationError
    from ..perf.assembly import ModelOptionError
    from ..perf.scaling import ScalingError
    from ..perf.sensitivity import SensitivityError
    from ..perf.topology import TopologyError
    from ..perf.variability import VariabilityError
    from ..policies.base import PolicyError
    from ..sim.traces import TraceError

    handled: tuple[type[BaseException], ...] = (
        ClusterError, JobError, PolicyError, FileNotFoundError, TraceError, TopologyError, VariabilityError,
        SensitivityError, ScalingError, ModelOptionError, OptionError, QueueError, RegistryError, ReservationError,
    )
    saved = warnings.showwarning
    warnings.showwarning = _showwarning
    try:
        yield
    except handled as e:
        msg = str(e)
        if isinstance(e, FileNotFoundError) and e.filename:
            msg = f"no such file: {e.filename}"
        err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    finally:
        warnings.showwarning = saved


def ray_connect(address: str, num_gpus: int | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one running here; ``local``: start one in this
    process, with ``num_gpus``/``num_cpus`` declared); a clear error and exit code 2 when Ray is missing
    or unreachable."""
    import logging

    try:
        import ray
    except ImportError:
        # (\[ : the extra's name is text, not a markup tag)
        err_console.print("[bold red]error:[/] --ray needs Ray: pip install 'gpuloom\\[ray]'", highlight=False)
        raise typer.Exit(2) from None
    if ray.is_initialized():
        return
    try:
        if address == "local":  # always a new instance, never one already running on this machine
            ray.init(address="local", num_gpus=num_gpus, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        else:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] cannot connect to the Ray cluster at {address!r}: {e}", highlight=False)
        raise typer.Exit(2) from None
