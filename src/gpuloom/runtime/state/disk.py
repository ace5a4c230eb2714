"""Free space where the database and the logs live: what the service does before a disk is full.

A file system is *nearly full* when less than ``min(256 MiB, 5 %)`` of it is free for unprivileged
writers (``statvfs``'s ``f_bavail``: jobs write their logs as their own accounts).  The service asks
:class:`DiskGuard` every loop tick (a ``statvfs`` each) and on every submission:

* **the database's** (an SQLite file's directory; a PostgreSQL server's disk is not watched here,
  its ``DiskFull`` error does the same at the first write that fails): submissions are refused with
  :class:`~.store.StoreFull` (the API's 503, saying the state disk is full), and the service starts
  and preempts no job (it still reaps exits, records ends, cancels and time limits), so that what it
  must record finds room;
* **the logs'** (the same file system unless ``--log-dir`` is elsewhere): the largest running logs are
  cut to :data:`PRESSURE_CAP`, one at a time, until it is not nearly full.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .store import StoreFull

log = logging.getLogger("gpuloom.service")

RESERVE_MAX = 256 << 20  # a file system with less free than this, or than RESERVE_FRACTION of it, is nearly full
RESERVE_FRACTION = 0.05
PRESSURE_CAP = 4 << 20  # the cap of running logs while their file system is nearly full


def free_space(path: str | Path) -> tuple[int, int] | None:
    """(bytes free for unprivileged writers, size) of the file system holding ``path``; None if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def nearly_full(free: int, total: int) -> bool:
    return free < min(RESERVE_MAX, int(total * RESERVE_FRACTION))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class DiskGuard:
    """Watches the database's directory (None: not a local file) and the log directory."""

    def __init__(self, db_dir: Path | None, log_dir: Path) -> None:
        self.db_dir = db_dir
        self.log_dir = log_dir
        self.db_was_low = False

    def _low(self, path: Path | None) -> tuple[int, int] | None:
        """(free, size) when ``path``'s file system is nearly full, else None."""
        if path is None:
            return None
        space = free_space(path)
        return space if space is not None and nearly_full(*space) else None

    def db_low(self) -> bool:
        """Whether the database's file system is nearly full now (logs the change either way)."""
        low = self._low(self.db_dir) is not None
        if low != self.db_was_low:
            self.db_was_low = low
            if low:
                log.error("the state disk is nearly full (%s): submissions are refused and no job starts until "
                          "space is freed", self.db_dir)
            else:
                log.warning("the state disk has room again (%s): submissions and starts resume", self.db_dir)
        return low

    def check_submit(self) -> None:
        """Raise :class:`StoreFull` (the API's 503) while the database's file system is nearly full."""
        space = self._low(self.db_dir)
        if space is not None:
            free, total = space
            raise StoreFull(f"the state disk is full: {self.db_dir} has {_mib(free)} free of {_mib(total)}, less "
                            f"than the {_mib(min(RESERVE_MAX, int(total * RESERVE_FRACTION)))} the server keeps "
                            "for its records; submissions are refused until space is freed")

    def logs_low(self) -> bool:
        return self._low(self.log_dir) is not None
