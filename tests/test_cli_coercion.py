"""The ``gpuloom`` program converts option values without typer's pydantic adapters where the conversion is the
identity or a path (:mod:`gpuloom.cli.coercion`): every command's values, types and errors are typer's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuloom.cli as cli
from gpuloom.cli.coercion import _Fast, fast_coercion

try:
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover
    from click import exceptions as cx  # type: ignore[no-redef]


def command(name: str, fast: bool) -> Any:
    group = cli.tidy_help(cli.command_for(["gpuloom", name]))
    return (fast_coercion(group) if fast else group).commands[name]


def parsed(name: str, args: list[str], fast: bool) -> Any:
    """The command's parameters, or the usage error's class and message."""
    cmd = command(name, fast)
    try:
        ctx = cmd.make_context(name, list(args))
    except cx.ClickException as e:
        return type(e).__name__, e.format_message()
    return [(k, type(v).__name__, repr(v)) for k, v in ctx.params.items()]


SIMULATE = [
    [],
    ["--trace", "x.csv", "--cluster", "64x8", "--out", "o", "--format", "philly"],
    ["--trace=", "-o", "a b/c", "--reservations", "cal.csv", "--queues", "q.toml"],
    ["--round", "60", "--seed", "3", "--rate", "2.5", "-P", "a=1", "-P", "b=2", "--trace-opt", "pending=error",
     "--max-time", "1e5", "--no-plots", "--json", "--generate", "10", "--limit", "7", "--measure-jobs", "1:5",
     "--cpus-per-node", "12", "--mem-gb-per-node", "64.5", "--reserve-depth", "2", "--locality-penalty", "0.5",
     "--variability-seed", "4", "--order", "srtf", "--non-preemptive", "--drop-impossible", "--no-check"],
    ["--round", "abc"],
    ["--seed", "1.5"],
    ["--generate", "x"],
    ["--limit", ""],
    ["--round", "inf"],
    ["--cluster"],
    ["--bogus"],
]


@pytest.mark.parametrize("args", SIMULATE, ids=lambda a: " ".join(a) or "defaults")
def test_simulate_options_as_typer_converts_them(args: list[str]) -> None:
    assert parsed("simulate", args, True) == parsed("simulate", args, False)


def test_every_commands_defaults_as_typer_converts_them() -> None:
    names = [c.name or c.callback.__name__.replace("_", "-") for c in cli.app.registered_commands]
    names += [g.name for g in cli.app.registered_groups if g.name]
    assert "simulate" in names and len(names) > 20
    for name in names:
        assert parsed(name, [], True) == parsed(name, [], False), name


def test_the_fast_converter_is_the_one_used() -> None:
    cmd = command("simulate", True)
    conv = {p.name: p._runtime_param for p in cmd.params}
    assert all(isinstance(c, _Fast) for c in conv.values())
    cmd.make_context("simulate", ["--trace", "x.csv", "--round", "60"])
    # a number given as text goes to typer's converter, built then; the others need none
    assert conv["round_len"].real is not None
    assert conv["trace"].real is None and conv["cluster"].real is None and conv["seed"].real is None


def test_simulate_parses_without_pydantic(tmp_path: Path) -> None:
    code = ("import sys, gpuloom.cli as cli, gpuloom.cli.sim as s\n"
            "def stop(*a, **k):\n"
            "    print(a[0], type(a[0]).__name__, 'pydantic' in sys.modules); raise SystemExit(0)\n"
            "s.workload = stop\n"
            f"sys.argv = ['gpuloom', 'simulate', '--trace', 'x.csv', '--cluster', '64x8', '--out', {str(tmp_path)!r}]\n"
            "cli.main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["x.csv", "PosixPath", "False"]
