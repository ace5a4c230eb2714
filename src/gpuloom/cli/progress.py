"""Progress of ``simulate`` and ``compare``: jobs done, simulated time, elapsed time and an ETA.

One display serves one run or many (``compare``: configurations × seeds, in
worker processes).  Runs report ``update(key, done, total, now)`` — jobs
finished of the run's total and its simulated clock — and the display sums
them:

* on a terminal, a transient rich progress bar, shown once the work has taken
  more than ``delay`` seconds (short runs print nothing);
* otherwise (a log, CI), one plain line on stderr per ``interval`` seconds,
  e.g. ``compare: 3/8 runs, 1,234/4,000 jobs (30.9 %), simulated up to 12.3 h,
  0:12 elapsed, ETA 0:27``, and nothing for work shorter than one interval.

The ETA assumes the remaining jobs take as long as the finished ones did:
``elapsed × (jobs left / jobs done)``; it is ``?`` until a job has finished.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console


def hms(seconds: float) -> str:
    """``75`` → ``1:15``, ``3725`` → ``1:02:05``; ``?`` for unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def sim_time(seconds: float) -> str:
    """Simulated time in the unit that reads best: ``45 s``, ``12.5 min``, ``3.2 h``, ``4.1 d``."""
    if seconds < 600:
        return f"{seconds:,.0f} s"
    if seconds < 36_000:
        return f"{seconds / 60:,.1f} min"
    if seconds < 10 * 86_400:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86_400:,.1f} d"


@dataclass
class Progress:
    """Sums progress over runs and shows it (see the module docstring)."""

    what: str
    runs: int = 1
    jobs: int = 0  # jobs expected over all runs, known before they report (0: only what they report)
    console: Console | None = None  # set in __post_init__ (stderr unless given)
    interval: float = 10.0
    delay: float = 1.0
    clock: Callable[[], float] = time.monotonic
    tty: bool | None = None
    start: float = field(init=False)
    state: dict[Any, tuple[int, int, float, bool]] = field(init=False, default_factory=dict)
    lines: list[str] = field(init=False, default_factory=list)  # the plain lines printed (for tests)

    def __post_init__(self) -> None:
        if self.console is None:
            from .common import err_console

            self.console = err_console
        if self.tty is None:
            self.tty = self.console.is_terminal
        self.start = self.clock()
        self._last_line = self.start
        self._bar: Any = None
        self._task: Any = None

    @property
    def _console(self) -> Console:
        assert self.console is not None  # set in __post_init__
        return self.console

    # -- the numbers --------------------------------------------------------
    def totals(self) -> tuple[int, int, int, float]:
        """(jobs done, jobs in all, runs finished, furthest simulated time)."""
        done = sum(d for d, _, _, _ in self.state.values())
        total = max(self.jobs, sum(t for _, t, _, _ in self.state.values()))
        finished = sum(1 for *_, f in self.state.values() if f)
        now = max((n for _, _, n, _ in self.state.values()), default=0.0)
        return done, total, finished, now

    def eta(self) -> float:
        done, total, _, _ = self.totals()
        if done <= 0:
            return math.nan
        return (self.clock() - self.start) * (total - done) / done

    def line(self) -> str:
        done, total, finished, now = self.totals()
        pct = f" ({100 * done / total:.1f} %)" if total else ""
        runs = f"{finished}/{self.runs} runs, " if self.runs > 1 else ""
        sim = "simulated up to" if self.runs > 1 else "simulated"
        return (f"{self.what}: {runs}{done:,}/{total:,} jobs{pct}, {sim} {sim_time(now)}, "
                f"{hms(self.clock() - self.start)} elapsed, ETA {hms(self.eta())}")

    # -- updates ------------------------------------------------------------
    def update(self, key: Any, done: int, total: int, now: float, finished: bool = False) -> None:
        self.state[key] = (done, total, now, finished)
        t = self.clock()
        if self.tty:
            if self._bar is None and t - self.start >= self.delay:
                self._open_bar()
            if self._bar is not None:
                d, tot, _, _ = self.totals()
                self._bar.update(self._task, completed=d, total=max(tot, 1), **self._fields())
        elif t - self._last_line >= self.interval:
            self._last_line = t
            text = self.line()
            self.lines.append(text)
            self._console.print(text, highlight=False, soft_wrap=True)

    def tick(self) -> None:
        """Nothing new, but time passes: refresh the bar's clocks, or print the plain line when its interval is up."""
        if self._bar is not None:
            self._bar.update(self._task, **self._fields())
        if not self.tty and self.state and self.clock() - self._last_line >= self.interval:
            self._last_line = self.clock()
            text = self.line()
            self.lines.append(text)
            self._console.print(text, highlight=False, soft_wrap=True)

    def _runs_text(self) -> str:
        _, _, finished, _ = self.totals()
        return f"{finished}/{self.runs} runs " if self.runs > 1 else ""

    def _open_bar(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as Bar

        self._bar = Bar(TextColumn(self.what), TextColumn("{task.fields[runs]}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("jobs, sim {task.fields[sim]}, {task.fields[elapsed]} elapsed, ETA {task.fields[eta]}"),
                        console=self._console, transient=True, auto_refresh=True)
        d, tot, _, now_max = self.totals()
        self._task = self._bar.add_task(self.what, total=max(tot, 1), completed=d, **self._fields())
        self._bar.start()

    def _fields(self) -> dict[str, str]:
        return {"sim": sim_time(self.totals()[3]), "runs": self._runs_text(),
                "elapsed": hms(self.clock() - self.start), "eta": hms(self.eta())}

    def close(self) -> None:
        """Stop the bar; in plain mode, a last line if any line was printed."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif not self.tty and self.lines:
            text = self.line()
            self.lines.append(text)
            self._console.print(text, highlight=False, soft_wrap=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
