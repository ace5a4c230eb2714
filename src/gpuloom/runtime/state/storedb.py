"""The store's database: its engine (SQLite pragmas, PostgreSQL pool), tables created and columns added,
the write transaction (full disk -> :class:`~.storeerrors.StoreFull`, the fence checked last), the
server epoch (a fencing token) and the ``meta`` key/values."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, literal, select, update
from sqlalchemy.engine import Engine

from .schema import _ADDED_COLUMNS, epoch_t, meta_t, metadata
from .storeerrors import Fenced, StoreError, StoreFull, is_full
from .storelock import StoreLock

log = logging.getLogger("gpuloom.store")
CONNECT_TIMEOUT_S = 10  # PostgreSQL: seconds to reach the server (unless the URL sets connect_timeout)


class _Entered:
    """Context manager over an already-entered ``engine.begin()``."""

    def __init__(self, cm: Any, conn: Any) -> None:
        self.cm = cm
        self.conn = conn

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, *exc: Any) -> Any:
        return self.cm.__exit__(*exc)


class _Tx:
    """A transaction whose full-disk errors, at its start, inside it or at its commit, become :class:`StoreFull`."""

    def __init__(self, store: StoreDb, durable: bool) -> None:
        self.store = store
        self.durable = durable
        self.cm: Any = None
        self.conn: Any = None

    def __enter__(self) -> Any:
        if self.store.fenced is not None:
            raise Fenced(self.store.fenced)
        try:
            self.cm = self.store._begin_raw(self.durable)
            self.conn = self.cm.__enter__()
            return self.conn
        except Exception as e:
            full = self.store.full(e)
            if full is e:
                raise
            raise full from e

    def __exit__(self, et: Any, ev: BaseException | None, tb: Any) -> Any:
        fence_error: BaseException | None = None
        if et is None and self.store.fence is not None:
            try:  # last, so SQLite's write lock is held; PostgreSQL's FOR SHARE holds off a new epoch until commit
                self.store.check_fence(self.conn)
            except BaseException as e:  # noqa: BLE001  (rolled back below, then raised)
                fence_error, et, ev, tb = e, type(e), e, e.__traceback__
        try:
            out = self.cm.__exit__(et, ev, tb)
            if fence_error is not None:
                raise fence_error
        except Exception as e:
            full = self.store.full(e)
            if full is e:
                raise
            raise full from e
        if isinstance(ev, Exception):
            full = self.store.full(ev)
            if full is not ev:
                raise full from ev
        return out


class StoreDb:
    """The database under a :class:`~.store.Store`: its engine, lock, listeners, transactions, fence and
    meta (``url`` is an SQLAlchemy URL)."""

    def __init__(self, url: str, synchronous: str = "FULL") -> None:
        """``synchronous`` is the level of durable writes (FULL or NORMAL); other writes use NORMAL."""
        self.url = url
        self.lock = StoreLock()  # reentrant; the scheduling loop's statements go first (:mod:`.storelock`)
        #: ``fn(job_id, kind, detail, fields)`` called after each job event commits (see the module notes)
        self.listeners: list[Callable[[int | None, str, Mapping[str, Any], Mapping[str, Any]], None]] = []
        self.is_sqlite = url.startswith("sqlite")
        #: this server's epoch (:meth:`take_epoch`): every write checks it in its transaction; None: not checked
        self.fence: int | None = None
        self.fenced: str | None = None  # why writes are refused: another server took the database
        self.path: Path | None = None  # the database file, when it is a local one (SQLite)
        kw: dict[str, Any] = {"future": True}
        if self.is_sqlite:
            kw["connect_args"] = {"check_same_thread": False, "timeout": 30}
            path = url.split("///", 1)[1] if "///" in url else ""
            if path and path != ":memory:":
                self.path = Path(path).absolute()
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                # private from the start (SQLite gives its -wal and -shm files the same mode)
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
                if os.stat(path).st_uid == os.geteuid():
                    os.chmod(path, 0o600)
        elif url.startswith("postgresql"):
            # after the database restarts, pooled connections are dead: each is tried (one round trip) as it
            # leaves the pool and replaced if dead, so no request fails on one; an unreachable server fails
            # in seconds, not after the system's TCP timeout
            kw["pool_pre_ping"] = True
            if "connect_timeout" not in url:
                kw["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        try:
            self.engine: Engine = create_engine(url, **kw)
        except Exception as e:  # bad URL, missing driver
            raise StoreError(f"database {url!r}: {e}") from None
        self.sync = synchronous.upper()
        if self.is_sqlite:
            sync = self.sync
            if sync not in ("NORMAL", "FULL"):
                raise StoreError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")

            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn: Any, _rec: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={sync}")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()

        with self.lock:
            metadata.create_all(self.engine)
            self._add_missing_columns()
            for table in metadata.sorted_tables:  # and indexes added since (create_all skips existing tables)
                for ix in table.indexes:
                    ix.create(self.engine, checkfirst=True)

    def _add_missing_columns(self) -> None:
        """A store made by an older release lacks columns added since: add them (nullable)."""
        from sqlalchemy import inspect as sa_inspect

        insp = sa_inspect(self.engine)
        for table, cols in _ADDED_COLUMNS.items():
            have = {c["name"] for c in insp.get_columns(table)}
            missing = [(n, t) for n, t in cols if n not in have]
            if missing:
                with self.engine.begin() as c:
                    for name, typ in missing:
                        c.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {typ}")

    def close(self) -> None:
        self.engine.dispose()

    # -- pragmas (for tests and `gpuloom serve` logging) ----------------------
    def journal_mode(self) -> str:
        if not self.is_sqlite:
            return "n/a"
        with self.engine.connect() as c:
            return str(c.exec_driver_sql("PRAGMA journal_mode").scalar())

    # -- meta -------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self.lock, self.engine.connect() as c:
            return c.execute(select(meta_t.c.value).where(meta_t.c.key == key)).scalar()

    def set_meta_default(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless a value is already there; return the stored one."""
        with self.lock, self._begin(True) as c:
            cur = c.execute(select(meta_t.c.value).where(meta_t.c.key == key)).scalar()
            if cur is not None:
                return cur
            c.execute(insert(meta_t).values(key=key, value=value))
            return value

    def set_meta(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what was there."""
        with self.lock, self._begin(False) as c:
            if c.execute(update(meta_t).where(meta_t.c.key == key).values(value=value)).rowcount == 0:
                c.execute(insert(meta_t).values(key=key, value=value))

    # -- the server epoch (a fencing token) ----------------------------------------
    def take_epoch(self, expect: int | None = None) -> int | None:
        """Raise the stored server epoch by one (from ``expect`` only, when given; None if it is not that)
        and make the new one this store's :attr:`fence`.  A server calls it once it holds the database's
        lock: any write of an earlier holder fails from then on (:class:`Fenced`)."""
        with self.lock, self.engine.begin() as c:  # not fenced: it moves the fence
            cur = c.execute(select(epoch_t.c.epoch).where(epoch_t.c.id == 1).with_for_update()).scalar()
            if expect is not None and cur != expect:
                return None
            if cur is None:
                c.execute(insert(epoch_t).values(id=1, epoch=1))
            else:
                c.execute(update(epoch_t).where(epoch_t.c.id == 1).values(epoch=cur + 1))
        self.fence, self.fenced = (1 if cur is None else cur + 1), None
        return self.fence

    def stored_epoch(self) -> int | None:
        """The server epoch in the store (None: no server took it yet)."""
        with self.lock, self.engine.connect() as c:
            return c.execute(select(epoch_t.c.epoch).where(epoch_t.c.id == 1)).scalar()

    def check_fence(self, c: Any) -> None:
        """Raise :class:`Fenced` (and refuse every later write) unless the stored epoch is still :attr:`fence`;
        on PostgreSQL the epoch's row stays share-locked until ``c``'s transaction ends."""
        q = select(epoch_t.c.epoch).where(epoch_t.c.id == 1)
        now = c.execute(q if self.is_sqlite else q.with_for_update(read=True)).scalar()
        if now != self.fence:
            self.fenced = (f"another gpuloom server took the database (its server epoch is {now}, this server's "
                           f"{self.fence}); this server stops, the other one schedules")
            log.critical("a write is refused: %s", self.fenced)
            raise Fenced(self.fenced)

    # -- transactions ---------------------------------------------------------
    def _begin(self, durable: bool = True) -> _Tx:
        """A transaction; on SQLite its commit is fsynced per ``durable`` (see module docstring).  A full
        disk raises :class:`StoreFull`."""
        return _Tx(self, durable)

    def full(self, e: Exception) -> Exception:
        """:class:`StoreFull` for an error that says the database's disk is full; else ``e`` itself."""
        if isinstance(e, StoreFull) or not is_full(e):
            return e
        where = str(self.path) if self.path is not None else self.engine.url.render_as_string(hide_password=True)
        why = str(getattr(e, "orig", None) or e).splitlines()[0]
        return StoreFull(f"the state disk is full: the database ({where}) cannot record changes ({why}); "
                         "free space on its file system")

    def _begin_raw(self, durable: bool):  # noqa: ANN202
        conn = self.engine.begin()
        if self.is_sqlite:
            level = self.sync if durable else "NORMAL"
            c = conn.__enter__()
            c.exec_driver_sql(f"PRAGMA synchronous={level}")
            return _Entered(conn, c)
        return conn

    def ping(self) -> None:
        """One trivial query, without the writer lock (a long write does not delay it); raises if the
        database cannot answer."""
        with self.engine.connect() as c:
            c.execute(select(literal(1))).scalar()
