"""gpuloom.core.parse: one boolean parser, and every place that reads booleans going through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuloom.core.job import JobSpec
from gpuloom.core.parse import bool_literal, parse_bool
from gpuloom.policies.base import PolicyError, make, parse_flag
from gpuloom.sim.runconfig import ConfigError, parse_run_config
from gpuloom.sim.traces import load_trace, save_trace

# --------------------------------------------------------------------------- booleans

@pytest.mark.parametrize("v", [True, "true", "True", " YES ", "on", "1", 1])
def test_parse_bool_true(v: object) -> None:
    assert parse_bool(v, "x") is True


@pytest.mark.parametrize("v", [False, "false", "FALSE", "no", "Off", "0", 0])
def test_parse_bool_false(v: object) -> None:
    assert parse_bool(v, "x") is False


@pytest.mark.parametrize("v", ["maybe", "", 2, 1.0, None, "t", [True]])
def test_parse_bool_rejects(v: object) -> None:
    with pytest.raises(ValueError) as e:
        parse_bool(v, "backfill")
    assert str(e.value) == f"backfill must be true or false, got {v!r}"


def test_bool_parsers_are_one() -> None:
    # the policy helper, the run configuration and the CLI's value guess all answer as parse_bool
    for v in ("yes", "Off", "1", True):
        assert parse_flag(v, "f") is parse_bool(v)
    with pytest.raises(ValueError, match="^f must be true or false, got 'maybe'$"):
        parse_flag("maybe", "f")
    with pytest.raises(PolicyError, match="backfill must be true or false"):
        make("place", "packed-sticky", {"backfill": "sometimes"})
    assert parse_run_config("order=fifo,preemptive=off").preemptive is False
    assert parse_run_config("order=fifo,preemptive=YES").preemptive is True
    with pytest.raises(ConfigError, match="config 'order=fifo,preemptive=maybe': preemptive must be true or false"):
        parse_run_config("order=fifo,preemptive=maybe")
    from gpuloom.cli.common import parse_value

    assert parse_value("TRUE") is True and parse_value("false") is False
    assert parse_value("1") == 1 and parse_value("yes") == "yes"  # untyped text: only true/false are bools
    assert bool_literal(" True ") is True and bool_literal("no") is None


def test_own_csv_keeps_bool_attrs(tmp_path: Path) -> None:
    jobs = [JobSpec("a", 0.0, 1, 10.0, attrs={"spot": True, "tag": "no", "n": 1}),
            JobSpec("b", 1.0, 1, 10.0, attrs={"spot": False, "tag": "yes", "n": 0})]
    save_trace(jobs, tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv") == jobs
    assert [type(j.attrs["spot"]) for j in load_trace(tmp_path / "t.csv")] == [bool, bool]
