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
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

#: the advisory lock key on PostgreSQL (a fixed 63-bit number: "gpuloom" in ASCII)
PG_LOCK_KEY = int.from_bytes(b"gpuloom", "big")


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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

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
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_LOCK_KEY}).scalar()
        conn.commit()
        if not got:
            conn.close()
            raise AlreadyServed(f"another gpuloom server is using the database {_safe_url(self.url)}; stop it first, "
                                "or give this one its own database")
        self.conn = conn
        return self

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

    def acquire(self, state_dir: str | Path, store: Any) -> ServerLocks:
        try:
            self.held.append(FileLock(Path(state_dir) / "server.lock", f"the state directory {state_dir}").acquire())
            if store.is_sqlite:
                db = store.url.split("///", 1)[1] if "///" in store.url else ""
                if db and db != ":memory:":
                    self.held.append(FileLock(db + ".lock", f"the database {db}").acquire())
            elif store.engine.dialect.name == "postgresql":
                self.held.append(PgAdvisoryLock(store.engine, store.url).acquire())
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        for lk in reversed(self.held):
            lk.release()
        self.held.clear()
