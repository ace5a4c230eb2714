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

Modules: :mod:`.schema` has the tables; :mod:`.storeerrors` the errors; :mod:`.storedb` the engine,
transactions, fence and meta (:class:`~.storedb.StoreDb`); :mod:`.jobreads` the reads of jobs
(:class:`~.jobreads.JobReads`); :mod:`.jobrow` :class:`JobRow` and its encoding; here
:class:`Store` adds the writes (jobs, events, profiles, tokens).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Float, String, Text, bindparam, delete, func, insert, literal, select, update

from ...core.lifecycle import JobState
from .jobreads import JobReads
from .jobrow import JobRow, _encode
from .schema import (
    allocations_t,
    audit_t,
    epoch_t,
    events_t,
    gpu_usage_t,
    idempotency_t,
    jobs_t,
    meta_t,
    metadata,
    profiles_t,
    reservations_t,
    series_t,
    tokens_t,
)
from .storedb import CONNECT_TIMEOUT_S, StoreDb, log
from .storeerrors import Fenced, StoreError, StoreFull, StoreUnavailable, is_full, unavailable

__all__ = ["CONNECT_TIMEOUT_S", "S_CANCELLED", "TOKEN_ID_LEN", "Fenced", "JobReads", "JobRow", "Store", "StoreDb",
           "StoreError", "StoreFull", "StoreUnavailable", "allocations_t", "audit_t", "epoch_t", "events_t",
           "gpu_usage_t", "hash_token", "idempotency_t", "is_full", "jobs_t", "log", "meta_t", "metadata",
           "profiles_t", "reservations_t", "series_t", "tokens_t", "unavailable"]

S_CANCELLED = JobState.CANCELLED.value
TOKEN_ID_LEN = 12  # a token's public id: this many hex digits of its hash


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Store(JobReads):
    """Thread-safe access to the service's tables.  ``url`` is an SQLAlchemy URL."""
    # -- jobs -------------------------------------------------------------------
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

    def set_pending_reasons(self, reasons: Mapping[int, str | None]) -> None:
        """Store why queued jobs wait (``pending_reason``), many in one transaction, no events."""
        if not reasons:
            return
        q = update(jobs_t).where(jobs_t.c.id == bindparam("_id")).values(pending_reason=bindparam("_why"))
        with self.lock, self._begin(False) as c:
            c.execute(q, [{"_id": int(k), "_why": v} for k, v in reasons.items()])

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
