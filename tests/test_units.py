"""One reader for the moments users write: maintenance ``start``, reservation ``start``, ``--since``/``--until``."""

from __future__ import annotations

import pytest

from gpuloom.core.units import parse_wall_time

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(("text", "ahead", "ago"), [
    ("now", T0, T0),
    ("NOW", T0, T0),
    ("now+1h", T0 + 3600, T0 + 3600),  # an explicit sign means what it says in either direction
    ("now + 90m", T0 + 5400, T0 + 5400),
    ("now-2h", T0 - 7200, T0 - 7200),
    ("+30", T0 + 1800, T0 + 1800),  # Slurm: a bare number of a duration is minutes
    ("now+1:30:00", T0 + 5400, T0 + 5400),
    ("now+1w", T0 + 604800, T0 + 604800),
    ("2h", T0 + 7200, T0 - 7200),  # a bare duration: ahead for a start, an age for --since
    ("1.5d", T0 + 129600, T0 - 129600),
    ("45s", T0 + 45, T0 - 45),
    ("1w", T0 + 604800, T0 - 604800),
    ("1700000600", 1_700_000_600.0, 1_700_000_600.0),  # Unix seconds, as text
    ("2023-11-14T22:13:20", T0, T0),  # UTC unless it says
    ("2023-11-14T23:13:20+01:00", T0, T0),
    ("2023-11-14T22:13:20Z", T0, T0),
    ("2023-11-14", T0 - 80000, T0 - 80000),  # midnight UTC
    (1_700_000_123, 1_700_000_123.0, 1_700_000_123.0),
    (12.5, 12.5, 12.5),
])
def test_each_form_reads_to_the_exact_second(text: str | float, ahead: float, ago: float) -> None:
    assert parse_wall_time(text, T0, "start") == ahead
    assert parse_wall_time(text, T0, "--since", -1) == ago


@pytest.mark.parametrize(("value", "message"), [
    ("yesterday", "start: expected an ISO date/time .* got 'yesterday'"),
    ("now+soon", "start: expected .* got 'now\\+soon'"),
    ("now+0", "start: expected .* got 'now\\+0'"),
    ("2023-13-01", "start: expected .* got '2023-13-01'"),
    ("nan", "start: must be a finite time, got 'nan'"),
    (float("inf"), "start: must be a finite time, got 'inf'"),
    (True, "start: expected .* got 'True'"),
    (None, "start: expected .* got 'None'"),
])
def test_refusals_name_the_field_and_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_wall_time(value, T0, "start")


def test_direction_is_one_or_minus_one() -> None:
    with pytest.raises(ValueError, match="direction must be 1 or -1"):
        parse_wall_time("2h", T0, "start", 0)
