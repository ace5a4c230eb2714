"""The audit trail: who did what, to whose job or account, and when.

Two sources, read together by :func:`trail` (``GET /audit``, ``gpuloom audit``; admins only):

* **job events** (the ``events`` table): every state change of a job.  Its *actor* is the
  event's ``actor`` (or ``by``, as cancels record it); a submission's is the submitting user
  unless an admin submitted for them; any other event is the service's own decision:
  ``scheduler`` (:func:`event_actor`).  Its *subject* is the job's owner.
* **other changes** (the ``audit`` table, defined with the others in :mod:`.store`): tokens created and revoked, queue tree
  changes (queues, users' default queues, the default queue, groups), written by
  :func:`record` with the actor, the subject (the user concerned, if any) and the target
  (a queue, group or token id).  No secret is stored: a token is named by its id.

Every :func:`record` is also logged (logger ``gpuloom.audit``, fields ``event``, ``actor``,
``subject``, ``target``).  The table is on the store's ``metadata``, so a store made before it
gets it when it opens (:class:`.store.Store` creates missing tables).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, insert, or_, select, true

from .store import TOKEN_ID_LEN as ID_LEN
from .store import Store, audit_t, events_t, hash_token, jobs_t, tokens_t

log = logging.getLogger("gpuloom.audit")
SCHEDULER = "scheduler"  # the actor of the service's own decisions
MAX_TRAIL = 10_000  # records one request may return
_CHUNK = 2000  # job events read at a time while filtering by actor

def event_actor(kind: str, detail: Mapping[str, Any]) -> str:
    """Who caused a job event (see the module notes)."""
    who = detail.get("actor") or detail.get("by")
    if who:
        return str(who)
    if kind == "submit" and detail.get("user"):
        return str(detail["user"])
    return SCHEDULER


def record(store: Store, actor: str, kind: str, subject: str | None = None, target: str | None = None,
           detail: Mapping[str, Any] | None = None, now: float | None = None) -> None:
    """Store one change that is not a job's (committed before it returns), and log it."""
    now = time.time() if now is None else now
    with store.lock, store._begin(True) as c:
        c.execute(insert(audit_t).values(time=now, actor=actor, kind=kind, subject=subject, target=target,
                                         detail=json.dumps(dict(detail or {}), sort_keys=True)))
    extra = {"event": kind, "actor": actor, **({"subject": subject} if subject else {}),
             **({"target": target} if target else {})}
    what = " ".join(x for x in (target, f"({subject})" if subject and subject != target else None) if x)
    log.info("%s: %s %s", actor, kind, what, extra=extra)


def _kind_match(col: Any, kind: str) -> Any:
    """``kind`` itself, or a family: ``queue`` is ``queue.set``, ``queue.delete``, ..."""
    return or_(col == kind, col.startswith(kind + ".", autoescape=True))


Cursor = tuple[float, int, int]  # (time, source: 0 the audit table, 1 job events, row id): the trail's order


def parse_cursor(text: str) -> Cursor:
    """``TIME:SOURCE:ID`` (a record's ``cursor``) as a :data:`Cursor`; ``ValueError`` naming it otherwise."""
    try:
        t, src, rid = text.split(":")
        out = (float(t), int(src), int(rid))
    except ValueError:
        raise ValueError("after: a record's cursor, TIME:SOURCE:ID (the X-Next-After header)") from None
    if out[1] not in (0, 1) or not math.isfinite(out[0]):
        raise ValueError("after: a record's cursor, TIME:SOURCE:ID (the X-Next-After header)")
    return out


def _after(tcol: Any, idcol: Any, src: int, after: Cursor | None) -> Any:
    """Rows of source ``src`` past ``after`` in the trail's order (time, source, id)."""
    if after is None:
        return true()
    t, s, i = after
    if src > s:
        return tcol >= t
    if src < s:
        return tcol > t
    return or_(tcol > t, and_(tcol == t, idcol > i))


def trail(store: Store, since: float | None = None, actor: str | None = None, kind: str | None = None,
          limit: int = 1000, after: Cursor | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` records from ``since`` (wall seconds) on and past ``after``, of both sources, by
    time: ``{"time", "actor", "kind", "subject", "target", "job", "detail", "cursor"}``; only ``actor``'s,
    only of ``kind`` (or its family)."""
    if not 1 <= limit <= MAX_TRAIL:
        raise ValueError(f"limit: 1 to {MAX_TRAIL} records, got {limit}")
    q = (select(audit_t).where(_after(audit_t.c.time, audit_t.c.id, 0, after))
         .order_by(audit_t.c.time, audit_t.c.id).limit(limit))
    if since is not None:
        q = q.where(audit_t.c.time >= since)
    if actor is not None:
        q = q.where(audit_t.c.actor == actor)
    if kind is not None:
        q = q.where(_kind_match(audit_t.c.kind, kind))
    with store.lock, store.engine.connect() as c:
        rows = c.execute(q).mappings().all()
    out = [{"time": r["time"], "actor": r["actor"], "kind": r["kind"], "subject": r["subject"],
            "target": r["target"], "job": None, "detail": json.loads(r["detail"]) if r["detail"] else {},
            "cursor": f"{r['time']!r}:0:{r['id']}"} for r in rows]
    out += _job_events(store, since, actor, kind, limit, after)
    out.sort(key=lambda r: parse_cursor(r["cursor"]))
    return out[:limit]


def _job_events(store: Store, since: float | None, actor: str | None, kind: str | None,
                limit: int, after: Cursor | None) -> list[dict[str, Any]]:
    """Job events as audit records, read a chunk at a time until ``limit`` match."""
    q = (select(events_t.c.id, events_t.c.job_id, events_t.c.time, events_t.c.kind, events_t.c.detail, jobs_t.c.user)
         .select_from(events_t.outerjoin(jobs_t, jobs_t.c.id == events_t.c.job_id))
         .order_by(events_t.c.time, events_t.c.id).limit(_CHUNK))
    if since is not None:
        q = q.where(events_t.c.time >= since)
    if kind is not None:
        q = q.where(events_t.c.kind == kind)
    if actor is not None and actor != SCHEDULER:  # a superset (the name in the detail); exact below
        q = q.where(events_t.c.detail.contains(json.dumps(actor), autoescape=True))
    out: list[dict[str, Any]] = []
    while len(out) < limit:
        with store.lock, store.engine.connect() as c:
            rows = c.execute(q.where(_after(events_t.c.time, events_t.c.id, 1, after))).all()
        for eid, job, t, k, d, owner in rows:
            detail = json.loads(d) if d else {}
            who = event_actor(k, detail)
            if actor is None or who == actor:
                out.append({"time": t, "actor": who, "kind": k, "subject": owner, "target": None, "job": job,
                            "detail": detail, "cursor": f"{t!r}:1:{eid}"})
        if len(rows) < _CHUNK:
            break
        after = (rows[-1][2], 1, rows[-1][0])  # the next chunk: past the last row read
    return out[:limit]


def token_owner(store: Store, token_id: str) -> str | None:
    """The user of the token whose id (the first digits of its hash) is ``token_id``, if one."""
    if len(token_id) != ID_LEN:
        return None
    with store.lock, store.engine.connect() as c:
        v = c.execute(select(tokens_t.c.user).where(tokens_t.c.token_hash.startswith(token_id, autoescape=True))).scalar()
    return None if v is None else str(v)


def token_created(store: Store, actor: str, user: str, token: str, admin: bool, expires_in: float | None) -> None:
    """Record a new token by its id (never the token)."""
    record(store, actor, "token.create", user, hash_token(token)[:ID_LEN], {"admin": admin, "expires_in": expires_in})
