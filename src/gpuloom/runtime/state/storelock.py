"""The store's lock: reentrant, and the scheduling loop's thread goes first.

Every read and write of the store holds one process-wide lock (:mod:`.store`: SQLite has one writer).
A plain lock is not fair: under a stream of submissions, API threads, each holding it for a commit,
hand it to one another while the loop waits for each of the few statements of a round, and rounds
fall seconds apart.  Here a thread marked *first* (:meth:`StoreLock.first`: the loop's) that waits for
the lock gets it as soon as its holder lets go, before any other waiting thread, and no other thread
takes it while it waits; so a round waits for at most one commit per statement, whatever the
submission rate.  The others take it in no particular order, as before.

Three C locks, no condition variable (whose woken thread queues again on the condition's mutex: that
convoy cost a third more server CPU per submission from 32 clients): ``_main`` is the lock itself; the
first thread holds ``_next`` while it waits for ``_main``; the other threads pass ``_low`` one at a time,
so at most one of them waits on ``_main``, and it lets ``_main`` go again if it finds ``_next`` held.
"""

from __future__ import annotations

import threading
from typing import Any


class StoreLock:
    """A reentrant lock (``with lock:``) under which the thread marked :meth:`first` never waits behind
    a thread that came after it."""

    def __init__(self) -> None:
        self._main = threading.Lock()
        self._next = threading.Lock()  # held by the first thread while it waits for ``_main``
        self._low = threading.Lock()  # held by another thread from its wait until its release
        self._owner: int | None = None
        self._depth = 0
        self._holds_low = False  # (the owner's)
        self._first_ids: set[int] = set()
        self._count = threading.Lock()
        self._waiting = [0, 0]  # threads marked first, other threads, in acquire()

    def first(self) -> None:
        """Mark the calling thread as the one that goes first (the scheduling loop's)."""
        self._first_ids.add(threading.get_ident())

    def acquire(self) -> None:
        me = threading.get_ident()
        if self._owner == me:  # (only this thread sets the owner to itself)
            self._depth += 1
            return
        first = me in self._first_ids
        k = 0 if first else 1
        with self._count:
            self._waiting[k] += 1
        held: list[threading.Lock] = []
        try:
            if first:
                self._take(self._next, held)
                self._take(self._main, held)
                self._give(self._next, held)
            else:
                self._take(self._low, held)
                while True:
                    self._take(self._main, held)
                    if not self._next.locked():
                        break
                    self._give(self._main, held)  # the first thread waits: it goes before us
                    self._take(self._next, held)  # until it has taken ``_main``
                    self._give(self._next, held)
        except BaseException:  # (interrupted while waiting: give back what it took)
            for lk in reversed(held):
                lk.release()
            raise
        finally:
            with self._count:
                self._waiting[k] -= 1
        self._owner = me
        self._depth = 1
        self._holds_low = not first

    @staticmethod
    def _take(lk: threading.Lock, held: list[threading.Lock]) -> None:
        lk.acquire()
        held.append(lk)

    @staticmethod
    def _give(lk: threading.Lock, held: list[threading.Lock]) -> None:
        held.remove(lk)
        lk.release()

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("release of a store lock this thread does not hold")
        if self._depth > 1:
            self._depth -= 1
            return
        low = self._holds_low
        self._owner = None
        self._depth = 0
        self._main.release()
        if low:
            self._low.release()

    def waiting(self) -> tuple[int, int]:
        """(threads marked first, other threads) waiting for the lock now."""
        with self._count:
            return self._waiting[0], self._waiting[1]

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
