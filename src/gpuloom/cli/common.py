"""Helpers shared by CLI commands: parameter parsing, clusters, workloads, errors and warnings.

Errors a user can fix are one line on stderr, ``error: ...``, and exit code 2;
warnings (an option that is ignored, a combination that is rarely meant, a
library warning) are one line each, ``warning: ...``.  Neither is wrapped at
the terminal width, so a log or a CI transcript shows each on one line.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console


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
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, markup=True, soft_wrap=True)


def _showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    warn(str(message))


def parse_value(text: str) -> Any:
    """``"0.5"`` → 0.5, ``"true"`` → True, ``"1,2,3"`` → [1, 2, 3], JSON as JSON, else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
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


def policy_and_model_options(
    param: Sequence[str] | None, seed: int, **flags: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``-P`` items plus model flags (``profiles=``, ``variability=``, ...) → (policy params, model options).

    ``-P`` names listed in :data:`gpuloom.sim.setup.MODEL_OPTIONS` configure the
    throughput model; flags that are not ``None`` do too; ``seed`` is the default
    seed for generated model data.  ``simulate`` and ``serve`` share this, so both
    build the same model from the same options.
    """
    from ..sim.setup import split_params

    params, model_opts = split_params(parse_params(param))
    for name, value in flags.items():
        if value is not None:
            model_opts[name] = str(value) if isinstance(value, Path) else value
    model_opts.setdefault("seed", seed)
    return params, model_opts


def check_policies(order: str, group: str, size: str, place: str, params: Sequence[str]) -> None:
    """Policy names and ``-P`` names, with "did you mean" and the accepted names; warn about odd pairs."""
    from ..policies.check import check_names, check_params, conflicts
    from ..sim.setup import MODEL_OPTIONS

    stages = {"order": order, "group": group, "size": size, "place": place}
    check_names(stages)
    check_params(stages, params, also=MODEL_OPTIONS)
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
    from ..perf.scaling import ScalingError
    from ..perf.sensitivity import SensitivityError
    from ..perf.topology import TopologyError
    from ..perf.variability import VariabilityError
    from ..policies.base import PolicyError
    from ..sim.traces import TraceError

    handled: tuple[type[BaseException], ...] = (
        ClusterError, JobError, PolicyError, FileNotFoundError, TraceError, TopologyError, VariabilityError,
        SensitivityError, ScalingError, OptionError,
    )
    saved = warnings.showwarning
    warnings.showwarning = _showwarning
    try:
        yield
    except handled as e:
        msg = str(e)
        if isinstance(e, FileNotFoundError) and e.filename:
            msg = f"no such file: {e.filename}"
        err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    finally:
        warnings.showwarning = saved


def out_dir(path: Path | None, default: str = "gpuloom-out") -> Path:
    p = path or Path(default)
    p.mkdir(parents=True, exist_ok=True)
    return p
