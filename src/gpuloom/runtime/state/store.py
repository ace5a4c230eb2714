"""The service's state store: the truth about every accepted job.

SQLAlchemy 2.0 Core over an SQLite file by default (``sqlite:///PATH``), or
PostgreSQL by URL (``postgresql+psycopg://...``, optional extra ``postgres``).

Design decisions:

* **Durability first.** Every mutation is one transaction committed before the
  method returns, so the API acknowledges a submission only once it is on disk.
  SQLite runs in WAL mode with a busy timeout.  What users are told
  (submissions, cancels, tokens) commits with ``synchronous=FULL``: it
  survives a power cut, not only a killed server.  The loop's records of
  processes (launch, stop, finish) commit with ``synchronous=NORMAL``
  (``durable=False``): in WAL mode that survives a killed server, and after a
  power cut the processes they describe are gone too, so recovery requeues
  those jobs either way.  This makes a launch record ~4x cheaper here.
* **One writer.** SQLite allows one writer at a time; a process-wide lock
  serialises writes (API threads and the scheduling loop) instead of relying on
  busy retries.  Reads go through the same lock too: they are short, and it
  keeps the behaviour identical on PostgreSQL.
* **Plain columns for what is queried, JSON for the rest.**  ``jobs`` keeps the
  validated spec, the current allocation (node names, global GPU ids, core ids,
  memory) and the launched processes (node, pid, process start time: enough
  to adopt them after a restart) as JSON text.
* **Listeners** (:attr:`Store.listeners`) hear of every job event once it is
  committed (logging and metrics subscribe; a listener that raises is logged
  and ignored).
* Tables: ``jobs``, ``events`` (history of each job), ``allocations`` (what
  each job held, from when to when), ``profiles`` (model →
  measured profile), ``tokens`` (sha256 of a token → user, admin flag,
  expiry), ``idempotency`` (a submission's key → its jobs) and ``meta``
  (service epoch and other key/values), ``server_epoch`` (the fencing token
  below).
* **Fenced writes.**  A server that takes the database raises the stored
  server epoch (:meth:`Store.take_epoch`); each write transaction then checks,
  last before its commit, that the epoch is still its own (:class:`Fenced`
  otherwise, rolled back): a server paused past the loss of its lock writes
  nothing once another took the database.
* **Private.**  An SQLite file is created 0600 (its WAL and shared-memory
  files take the same mode): job specs hold users' environments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.sql import Select

from ...core.lifecycle import JobState
from .storelock import StoreLock

log = logging.getLogger("gpuloom.store")
metadata = MetaData()

jobs_t = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("user", String(100), nullable=False, index=True),
    Column("spec", Text, nullable=False),
    Column("state", String(40), nullable=False, index=True),
    Column("submit_time", Float, nullable=False),
    Column("first_start", Float),
    Column("last_start", Float),
    Column("end_time", Float),
    Column("alloc", Text),  # JSON: current allocation, null when holding nothing
    Column("procs", Text),  # JSON: launched processes (node, pid, start_time, cores)
    Column("attempts", Integer, nullable=False, default=0),  # launches so far
    Column("resume_count", Integer, nullable=False, default=0),  # launches with GPULOOM_RESUME=1
    Column("preemptions", Integer, nullable=False, default=0),
    Column("checkpoint_dir", Text),
    Column("progress", Float),  # iterations done by its last progress line when it last stopped
    Column("held_time", Float, nullable=False, default=0.0),  # seconds held before the current run (service time)
    Column("held_gpu_time", Float, nullable=False, default=0.0),
    Column("exit_code", Integer),
    Column("reason", Text),  # why it ended / waits / was refused
    Column("cancel_requested", Boolean, nullable=False, default=False),
    # the job's remaining work (reference seconds) exactly as of ``work_at`` (service time): a
    # restarted service continues from it at the model's speed instead of guessing from held time
    Column("work_left", Float),
    Column("work_at", Float),
    Column("pending_reason", String(200)),  # why a queued job waits, as of the last round (Slurm's REASON)
    Column("array_id", Integer),  # job arrays: the first task's id, and this task's index
    Column("array_task", Integer),
    # service time of the last launch (``last_start`` is its wall time, for people): held time counts
    # from it, across restarts too, whatever the wall clock did meanwhile
    Column("last_start_at", Float),
)
#: a dependency on an array reads its tasks' counts by state (and whether they started) from this index
#: alone, without the rows (a 10,000-task array: ~1.5 ms instead of ~25 ms)
Index("ix_jobs_array_state", jobs_t.c.array_id, jobs_t.c.state, jobs_t.c.first_start)

#: columns added after the first release: created on stores that predate them
_ADDED_COLUMNS = {"jobs": (("work_left", "FLOAT"), ("work_at", "FLOAT"), ("pending_reason", "VARCHAR(200)"),
                           ("array_id", "INTEGER"), ("array_task", "INTEGER"), ("last_start_at", "FLOAT")),
                  "tokens": (("expires", "FLOAT"),)}

events_t = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, index=True),
    Column("time", Float, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("detail", Text),
)

#: what each job held over time: one row per allocation (a launch, a regroup, an adoption keeps it);
#: kept by :meth:`Store.update_job` whenever a job's ``alloc`` changes, in the same transaction
allocations_t = Table(
    "allocations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, nullable=False, index=True),
    Column("start_time", Float, nullable=False),  # wall seconds
    Column("end_time", Float),  # null while held
    Column("gpus", Integer, nullable=False),
    Column("nodes", Text, nullable=False),  # comma-separated node names
    Column("alloc", Text, nullable=False),  # JSON, as in jobs.alloc
    Column("opened_by", String(40)),  # the event that took it (launch, resume, move, resize, regroup)
    Column("closed_by", String(40)),  # the event that gave it up (preempt, finished, failed, ...)
)

profiles_t = Table(
    "profiles",
    metadata,
    Column("model", String(200), primary_key=True),
    Column("profile", Text, nullable=False),
    Column("updated", Float, nullable=False),
)

tokens_t = Table(
    "tokens",
    metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("user", String(100), nullable=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("created", Float, nullable=False),
    Column("expires", Float),  # wall time after which the token is refused (null: never)
)

#: a submission's idempotency key -> the job it created (a retried submission gets the same job)
idempotency_t = Table(
    "idempotency",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("job_id", Integer, nullable=False),
    Column("created", Float, nullable=False),
)

# Who changed what outside jobs (tokens, queues): written and read by :mod:`.audit`.
audit_t = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False, index=True),  # wall seconds
    Column("actor", String(100), nullable=False, index=True),  # who did it: a user name (the token's)
    Column("kind", String(40), nullable=False, index=True),  # token.create, queue.set, ...
    Column("subject", String(100)),  # the user concerned (a token's owner, a user given a queue)
    Column("target", String(200)),  # what changed: a queue, a group, a token id
    Column("detail", Text),  # JSON
)

# Advance reservations, wall-clock times: written and read by :mod:`.reservations`.
reservations_t = Table(
    "reservations",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("start", Float, nullable=False),  # wall seconds
    Column("end", Float, nullable=False),
    Column("users", Text, nullable=False),  # JSON list
    Column("nodes", Text, nullable=False),  # JSON list (empty: a GPU count)
    Column("gpus", Float, nullable=False),
    Column("created", Float, nullable=False),
    Column("creator", String(100), nullable=False),
)

meta_t = Table(
    "meta",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
#: the server epoch, a fencing token (one row, id 1): raised by each server that takes the database
#: (:meth:`Store.take_epoch`); a server's writes commit only while the stored epoch is still its own
epoch_t = Table(
    "server_epoch",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", Integer, nullable=False),
)
# GPU telemetry totals per job and the dashboard's time series: written and read by :mod:`.gpudb`.
gpu_usage_t = Table(
    "gpu_usage", metadata,
    Column("job_id", Integer, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("util_sum", Float, nullable=False),  # sum over samples of the mean utilisation (%) of its GPUs
    Column("util_max", Float, nullable=False),
    Column("mem_max_mb", Float, nullable=False),  # MiB its GPUs held at once, at most
    Column("energy_j", Float),  # None: some GPU had no power reading
    Column("updated", Float, nullable=False),
)
series_t = Table(
    "series", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("step", Float, nullable=False),  # the interval the point stands for: fine or COARSE_S
    Column("doc", Text, nullable=False),
    Index("ix_series_step_time", "step", "time"),
)

_JSON_COLS = ("spec", "alloc", "procs")
CONNECT_TIMEOUT_S = 10  # PostgreSQL: seconds to reach the server (unless the URL sets connect_timeout)
_IN_CHUNK = 500  # ids per ``IN (...)``: below every SQLite build's limit on bound parameters
S_CANCELLED = JobState.CANCELLED.value
TOKEN_ID_LEN = 12  # a token's public id: this many hex digits of its hash


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class JobRow:
    """One row of ``jobs`` with the JSON columns decoded."""

    id: int
    name: str
    user: str
    spec: dict[str, Any]
    state: str
    submit_time: float
    first_start: float | None = None
    last_start: float | None = None
    end_time: float | None = None
    alloc: dict[str, Any] | None = None
    procs: list[dict[str, Any]] | None = None
    attempts: int = 0
    resume_count: int = 0
    preemptions: int = 0
    checkpoint_dir: str | None = None
    progress: float | None = None
    held_time: float = 0.0
    held_gpu_time: float = 0.0
    exit_code: int | None = None
    reason: str | None = None
    cancel_requested: bool = False
    work_left: float | None = None
    work_at: float | None = None
    pending_reason: str | None = None
    array_id: int | None = None
    array_task: int | None = None
    last_start_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


#: the columns of a :class:`JobRow`, selected in its fields' order: :func:`_decode` builds it by position
#: (a page of 1,000 rows in ~3 ms; by column name, through SQLAlchemy's row mappings, ~50 ms)
_ROW_FIELDS = tuple(f for f in JobRow.__dataclass_fields__ if f != "extra")
_ROW_COLS = tuple(jobs_t.c[f] for f in _ROW_FIELDS)
_JSON_AT = tuple(_ROW_FIELDS.index(k) for k in _JSON_COLS)


def _decode(row: Sequence[Any]) -> JobRow:
    """A row of ``select(*_ROW_COLS)`` as a :class:`JobRow`, its JSON columns decoded."""
    v = list(row)
    for i in _JSON_AT:
        if v[i] is not None:
            v[i] = json.loads(v[i])
    return JobRow(*v)


def _encode(fields: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(fields)
    for k in _JSON_COLS:
        if k in out and out[k] is not None:
            out[k] = json.dumps(out[k], sort_keys=True)
    return out


class _Entered:
    """Context manager over an already-entered ``engine.begin()``."""

    def __init__(self, cm: Any, conn: Any) -> None:
        self.cm = cm
        self.conn = conn

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, *exc: Any) -> Any:
        return self.cm.__exit__(*exc)


def _filtered(q: Select[Any], states: Iterable[str] | None, user: str | None, after_id: int | None,
              since: float | None, until: float | None, limit: int | None) -> Select[Any]:
    """``q`` over jobs by id: those in ``states``, of ``user``, after id ``after_id``, not ended before
    ``since``, submitted by ``until``; at most ``limit`` of them."""
    if since is not None:
        q = q.where((jobs_t.c.end_time.is_(None)) | (jobs_t.c.end_time >= since))
    if until is not None:
        q = q.where(jobs_t.c.submit_time <= until)
    if states is not None:
        q = q.where(jobs_t.c.state.in_(list(states)))
    if user is not None:
        q = q.where(jobs_t.c.user == user)
    if after_id is not None:
        q = q.where(jobs_t.c.id > after_id)
    q = q.order_by(jobs_t.c.id)
    return q if limit is None else q.limit(limit)


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


class _Tx:
    """A transaction whose full-disk errors, at its start, inside it or at its commit, become :class:`StoreFull`."""

    def __init__(self, store: Store, durable: bool) -> None:
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


class Store:
    """Thread-safe access to the service's tables.  ``url`` is an SQLAlchemy URL."""

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

    # -- jobs -------------------------------------------------------------------
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

    def add_job(self, spec: Mapping[str, Any], user: str, state: str, now: float | None = None) -> int:
        """Insert a job and its 'submit' event in one committed transaction; return its id."""
        return self.add_jobs([spec], user, state, now)[0]

    def add_jobs(self, specs: Sequence[Mapping[str, Any]], user: str, state: str, now: float | None = None,
                 array_tasks: Sequence[int] | None = None, actor: str | None = None) -> list[int]:
        """Insert jobs and their 'submit' events in one committed transaction; return their ids.

        With ``array_tasks`` (one index per spec) they are one job array: each row's ``array_id``
        is the first job's id (Slurm's array job id), ``array_task`` its index.  ``actor``: who submitted
        for ``user`` (an admin), recorded in the submit events."""
        now = time.time() if now is None else now
        if array_tasks is not None and len(array_tasks) != len(specs):
            raise ValueError("one array task index per spec")
        with self.lock, self._begin(True) as c:
            ids = self._insert_jobs(c, specs, user, state, now, array_tasks, actor)
        self._notify_submitted(ids, user, state, now, array_tasks, specs, actor)
        return ids

    def add_jobs_row(self, specs: Sequence[Mapping[str, Any]], user: str, state: str, now: float | None = None,
                     array_tasks: Sequence[int] | None = None, actor: str | None = None) -> tuple[list[int], JobRow]:
        """:meth:`add_jobs`, and the first job's row as stored, read under the same hold of the lock: a
        submission that answers with its job waits for the lock once, not twice."""
        now = time.time() if now is None else now
        if array_tasks is not None and len(array_tasks) != len(specs):
            raise ValueError("one array task index per spec")
        with self.lock:
            with self._begin(True) as c:
                ids = self._insert_jobs(c, specs, user, state, now, array_tasks, actor)
            row = self.get_job(ids[0])
        self._notify_submitted(ids, user, state, now, array_tasks, specs, actor)
        assert row is not None  # (committed above; jobs are deleted only when purged, long after they end)
        return ids, row

    def _insert_jobs(self, c: Any, specs: Sequence[Mapping[str, Any]], user: str, state: str, now: float,
                     array_tasks: Sequence[int] | None, actor: str | None = None) -> list[int]:
        ids: list[int] = []
        for k, spec in enumerate(specs):
            res = c.execute(
                insert(jobs_t).values(
                    **_encode(
                        {
                            "name": str(spec.get("name") or "job"),
                            "user": user,
                            "spec": dict(spec),
                            "state": state,
                            "submit_time": now,
                            "checkpoint_dir": spec.get("checkpoint_dir"),
                            "attempts": 0,
                            "resume_count": 0,
                            "preemptions": 0,
                            "held_time": 0.0,
                            "held_gpu_time": 0.0,
                            "cancel_requested": False,
                            "array_id": ids[0] if array_tasks is not None and ids else None,
                            "array_task": None if array_tasks is None else int(array_tasks[k]),
                        }
                    )
                )
            )
            ids.append(int(res.inserted_primary_key[0]))
        if array_tasks is not None:
            c.execute(update(jobs_t).where(jobs_t.c.id == ids[0]).values(array_id=ids[0]))
        detail = json.dumps({"user": user} if actor in (None, user) else {"actor": actor, "user": user})
        c.execute(insert(events_t), [{"job_id": jid, "time": now, "kind": "submit", "detail": detail} for jid in ids])
        return ids

    def _notify_submitted(self, ids: Sequence[int], user: str, state: str, now: float,
                          array_tasks: Sequence[int] | None, specs: Sequence[Mapping[str, Any]] = (),
                          actor: str | None = None) -> None:
        detail = {"user": user} if actor in (None, user) else {"actor": actor, "user": user}
        for k, jid in enumerate(ids):
            arr = {} if array_tasks is None else {"array_id": ids[0], "array_task": int(array_tasks[k])}
            # (the job's name and queue, for its log lines: not stored with the event)
            spec = specs[k] if k < len(specs) else {}
            named = {"name": str(spec.get("name") or "job"), "queue": spec.get("queue")} if spec else {}
            self._notify(jid, "submit", detail, {"state": state, "submit_time": now, **arr, **named})

    def _notify(self, job_id: int | None, kind: str, detail: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        for fn in list(self.listeners):
            try:
                fn(job_id, kind, detail, fields)
            except Exception:  # a listener must never undo or block a committed change
                log.exception("store listener failed on %s of job %s", kind, job_id)

    def job_for_key(self, user: str, key: str) -> int | None:
        """The (first) job a submission with idempotency ``key`` by ``user`` created, if any."""
        with self.lock, self.engine.connect() as c:
            v = c.execute(select(idempotency_t.c.job_id).where(idempotency_t.c.user == user,
                                                                idempotency_t.c.key == key)).scalar()
        return None if v is None else int(v)

    def add_jobs_once(self, specs: Sequence[Mapping[str, Any]], user: str, state: str, key: str,
                      now: float | None = None, array_tasks: Sequence[int] | None = None,
                      actor: str | None = None) -> tuple[list[int], bool]:
        """:meth:`add_jobs` and the key's record in one transaction: (new ids, True), or ([the first id the
        key already names], False)."""
        now = time.time() if now is None else now
        with self.lock:
            old = self.job_for_key(user, key)
            if old is not None:
                return [old], False
            with self._begin(True) as c:
                ids = self._insert_jobs(c, specs, user, state, now, array_tasks, actor)
                c.execute(insert(idempotency_t).values(user=user, key=key, job_id=ids[0], created=now))
        self._notify_submitted(ids, user, state, now, array_tasks, specs, actor)
        return ids, True

    def purge_jobs(self, before: float, states: Iterable[str]) -> list[int]:
        """Delete jobs in ``states`` that ended before ``before`` (wall time), with their events,
        allocation records and idempotency keys; returns their ids."""
        with self.lock, self._begin(True) as c:
            ids = [int(r[0]) for r in c.execute(select(jobs_t.c.id).where(
                jobs_t.c.state.in_(list(states)), jobs_t.c.end_time < before))]
            for k in range(0, len(ids), 500):
                chunk = ids[k:k + 500]
                c.execute(delete(events_t).where(events_t.c.job_id.in_(chunk)))
                c.execute(delete(allocations_t).where(allocations_t.c.job_id.in_(chunk)))
                c.execute(delete(idempotency_t).where(idempotency_t.c.job_id.in_(chunk)))
                c.execute(delete(jobs_t).where(jobs_t.c.id.in_(chunk)))
        return ids

    def get_job(self, job_id: int) -> JobRow | None:
        with self.lock, self.engine.connect() as c:
            row = c.execute(select(*_ROW_COLS).where(jobs_t.c.id == job_id)).first()
        return None if row is None else _decode(row)

    def list_jobs(
        self, states: Iterable[str] | None = None, user: str | None = None, after_id: int | None = None,
        since: float | None = None, until: float | None = None, limit: int | None = None,
    ) -> list[JobRow]:
        """Jobs by id; ``since``/``until`` (wall seconds): only those not ended before ``since`` and
        submitted by ``until``; at most ``limit`` of them, after id ``after_id``."""
        q = _filtered(select(*_ROW_COLS), states, user, after_id, since, until, limit)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).all()
        return [_decode(r) for r in rows]

    def job_columns(self, columns: Sequence[str], states: Iterable[str] | None = None, user: str | None = None,
                    after_id: int | None = None, since: float | None = None, limit: int | None = None,
                    ) -> list[tuple[Any, ...]]:
        """:meth:`list_jobs` with only ``columns`` (names of :class:`JobRow` fields), each job a tuple of
        their values in that order, JSON columns decoded: a listing that shows a few fields reads only those."""
        q = _filtered(select(*(jobs_t.c[k] for k in columns)), states, user, after_id, since, None, limit)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).all()
        at = [i for i, k in enumerate(columns) if k in _JSON_COLS]
        if not at or not rows:
            return [tuple(r) for r in rows]
        cols = [list(c) for c in zip(*rows, strict=True)]
        for i in at:  # each JSON column's texts decoded in one call
            texts = [x for x in cols[i] if x is not None]
            decoded = iter(json.loads("[" + ",".join(texts) + "]"))
            cols[i] = [None if x is None else next(decoded) for x in cols[i]]
        return list(zip(*cols, strict=True))

    def count_jobs(self, states: Iterable[str] | None = None, user: str | None = None,
                   since: float | None = None) -> int:
        """How many jobs :meth:`list_jobs` would list with these filters and no page."""
        q = select(func.count()).select_from(jobs_t)
        if states is not None:
            q = q.where(jobs_t.c.state.in_(list(states)))
        if user is not None:
            q = q.where(jobs_t.c.user == user)
        if since is not None:
            q = q.where((jobs_t.c.end_time.is_(None)) | (jobs_t.c.end_time >= since))
        with self.lock, self.engine.connect() as c:
            return int(c.execute(q).scalar() or 0)

    def update_job(
        self,
        job_id: int,
        fields: Mapping[str, Any],
        event_kind: str | None = None,
        detail: Mapping[str, Any] | None = None,
        expect_state: Iterable[str] | None = None,
        now: float | None = None,
        durable: bool = True,
    ) -> bool:
        """Update a job (and log an event) atomically.

        With ``expect_state`` the update only happens if the job is in one of
        those states (compare-and-set); returns whether a row changed.
        """
        now = time.time() if now is None else now
        q = update(jobs_t).where(jobs_t.c.id == job_id)
        if expect_state is not None:
            q = q.where(jobs_t.c.state.in_(list(expect_state)))
        with self.lock, self._begin(durable) as c:
            res = c.execute(q.values(**_encode(fields)))
            changed = res.rowcount > 0
            if changed and event_kind is not None:
                c.execute(
                    insert(events_t).values(
                        job_id=job_id, time=now, kind=event_kind, detail=json.dumps(dict(detail or {}), sort_keys=True)
                    )
                )
            if changed and "alloc" in fields:
                self._track_alloc(c, job_id, fields["alloc"], event_kind or "update", now)
        if changed and event_kind is not None:
            self._notify(job_id, event_kind, detail or {}, fields)
        return changed

    @staticmethod
    def _track_alloc(c: Any, job_id: int, alloc: Mapping[str, Any] | None, kind: str, now: float) -> None:
        """Close the job's open allocation record; open one for ``alloc`` (see ``allocations_t``)."""
        c.execute(update(allocations_t).where(allocations_t.c.job_id == job_id, allocations_t.c.end_time.is_(None))
                  .values(end_time=now, closed_by=kind))
        if alloc:
            parts = alloc.get("parts", [])
            c.execute(insert(allocations_t).values(
                job_id=job_id, start_time=now, end_time=None, gpus=sum(len(p.get("gpus", ())) for p in parts),
                nodes=",".join(str(p["node"]) for p in parts), alloc=json.dumps(dict(alloc), sort_keys=True),
                opened_by=kind, closed_by=None))

    def allocations(self, job_ids: Iterable[int] | None = None, since: float | None = None,
                    until: float | None = None) -> list[dict[str, Any]]:
        """Allocation records (all, or the jobs'), those overlapping [since, until], by start time."""
        q = select(allocations_t).order_by(allocations_t.c.start_time, allocations_t.c.id)
        if job_ids is not None:
            q = q.where(allocations_t.c.job_id.in_(list(job_ids)))
        if since is not None:
            q = q.where((allocations_t.c.end_time.is_(None)) | (allocations_t.c.end_time >= since))
        if until is not None:
            q = q.where(allocations_t.c.start_time <= until)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [{**r, "alloc": json.loads(r["alloc"])} for r in rows]

    def update_jobs(self, changes: Sequence[tuple[int, Mapping[str, Any], str, Mapping[str, Any]]],
                    now: float | None = None, durable: bool = False) -> None:
        """Update many jobs, each with its event, in one transaction: all of them or (it raises) none.
        ``changes``: ``(job id, fields, event kind, detail)``; fields without ``alloc``."""
        if not changes:
            return
        now = time.time() if now is None else now
        with self.lock, self._begin(durable) as c:
            for job_id, fields, kind, detail in changes:
                if "alloc" in fields:
                    raise ValueError("update_jobs does not keep allocation records: use update_job")
                c.execute(update(jobs_t).where(jobs_t.c.id == job_id).values(**_encode(fields)))
                c.execute(insert(events_t).values(job_id=job_id, time=now, kind=kind,
                                                  detail=json.dumps(dict(detail), sort_keys=True)))
        for job_id, fields, kind, detail in changes:
            self._notify(job_id, kind, detail, fields)

    def ping(self) -> None:
        """One trivial query, without the writer lock (a long write does not delay it); raises if the
        database cannot answer."""
        with self.engine.connect() as c:
            c.execute(select(literal(1))).scalar()

    def set_pending_reasons(self, reasons: Mapping[int, str | None]) -> None:
        """Store why queued jobs wait (``pending_reason``), many in one transaction, no events."""
        if not reasons:
            return
        q = update(jobs_t).where(jobs_t.c.id == bindparam("_id")).values(pending_reason=bindparam("_why"))
        with self.lock, self._begin(False) as c:
            c.execute(q, [{"_id": int(k), "_why": v} for k, v in reasons.items()])

    def count_by_state(self) -> dict[str, int]:
        q = select(jobs_t.c.state, func.count()).group_by(jobs_t.c.state)
        with self.lock, self.engine.connect() as c:
            return {str(s): int(n) for s, n in c.execute(q).all()}

    def count_of(self, states: Iterable[str], user: str | None = None, queues: Iterable[str] | None = None) -> int:
        """Jobs in ``states``, of ``user`` and in ``queues`` (the spec's ``queue``) where given: what the
        submission limits count (an array's tasks each count)."""
        from sqlalchemy import JSON, cast, type_coerce

        q = select(func.count()).select_from(jobs_t).where(jobs_t.c.state.in_(list(states)))
        if user is not None:
            q = q.where(jobs_t.c.user == user)
        if queues is not None:  # SQLite reads JSON text as it is; PostgreSQL needs it cast
            spec = type_coerce(jobs_t.c.spec, JSON) if self.is_sqlite else cast(jobs_t.c.spec, JSON)
            q = q.where(spec["queue"].as_string().in_(list(queues)))
        with self.lock, self.engine.connect() as c:
            return int(c.execute(q).scalar() or 0)

    def array_tasks(self, array_id: int) -> list[JobRow]:
        """The tasks of job array ``array_id``, by task index."""
        q = select(*_ROW_COLS).where(jobs_t.c.array_id == array_id).order_by(jobs_t.c.array_task)
        with self.lock, self.engine.connect() as c:
            return [_decode(r) for r in c.execute(q).all()]

    def count_array(self, array_id: int, states: Iterable[str]) -> int:
        """How many tasks of job array ``array_id`` are in ``states``."""
        q = select(func.count()).select_from(jobs_t).where(jobs_t.c.array_id == array_id,
                                                             jobs_t.c.state.in_(list(states)))
        with self.lock, self.engine.connect() as c:
            return int(c.execute(q).scalar() or 0)

    # -- arrays and dependencies: counts and states, never the rows of every task ------------
    def array_size(self, array_id: int) -> int:
        """How many tasks job array ``array_id`` has (0: it is no array's id)."""
        return self.count_arrays([array_id]).get(int(array_id), 0)

    def array_task_id(self, array_id: int, task: int) -> int | None:
        """The job id of task ``task`` of job array ``array_id``, if there is one."""
        q = select(jobs_t.c.id).where(jobs_t.c.array_id == array_id, jobs_t.c.array_task == task)
        with self.lock, self.engine.connect() as c:
            v = c.execute(q).scalar()
        return None if v is None else int(v)

    def job_exists(self, job_id: int) -> bool:
        with self.lock, self.engine.connect() as c:
            return c.execute(select(jobs_t.c.id).where(jobs_t.c.id == job_id)).first() is not None

    def job_states(self, job_ids: Iterable[int]) -> dict[int, tuple[str, bool]]:
        """``{id: (state, started)}`` of the jobs that exist (started: it has a first start)."""
        ids = sorted({int(j) for j in job_ids})
        out: dict[int, tuple[str, bool]] = {}
        with self.lock, self.engine.connect() as c:
            for k in range(0, len(ids), _IN_CHUNK):
                q = select(jobs_t.c.id, jobs_t.c.state, jobs_t.c.first_start).where(
                    jobs_t.c.id.in_(ids[k:k + _IN_CHUNK]))
                out.update({int(i): (str(s), f is not None) for i, s, f in c.execute(q).all()})
        return out

    def array_counts(self, array_ids: Iterable[int]) -> dict[int, dict[str, tuple[int, int]]]:
        """Per job array: its tasks by state, ``{state: (tasks, tasks that started)}``, in one grouped query
        (per 500 arrays)."""
        aids = sorted({int(a) for a in array_ids})
        out: dict[int, dict[str, tuple[int, int]]] = {a: {} for a in aids}
        with self.lock, self.engine.connect() as c:
            for k in range(0, len(aids), _IN_CHUNK):
                q = (select(jobs_t.c.array_id, jobs_t.c.state, func.count(), func.count(jobs_t.c.first_start))
                     .where(jobs_t.c.array_id.in_(aids[k:k + _IN_CHUNK])).group_by(jobs_t.c.array_id, jobs_t.c.state))
                for aid, state, n, started in c.execute(q).all():
                    out[int(aid)][str(state)] = (int(n), int(started))
        return out

    def count_arrays(self, array_ids: Iterable[int], states: Iterable[str] | None = None) -> dict[int, int]:
        """Per job array (those with tasks): how many of its tasks are in ``states`` (all: None), in one
        grouped query (per 500 arrays)."""
        aids = sorted({int(a) for a in array_ids})
        out: dict[int, int] = {}
        with self.lock, self.engine.connect() as c:
            for k in range(0, len(aids), _IN_CHUNK):
                q = select(jobs_t.c.array_id, func.count()).where(jobs_t.c.array_id.in_(aids[k:k + _IN_CHUNK]))
                if states is not None:
                    q = q.where(jobs_t.c.state.in_(list(states)))
                out.update({int(a): int(n) for a, n in c.execute(q.group_by(jobs_t.c.array_id)).all()})
        return out

    def cancel_held(self, reasons: Mapping[int, str], expect_state: str, now: float | None = None) -> list[int]:
        """Cancel the jobs still in ``expect_state``, each with its reason and a ``cancelled`` event, in one
        transaction of four statements however many they are; returns those cancelled (by id)."""
        if not reasons:
            return []
        now = time.time() if now is None else now
        rows = [{"_id": int(j), "_why": why, "_detail": json.dumps({"reason": why}), "_now": now,
                 "_expect": expect_state} for j, why in sorted(reasons.items())]
        cond = (jobs_t.c.id == bindparam("_id"), jobs_t.c.state == bindparam("_expect"))
        with self.lock, self._begin(True) as c:
            last = c.execute(select(func.max(events_t.c.id))).scalar() or 0
            # the event first, while the state still says whether this job is to be cancelled
            c.execute(insert(events_t).from_select(
                ["job_id", "time", "kind", "detail"],
                select(jobs_t.c.id, bindparam("_now", type_=Float), literal(S_CANCELLED, String),
                       bindparam("_detail", type_=Text)).where(*cond)), rows)
            c.execute(update(jobs_t).where(*cond).values(state=S_CANCELLED, end_time=bindparam("_now"),
                                                          reason=bindparam("_why"), pending_reason=None), rows)
            done = [int(j) for j in c.execute(select(events_t.c.job_id).where(events_t.c.id > last)
                                              .order_by(events_t.c.id)).scalars()]
        for j in done:
            self._notify(j, S_CANCELLED, {"reason": reasons[j]},
                         {"state": S_CANCELLED, "end_time": now, "reason": reasons[j], "pending_reason": None})
        return done

    def get_jobs(self, job_ids: Iterable[int]) -> dict[int, JobRow]:
        ids = list(job_ids)
        if not ids:
            return {}
        with self.lock, self.engine.connect() as c:
            rows = c.execute(select(*_ROW_COLS).where(jobs_t.c.id.in_(ids))).all()
        return {j.id: j for j in map(_decode, rows)}

    def set_states(self, job_ids: Iterable[int], state: str, expect_state: Iterable[str],
                   now: float | None = None) -> int:
        """Move many jobs to ``state`` in one transaction (only those in ``expect_state``)."""
        ids = list(job_ids)
        if not ids:
            return 0
        now = time.time() if now is None else now
        with self.lock, self._begin(False) as c:
            res = c.execute(
                update(jobs_t)
                .where(jobs_t.c.id.in_(ids), jobs_t.c.state.in_(list(expect_state)))
                .values(state=state)
            )
            c.execute(insert(events_t), [{"job_id": i, "time": now, "kind": state, "detail": "{}"} for i in ids])
            n = int(res.rowcount)
        for i in ids:
            self._notify(i, state, {}, {"state": state})
        return n

    def events(self, job_id: int | None = None) -> list[dict[str, Any]]:
        q = select(events_t).order_by(events_t.c.id)
        if job_id is not None:
            q = q.where(events_t.c.job_id == job_id)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [{**r, "detail": json.loads(r["detail"]) if r["detail"] else {}} for r in rows]

    def add_event(
        self, job_id: int | None, kind: str, detail: Mapping[str, Any] | None = None, durable: bool = True,
        now: float | None = None,
    ) -> None:
        now = time.time() if now is None else now
        with self.lock, self._begin(durable) as c:
            c.execute(
                insert(events_t).values(
                    job_id=job_id, time=now, kind=kind, detail=json.dumps(dict(detail or {}), sort_keys=True)
                )
            )
        self._notify(job_id, kind, detail or {}, {})

    # -- profiles ---------------------------------------------------------------
    def put_profile(self, model: str, profile: Mapping[str, Any]) -> None:
        with self.lock, self._begin(True) as c:
            exists = c.execute(select(profiles_t.c.model).where(profiles_t.c.model == model)).first()
            vals = {"profile": json.dumps(dict(profile), sort_keys=True), "updated": time.time()}
            if exists:
                c.execute(update(profiles_t).where(profiles_t.c.model == model).values(**vals))
            else:
                c.execute(insert(profiles_t).values(model=model, **vals))

    def get_profile(self, model: str) -> dict[str, Any] | None:
        with self.lock, self.engine.connect() as c:
            v = c.execute(select(profiles_t.c.profile).where(profiles_t.c.model == model)).scalar()
        return None if v is None else json.loads(v)

    # -- tokens -----------------------------------------------------------------
    def add_token(self, token: str, user: str, admin: bool = False, expires: float | None = None) -> None:
        with self.lock, self._begin(True) as c:
            c.execute(
                insert(tokens_t).values(token_hash=hash_token(token), user=user, admin=admin, created=time.time(),
                                        expires=expires)
            )

    def lookup_token(self, token: str, now: float | None = None) -> tuple[str, bool] | None:
        """(user, admin) of a token that exists and has not expired, else None."""
        with self.lock, self.engine.connect() as c:
            row = c.execute(
                select(tokens_t.c.user, tokens_t.c.admin, tokens_t.c.expires)
                .where(tokens_t.c.token_hash == hash_token(token))
            ).first()
        if row is None or (row[2] is not None and row[2] <= (time.time() if now is None else now)):
            return None
        return str(row[0]), bool(row[1])
