"""Bulk job actions (cancel, hold, release, requeue) over a selection, as ``scancel`` selects.

A selection is job ids and array ids (``16``: job 16, or every task of array 16; ``16_3``: one task;
``16_[1-5,7]``: tasks of it), and filters (user, state, queue, name) that narrow the ids given, or
select among the active jobs when no id is given.  A user who is not an admin acts on their own jobs
only: another user's job named by id is refused (``denied`` in the result), one a filter matched is
skipped and counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.lifecycle import SHORT_STATE, JobState
from ..state.history import array_label
from .errors import PermissionDenied
from .states import ACTIVE_STATES

if TYPE_CHECKING:
    from ..state.store import JobRow
    from .service import Service

ACTIONS = ("cancel", "hold", "release", "requeue")
_ID = re.compile(r"^(\d+)(?:_(\d+|\[[\d,\-]+\]))?$")
MAX_TASKS = 100_000  # a range wider than this is refused (a typo, not a request)


class SelectError(ValueError):
    """A selection that cannot be read; ``field`` names the part."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Selector:
    jobs: Sequence[str] = ()
    user: str | None = None
    state: Sequence[str] = ()
    queue: str | None = None
    name: str | None = None


@dataclass
class Selection:
    rows: list[JobRow] = field(default_factory=list)
    denied: list[int] = field(default_factory=list)  # named explicitly, another user's
    skipped: int = 0  # matched by a filter, another user's
    missing: list[str] = field(default_factory=list)  # ids that name no job


def _tasks(spec: str, where: str) -> list[int]:
    """``3`` or ``[1-5,7]`` as task indices."""
    if not spec.startswith("["):
        return [int(spec)]
    out: list[int] = []
    for piece in spec[1:-1].split(","):
        a, _, b = piece.partition("-")
        if not a or (_ and not b):
            raise SelectError(f"jobs: {where!r}: a task range is N, N-M or a list of them", "jobs")
        lo, hi = int(a), int(b or a)
        if hi < lo or hi - lo >= MAX_TASKS:
            raise SelectError(f"jobs: {where!r}: task range {piece} is empty or too wide", "jobs")
        out.extend(range(lo, hi + 1))
    return out


def _states(given: Sequence[str]) -> set[str]:
    """State filters, Slurm's short names (PD, R, CG, CD, F, CA) or the stored ones."""
    by_short: dict[str, set[str]] = {}
    for st, short in SHORT_STATE.items():
        by_short.setdefault(short, set()).add(st.value)
    long = {s.value for s in JobState}
    out: set[str] = set()
    for s in given:
        for part in str(s).split(","):
            p = part.strip()
            if p.upper() in by_short:
                out |= by_short[p.upper()]
            elif p.lower() in long:
                out.add(p.lower())
            else:
                raise SelectError(f"state: unknown state {p!r} (use {', '.join(sorted(by_short))} or a full "
                                  "state name)", "state")
    return out


def select(svc: Service, sel: Selector, user: str, admin: bool) -> Selection:
    """The jobs ``sel`` names that ``user`` may act on (module notes)."""
    store = svc.store
    states = _states(sel.state) if sel.state else None
    filters = sel.user is not None or states is not None or sel.queue is not None or sel.name is not None
    if not sel.jobs and not filters:
        raise SelectError("select jobs: give job ids or a filter (user, state, queue, name)", "jobs")
    out = Selection()
    named: dict[int, JobRow] = {}
    if sel.jobs:
        for text in sel.jobs:
            m = _ID.match(str(text).strip())
            if m is None:
                raise SelectError(f"jobs: {text!r} is no job id (N, N_T, N_[A-B])", "jobs")
            base = int(m.group(1))
            if m.group(2) is None:
                tasks = store.array_tasks(base)
                if tasks:  # an array's id: every task, as scancel
                    named.update((r.id, r) for r in tasks)
                    continue
                row = store.get_job(base)
                if row is None:
                    out.missing.append(str(text))
                else:
                    named[row.id] = row
                continue
            want = set(_tasks(m.group(2), str(text)))
            found = [r for r in store.array_tasks(base) if r.array_task in want]
            if not found:
                out.missing.append(str(text))
            named.update((r.id, r) for r in found)
        candidates = [named[k] for k in sorted(named)]
    else:
        candidates = store.list_jobs(states if states is not None else ACTIVE_STATES,
                                     sel.user if sel.user is not None else (None if admin else user))
    for r in candidates:
        if sel.user is not None and r.user != sel.user:
            continue
        if states is not None and r.state not in states:
            continue
        if sel.queue is not None and str(r.spec.get("queue") or "") != sel.queue:
            continue
        if sel.name is not None and r.name != sel.name:
            continue
        if not admin and r.user != user:
            if r.id in named and not filters:
                out.denied.append(r.id)
            else:
                out.skipped += 1
            continue
        out.rows.append(r)
    return out


def apply(svc: Service, action: str, sel: Selection, user: str, admin: bool) -> dict[str, Any]:
    """Carry out ``action`` on the selection; per job, what was done."""
    if action not in ACTIONS:
        raise SelectError(f"action: expected one of {', '.join(ACTIONS)}, got {action!r}", "action")
    ctl = svc.control
    done: list[dict[str, Any]] = []
    for r in sel.rows:
        try:
            if action == "cancel":
                new = svc.cancel(r.id, user, admin)
                result = "cancelled" if new.state == JobState.CANCELLED.value else (
                    "cancel requested" if new.state in ACTIVE_STATES else f"already {new.state}")
            elif action == "hold":
                result = ctl.hold(r, user, admin)
            elif action == "release":
                result = ctl.release(r, user, admin)
            else:
                result = ctl.requeue(r, user)
        except PermissionDenied as e:
            result = f"denied: {e}"
        done.append({"id": r.id, "array": array_label(r), "user": r.user, "result": result})
    return {"action": action, "jobs": done, "denied": sel.denied, "skipped": sel.skipped, "missing": sel.missing}
