"""The store's reads of jobs: rows, listings, counts, allocation records, events, and the counts and
states of arrays and dependencies (never the rows of every task)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select

from .jobrow import _JSON_COLS, _ROW_COLS, JobRow, _decode, _filtered
from .schema import allocations_t, events_t, idempotency_t, jobs_t
from .storedb import StoreDb

_IN_CHUNK = 500  # ids per ``IN (...)``: below every SQLite build's limit on bound parameters


class JobReads(StoreDb):
    """Reads of jobs and their records (:class:`~.store.Store` adds the writes)."""

    def job_for_key(self, user: str, key: str) -> int | None:
        """The (first) job a submission with idempotency ``key`` by ``user`` created, if any."""
        with self.lock, self.engine.connect() as c:
            v = c.execute(select(idempotency_t.c.job_id).where(idempotency_t.c.user == user,
                                                                idempotency_t.c.key == key)).scalar()
        return None if v is None else int(v)

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

    def get_jobs(self, job_ids: Iterable[int]) -> dict[int, JobRow]:
        ids = list(job_ids)
        if not ids:
            return {}
        with self.lock, self.engine.connect() as c:
            rows = c.execute(select(*_ROW_COLS).where(jobs_t.c.id.in_(ids))).all()
        return {j.id: j for j in map(_decode, rows)}

    def events(self, job_id: int | None = None) -> list[dict[str, Any]]:
        q = select(events_t).order_by(events_t.c.id)
        if job_id is not None:
            q = q.where(events_t.c.job_id == job_id)
        with self.lock, self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [{**r, "detail": json.loads(r["detail"]) if r["detail"] else {}} for r in rows]
