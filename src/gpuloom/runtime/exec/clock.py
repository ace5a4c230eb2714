"""The service's clocks, injected so that tests can drive time by hand.

The service reads time only through a :class:`Clock`: ``time()`` (wall-clock
seconds since the Unix epoch: what is stored and shown for people),
``monotonic()`` (what measures durations; on Linux it counts from the boot and
is the same for every process of that boot) and ``boot()`` (which boot the
monotonic reading counts from, or None if unknown).  :class:`SystemClock` is the
real one; :class:`ManualClock` moves only when told, so a test can put the
service and the simulator at the same instant, or step its wall reading alone.

:class:`ServiceTime` is the time the scheduler works in: seconds since the
store's epoch, advanced by the monotonic clock, so a wall-clock step (NTP, an
operator's ``date -s``) moves no duration.  :func:`resume` says where a new
process continues it from (see docs/service.md, "Time").
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.cache
def boot_id() -> str | None:
    """This machine's boot id (Linux), None where there is none."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def boot(self) -> str | None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def boot(self) -> str | None:
        return boot_id()  # (None, not Linux: a restart trusts the wall clock's gap, :func:`resume`)


class ManualClock:
    """A clock that moves only when told: :meth:`advance` and :meth:`set` move both readings
    together, :meth:`jump` steps the wall reading alone (either way), :meth:`reboot` starts a new
    boot (the monotonic reading restarts from ``0``)."""

    def __init__(self, start: float = 1_000_000.0, boot: str = "boot-0") -> None:
        self.wall = float(start)
        self.mono = float(start)
        self._boot = boot

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def boot(self) -> str | None:
        return self._boot

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError("a clock does not run backwards")
        self.wall += dt
        self.mono += dt

    def set(self, t: float) -> None:
        """Advance until the wall reading is ``t``."""
        if t < self.wall:
            raise ValueError("a clock does not run backwards")
        self.advance(t - self.wall)

    def jump(self, dt: float) -> None:
        """Step the wall reading by ``dt`` seconds (negative: back); the monotonic one does not move."""
        self.wall += dt

    def reboot(self, boot: str) -> None:
        self._boot = boot
        self.mono = 0.0


class ServiceTime:
    """Service time: ``start`` at this process's anchor, then as the monotonic clock advances."""

    __slots__ = ("clock", "start", "_mono0")

    def __init__(self, clock: Clock, start: float) -> None:
        self.clock = clock
        self.start = float(start)
        self._mono0 = clock.monotonic()

    def now(self) -> float:
        return self.start + (self.clock.monotonic() - self._mono0)

    def mark(self) -> str:
        """One instant in service, wall and monotonic time (JSON): what :func:`resume` continues from."""
        c = self.clock
        return json.dumps({"service": self.now(), "wall": c.time(), "monotonic": c.monotonic(), "boot": c.boot()})


def resume(clock: Clock, epoch: float, mark: str | None) -> float:
    """The service time a new process starts at, from the last stored :meth:`ServiceTime.mark`.

    * No mark (a new store, or one from a version without marks): wall time since ``epoch``.
    * The mark's boot is this boot: the mark's service time plus the monotonic seconds since it,
      exactly (the monotonic clock is the boot's, not the process's; a wall step while the server
      was down counts nothing).
    * Another boot (a reboot, or the store served from another machine): plus the wall seconds
      since the mark, never fewer than 0 (a wall clock set back while it was down counts nothing;
      one set forward counts as downtime: nothing else can tell them apart).
    """
    m: Mapping[str, Any] | None = None
    if mark:
        try:
            d = json.loads(mark)
            if isinstance(d, dict) and all(_finite(d.get(k)) for k in ("service", "wall", "monotonic")):
                m = d
        except ValueError:
            m = None
    if m is None:
        return max(0.0, clock.time() - epoch)
    base = float(m["service"])
    boot = clock.boot()
    if boot is not None and m.get("boot") == boot:
        gap = clock.monotonic() - float(m["monotonic"])
        if gap >= 0:  # (negative: not the same monotonic clock after all, e.g. another time namespace)
            return base + gap
    return base + max(0.0, clock.time() - float(m["wall"]))


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
