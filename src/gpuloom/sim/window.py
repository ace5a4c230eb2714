"""A measurement window: the jobs a run's figures are computed over (``--measure-jobs A:B``).

Jobs are numbered by arrival order from 0 (ties in the workload's order), as
Synergy's and Gavel's simulators number them; the window ``(A, B)`` holds jobs
A .. B-1.  Every job still runs: the window only selects whose JCT, slowdown,
queueing delay and makespan the summary reads (:meth:`RunResult.summary`), and
the span over which utilisation is averaged (the window's first arrival to its
last finish).  A window well after the start measures a loaded cluster in its
steady state instead of one still filling up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Window = tuple[int, int]
OPTION = "--measure-jobs"


class WindowError(ValueError):
    """A window that is malformed or does not fit the workload; the message names the option."""


def parse_window(text: str, option: str = OPTION) -> Window:
    """``"4000:5000"`` -> ``(4000, 5000)``; anything else a :class:`WindowError` naming ``option``."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise WindowError(f"{option} must be A:B, two whole numbers (jobs A..B-1 by arrival order), "
                          f"got {text!r}") from None
    return check_window((a, b), None, option)


def check_window(window: Window, jobs: int | None, option: str = OPTION) -> Window:
    """``window`` if ``0 <= A < B`` and, with ``jobs`` given, ``B <= jobs``; else a :class:`WindowError`."""
    a, b = window
    if a < 0 or a >= b:
        raise WindowError(f"{option} {a}:{b}: needs 0 <= A < B (jobs A..B-1 by arrival order)")
    if jobs is not None and b > jobs:
        raise WindowError(f"{option} {a}:{b} reaches beyond the workload: it has {jobs} jobs "
                          f"(0..{jobs - 1} by arrival order)")
    return a, b


def text(window: Window) -> str:
    """``(4000, 5000)`` -> ``"4000:5000"`` (the option's form)."""
    return f"{window[0]}:{window[1]}"


def describe(window: Window, jobs: int) -> str:
    """One line for reports: which jobs the figures are over."""
    a, b = window
    return f"jobs {a}-{b - 1} by arrival order ({b - a:,} of {jobs:,}; every job ran, the figures are over these)"


def mask(arrivals: Sequence[float] | np.ndarray, window: Window) -> np.ndarray:
    """Boolean mask over jobs given in any order: True for the jobs ranked A..B-1 by arrival (stable)."""
    arr = np.asarray(arrivals, dtype=float)
    rank = np.argsort(arr, kind="stable")
    m = np.zeros(len(arr), dtype=bool)
    m[rank[window[0]:window[1]]] = True
    return m


def stop_when_finished(ids: set[str]) -> Callable[[Any, str], None]:
    """A :class:`~gpuloom.sim.engine.Simulator` observer that ends the run once every job of ``ids`` has
    finished (as Synergy's and Gavel's runners stop when their window is measured; jobs keep arriving until
    then).  Later jobs are left unfinished."""
    left = set(ids)

    def observe(sim: Any, event: str) -> None:
        if event == "complete" and left:
            done = [jid for jid in left if sim.by_id[jid].finish is not None]
            left.difference_update(done)
            if not left:
                sim.config.max_time = sim.now  # the rest of the run measures nothing

    return observe
