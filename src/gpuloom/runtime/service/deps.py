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
  cancelled), ``afterany`` (ended).  On an array, as in Slurm: ``afterok``
  every task finished with exit 0; ``afternotok`` every task ended and at least
  one failed or was cancelled; ``afterany`` every task ended; ``after`` every
  task started or ended.
* **Stored once.**  A dependency is resolved at submission (an unknown job is
  refused, naming the field) and stored in the spec as ``depends_on``: one
  ``[kind, [job ids], [[array id, tasks], ...]]`` per item, the third element
  only when it names arrays.  An array is a reference (its id and how many
  tasks it had), never its task ids, so a dependency costs the same whatever
  the array's size; ``ID_N`` is the task's job id.  Specs stored as
  ``[kind, [job ids]]`` (older releases expanded arrays into task ids) are
  read as they are.  A job or task that no longer exists counts as cancelled.

A job held back by either never reaches the driver: the service's
:class:`Gate` keeps it (state ``waiting_for_initial_contact``, pending reason
``Dependency`` or ``JobArrayTaskLimit``) and hands it on once it may run.  A
dependency that can never be met (``afterok`` on a job that failed, or on an
array one of whose tasks did) cancels the job with reason
``DependencyNeverSatisfied``, which in turn cancels its own dependents, as
Slurm does with ``kill_invalid_depend``.

**Cost of a round.**  Held jobs with the same ``depends_on`` (every task of an
array) form one group with one verdict.  A round reads the state of every
referenced job in one query and a per-state count of every referenced array in
one grouped query, decides each group in O(its items), and writes only what
changed (pending reasons of new or moved jobs, one transaction for all the
jobs it cancels).  Its statements do not grow with the number of held jobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...core.lifecycle import JobState
from ..exec.clock import Clock
from ..state.store import JobRow, Store, unavailable
from .errors import SubmitError

S = JobState
MAX_ARRAY = 10_000  # tasks in one array
KINDS = ("after", "afterok", "afternotok", "afterany")
DEPENDENCY = "Dependency"
NEVER = "DependencyNeverSatisfied"
ARRAY_LIMIT = "JobArrayTaskLimit"
_ENDED = {S.FINISHED.value, S.FAILED.value, S.CANCELLED.value}
_BAD_END = {S.FAILED.value, S.CANCELLED.value}
_PAST_GATE = tuple(s.value for s in JobState if s.value not in _ENDED and s is not S.WAITING_FOR_INITIAL_CONTACT)
_GONE = (S.CANCELLED.value, False)  # a job that no longer exists: (state, started)


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
    """The dependency as stored (``depends_on``, see the module notes) against the store;
    :class:`SubmitError` names the field for an unknown job.  Reads no task rows: existence and counts."""
    try:
        items = parse_dependency(text)
    except ValueError as e:
        raise SubmitError(str(e), "dependency", "bad_dependency") from None
    out: list[list[Any]] = []
    for kind, targets in items:
        ids: list[int] = []
        arrays: list[list[int]] = []
        for t in targets:
            if "_" in t:
                aid, task = (int(x) for x in t.split("_"))
                jid = store.array_task_id(aid, task)
                if jid is None:
                    raise SubmitError(f"dependency: no task {task} in job array {aid}", "dependency", "bad_dependency")
                ids.append(jid)
                continue
            jid = int(t)
            size = store.array_size(jid)
            if size:
                arrays.append([jid, size])
            elif store.job_exists(jid):
                ids.append(jid)
            else:
                raise SubmitError(f"dependency: no job {jid}", "dependency", "bad_dependency")
        out.append([kind, ids, arrays] if arrays else [kind, ids])
    return out


def _items(depends_on: Iterable[Iterable[Any]]) -> Iterable[tuple[str, list[Any], list[Any]]]:
    """(kind, job ids, [[array id, tasks], ...]) of each stored item, old (two-element) ones included."""
    for item in depends_on:
        it = list(item)
        yield str(it[0]), list(it[1]), list(it[2]) if len(it) > 2 else []


def _job_verdict(kind: str, jid: int, state: str, started: bool) -> tuple[bool | None, str]:
    """One job's part of a dependency: (True: met, None: not yet, False: never) and why never."""
    if kind == "afterok":
        if state in _BAD_END:
            return False, f"{NEVER}: job {jid} {state}"
        return (True if state == S.FINISHED.value else None), ""
    if kind == "afternotok":
        if state == S.FINISHED.value:
            return False, f"{NEVER}: job {jid} finished"
        return (True if state in _BAD_END else None), ""
    if kind == "afterany":
        return (True if state in _ENDED else None), ""
    return (True if state in _ENDED or started else None), ""  # after: started (or ended)


def _array_verdict(kind: str, aid: int, size: int, counts: Mapping[str, tuple[int, int]]) -> tuple[bool | None, str]:
    """One array's part of a dependency, from its tasks' counts by state ``{state: (tasks, started)}``.
    Tasks that no longer exist count as cancelled."""
    present = sum(n for n, _ in counts.values())
    finished = counts.get(S.FINISHED.value, (0, 0))[0]
    bad = sum(counts.get(s, (0, 0))[0] for s in _BAD_END) + max(0, size - present)
    ended = finished + bad
    if kind == "afterok":
        if bad:
            return False, f"{NEVER}: array {aid}: {bad} of {size} tasks failed or cancelled"
        return (True if finished >= size else None), ""
    if kind == "afternotok":
        if finished >= size:
            return False, f"{NEVER}: array {aid}: all {size} tasks finished"
        return (True if ended >= size else None), ""
    if kind == "afterany":
        return (True if ended >= size else None), ""
    begun = ended + sum(started for s, (_, started) in counts.items() if s not in _ENDED)
    return (True if begun >= size else None), ""  # after: every task started (or ended)


def verdict(depends_on: Iterable[Iterable[Any]], jobs: Mapping[int, tuple[str, bool]],
            arrays: Mapping[int, Mapping[str, tuple[int, int]]]) -> tuple[bool | None, str]:
    """(True: met, None: not yet, False: never) and why, for a stored dependency, given the referenced
    jobs' ``(state, started)`` and the referenced arrays' task counts (:meth:`Store.array_counts`)."""
    waiting = False
    for kind, ids, refs in _items(depends_on):
        for jid in ids:
            state, started = jobs.get(int(jid), _GONE)  # a vanished job cannot satisfy anything
            ok, why = _job_verdict(kind, int(jid), state, started)
            if ok is False:
                return False, why
            waiting = waiting or ok is None
        for aid, size in refs:
            ok, why = _array_verdict(kind, int(aid), int(size), arrays.get(int(aid), {}))
            if ok is False:
                return False, why
            waiting = waiting or ok is None
    return (None, DEPENDENCY) if waiting else (True, "")


class _Group:
    """Held jobs with one and the same ``depends_on`` (e.g. every task of an array): one verdict."""

    __slots__ = ("deps", "jobs", "fresh")

    def __init__(self, deps: list[Any]) -> None:
        self.deps = deps
        self.jobs: set[int] = set()
        self.fresh: set[int] = set()  # added since the last verdict: their pending reason is not set yet


class Gate:
    """Jobs picked up from the store wait here until their dependencies and array limits allow them.

    :meth:`add` takes a new row; :meth:`ready` returns the rows that may run now (in id order),
    cancels those whose dependencies can never be met and records the pending reason of the
    rest (``store.set_pending_reasons``).  :attr:`by_queue` and :attr:`by_reason` count the held
    jobs (for metrics, kept as jobs come and go)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.held: dict[int, JobRow] = {}
        self.reasons: dict[int, str] = {}
        self.by_queue: dict[str, int] = {}
        self.by_reason: dict[str, int] = {}
        self._groups: dict[str, _Group] = {}  # canonical depends_on -> the jobs waiting on it
        self._group_of: dict[int, str] = {}
        self._met: set[int] = set()  # no dependency left to wait for: only an array limit can hold them
        self._unsaved: set[int] = set()  # jobs whose reason the store refused to take (written with the next)

    def __len__(self) -> int:
        return len(self.held)

    def add(self, row: JobRow) -> None:
        if row.id in self.held:
            return
        self.held[row.id] = row
        _bump(self.by_queue, str(row.spec.get("queue") or ""), 1)
        if row.pending_reason:  # as stored (after a restart): rewritten only if it changes
            self._set_reason(row.id, row.pending_reason, {})
        deps = row.spec.get("depends_on")
        if not deps:
            self._met.add(row.id)
            return
        key = json.dumps(deps, separators=(",", ":"))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(deps)
        group.jobs.add(row.id)
        group.fresh.add(row.id)
        self._group_of[row.id] = key

    def drop(self, job_id: int) -> None:
        row = self.held.pop(job_id, None)
        if row is None:
            return
        _bump(self.by_queue, str(row.spec.get("queue") or ""), -1)
        self._set_reason(job_id, None, {})
        self._met.discard(job_id)
        key = self._group_of.pop(job_id, None)
        if key is not None:
            group = self._groups[key]
            group.jobs.discard(job_id)
            group.fresh.discard(job_id)
            if not group.jobs:
                del self._groups[key]

    def _set_reason(self, job_id: int, why: str | None, changed: dict[int, str | None]) -> None:
        old = self.reasons.get(job_id)
        if old == why:
            return
        if old is not None:
            _bump(self.by_reason, old.split(":", 1)[0], -1)
            del self.reasons[job_id]
        if why is not None:
            _bump(self.by_reason, why.split(":", 1)[0], 1)
            self.reasons[job_id] = why
        changed[job_id] = why

    def ready(self) -> list[JobRow]:
        if not self.held:
            return []
        changed: dict[int, str | None] = {}
        while self._groups:  # again after cancellations: a cancelled job may doom its dependents
            doomed = self._decide(changed)
            if not doomed:
                break
            # stored first: a store that refuses it raises with the jobs still held (decided again later)
            self.store.cancel_held(doomed, S.WAITING_FOR_INITIAL_CONTACT.value, now=self.clock.time())
            for jid in doomed:
                self.drop(jid)
                changed.pop(jid, None)
        out = self._release(changed)
        if self._unsaved:  # reasons a refused write left unstored, as they are now
            changed = {**{j: self.reasons.get(j) for j in self._unsaved}, **changed}
        try:  # (the jobs released are the caller's now: a refused write of reasons must not lose them)
            self.store.set_pending_reasons(changed)
            self._unsaved = set()
        except Exception as e:
            if not unavailable(e):
                raise
            self._unsaved = set(changed)
        return out

    def _decide(self, changed: dict[int, str | None]) -> dict[int, str]:
        """One verdict per group (two queries for all of them): met groups move on to the array
        limits, waiting ones keep (or get) their reason; returns the jobs to cancel, with why."""
        job_ids: set[int] = set()
        array_ids: set[int] = set()
        for group in self._groups.values():
            for _, ids, refs in _items(group.deps):
                job_ids.update(int(j) for j in ids)
                array_ids.update(int(a) for a, _ in refs)
        jobs = self.store.job_states(job_ids) if job_ids else {}
        arrays = self.store.array_counts(array_ids) if array_ids else {}
        doomed: dict[int, str] = {}
        for key, group in list(self._groups.items()):
            ok, why = verdict(group.deps, jobs, arrays)
            if ok is None:
                for jid in group.fresh:
                    self._set_reason(jid, why, changed)
                group.fresh.clear()
                continue
            del self._groups[key]
            for jid in group.jobs:
                del self._group_of[jid]
                if ok:
                    self._met.add(jid)
                else:
                    doomed[jid] = why
        return doomed

    def _release(self, changed: dict[int, str | None]) -> list[JobRow]:
        """The met jobs that their arrays' limits let through (by id), out of the gate."""
        free: list[int] = []
        limited: dict[int, list[int]] = {}
        for jid in self._met:
            row = self.held[jid]
            if row.spec.get("array_limit") and row.array_id is not None:
                limited.setdefault(row.array_id, []).append(jid)
            else:
                free.append(jid)
        active = self._active_tasks(limited)
        for aid, jids in limited.items():
            jids.sort()
            room = max(0, int(self.held[jids[0]].spec["array_limit"]) - active.get(aid, 0))
            free += jids[:room]
            for jid in jids[room:]:
                self._set_reason(jid, ARRAY_LIMIT, changed)
        out = []
        for jid in sorted(free):
            out.append(self.held[jid])
            self._set_reason(jid, None, changed)
            self.drop(jid)
        return out

    def _active_tasks(self, arrays: Iterable[int]) -> dict[int, int]:
        """Per limited array: its tasks past the gate and not ended (one grouped query).  Held tasks wait
        for contact, and so does no released one once its round is over (it was handed on, or failed to
        fit)."""
        aids = set(arrays)
        return self.store.count_arrays(aids, _PAST_GATE) if aids else {}


def _bump(counts: dict[str, int], key: str, by: int) -> None:
    n = counts.get(key, 0) + by
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)
