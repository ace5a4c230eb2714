"""The store's errors, and which of them say the store's state (full disk, database unreachable, fenced)
rather than a bad request: those a later retry may get past."""

from __future__ import annotations


class StoreError(RuntimeError):
    pass


class StoreFull(StoreError):
    """The database's disk is full (SQLite ``SQLITE_FULL``, PostgreSQL ``DiskFull`` 53100): the write
    was not made.  The API answers 503; the service retries what it must record."""


class StoreUnavailable(StoreError):
    """A write that must come after records the store has not taken yet (:mod:`..service.outbox`) was not made."""


class Fenced(StoreUnavailable):
    """A write of a server whose database another server took since (the stored server epoch is no longer
    this store's :attr:`Store.fence`): rolled back, and every later write refused at once."""


def unavailable(e: BaseException) -> bool:
    """Whether a store error is the store's state, not the request's: its disk full, the database
    unreachable or restarting, a lock or connection lost.  Retrying it later may succeed (the loop's
    records wait, :mod:`..service.outbox`; the API answers 503); any other error is a bug or bad data."""
    from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(e, StoreFull | StoreUnavailable | OperationalError | InterfaceError | DisconnectionError | PoolTimeout):
        return True
    return isinstance(e, DBAPIError) and bool(e.connection_invalidated)


def is_full(e: BaseException) -> bool:
    """Whether a database error says its disk is full."""
    orig = getattr(e, "orig", None) or e
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == 13:  # SQLITE_FULL
        return True
    if "53100" in (getattr(orig, "sqlstate", None), getattr(orig, "pgcode", None)):  # psycopg 3, psycopg2
        return True
    return "database or disk is full" in str(orig)
