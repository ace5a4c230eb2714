"""A row of ``jobs`` as the store hands it out (:class:`JobRow`, its JSON columns decoded), how a row is
encoded for writing, and the filters of a listing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.sql import Select

from .schema import jobs_t

_JSON_COLS = ("spec", "alloc", "procs")


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
