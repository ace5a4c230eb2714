"""The quota stage's state and accounting: the queue tree as given to it (a file, a table, a tree), each job's
leaf and priority, what a job asks of its queue, and what each queue holds under a plan.

:class:`QuotaState` is the base of :class:`~.queues.QuotaQueues` (admission, :mod:`.queues`) through
:class:`~.queue_reclaim.QuotaReclaim` (what it says after placement): it keeps everything the stage remembers
between rounds, and answers which leaf a job is in and what each queue holds (from the book of active jobs,
:mod:`.queue_book`, when a driver feeds one).
"""

from __future__ import annotations

import tomllib
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..core.job import Job
from ..core.plan import Allocation, Plan, changes
from ..core.queues import QueueError, QueueTree, parse_queues, summed_up, usage
from .base import View, parse_flag
from .queue_base import Admission, QueuePolicy
from .queue_book import QueueBook

_EPS = 1e-6
Triple = tuple[float, float, float]
#: a leaf's guaranteed tier: its (rank, job)s, what each asks, their ids, what they sum to; and the rest of
#: the leaf's list: the jobs it passed before its last one, and how many of the list's jobs that spans
TierA = tuple[list[tuple[int, Job]], list[Triple], set[str], Triple, list[tuple[int, Job]], int]


def load_queue_file(path: str | Path) -> QueueTree:
    """A queue tree from a TOML file (see :mod:`gpuloom.core.queues`); errors name the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise QueueError(f"{p}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise QueueError(f"{p}: {e}") from None
    return parse_queues(data, str(p))


def as_tree(queues: Any) -> QueueTree | None:
    """``queues`` as given to the stage: a tree, a mapping, a TOML path, or None (one queue per name)."""
    if queues is None or isinstance(queues, QueueTree):
        return queues
    if isinstance(queues, Mapping):
        return parse_queues(queues)
    if isinstance(queues, str | Path):
        return load_queue_file(queues)
    raise QueueError(f"queues must be a queue file, a table of queues or a QueueTree, got {queues!r}")


def job_priority(job: Job) -> float:
    p = (job.spec.attrs or {}).get("priority")
    if p is None:
        return 0.0
    try:
        return float(p)
    except (TypeError, ValueError):
        raise QueueError(f"job {job.id}: priority must be a number, got {p!r}") from None


def _demand(j: Job, per_gpu: tuple[float, float]) -> Triple:
    """What ``j`` asks of its queue: its GPUs, its cores and memory (else its GPUs' share of the cluster's)."""
    c = j.extra.get("queue_demand")
    if c is None or c[0] != per_gpu:
        s = j.spec
        g = s.gpus
        c = j.extra["queue_demand"] = (per_gpu, (
            float(g), float(s.cpus) if s.cpus is not None else g * per_gpu[0],
            float(s.mem_mb) if s.mem_mb is not None else g * per_gpu[1]))
    return c[1]




_T = TypeVar("_T")


class _PlanMemo(Generic[_T]):
    """What was worked out for the last plan asked of, kept while it is the same plan object, of the same
    size, in the same view (``owed`` and the round's check ask of the same plan for its smallest jobs left out)."""

    __slots__ = ("key", "value")

    def __init__(self) -> None:
        # the view held weakly: a view kept past its round makes the driver copy its jobs at the next change
        self.key: tuple[Plan, weakref.ref[View], tuple[int, ...]] | None = None
        self.value: Any = None

    def __call__(self, plan: Plan, view: View, work: Callable[[Plan, View], _T]) -> _T:
        sizes = (len(plan.allocations), len(plan.added), len(plan.removed), len(view.current))
        key = self.key
        if key is not None and key[0] is plan and key[1]() is view and key[2] == sizes:
            return self.value
        out = work(plan, view)
        self.key, self.value = (plan, weakref.ref(view), sizes), out
        return out


class QuotaState(QueuePolicy):
    """The quota stage's configuration and what it keeps between rounds; each job's leaf, what queues hold."""

    #: False: every queue's usage is summed from a plan's allocations (tests compare the two ways)
    incremental = True

    def __init__(self, queues: Any = None, borrow: bool | str = True, priority: bool | str = True,
                 guarantees: bool | str = True) -> None:
        self.tree = as_tree(queues)
        self.auto = self.tree is None
        self.borrow = parse_flag(borrow, "borrow")
        self.priority = parse_flag(priority, "priority")
        self.guarantees = parse_flag(guarantees, "guarantees")
        if not self.borrow and not self.guarantees:
            raise ValueError("with borrow=false and guarantees=false no job could ever run")
        self.version = 0  # bumped whenever the tree changes (job -> leaf caches are keyed by it)
        self._checked_for: Any = None  # the cluster the tree's capacity was checked against
        self._per_gpu: tuple[Any, tuple[float, float]] = (None, (0.0, 0.0))  # a cluster, its cores and MB per GPU
        self._last = Admission()
        self._lists: list[Collection[tuple[int, Job]]] = []  # per leaf, its active jobs (rank, job) in order
        self._book: QueueBook | None = None  # the active jobs per leaf, when a driver feeds them (listener)
        self._from_book = False  # the last admission read the book
        # per leaf, its guaranteed tier and what each of its jobs asks, while its jobs do not change (the
        # book's leaves, no limits): for the tree, strictness and cluster of _tier_a_key
        self._tier_a: dict[int, TierA] = {}
        self._tier_a_key: Any = None
        self._tier_a_merged: list[Job] | None = None  # every leaf's cached tier A in rank order (all hit)
        # the leaves' guaranteed ids of the last walk by rank, and their union (_taken_union)
        self._taken_memo: tuple[list[Collection[str]], set[str]] | None = None
        self._prioritised = False  # the last admission saw a job of non-zero priority
        self._by_rank: Admission | None = None  # the last admission, when its borrowing walk is by rank (below)
        # the last lazy one, and its read_whole (None: done)
        self._whole: tuple[Admission, Callable[[], None] | None] | None = None
        self._starved: set[int] = set()
        self._owed_before: set[int] = set()  # queues still owed after the last round's hooks
        # what the last lent() read and summed: the allocations, each leaf's GPUs, the lenders (lent_since)
        self._lent_memo: tuple[Mapping[str, Allocation], list[float], set[int]] | None = None
        # the usage from the book, and each leaf's smallest job left out, of the last plan asked of
        self._usage_memo: _PlanMemo[list[list[float]] | None] = _PlanMemo()
        self._smallest_memo: _PlanMemo[Callable[[int], float] | None] = _PlanMemo()
        # the last round planned in one pass over the walk read from the book (no reclaim, no eviction) and its
        # prefix filled the cluster: a round on its plan would plan it again (see appended)
        self._settled = False
        self.counters = {"reclaim_passes": 0, "dropped": 0}  # (stats() adds the last admission's tiers)

    # -- the tree --------------------------------------------------------------------------------
    def set_tree(self, tree: QueueTree | None) -> None:
        """Replace the queue tree (the service's admin API); every job's queue is looked up again."""
        self.tree = tree
        self.auto = tree is None
        self.version += 1
        self._checked_for = None
        self._starved = set()

    def _tree(self, jobs: Sequence[Job], view: View) -> QueueTree:
        if self.auto:
            names = {self._auto_name(j) for j in jobs}
            have = set(self.tree.names) if self.tree is not None else set()
            if self.tree is None or not names <= have:
                keep = self.tree.names if self.tree is not None else []
                self.tree = QueueTree.flat(keep + sorted(names - have))
                self.version += 1
        tree = self.tree
        assert tree is not None
        if self._checked_for is not view.cluster:
            tree.check_capacity(view.cluster)
            self._checked_for = view.cluster
        return tree

    @staticmethod
    def _auto_name(job: Job) -> str:
        return str((job.spec.attrs or {}).get("queue") or job.spec.user or "default")

    def leaf(self, job: Job) -> int:
        """The leaf index of ``job``'s queue (cached on the job for this tree)."""
        c = job.extra.get("queue_leaf")
        if c is not None and c[0] == self.version and c[1] is self.tree:
            return c[2]
        return self._look_up(job)[2]

    def _look_up(self, job: Job) -> tuple[int, QueueTree, int, float]:
        """(tree version, tree, leaf, priority): what ``job.extra["queue_leaf"]`` caches."""
        tree = self.tree
        assert tree is not None
        if self.auto:
            q = tree.index[self._auto_name(job)]
        else:
            q = tree.leaf_of(job.id, job.spec.attrs, job.spec.user)
        c = job.extra["queue_leaf"] = (self.version, tree, q, job_priority(job))
        return c

    def queue_of(self, job: Job) -> str:
        assert self.tree is not None
        return self.tree.queues[self.leaf(job)].name

    def leaves(self, jobs: Sequence[Job]) -> dict[str, int]:
        return {j.id: self.leaf(j) for j in jobs}

    def _book_ready(self, view: View) -> QueueBook | None:
        """The book, when this round's admission filled it for this tree and it holds every active job of
        ``view`` (each one's leaf, what each leaf holds now), else None."""
        book = self._book
        if (self._from_book and book is not None and not book.pending and book.follows(view)
                and book.version is not None and book.version[0] == self.version and book.version[1] is self.tree):
            return book
        return None

    def usage_of(self, plan: Plan, view: View) -> list[list[float]]:
        """:func:`~gpuloom.core.queues.usage` of ``plan``: what the book's leaves hold now, with what ``plan``
        changes of the current allocations (:meth:`~gpuloom.core.plan.Plan.extending`) taken out and added, in
        O(changes + queues); when the book is not ready, a group's share (a fraction: sums in another order
        could round otherwise) is or was held, or the plan does not extend the current allocations, the
        allocations are summed."""
        tree = self.tree
        assert tree is not None
        out = self._changed_usage(plan, view) if self.incremental else None
        if out is None:
            allocs = plan.allocations
            out = usage(tree, allocs, self.leaf_map(allocs, view))
        return out

    def _changed_usage(self, plan: Plan, view: View) -> list[list[float]] | None:
        """:meth:`_usage_from_book`, kept for the plan last asked of (the same object, of the same size, in the
        same view: fair share's ``enforce`` and ``owed``, when it cannot work out the GPUs alone, may ask of the same
        plan)."""
        return self._usage_memo(plan, view, self._usage_from_book)

    def _usage_from_book(self, plan: Plan, view: View) -> list[list[float]] | None:
        book = self._book_ready(view)
        if book is None or not book.exact:
            return None
        current, allocs = view.current, plan.allocations
        removed, added = changes(current, plan)
        tree = self.tree
        assert tree is not None
        where = book.where
        leaf = [[0.0, 0.0, 0.0] for _ in range(len(tree))]
        for q, h in book.held.items():
            leaf[q] = h.copy()
        for ids, held, sign in ((removed, current, -1.0), (added, allocs, 1.0)):
            for jid in ids:
                a = held.get(jid)
                w = where.get(jid)
                if a is None or w is None or a.group:
                    return None
                u = leaf[w[0]]
                u[0] += sign * a.num_gpus
                u[1] += sign * a.cpus
                u[2] += sign * a.mem_mb
        if tree.one_level:
            return leaf
        return summed_up(tree, leaf)

    def leaf_map(self, ids: Iterable[str], view: View) -> dict[str, int]:
        """``{job id: its leaf}`` for the active jobs ``ids`` of ``view``: from the book when this round's
        admission filled it for this tree (it has every active job's leaf), else looked up job by job."""
        book = self._book_ready(view)
        if book is not None:
            where = book.where
            try:
                return {jid: where[jid][0] for jid in ids}
            except KeyError:  # (not one of the jobs the book holds: look each up)
                pass
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        return {jid: self.leaf(by_id[jid]) for jid in ids}

    # -- what admission looks up --------------------------------------------------------------------
    def listener(self, tally: Any) -> QueueBook:
        """The book of active jobs per leaf, following the driver whose tally is ``tally`` (see
        :mod:`.queue_book`)."""
        self._book = QueueBook(tally)
        return self._book

    def _leaf_and_priority(self, job: Job) -> tuple[int, bool]:
        c = job.extra.get("queue_leaf")
        if c is None or c[0] != self.version or c[1] is not self.tree:
            c = self._look_up(job)
        return c[2], bool(c[3])

    def _per_gpu_of(self, cl: Any) -> tuple[float, float]:
        """The cores and MB per GPU of the cluster ``cl`` (frozen: its totals are summed once)."""
        if self._per_gpu[0] is not cl:
            self._per_gpu = (cl, (cl.total_cpus / cl.num_gpus, cl.total_mem_mb / cl.num_gpus) if cl.num_gpus
                             else (0.0, 0.0))
        return self._per_gpu[1]

