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
* Tables: ``jobs``, ``events`` (history of each job), ``profiles`` (model →
  measured profile), ``tokens`` (sha256 of a token → user, admin flag) and
  ``meta`` (service epoch and other key/values).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine, RowMapping

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
    Column("held_time", Float, nullable=False, default=0.0),  # wall seconds held before the current run
    Column("held_gpu_time", Float, nullable=False, default=0.0),
    Column("exit_code", Integer),
    Column("reason", Text),  # why it ended / waits / was refused
    Column("cancel_requested", Boolean, nullable=False, default=False),
    # the job's remaining work (reference seconds) exactly as of ``work_at`` (service time): a
    # restarted service continues from it at the model's speed instead of guessing from held time
    Column("work_left", Float),
    Column("work_at", Float),
)

#: columns added after the first release: created on stores that predate them
_ADDED_COLUMNS = {"jobs": (("work_left", "FLOAT"), ("work_at", "FLOAT"))}

events_t = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, index=True),
    Column("time", Float, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("detail", Text),
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
)

meta_t = Table(
    "meta",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)

_JSON_COLS = ("spec", "alloc", "procs")


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
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        return d


def _decode(row: RowMapping) -> JobRow:
    d = dict(row)
    for k in _JSON_COLS:
        if d.get(k) is not None:
            d[k] = json.loads(d[k])
    return JobRow(**d)


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


class StoreError(RuntimeError):
    pass


class Store:
    """Thread-safe access to the service's tables.  ``url`` is an SQLAlchemy URL."""

    def __init__(self, url: str, synchronous: str = "FULL") -> None:
        """``synchronous`` is the level of durable writes (FULL or NORMAL); other writes use NORMAL."""
        self.url = url
        self.lock = threading.RLock()
        self.is_sqlite = url.startswith("sqlite")
        kw: dict[str, Any] = {"future": True}
        if self.is_sqlite:
            kw["connect_args"] = {"check_same_thread": False, "timeout": 30}
            path = url.split("///", 1)[1] if "///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
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

    # -- jobs -------------------------------------------------------------------
    def _begin(self, durable: bool = True):  # noqa: ANN202
        """A transaction; on SQLite its commit is fsynced per ``durable`` (see module docstring)."""
        conn = self.engine.begin()
        if self.is_sqlite:
            level = self.sync if durable else "NORMAL"
            c = conn.__enter__()
            c.exec_driver_sql(f"PRAGMA synchronous={level}")
            return _Entered(conn, c)
        return conn

    def add_job(self, spec: Mapping[str, Any], user: str, state: str, now: float | None = None) -> int:
        """Insert a job and its 'submit' event in one committed transaction; return its id."""
        now = time.time() if now is None else now
        with self.lock, self._begin(True) as c:
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
                        }
                    )
                )
            )
            jid = int(res.inserted_primary_key[0])
            c.execute(insert(events_t).values(job_id=jid, time=now, kind="submit", detail=json.dumps({"user": user})))
            return jid

    def get_job(self, job_id: int) -> JobRow | None:
        with self.lock, self.engine.connect() as c:
            row = c.execute(select(jobs_t).where(jobs_t.c.id == job_id)).mappings().first()
        return None if row is None else _decode(row)

    def list_jobs(
        self, states: Iterable[str] | None = None, user: str | None = None, after_id: int | None = None
    ) -> list[JobRow]:
        q = select(jobs_t)
        if states is not None:
            q = q.where(jobs_t.c.state.in_(list(states)))
        if user is not None:
            q = q.where(jobs_t.c.user == user)
        if after_id is not None:
            q = q.where(jobs_t.c.id > after_id)
        q = q.order_by(jobs_t.c.id)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [_decode(r) for r in rows]

    def count_jobs(self, states: Iterable[str] | None = None) -> int:
        q = select(func.count()).select_from(jobs_t)
        if states is not None:
            q = q.where(jobs_t.c.state.in_(list(states)))
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
        return changed

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
            return int(res.rowcount)

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
    def add_token(self, token: str, user: str, admin: bool = False) -> None:
        with self.lock, self._begin(True) as c:
            c.execute(
                insert(tokens_t).values(token_hash=hash_token(token), user=user, admin=admin, created=time.time())
            )

    def lookup_token(self, token: str) -> tuple[str, bool] | None:
        with self.lock, self.engine.connect() as c:
            row = c.execute(
                select(tokens_t.c.user, tokens_t.c.admin).where(tokens_t.c.token_hash == hash_token(token))
            ).first()
        return None if row is None else (str(row[0]), bool(row[1]))

    def has_admin(self) -> bool:
        with self.lock, self.engine.connect() as c:
            return c.execute(select(tokens_t.c.user).where(tokens_t.c.admin.is_(True))).first() is not None
