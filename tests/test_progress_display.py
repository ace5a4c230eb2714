"""Progress of simulate/compare: plain lines per interval off a terminal, exact ETA arithmetic."""

from __future__ import annotations

import io

from rich.console import Console

from gpuloom.cli.progress import Progress, hms, sim_time


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_once_per_interval_with_eta() -> None:
    clock, buf = Clock(), io.StringIO()
    p = Progress("compare", runs=2, console=Console(file=buf, width=300), interval=10, clock=clock, tty=False)
    clock.t = 104
    p.update(("fifo", 0), 100, 400, 3600.0)
    assert p.lines == []  # less than one interval: nothing
    clock.t = 112
    p.update(("srtf", 0), 100, 400, 7200.0)
    # 200 of 800 jobs in 12 s: 600 left take 36 s
    assert p.lines == ["compare: 0/2 runs, 200/800 jobs (25.0 %), simulated up to 120.0 min, 0:12 elapsed, ETA 0:36"]
    clock.t = 115
    p.update(("fifo", 0), 400, 400, 9000.0, finished=True)
    assert len(p.lines) == 1  # within the interval
    clock.t = 123
    p.tick()  # no update, but the interval is up
    assert p.lines[-1] == ("compare: 1/2 runs, 500/800 jobs (62.5 %), simulated up to 150.0 min, 0:23 elapsed, "
                           "ETA 0:14")
    p.close()
    assert len(p.lines) == 3 and buf.getvalue().count("\n") == 3


def test_short_work_prints_nothing() -> None:
    clock, buf = Clock(), io.StringIO()
    with Progress("simulate", console=Console(file=buf), clock=clock, tty=False) as p:
        clock.t = 101
        p.update(0, 10, 10, 50.0, finished=True)
    assert buf.getvalue() == "" and p.line() == "simulate: 10/10 jobs (100.0 %), simulated 50 s, 0:01 elapsed, ETA 0:00"


def test_formats() -> None:
    assert [hms(x) for x in (0, 75, 3725, float("nan"))] == ["0:00", "1:15", "1:02:05", "?"]
    assert [sim_time(x) for x in (45, 750, 36_000, 90 * 86_400)] == ["45 s", "12.5 min", "10.0 h", "90.0 d"]
