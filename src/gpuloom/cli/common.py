"""Helpers shared by CLI commands: parameter parsing, clusters, workloads, errors."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

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


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's input errors into one clear line and exit code 2."""
    from ..core.cluster import ClusterError
    from ..core.job import JobError
    from ..perf.assembly import ModelOptionError
    from ..perf.scaling import ScalingError
    from ..perf.sensitivity import SensitivityError
    from ..perf.topology import TopologyError
    from ..perf.variability import VariabilityError
    from ..policies.base import PolicyError
    from ..sim.traces import TraceError

    handled: tuple[type[BaseException], ...] = (
        ClusterError, JobError, PolicyError, FileNotFoundError, TraceError, TopologyError, VariabilityError,
        SensitivityError, ScalingError, ModelOptionError,
    )
    try:
        yield
    except handled as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None


def ray_connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one running here; ``local``: start one in this
    process); a clear error and exit code 2 when Ray is missing or unreachable."""
    import logging

    try:
        import ray
    except ImportError:
        err_console.print("[bold red]error:[/] --ray needs Ray: pip install 'gpuloom[ray]'", highlight=False)
        raise typer.Exit(2) from None
    if ray.is_initialized():
        return
    try:
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] cannot connect to the Ray cluster at {address!r}: {e}", highlight=False)
        raise typer.Exit(2) from None


def out_dir(path: Path | None, default: str = "gpuloom-out") -> Path:
    p = path or Path(default)
    p.mkdir(parents=True, exist_ok=True)
    return p
