"""Helpers shared by CLI commands: parameter parsing, clusters, workloads, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..core.parse import bool_literal

console = Console()
err_console = Console(stderr=True)


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


def parse_params(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise typer.BadParameter(f"policy parameter {item!r} must look like name=value")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if not k:
            raise typer.BadParameter(f"policy parameter {item!r} has an empty name")
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


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's input errors into one clear line and exit code 2."""
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
        SensitivityError, ScalingError,
    )
    try:
        yield
    except handled as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None


def out_dir(path: Path | None, default: str = "gpuloom-out") -> Path:
    p = path or Path(default)
    p.mkdir(parents=True, exist_ok=True)
    return p
