"""The CLI's one formatter of API times (jobs, queue --start, reservation)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpuloom.cli.timefmt import local_time


@pytest.fixture
def utc_plus_2(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Etc/GMT-2")  # POSIX sign: two hours east of UTC
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_api_times_print_as_local_time_without_zone(utc_plus_2: None) -> None:
    assert local_time("2023-11-14T22:13:20.250+00:00") == "2023-11-15T00:13:20"
    assert local_time("2023-11-14T23:13:20+01:00") == "2023-11-15T00:13:20"
    assert [local_time(None), local_time(""), local_time(None, "N/A")] == ["-", "-", "N/A"]
