"""One server per state: an exclusive lock on the state directory and on the database.

A second ``gpuloom serve`` on the same state directory or the same database
would plan the same GPUs twice and stop the other's jobs.  So a server holds,
for as long as it runs:

* a file lock (``flock``) on ``STATE_DIR/server.lock``;
* for SQLite, a file lock on ``DB.lock`` beside the database file (two state
  directories may name one database with ``--db``);
* for PostgreSQL, a session-level advisory lock (``pg_try_advisory_lock``) on
  a connection it keeps open.

Locks held by a process that dies (even by SIGKILL) are released by the
kernel, or by PostgreSQL when the session ends, so a restart after a crash is
never refused.  A second server fails at once with :class:`AlreadyServed`,
whose message says who holds the lock.

A PostgreSQL session, and its advisory lock, ends when the database restarts.
So the server confirms its lock (:meth:`ServerLocks.check`: its session's own
row in ``pg_locks``, one query) at least every second and before every round
that starts or preempts jobs: a lost one is taken again on a new session, or,
if another server took it meanwhile, :class:`AlreadyServed` tells this one to
stop scheduling (the service gives up and the process exits).

A server paused past its check (a VM pause, SIGSTOP) may resume after another
took the database.  So taking the locks also takes a new server epoch, a
fencing token in the store (:meth:`~.store.Store.take_epoch`): every write
checks it in its own transaction, and a stale server's launch intent, stop
or other record fails (:class:`~.store.Fenced`) before it acts.  A lock taken
again on a new session keeps its epoch only if the stored one is still it:
otherwise another server held the database meanwhile, and this one stops.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the advisory lock key on PostgreSQL (a fixed 63-bit number: "gpuloom" in ASCII)
PG_LOCK_KEY = int.from_bytes(b"gpuloom", "big")
log = logging.getLogger("gpuloom.service")


class AlreadyServed(RuntimeError):
    """Another server holds the state directory or the database."""


class FileLock:
    """An exclusive ``flock`` on ``path`` (created 0600), with the holder's pid written in it."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self.fd: int | None = None

    def acquire(self) -> FileLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise AlreadyServed(f"another gpuloom server{who} is using {self.what}; stop it first, "
                                f"or give this one its own --state-dir and --db") from None
        pid = f"{os.getpid()}\n".encode()
        try:  # written over the last holder's pid, then cut to length: no new block on a full disk
            os.pwrite(fd, pid, 0)
            os.ftruncate(fd, len(pid))
        except OSError as e:  # the pid is for the message of a server refused; the lock is what counts
            log.warning("cannot write this server's pid in %s: %s", self.path, e)
        self.fd = fd
        return self

    def check(self) -> bool:
        """A file lock lasts as long as its descriptor: nothing to confirm (never taken again)."""
        return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None


class PgAdvisoryLock:
    """A session advisory lock on a PostgreSQL database, held on its own connection."""

    def __init__(self, engine: Any, url: str) -> None:
        self.engine = engine
        self.url = url
        self.conn: Any = None

    def acquire(self) -> PgAdvisoryLock:
        from sqlalchemy import text

        conn = self.engine.connect()
        try:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_LOCK_KEY}).scalar()
            conn.commit()
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        if not got:
            conn.close()
            raise AlreadyServed(f"another gpuloom server is using the database {_safe_url(self.url)}; stop it first, "
                                "or give this one its own database")
        self.conn = conn
        return self

    def check(self) -> bool:
        """Confirm the lock (one query on its session); take it again on a new session if the session was
        lost (the database restarted).  True if it was taken again.  Raises :class:`AlreadyServed` if another
        server holds it now, and the database's error while it cannot be reached."""
        from sqlalchemy import text

        if self.conn is not None:
            try:
                held = self.conn.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' "
                    "AND granted")).scalar()
                self.conn.commit()
                if held:
                    return False
                log.error("the database no longer holds this server's lock (its session lost it)")
            except Exception as e:  # noqa: BLE001  (the session is gone: the database restarted, or is down)
                log.warning("the database lock's session is lost (%s); taking the lock again",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
            self._drop()
        try:
            self.acquire()
        except AlreadyServed:
            raise AlreadyServed(f"another gpuloom server took the database {_safe_url(self.url)} while this one's "
                                "session was lost (the database restarted); this server stops, the other one "
                                "schedules") from None
        log.warning("the database lock is taken again, on a new session")
        return True

    def _drop(self) -> None:
        """Forget the session (not back to the pool, where it would keep a lock)."""
        if self.conn is not None:
            try:
                self.conn.invalidate()
                self.conn.close()
            except Exception:  # noqa: BLE001  (already dead)
                pass
            self.conn = None

    def release(self) -> None:
        if self.conn is not None:
            from sqlalchemy import text

            try:  # unlocked now: a closed session's backend may take a while to exit (and drop it) under load
                self.conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_LOCK_KEY})
                self.conn.commit()
            except Exception:  # noqa: BLE001  (a dead connection: its session, and the lock, are gone)
                pass
            # the session ends (not back to the pool, where it would keep the lock)
            self.conn.invalidate()
            self.conn.close()
            self.conn = None


def _safe_url(url: str) -> str:
    """The URL without a password."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(database)"


class ServerLocks:
    """The locks one server holds: state directory, then database."""

    def __init__(self) -> None:
        self.held: list[FileLock | PgAdvisoryLock] = []
        self.store: Any = None

    def acquire(self, state_dir: str | Path, store: Any) -> ServerLocks:
        try:
            self.held.append(FileLock(Path(state_dir) / "server.lock", f"the state directory {state_dir}").acquire())
            if store.is_sqlite:
                db = store.url.split("///", 1)[1] if "///" in store.url else ""
                if db and db != ":memory:":
                    self.held.append(FileLock(db + ".lock", f"the database {db}").acquire())
            elif store.engine.dialect.name == "postgresql":
                self.held.append(PgAdvisoryLock(store.engine, store.url).acquire())
            store.take_epoch()  # a server paused before this one took the database writes nothing from now on
        except BaseException:
            self.release()
            raise
        self.store = store
        return self

    def check(self) -> None:
        """Confirm every lock (see the module notes); raises :class:`AlreadyServed` if another server holds the
        database now or held it since, the database's error while it cannot be reached."""
        for lk in self.held:
            if lk.check() and self.store is not None and self.store.fence is not None:
                self._same_epoch(lk)

    def _same_epoch(self, lk: FileLock | PgAdvisoryLock) -> None:
        """After a lock was taken again: the stored epoch must still be this server's, or another server held
        the database meanwhile (and this one's view of it is stale)."""
        try:
            now = self.store.stored_epoch()
        except BaseException:
            lk.release()  # unconfirmed: taken again, and confirmed, at the next check
            raise
        if now != self.store.fence:
            lk.release()
            raise AlreadyServed(f"another gpuloom server took the database {_safe_url(self.store.url)} while this "
                                f"one's session was lost (its server epoch is {now}, this server's "
                                f"{self.store.fence}); this server stops, the other one schedules")

    def release(self) -> None:
        for lk in reversed(self.held):
            lk.release()
        self.held.clear()


#: how often a server that cannot open its store on a full disk tries again
ROOM_RETRY_S = 1.0


def _no_room(e: BaseException, url: str) -> bool:
    """Whether opening or first writing the store at ``url`` failed for want of disk space: an error that says so,
    or (SQLite, which reports a WAL it cannot create as an I/O error) any error while its directory's file system
    has no block free."""
    from .storeerrors import is_full

    if is_full(e) or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
        return True
    if url.startswith("sqlite") and "///" in url:
        db = url.split("///", 1)[1]
        if db and db != ":memory:":
            try:
                return os.statvfs(os.path.dirname(os.path.abspath(db))).f_bavail == 0
            except OSError:
                return False
    return False


def open_served(url: str, state_dir: str | Path, open_store: Callable[[str], Any],
                stop: Callable[[], bool] = lambda: False, retry_s: float = ROOM_RETRY_S) -> tuple[Any, ServerLocks]:
    """Open the store at ``url`` and take the server's locks (:meth:`ServerLocks.acquire`).  While the state disk
    is full (the database cannot be opened, or the server epoch not written) it waits, trying again every
    ``retry_s``, rather than exit: a restart on a full disk starts once there is room, as a running server
    goes on (its processes run on meanwhile; recovery adopts or ends them).  Any other error is raised, as is
    :class:`AlreadyServed`; ``stop()`` true ends the wait with the last error."""
    warned = False
    while True:
        store = None
        locks = ServerLocks()
        try:
            store = open_store(url)
            return store, locks.acquire(state_dir, store)
        except Exception as e:
            if store is not None:
                try:
                    store.close()
                except Exception:  # (closing a store that could not write: nothing to keep)
                    pass
            if isinstance(e, AlreadyServed) or not _no_room(e, url) or stop():
                raise
            if not warned:
                log.warning("the state disk is full: waiting for room to open the database %s (trying again every "
                            "%g s): %s", _safe_url(url), retry_s, e)
                warned = True
        time.sleep(retry_s)
