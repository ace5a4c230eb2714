"""Job arrays and dependencies (Slurm's ``--array`` and ``--dependency``), kept out of the scheduler.

* **Arrays.**  ``array: "0-9"`` (also ``"1,3,5-7"``, ``"0-15:4"``, and a limit
  ``"0-9%2"``: at most 2 tasks active at once) makes one job per index, stored
  in one transaction; each row has ``array_id`` (the first task's id, Slurm's
  array job id) and ``array_task`` (its index, the job's
  ``GPULOOM_ARRAY_TASK_ID``).
* **Dependencies.**  ``dependency: "afterok:5,afterany:7_2"`` (``,`` = all of
  them).  ``ID`` names a job, or every task of the array whose id it is;
  ``ID_N`` one task of an array.  Kinds: ``after`` (the jobs started or
  ended), ``afterok`` (finished with exit 0), ``afternotok`` (failed or were
  cancelled), ``afterany`` (ended).  They are resolved to job ids at
  submission (an unknown job is refused, naming the field) and stored in the
  spec (``depends_on``).

A job held back by either never reaches the driver: the service's
:class:`Gate` keeps it (state ``waiting_for_initial_contact``, pending reason
``Dependency`` or ``JobArrayTaskLimit``) and hands it on once it may run.  A
dependency that can never be met (``afterok`` on a job that failed) cancels
the job with reason ``DependencyNeverSatisfied``, which in turn cancels its
own dependents, as Slurm does with ``kill_invalid_depend``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..core.lifecycle import JobState
from .admission import SubmitError
from .clock import Clock
from .store import JobRow, Store

S = JobState
MAX_ARRAY = 10_000  # tasks in one array
KINDS = ("after", "afterok", "afternotok", "afterany")
DEPENDENCY = "Dependency"
NEVER = "DependencyNeverSatisfied"
ARRAY_LIMIT = "JobArrayTaskLimit"
_ENDED = {S.FINISHED.value, S.FAILED.value, S.CANCELLED.value}
_BAD_END = {S.FAILED.value, S.CANCELLED.value}
_PAST_GATE = tuple(s.value for s in JobState if s.value not in _ENDED and s is not S.WAITING_FOR_INITIAL_CONTACT)


def parse_array(text: str) -> tuple[list[int], int | None]:
    """``"0-9%2"`` -> ([0..9], 2).  Raises ``ValueError`` saying what is wrong."""
    s = str(text).strip()
    limit = None
    if "%" in s:
        s, lim = s.split("%", 1)
        if not lim.isdigit() or int(lim) < 1:
            raise ValueError(f"array: the limit after % must be a whole number >= 1, got {text!r}")
        limit = int(lim)
    out: list[int] = []
    for item in s.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*(?::\s*(\d+)\s*)?)?", item)
        if not m:
            raise ValueError(f"array: expected indices like 0-9, 1,3,5-7, 0-15:4 or 0-9%2, got {text!r}")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        step = int(m.group(3)) if m.group(3) is not None else 1
        if b < a or step < 1:
            raise ValueError(f"array: range {item.strip()!r} is empty")
        if len(out) + (b - a) // step + 1 > MAX_ARRAY:
            raise ValueError(f"array: at most {MAX_ARRAY} tasks, got more in {text!r}")
        out.extend(range(a, b + 1, step))
    tasks = sorted(set(out))
    return tasks, limit


def parse_dependency(text: str) -> list[tuple[str, list[str]]]:
    """``"afterok:5:6,afterany:7_2"`` -> [("afterok", ["5", "6"]), ("afterany", ["7_2"])]."""
    out = []
    for item in str(text).split(","):
        kind, _, rest = item.strip().partition(":")
        kind = kind.strip().lower()
        targets = [t.strip() for t in rest.split(":") if t.strip()]
        if kind not in KINDS:
            raise ValueError(f"dependency: unknown kind {kind!r} in {text!r} (use {', '.join(KINDS)})")
        if not targets or any(not re.fullmatch(r"\d+(_\d+)?", t) for t in targets):
            raise ValueError(f"dependency: expected {kind}:ID[:ID...] with ids like 5 or 5_2, got {item.strip()!r}")
        out.append((kind, targets))
    return out


def resolve_dependency(store: Store, text: str) -> list[list[Any]]:
    """The dependency as ``[[kind, [job ids]], ...]`` against the store; :class:`SubmitError` names
    the field for an unknown job."""
    try:
        items = parse_dependency(text)
    except ValueError as e:
        raise SubmitError(str(e), "dependency", "bad_dependency") from None
    out: list[list[Any]] = []
    for kind, targets in items:
        ids: list[int] = []
        for t in targets:
            if "_" in t:
                aid, task = (int(x) for x in t.split("_"))
                match = [r.id for r in store.array_tasks(aid) if r.array_task == task]
                if not match:
                    raise SubmitError(f"dependency: no task {task} in job array {aid}", "dependency", "bad_dependency")
                ids.extend(match)
                continue
            jid = int(t)
            tasks = store.array_tasks(jid)
            if tasks:
                ids.extend(r.id for r in tasks)
            elif store.get_job(jid) is not None:
                ids.append(jid)
            else:
                raise SubmitError(f"dependency: no job {jid}", "dependency", "bad_dependency")
        out.append([kind, ids])
    return out


def verdict(depends_on: Iterable[Iterable[Any]], rows: dict[int, JobRow]) -> tuple[bool | None, str]:
    """(True: met, None: not yet, False: never) and why, for a resolved dependency over ``rows``."""
    waiting = False
    for kind, ids in depends_on:
        for jid in ids:
            r = rows.get(int(jid))
            state = r.state if r is not None else S.CANCELLED.value  # a vanished job cannot satisfy anything
            if kind == "afterok":
                if state in _BAD_END:
                    return False, f"{NEVER}: job {jid} {state}"
                ok = state == S.FINISHED.value
            elif kind == "afternotok":
                if state == S.FINISHED.value:
                    return False, f"{NEVER}: job {jid} finished"
                ok = state in _BAD_END
            elif kind == "afterany":
                ok = state in _ENDED
            else:  # after: started (or ended)
                ok = state in _ENDED or (r is not None and r.first_start is not None)
            waiting = waiting or not ok
    return (None, DEPENDENCY) if waiting else (True, "")


class Gate:
    """Jobs picked up from the store wait here until their dependencies and array limits allow them.

    :meth:`add` takes a new row; :meth:`ready` returns the rows that may run now (in id order),
    cancels those whose dependencies can never be met and records the pending reason of the
    rest (``store.set_pending_reasons``)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.held: dict[int, JobRow] = {}
        self.reasons: dict[int, str | None] = {}

    def __len__(self) -> int:
        return len(self.held)

    def add(self, row: JobRow) -> None:
        self.held[row.id] = row

    def drop(self, job_id: int) -> None:
        self.held.pop(job_id, None)
        self.reasons.pop(job_id, None)

    def cancel(self, row: JobRow, why: str) -> None:
        """A held job whose dependency can never be met is cancelled, with the reason."""
        now = self.clock.time()
        self.store.update_job(row.id, {"state": S.CANCELLED.value, "end_time": now, "reason": why,
                                       "pending_reason": None},
                              S.CANCELLED.value, {"reason": why}, expect_state=[S.WAITING_FOR_INITIAL_CONTACT.value],
                              now=now)

    def ready(self) -> list[JobRow]:
        if not self.held:
            return []
        out: list[JobRow] = []
        changed: dict[int, str | None] = {}
        blocked: set[int] = set()
        again = True
        while again:  # a cancelled job may doom its dependents in the same pass
            again = False
            blocked.clear()
            need = {int(j) for r in self.held.values() for _, ids in r.spec.get("depends_on") or () for j in ids}
            rows = self.store.get_jobs(need) if need else {}
            for jid in sorted(self.held):
                row = self.held[jid]
                deps = row.spec.get("depends_on")
                if not deps:
                    continue
                ok, why = verdict(deps, rows)
                if ok is False:
                    self.drop(jid)
                    self.cancel(row, why)
                    again = True
                elif ok is None:
                    blocked.add(jid)
                    if self.reasons.get(jid) != why:
                        self.reasons[jid] = changed[jid] = why
        active = self._active_tasks()
        for jid in sorted(self.held):
            row = self.held[jid]
            if jid in blocked:
                continue
            limit = row.spec.get("array_limit")
            if limit and row.array_id is not None:
                if active.get(row.array_id, 0) >= int(limit):
                    if self.reasons.get(jid) != ARRAY_LIMIT:
                        self.reasons[jid] = changed[jid] = ARRAY_LIMIT
                    continue
                active[row.array_id] = active.get(row.array_id, 0) + 1
            self.held.pop(jid)
            if self.reasons.pop(jid, None) is not None:
                changed[jid] = None
            out.append(row)
        self.store.set_pending_reasons(changed)
        return out

    def _active_tasks(self) -> dict[int, int]:
        """Per limited array: its tasks past the gate and not ended.  Held tasks wait for contact, and
        so does no released one once its round is over (it was handed on, or failed to fit)."""
        arrays = {r.array_id for r in self.held.values() if r.array_id is not None and r.spec.get("array_limit")}
        return {aid: self.store.count_array(aid, _PAST_GATE) for aid in arrays}
