"""The service's clock, injected so that tests can drive time by hand.

The service reads time only through a :class:`Clock`: ``time()`` (wall-clock
seconds since the Unix epoch: what the store records and what service time is
measured from) and ``monotonic()`` (intervals: round timing, timeouts).
:class:`SystemClock` is the real one; :class:`ManualClock` moves only when told,
so a test can put the service and the simulator at the same instant.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only by :meth:`advance` or :meth:`set` (both readings move together)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = float(start)

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError("a clock does not run backwards")
        self.t += dt

    def set(self, t: float) -> None:
        if t < self.t:
            raise ValueError("a clock does not run backwards")
        self.t = float(t)
