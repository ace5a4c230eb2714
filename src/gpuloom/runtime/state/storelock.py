"""The store's lock: reentrant, and the scheduling loop's thread goes first.

Every read and write of the store holds one process-wide lock (:mod:`.store`: SQLite has one writer).
A plain lock is not fair: under a stream of submissions, API threads, each holding it for a commit,
hand it to one another while the loop waits for each of the few statements of a round, and rounds
fall seconds apart.  Here a thread marked *first* (:meth:`StoreLock.first`: the loop's) that waits for
the lock gets it as soon as its holder lets go, before any other waiting thread, and no other thread
takes it while it waits; so a round waits for at most one commit per statement, whatever the
submission rate.  The others take it in no particular order, as before, one woken per release.
"""

from __future__ import annotations

import threading
from typing import Any


class StoreLock:
    """A reentrant lock (``with lock:``) under which the thread marked :meth:`first` never waits behind
    a thread that came after it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._others = threading.Condition(self._mutex)  # threads not first, waiting
        self._firsts = threading.Condition(self._mutex)  # the first thread, waiting
        self._owner: int | None = None
        self._depth = 0
        self._first_waiting = 0
        self._others_waiting = 0
        self._first_ids: set[int] = set()

    def first(self) -> None:
        """Mark the calling thread as the one that goes first (the scheduling loop's)."""
        with self._mutex:
            self._first_ids.add(threading.get_ident())

    def acquire(self) -> None:
        me = threading.get_ident()
        if self._owner == me:  # (only this thread sets the owner to itself)
            self._depth += 1
            return
        with self._mutex:
            first = me in self._first_ids
            if first:
                self._first_waiting += 1
            else:
                self._others_waiting += 1
            try:
                while self._owner is not None or (not first and self._first_waiting):
                    (self._firsts if first else self._others).wait()
            except BaseException:  # (interrupted after a release woke it: the next waiter is woken instead)
                self._gone(first)
                if self._owner is None:
                    self._wake()
                raise
            self._gone(first)
            self._owner = me
            self._depth = 1

    def _gone(self, first: bool) -> None:
        if first:
            self._first_waiting -= 1
        else:
            self._others_waiting -= 1

    def _wake(self) -> None:
        """Wake one waiter (the mutex held, the lock free): the first thread if it waits, else another."""
        (self._firsts if self._first_waiting else self._others).notify()

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("release of a store lock this thread does not hold")
        if self._depth > 1:
            self._depth -= 1
            return
        with self._mutex:
            self._owner = None
            self._depth = 0
            self._wake()  # one waiter per release

    def waiting(self) -> tuple[int, int]:
        """(threads marked first, other threads) waiting for the lock now."""
        with self._mutex:
            return self._first_waiting, self._others_waiting

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
