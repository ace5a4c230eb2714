"""The queue stage: admission and ordering across queues shared by teams.

The queue tree itself is plain data (:mod:`gpuloom.core.queues`); this stage
decides, each round, which active jobs may run and in which order, before
grouping, sizing and placement see them.  The scheduler
(:meth:`gpuloom.scheduler.Scheduler.schedule`) runs it between the order
policy and the rest of the pipeline::

    order (any policy) → queue: admit + interleave → group → size → place → hooks → queue: enforce limits

**Within a queue** jobs keep the order policy's order (FIFO, SRTF, LAS, ...);
with ``priority`` (default on) a job's ``attrs["priority"]`` (higher first;
Slurm's and Kubernetes' sense) comes before it, stably.  A higher-priority job
ordered ahead of a running lower-priority one of its queue takes its place:
preemption by priority is the pipeline's ordinary preemption.

**Across queues**, a round admits in tiers:

1. *guaranteed* (tier A): each leaf queue, in its own order, admits jobs while
   what it is planned to hold stays within its guarantee (every resource the
   tree's quotas name) and every limit on its path;
2. *over quota* (tier B, only with ``borrow``): first the jobs an inner
   queue's guarantee surplus covers (an org's spare guarantee goes to its teams
   before anyone else), then all other work in the cross-queue order, each job
   admitted only if every limit on its path still holds.  The cross-queue order
   is the policy's name:

   * ``quota``: the order policy's order across queues (FIFO over the whole
     cluster once guarantees are met);
   * ``drf``: weighted dominant resource fairness by progressive filling: the
     next job comes from the queue whose dominant share (max over GPUs, cores,
     memory of planned use / cluster total) divided by its weight among its
     siblings is lowest, level by level down the tree;
   * ``fairshare``: Slurm's fair share: lowest (decayed usage + planned GPUs ×
     h/ln 2, the usage they would settle at) per weight among siblings first;
     usage halves every ``half_life`` seconds (default 7 days, Slurm's).

   Without ``borrow`` (strict quotas) a queue never exceeds its guarantee.

Jobs a limit (or a strict quota) keeps out are not handed to the rest of the
pipeline; their pending reason is ``QueueAtQuota``.

**Lending and reclaim.**  Tier A comes first in the order handed on, so a
guaranteed job takes GPUs before any borrowed work is selected.  If placement
still leaves a guaranteed job out while borrowed work holds GPUs (sticky
placement keeps running jobs where they are; a non-preemptive scheduler keeps
running jobs first), the scheduler plans again in two passes: tier A alone on
the whole cluster, then tier B on what it left, so borrowed work is preempted
(reclaimed) whenever that lets an owner's job run.  A guaranteed job still
left out while borrowed work holds GPUs (a hook kept it: elastic sizing's
protection) waits with reason ``WaitingForReclaim``.

**After placement** (:meth:`QuotaQueues.enforce`) a sizer that grows jobs
(elastic, Synergy) could take a queue over its limit: the latest-admitted jobs
of that queue are dropped from the plan until it is within.

**Invariants** (:mod:`.queue_checks`, run with the scheduler's round check
in both faces): no queue holds more than its limit; and a leaf queue below its
guarantee with a waiting job that fits the rest of it is never left waiting
for two rounds in a row while other queues hold GPUs beyond their guarantees
that, with the free ones, could place that job (the place policy is asked).
One round of grace covers a reclaim in progress.

Modules: the contract in :mod:`.queue_base`, ``none`` and ``quota`` here,
``drf`` and ``fairshare`` in :mod:`.queue_fair`, the invariants in
:mod:`.queue_checks`, the tree in :mod:`gpuloom.core.queues`.

Accounting: a job counts its allocation's GPUs divided among its group's
members (Muri), its own cores and memory; admission counts what a job asks
for (``spec.cpus``/``spec.mem_mb``, else its GPU-proportional share of the
cluster).

``queues``: a :class:`~gpuloom.core.queues.QueueTree`, a mapping in its TOML
form, or the path of a TOML file; none given: one queue per name jobs give
(``attrs["queue"]``, else the user, else ``default``), equal weights, no
guarantees or limits: DRF or fair share between users.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import tomllib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..core.job import Job
from ..core.plan import Allocation, Plan, changes, drop_job
from ..core.queues import INF, QueueError, QueueTree, parse_queues, usage
from .base import PlacePolicy, View, parse_flag, register
from .queue_base import Admission, Owed, QueuePolicy
from .queue_book import QueueBook, Walk
from .queue_checks import GuaranteedAsks, above, check_queues

QUEUE_AT_QUOTA = "QueueAtQuota"
WAITING_FOR_RECLAIM = "WaitingForReclaim"
PRIORITY = "Priority"

_EPS = 1e-6
Triple = tuple[float, float, float]
#: a leaf's guaranteed tier: its (rank, job)s, what each asks, their ids, what they sum to; and the rest of
#: the leaf's list: the jobs it passed before its last one, and how many of the list's jobs that spans
TierA = tuple[list[tuple[int, Job]], list[Triple], set[str], Triple, list[tuple[int, Job]], int]
_rank = itemgetter(0)


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


_T = TypeVar("_T")


class _PlanMemo(Generic[_T]):
    """What was worked out for the last plan asked of, kept while it is the same plan object, of the same
    size, in the same view (``owed`` and the round's check ask of the same plan)."""

    __slots__ = ("key", "value")

    def __init__(self) -> None:
        self.key: tuple[Plan, View, tuple[int, ...]] | None = None
        self.value: Any = None

    def __call__(self, plan: Plan, view: View, work: Callable[[Plan, View], _T]) -> _T:
        sizes = (len(plan.allocations), len(plan.added), len(plan.removed), len(view.current))
        key = self.key
        if key is not None and key[0] is plan and key[1] is view and key[2] == sizes:
            return self.value
        out = work(plan, view)
        self.key, self.value = (plan, view, sizes), out
        return out


@register("queue", "none")
class NoQueues(QueuePolicy):
    """No queues: the order policy's order over the whole cluster."""


@register("queue", "quota")
class QuotaQueues(QueuePolicy):
    """Guarantees first, then borrowing in the order policy's order across queues (see the module notes)."""

    enabled = True
    dynamic = False
    #: the admission keeps the borrowing walk's choices (Admission.log) for next_change
    logs_walk = False
    #: False: every queue's usage is summed from a plan's allocations (tests compare the two ways)
    incremental = True
    #: False: a leaf's cached guaranteed tier is walked again whenever one of its jobs ends (tests compare)
    tiers_past_ends = True
    #: False: a leaf's guaranteed tier one of whose jobs ended within it is walked again from the start, not from
    #: that job on (tests compare)
    tiers_resumed = True
    #: False: a walk by rank with every job taken merges the leaves' lists too (tests compare)
    rank_walk = True

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
        self._flat: tuple[QueueTree | None, bool] = (None, False)  # a tree, and whether it has one level
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
        same view: owed and the round's check ask of the same plan)."""
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
        if self._flat[0] is not tree:  # (whether every leaf is its own path: asked once per tree)
            self._flat = (tree, all(len(p) == 1 for p in tree.path))
        if self._flat[1]:
            return leaf
        out = [[0.0, 0.0, 0.0] for _ in range(len(tree))]
        for q in tree.leaves:
            g, c, m = leaf[q]
            for n in tree.path[q]:
                u = out[n]
                u[0] += g
                u[1] += c
                u[2] += m
        return out

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

    # -- admission -------------------------------------------------------------------------------
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

    def admit(self, ordered: Sequence[Job], view: View, strict: bool = False, full: bool = False,
              lazy: bool = False) -> Admission:
        book = self._book
        from_book = lazy and self.borrow and book is not None and book.follows(view)
        if from_book:
            assert book is not None
            tree = self._tree(book.new_jobs(), view)
        else:
            tree = self._tree(ordered, view)
        self._tree_ready(tree, view)
        nq = len(tree)
        cl = view.cluster
        per_gpu = self._per_gpu_of(cl)
        prioritised: set[int] = set()  # leaves with a job of non-zero priority
        lists: list[Collection[tuple[int, Job]]]
        if from_book:
            assert book is not None
            leaves = book.fill((self.version, tree), self._leaf_and_priority)
            empty: dict[str, tuple[int, Job]] = {}
            lists = [leaves.get(q, empty).values() for q in range(nq)]
            prioritised = {q for q, k in book.prioritised.items() if k}
        else:
            built: list[list[tuple[int, Job]]] = [[] for _ in range(nq)]
            version, look_up = self.version, self._look_up
            for i, j in enumerate(ordered):
                c = j.extra.get("queue_leaf")
                if c is None or c[0] != version or c[1] is not tree:
                    c = look_up(j)
                built[c[2]].append((i, j))
                if c[3]:
                    prioritised.add(c[2])
            lists = list(built)
        self._from_book = from_book
        self._prioritised = bool(prioritised) and self.priority
        if self.priority:
            for q in prioritised:
                lists[q] = sorted(lists[q], key=lambda x: -x[1].extra["queue_leaf"][3])

        def demand(j: Job) -> Triple:
            return _demand(j, per_gpu)

        self._lists = lists
        use = [[0.0, 0.0, 0.0] for _ in range(nq)]
        limit, owed, path = tree.limit, tree.owed, tree.path
        adm = Admission()

        def fits(d: Triple, cap: Sequence[Triple], nodes: Sequence[int]) -> bool:
            for n in nodes:
                u, c = use[n], cap[n]
                if u[0] + d[0] > c[0] + _EPS or u[1] + d[1] > c[1] + _EPS or u[2] + d[2] > c[2] + _EPS:
                    return False
            return True

        def take(q: int, d: Triple) -> None:
            for n in path[q]:
                u = use[n]
                u[0] += d[0]
                u[1] += d[1]
                u[2] += d[2]

        # tier A: each leaf within its guarantee (and every limit on its path).  Without limits a leaf's tier
        # depends on its own jobs alone: read from the book, it is walked again only when they changed;
        # otherwise its takes are made again in the same order (the same sums, to the bit), or in a flat tree
        # (no node but the leaf sums them) its use is set to what they summed to
        cache: dict[int, TierA] | None = None
        # per leaf, its last tier and the rank of the first of its jobs that ended, when its walk goes on from there
        resume: dict[int, tuple[TierA, int]] = {}
        flat = False
        # no limit anywhere: every job fits them (each is INF); one level: a leaf's use is its own
        limited, flat_tree = tree.limited, all(len(p) == 1 for p in path)
        if from_book and not tree.limited:
            assert book is not None
            key = (self.version, tree, strict, per_gpu)
            if self._tier_a_key != key:
                self._tier_a, self._tier_a_key, self._tier_a_merged = {}, key, None
            else:
                tiers = self._tier_a
                for q in book.changed:
                    tiers.pop(q, None)
                # a leaf whose jobs only ended or arrived keeps its tier when each ended after the tier's last
                # job in its list and none that arrived fits beside the tier (see _keeps_tier)
                keep = self.tiers_past_ends
                for q, ranks in book.ended.items():
                    hit = tiers.get(q)
                    if hit is not None:
                        ranked = keep and not (self.priority and q in prioritised)
                        if not (ranked and _keeps_tier(hit, ranks, strict)):
                            del tiers[q]
                            if ranked and not strict and self.tiers_resumed:
                                resume[q] = (hit, min(ranks))
                for q, new in book.arrived.items():
                    hit = tiers.get(q)
                    if hit is not None and not (keep and not (self.priority and q in prioritised)
                                                and _takes_none(hit, new, owed[q], per_gpu)):
                        del tiers[q]
            book.changed.clear()
            book.ended.clear()
            book.arrived.clear()
            cache = self._tier_a
            flat = all(len(p) == 1 for p in path)
        taken_by: list[Collection[str]] = [()] * nq  # per leaf, its guaranteed jobs' ids
        # per leaf, its tier when the cache knows where tier A ends in its list (cached, or walked now): its jobs past
        # the tier are read from there (made into iterators only when the walk reads the leaves: the walk by rank
        # does not), not by testing each of the leaf's jobs against the tier's ids
        after: list[TierA | None] = [None] * nq
        if self.guarantees:
            mines: list[list[tuple[int, Job]]] = []  # each leaf's tier (joined only when not every one was cached)
            all_hit = cache is not None
            for q in tree.leaves:
                o = owed[q]
                if o[0] < 1 - _EPS:
                    continue  # every job asks for at least one GPU
                hit = cache.get(q) if cache is not None else None
                if hit is not None:
                    mine, ds, ids, total = hit[:4]
                    after[q] = hit
                    if flat:
                        use[q] = list(total)
                    else:
                        for d in ds:
                            take(q, d)
                    mines.append(mine)
                    taken_by[q] = ids
                    continue
                all_hit = False
                mine, ds = [], []
                gaps: list[tuple[int, Job]] = []  # (the jobs passed, up to the last one taken)
                passed: list[tuple[int, Job]] = []
                span = 0
                # (from the book: its jobs not walked yet, by GPUs, to stop where none of them would fit; counted
                # from the first job passed on, which about one walk in nine meets: the jobs read before it are those
                # taken and passed)
                sizes = book.sizes.get(q, {}) if from_book and book is not None else None
                ahead: dict[int, int] | None = None
                jobs: Iterable[tuple[int, Job]] = lists[q]
                res = resume.get(q)
                if res is not None:
                    # its jobs only ended (or arrived) since its tier was walked, the first that ended within the
                    # tier: up to that job the list is the same, so the walk made the same steps there (the same
                    # takes, the same sums; it stopped nowhere before it); it goes on from there (_resume_tier)
                    mine, ds, gaps, passed, span = _resume_tier(res[0], res[1])
                    u = use[q]
                    for d in ds:
                        if flat_tree:
                            u[0] += d[0]
                            u[1] += d[1]
                            u[2] += d[2]
                        else:
                            take(q, d)
                    jobs = itertools.islice(jobs, len(mine) + len(gaps) + len(passed), None)
                for x in jobs:
                    j = x[1]
                    c = j.extra.get("queue_demand")  # (_demand's cache, read inline; worked out on a miss)
                    d = c[1] if c is not None and c[0] == per_gpu else _demand(j, per_gpu)
                    if ahead is not None:
                        ahead[j.spec.gpus] -= 1
                    u = use[q]
                    if (u[0] + d[0] <= o[0] + _EPS and u[1] + d[1] <= o[1] + _EPS and u[2] + d[2] <= o[2] + _EPS
                            and (not limited or fits(d, limit, path[q]))):  # (fits(d, owed, (q,)), inline)
                        if flat_tree:  # (the leaf alone sums it: take's loop over its path, inline)
                            u[0] += d[0]
                            u[1] += d[1]
                            u[2] += d[2]
                        else:
                            take(q, d)
                        mine.append(x)
                        ds.append(d)
                        if passed:
                            gaps += passed
                            passed = []
                        span = len(mine) + len(gaps)
                        if u[0] > o[0] - 1 + _EPS:
                            break  # no room left for even one GPU
                        continue
                    passed.append(x)
                    if strict:
                        break
                    elif sizes is not None:
                        if ahead is None:
                            ahead = dict(sizes)
                            for y in itertools.chain(mine, gaps, passed):  # (every job read, this one too)
                                ahead[y[1].spec.gpus] -= 1
                        room = o[0] - use[q][0] + _EPS
                        if not any(n and g <= room for g, n in ahead.items()):
                            break
                mines.append(mine)
                ids = {j.id for _, j in mine}
                taken_by[q] = ids
                if cache is not None:
                    u = use[q]
                    cache[q] = after[q] = (mine, ds, ids, (u[0], u[1], u[2]), gaps, span)
            # in the order policy's order across queues (running jobs first under FIFO), each queue's kept (ranks
            # are distinct: sorting by them merges the queues' lists); the same as the last round's when every
            # leaf's was (a copy: note_guaranteed extends it)
            merged = self._tier_a_merged if all_hit else None
            if merged is None:
                tier_a = [x for mine in mines for x in mine]
                tier_a.sort(key=_rank)
                merged = [j for _, j in tier_a]
                self._tier_a_merged = merged if cache is not None else None
            adm.guaranteed = list(merged)

        def rests() -> list[Iterator[tuple[int, Job]]]:  # per leaf, its jobs past its guaranteed tier, lazily
            return [_without(lists[q], taken_by[q]) if (a := after[q]) is None
                    else itertools.chain(a[4], itertools.islice(lists[q], a[5], None)) for q in range(nq)]

        asked = sum(use[n][0] for n in range(nq) if tree.parent[n] < 0)
        # without ``full`` the walk hands on jobs asking for up to twice the cluster (placement rarely needs
        # more to fill it; the scheduler walks again with ``full`` when it does)
        enough = INF if full else 2.0 * cl.num_gpus
        # tier B, part 1: an inner queue's guarantee surplus goes to its own subtree (walked until no room is
        # left in it for even one GPU)
        if self.guarantees and tree.surplus:
            extra: list[set[str]] = [set() for _ in range(nq)]  # per leaf, the jobs the surpluses took
            for n in tree.surplus:
                if use[n][0] > owed[n][0] - 1 + _EPS:
                    continue
                subtree = [q for q in tree.leaves if n in path[q]]
                walks = [_without(lists[q], {*taken_by[q], *extra[q]}) for q in subtree]
                for k, (_, j) in _merge_by_rank(walks):
                    q = subtree[k]
                    d = demand(j)
                    if fits(d, owed, (n,)) and fits(d, limit, path[q]):
                        take(q, d)
                        adm.over.append(j)
                        extra[q].add(j.id)
                        asked += d[0]
                        if use[n][0] > owed[n][0] - 1 + _EPS:
                            break
            taken_by = [{*taken_by[q], *extra[q]} if extra[q] else taken_by[q] for q in range(nq)]
            rest = [_without(lists[q], taken_by[q]) for q in range(nq)]
        else:
            rest = None
        if not self.borrow:
            if rest is None:
                rest = rests()
            for q in tree.leaves:
                for _, j in rest[q]:
                    adm.held[j.id] = QUEUE_AT_QUOTA
            self._remember(adm, view)
            return adm
        # tier B, part 2: everything else in the cross-queue order, within every limit, as placement reads it
        # (lazy) or at once
        share_key = self.share_key(tree, use, view)
        # a whole walk of the book merged by rank, each job taken (no limit, no surplus tier, no priority):
        # its jobs are the book's untaken ones in rank order (running_borrowed reads them without walking)
        by_rank = from_book and share_key is None and not tree.limited and not tree.surplus and not self._prioritised
        self._by_rank = adm if full and by_rank else None

        bound = [enough]  # (the walk by rank's: read_whole lifts both)

        def read_whole() -> None:  # (read_whole: from here on the walk is admit(full=True)'s)
            nonlocal enough
            enough = bound[0] = INF
            if by_rank:
                self._by_rank = adm

        self._whole = None if full else (adm, read_whole)
        over_append = adm.over.append
        pauses = lazy and not full  # (a lazy walk waits at its bound for the scheduler's word: Admission.paused)
        if by_rank and self.rank_walk and not self.logs_walk:
            # the walk by rank with every job taken is the jobs of ``ordered`` (the order of admission, the
            # book's ranks) outside the guaranteed tier, in its order: read so, without the leaves' heap (each
            # leaf's use is read by no key, so none is summed; heads are kept by no reader: None)
            taken = self._taken_union(taken_by)
            adm.walk = Walk(adm.guaranteed, adm.over,
                            self._by_rank_walk(adm, iter(ordered), taken, asked, bound, pauses))
            self._remember(adm, view)
            return adm
        if rest is None:
            rest = rests()
        heads: list[tuple[int, Job] | None] = [next(r, None) for r in rest]
        adm.heads = heads
        steps: list[tuple[int, Triple | None]] | None = None
        if self.logs_walk:  # (what the walk chose, step by step, from what use: next_change reads it)
            steps = []
            adm.log = (steps, [u[0] for u in use], heads)


        def borrowing() -> Iterator[Job | None]:
            nonlocal asked
            blocked: set[int] = set()  # strict: a leaf stops at its first job a limit keeps out
            stopped = None  # the leaf whose job ended the walk (its head was taken)
            # the cross-queue walk over the remaining jobs (heads[q] is leaf q's next, rest[q] the ones after
            # it; both kept up to date, so a walk that stops early leaves them as the jobs not read, heads[stopped]
            # as it was): by rank, or by lowest key (lazy heap: keys only grow as jobs are taken), each leaf's
            # jobs in its own order.  In a flat tree a leaf's key changes only when its own job is taken, and its
            # entry is pushed with the new key then: a popped entry is never stale
            key, stale = share_key, share_key is not None and not flat_tree
            # a flat tree's key as (use · factors).max, worked out inline (DRF's: drf_factors)
            factors = self.drf_factors() if key is not None and flat_tree else None
            heap: list[tuple[Any, int, int]]
            if key is None:
                heap = [(h[0], q, q) for q, h in enumerate(heads) if h is not None]
            else:
                heap = [(key(q), h[0], q) for q in tree.leaves if (h := heads[q]) is not None]
            heapq.heapify(heap)
            pop, push = heapq.heappop, heapq.heappush
            while heap:
                k, rank, q = pop(heap)
                if stale:
                    assert key is not None
                    now_k = key(q)
                    if now_k > k:
                        push(heap, (now_k, rank, q))
                        continue
                x = heads[q]
                assert x is not None
                j = x[1]
                if q in blocked:
                    adm.held[j.id] = QUEUE_AT_QUOTA
                    if steps is not None:
                        steps.append((q, None))
                else:
                    c = j.extra.get("queue_demand")  # (_demand's cache, read inline; worked out on a miss)
                    d = c[1] if c is not None and c[0] == per_gpu else _demand(j, per_gpu)
                    if limited and not fits(d, limit, path[q]):
                        adm.held[j.id] = QUEUE_AT_QUOTA
                        if strict:
                            blocked.add(q)
                        if steps is not None:
                            steps.append((q, None))
                    else:
                        if steps is not None:
                            steps.append((q, d))
                        if flat_tree:  # (the leaf alone sums it: take's loop over its path, inline)
                            u = use[q]
                            u[0] += d[0]
                            u[1] += d[1]
                            u[2] += d[2]
                        else:
                            take(q, d)
                        over_append(j)
                        yield j
                        asked += d[0]
                        if asked >= enough:
                            if pauses:
                                # the reader sees the walk end here (None); read on, it goes on if read_whole
                                # lifted the bound meanwhile, else it stops as it would have.  Whether jobs are
                                # left past it (it would be cut short) is known now: its leaf's next is peeked
                                nxt = next(rest[q], None)
                                if nxt is not None:
                                    rest[q] = itertools.chain((nxt,), rest[q])
                                adm.paused = nxt is not None or any(h is not None for k, h in enumerate(heads)
                                                                    if k != q)
                                yield None
                                adm.paused = None
                            if asked >= enough:
                                stopped = q
                                break
                heads[q] = nxt = next(rest[q], None)
                if nxt is not None:
                    if key is None:
                        push(heap, (nxt[0], q, q))
                    elif factors is not None:  # (max(a, b, c) as max works it out: the first of the largest)
                        u, f = use[q], factors[q]
                        k = u[0] * f[0]
                        b = u[1] * f[1]
                        if b > k:
                            k = b
                        b = u[2] * f[2]
                        if b > k:
                            k = b
                        push(heap, (k, nxt[0], q))
                    else:
                        push(heap, (key(q), nxt[0], q))
            # beyond that: not handed on; those a limit keeps out still say so (only those leaves are read on)
            for q in tree.leaves:
                head = None if q == stopped else heads[q]
                if head is None:
                    head = next(rest[q], None)
                    if head is None:
                        continue
                adm.truncated = True
                if q in blocked:
                    adm.held.update((j.id, QUEUE_AT_QUOTA) for _, j in (head, *rest[q]))
                elif any(limit[n][0] != INF or limit[n][1] != INF or limit[n][2] != INF for n in path[q]):
                    adm.held.update((j.id, QUEUE_AT_QUOTA) for _, j in (head, *rest[q])
                                    if not fits(demand(j), limit, path[q]))

        adm.walk = Walk(adm.guaranteed, adm.over, borrowing())
        if not lazy:
            adm.walk.finish()
        self._remember(adm, view)
        return adm

    def _taken_union(self, taken_by: list[Collection[str]]) -> Collection[str]:
        """Every leaf's guaranteed jobs' ids (``taken_by``) as one set, for the walk by rank's membership tests.  The
        sets of cached tiers are the same objects round after round (:data:`TierA`): the last union is kept, and
        only the leaves whose set is another object are taken out (their last set) and put in (their new one): the
        leaves' sets are disjoint.  It changes in place only when a leaf's tier did, that is after the book's
        leaves changed, which the last walk also reads: a walk is not read past the next admission's changes."""
        last = self._taken_memo
        if last is None or len(last[0]) != len(taken_by):
            union: set[str] = set().union(*taken_by)
        else:
            old, union = last
            for a, b in zip(old, taken_by, strict=True):
                if a is not b:
                    union.difference_update(a)
                    union.update(b)
        self._taken_memo = (list(taken_by), union)
        return union

    @staticmethod
    def _by_rank_walk(adm: Admission, jobs: Iterator[Job], taken: Collection[str], asked: float, enough: list[float],
                      pauses: bool) -> Iterator[Job | None]:
        """The borrowing walk by rank, every job taken (see :meth:`admit`): the jobs of ``jobs`` not in ``taken``,
        each appended to ``adm.over`` as it is handed on, until they ask for ``enough[0]`` GPUs (then it waits
        there when it ``pauses``, as the walk over the leaves does, and stops unless the bound was lifted;
        ``truncated`` when jobs are left)."""
        over_append = adm.over.append
        # (the jobs not in taken read from jobs by loops here, not through a generator of their own: one frame
        # resumed per job handed on, not two)
        j: Job | None = None
        for j in jobs:
            if j.id not in taken:
                break
        else:
            j = None
        while j is not None:
            over_append(j)
            yield j
            asked += j.spec.gpus  # (_demand's GPUs are float(spec.gpus): the same sum)
            nxt: Job | None = None
            for x in jobs:
                if x.id not in taken:
                    nxt = x
                    break
            if asked >= enough[0]:
                if pauses:  # (once: a bound lifted stays lifted)
                    pauses = False
                    adm.paused = nxt is not None
                    yield None
                    adm.paused = None
                if asked >= enough[0]:
                    adm.truncated = nxt is not None
                    return
            j = nxt

    def read_whole(self, adm: Admission) -> bool:
        """The walk stops handing on jobs once they ask for twice the cluster's GPUs (``admit`` without ``full``);
        until it does, it has yielded what the whole walk (``full``) yields, in the same order, with the same
        state (heads, use, log) behind it.  So while ``adm``'s walk (the last admission's) has not stopped, it
        becomes the whole walk by lifting that bound, and placement, which stopped reading it of its own
        accord, planned what it would plan on the whole walk.  Asked again of a walk it lifted, the same answer
        (placement may lift the bound as it reads: ``Walk.go_on``)."""
        whole = self._whole
        walk = adm.walk
        if whole is None or whole[0] is not adm or adm.truncated or walk is None or walk.more is None:
            return False
        lift = whole[1]
        if lift is not None:
            lift()
            self._whole = (adm, None)
        return True

    def settled(self, done: bool) -> None:
        """The scheduler's word on the round just planned: ``done`` when it was planned in one pass over a
        walk read from the book, its prefix filled the cluster, and no reclaim or eviction changed it."""
        self._settled = done and self._from_book

    def appended(self, jobs: Sequence[Job], view: View) -> bool:
        """Whether a round of ``view``, where only ``jobs`` (last in FIFO order) were admitted since a
        settled round (:meth:`settled`) whose plan is the current one, admits them last, each after every
        job admitted before: then the whole walk is the last one with them at its end, and the round
        only backfills them (the scheduler then asks :meth:`owed` of that plan, and the tier-A jobs must all
        be placed, as the whole round's reclaim would).  So: the cross-queue order by rank (``quota``),
        borrowing, no limit, no surplus tier, no priority, the tree and the walk's tiers as the last round
        left them (the book's leaves, cached tiers), and no job of ``jobs`` that fits its queue's guarantee
        beside the jobs it already admits there (it would join the guaranteed tier).

        An order by shares (``drf``, ``fairshare``) puts a new job after every job of its queue admitted
        before, so past every job the last walk read when that queue still had jobs left then
        (``Admission.heads``): the walk is the same as far as that round read it, while the keys choose
        as they did then (:meth:`walk_kept`).  When that round's plan left no GPU free, placement stops at
        the same point (each new job only adds to the waiting jobs it counts ahead), so the round plans
        what the last one did and places none of them."""
        book, tree = self._book, self.tree
        keyed = type(self).share_key is not QuotaQueues.share_key
        heads = self._last.heads
        if (not self._settled or self._starved or self._owed_before or self._prioritised or not self.borrow
                or tree is None or tree.limited or tree.surplus
                or book is None or not book.follows(view) or book.version != (self.version, tree)
                or (keyed and (heads is None or view.free is None or view.free.free_gpus != 0
                               or not self.walk_kept(view.now)))):
            return False
        version = self.version
        if self._tree(jobs, view) is not tree or self.version != version:
            return False  # (a new queue name: every job's queue is looked up again)
        cl = view.cluster
        per_gpu = self._per_gpu_of(cl)
        if self._tier_a_key != (version, tree, False, per_gpu):
            return False
        owed = tree.owed
        for j in jobs:
            q, prio = self._leaf_and_priority(j)
            if prio or (keyed and heads[q] is None):
                return False
            o = owed[q]
            if not self.guarantees or o[0] < 1 - _EPS:
                continue  # (no guaranteed tier there)
            hit = self._tier_a.get(q)
            if hit is None:
                return False
            u, d = hit[3], _demand(j, per_gpu)
            if u[0] + d[0] <= o[0] + _EPS and u[1] + d[1] <= o[1] + _EPS and u[2] + d[2] <= o[2] + _EPS:
                return False
        book.fill((version, tree), self._leaf_and_priority)
        book.changed.difference_update(self._tier_a)  # (their guaranteed tiers did not change)
        book.arrived.clear()  # (every leaf given a job has its tier cached, and none of them joins it)
        self._tree_ready(tree, view)  # (as admission would: fair share's usage decays to now)
        return True

    def walk_kept(self, now: float) -> bool:
        """Whether the borrowing walk's keys at ``now`` choose as they did in the last settled round, for
        the jobs it read then (time alone changes no key here; fair share's decay does)."""
        return not self.dynamic

    def all_guaranteed_placed(self, plan: Plan) -> bool:
        allocs = plan.allocations
        return all(j.id in allocs for j in self._last.guaranteed)

    def note_appended(self, placed: Sequence[Job]) -> None:
        """The round admitted its new jobs last (:meth:`appended`) and placed ``placed`` of them: they are
        borrowing."""
        last = self._last
        self._last = Admission(last.guaranteed, [*last.over, *placed], dict(last.held), last.truncated,
                               log=last.log, heads=last.heads)

    def running_borrowed(self, adm: Admission, view: View) -> list[Job] | None:
        """The running jobs ``adm``'s borrowing walk yields, in its order, without reading it: when the walk
        is the book's untaken jobs merged by rank and read to the end (``admit(full=True)`` with no limit,
        no surplus tier, no priority, the order across queues by rank), those are the running jobs outside
        the guaranteed tier sorted by rank; else None (the caller reads the walk)."""
        book = self._book
        if adm is not self._by_rank or book is None or not book.follows(view):
            return None
        kept = {j.id for j in adm.guaranteed}
        where, leaves = book.where, book.leaves
        out = [leaves[where[jid][0]][jid] for jid in view.current if jid not in kept]
        out.sort(key=_rank)
        return [j for _, j in out]

    def _tree_ready(self, tree: QueueTree, view: View) -> None:
        """Called by :meth:`admit` once the round's tree is known (fair share advances its usage)."""

    def _remember(self, adm: Admission, view: View) -> None:
        self._last = adm

    # the cross-queue order -------------------------------------------------------------------------
    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any] | None:
        """Key of a leaf in the progressive filling (lower first), or None: merge by the order policy's rank."""
        return None

    def drf_factors(self) -> Sequence[tuple[float, ...]] | None:
        """After :meth:`share_key` of a one-level tree: per leaf, the factors whose products with its use
        (GPUs, cores, MB) have the key as their largest, when the key is just that (the walk then works it
        out inline); else None."""
        return None

    # -- after placement -------------------------------------------------------------------------
    def enforce(self, plan: Plan, view: View) -> Plan:
        """Drop placed jobs of any queue over its limit (a sizer grew them, a hook kept them): first those a
        hook kept without admission, then the latest admitted."""
        tree = self.tree
        if tree is None or not tree.limited:
            return plan
        self._last.finish()
        allocs = plan.allocations
        placed = [j for j in view.jobs if j.id in allocs]
        leaf = {j.id: self.leaf(j) for j in placed}
        u = usage(tree, allocs, leaf)
        over = {n for n in range(len(tree)) if above(u[n], tree.limit[n])}
        if not over:
            return plan
        new = dict(allocs)
        admitted = {j.id for j in self._last.ordered}
        # first what a hook kept without admission, then the latest admitted
        for j in [j for j in placed if j.id not in admitted] + self._last.ordered[::-1]:
            if not over:
                break
            a = new.get(j.id)
            q = leaf.get(j.id)
            if a is None or q is None or not over.intersection(tree.path[q]):
                continue
            drop_job(new, j.id)
            self.counters["dropped"] += 1
            u = usage(tree, new, leaf)
            over = {n for n in over if above(u[n], tree.limit[n])}
        return Plan(new)

    def owed(self, plan: Plan, view: View) -> list[Owed]:
        if not self.guarantees or self.tree is None:
            return []
        tree = self.tree
        allocs = plan.allocations
        u = self.usage_of(plan, view)
        out = []
        smallest = self._smallest_left_out(plan, view)
        limited, guarantee = tree.limited, tree.guarantee
        for q in tree.leaves:
            room = guarantee[q][0] - u[q][0]
            if limited:  # (else every limit is infinite)
                room = min(room, *(tree.limit[n][0] - u[n][0] for n in tree.path[q]))
            if room < 1 - _EPS or (smallest is not None and smallest(q) > room + _EPS):
                continue  # (the book knows when no job of the queue left out fits what it is owed)
            jobs = _fitting(self._lists[q], allocs, room + _EPS)
            if not self.incremental:  # (listed whole now, as tests compare)
                jobs = iter(list(jobs))
            first = next(jobs, None)
            if first is not None:
                out.append(Owed(q, room, itertools.chain((first,), jobs)))
        return out

    def _smallest_left_out(self, plan: Plan, view: View) -> Callable[[int], float] | None:
        """When this round read the book: per leaf, the fewest GPUs one of its jobs ``plan`` leaves out asks for
        (those waiting, from the book, and those running now that the plan stops), else None.  Kept for the plan
        last asked of, as :meth:`_changed_usage` keeps its usage (owed and the round's check ask of the same
        plan; the book does not change in between)."""
        return self._smallest_memo(plan, view, self._smallest_of)

    def _smallest_of(self, plan: Plan, view: View) -> Callable[[int], float] | None:
        book = self._book
        if not self._from_book or book is None or not book.follows(view) or view.by_id is None:
            return None
        allocs, by_id, current = plan.allocations, view.by_id, view.current
        stopped: dict[int, float] = {}
        # (a plan that extends the current allocations stops only jobs it lists as taken out)
        extends = plan.base is current and len(allocs) == len(current) - len(plan.removed) + len(plan.added)
        for jid in plan.removed if extends else current:
            if jid not in allocs:
                q, g = book.where[jid][0], by_id[jid].spec.gpus
                if g < stopped.get(q, math.inf):
                    stopped[q] = g
        if not stopped:
            return book.smallest_waiting
        return lambda q: min(book.smallest_waiting(q), stopped.get(q, math.inf))

    def lent(self, allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        tree = self.tree
        if not self.guarantees or tree is None:
            return []
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        leaf = self.leaf_map([jid for jid in allocs if jid in by_id], view)
        held = [0.0] * len(tree)  # each leaf's GPUs, as usage() sums them (a leaf is on its own jobs' paths only)
        grouped = False
        for jid, q in leaf.items():
            a = allocs[jid]
            if a.group:
                grouped = True
                held[q] += a.num_gpus / (1 + len(a.group))
            else:  # (x / 1 is x, as a float: the same sums)
                held[q] += a.num_gpus
        g = tree.guarantee
        lenders = {q for q in tree.leaves if held[q] > g[q][0] + _EPS}
        # (for lent_since: with whole GPUs per job the sums are exact in any order)
        self._lent_memo = None if grouped else (allocs, held, lenders)
        if not lenders:
            return []
        adm = self._last
        kept = {j.id for j in adm.guaranteed}
        kept.update(guaranteed)
        over = [j for j in adm.over if j.id in allocs and leaf[j.id] in lenders and j.id not in kept]
        # placed without admission (a plan hook kept them): evicted first
        kept.update(j.id for j in adm.over)
        return over + [by_id[jid] for jid, q in leaf.items() if q in lenders and jid not in kept]

    def lent_since(self, before: Sequence[Job], gone: Sequence[Allocation], added: Sequence[Allocation],
                   allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        """:meth:`lent` from the last call's sums, in O(changes + queues): ``allocs`` is the mapping that call
        read, ``before`` what it gave, with ``gone`` taken out and ``added`` put in since.  Each leaf's GPUs are
        those sums with the changes; while no queue becomes a lender, the work lent is ``before`` without what
        left ``allocs``, what is now ``guaranteed`` and the queues no longer lenders (in its order, as
        :meth:`lent` gives it).  Otherwise (a group's share: fractions; a new lender) :meth:`lent`."""
        memo, tree = self._lent_memo, self.tree
        if (memo is None or memo[0] is not allocs or tree is None or any(a.group for a in gone)
                or any(a.group for a in added)):
            return self.lent(allocs, view, guaranteed)
        _, held, lenders = memo
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        for sign, allocations in ((-1, gone), (1, added)):
            for a in allocations:
                j = by_id.get(a.job_id)
                if j is not None:
                    held[self.leaf(j)] += sign * a.num_gpus
        g = tree.guarantee
        if any(held[q] > g[q][0] + _EPS for q in tree.leaves if q not in lenders):
            return self.lent(allocs, view, guaranteed)
        now = {q for q in lenders if held[q] > g[q][0] + _EPS}
        self._lent_memo = (allocs, held, now)
        kept = set(guaranteed)
        return [j for j in before if j.id in allocs and j.id not in kept and self.leaf(j) in now]

    def owed_again(self, owed: Sequence[Owed]) -> list[Owed]:
        again = [o for o in owed if o.queue in self._owed_before]
        self._owed_before = {o.queue for o in owed}
        return again

    def note_guaranteed(self, jobs: Sequence[Job]) -> None:
        adm = self._last
        ids = {j.id for j in jobs}
        adm.over[:] = [j for j in adm.over if j.id not in ids]  # (in place: a lazy walk appends to these lists)
        had = {x.id for x in adm.guaranteed}
        adm.guaranteed += [j for j in jobs if j.id not in had]
        for j in jobs:
            adm.held.pop(j.id, None)

    def pending_reasons(self, plan: Plan, view: View) -> Mapping[str, str]:
        adm = self._last
        adm.finish()
        allocs = plan.allocations
        out = dict(adm.held)
        if any(j.id in allocs for j in adm.over):
            for j in adm.guaranteed:
                if j.id not in allocs:
                    out[j.id] = WAITING_FOR_RECLAIM
        if self._prioritised:
            # a job that would fit in what higher-priority jobs of its queue hold waits for priority
            held_by: dict[int, list[tuple[float, float]]] = {}
            for j in adm.ordered:
                a = allocs.get(j.id)
                if a is not None:
                    held_by.setdefault(self.leaf(j), []).append((job_priority(j), a.num_gpus))
            if held_by:
                free = plan.free_gpus
                if free is None:
                    free = view.cluster.num_gpus - len({g for a in allocs.values() for g in a.gpu_ids})
                for j in view.jobs:
                    if j.id in allocs or j.id in out:
                        continue
                    p = job_priority(j)
                    higher = sum(g for pr, g in held_by.get(self.leaf(j), ()) if pr > p)
                    if higher and j.spec.gpus <= free + higher:
                        out[j.id] = PRIORITY
        return out

    def stats(self) -> dict[str, Any]:
        adm = self._last
        return {**self.counters, "guaranteed": len(adm.guaranteed), "borrowed": len(adm.over), "held": len(adm.held)}

    def next_change(self, view: View) -> float:
        """Admission reads only the jobs and the plan, so time alone changes nothing; except after a round
        that left a queue starved (:mod:`.queue_checks`) or still owed after the hooks: the next round must
        be computed, to reclaim over the hook and to check that the starvation did not last two rounds."""
        if self.dynamic or self._starved or self._owed_before:
            return view.now
        return math.inf

    def note_reclaim(self) -> None:
        self.counters["reclaim_passes"] += 1

    def forgive(self) -> None:
        """A plan hook kept this round's plan off nodes out of service (drained): GPUs the starvation check
        counts as lent may be there, where no queue can use them, so the round starts no two-round count."""
        self._starved = set()

    # -- invariants ------------------------------------------------------------------------------
    #: what the guaranteed jobs asked for per leaf at the last check (made at the first)
    _asks: GuaranteedAsks | None = None

    def check(self, plan: Plan, view: View, place: PlacePolicy) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` if a queue is over its limit, or a queue below its
        guarantee has waited two rounds in a row while GPUs it could use are lent (:mod:`.queue_checks`)."""
        if self.tree is not None:
            smallest = self._smallest_left_out(plan, view)
            lists = self._lists
            # with the usage from the book (no group: each job's GPUs are its own), the GPUs free are those
            # no queue holds
            u = self._changed_usage(plan, view) if self.incremental else None
            leaves: Mapping[str, int]
            free: float | None = None
            if u is not None:
                assert self._book is not None
                leaves = _Leaves(self._book.where)
                free = view.cluster.num_gpus - sum(u[q][0] for q in self.tree.leaves)
            else:
                leaves = self.leaf_map(plan.allocations, view)
            if self._asks is None:
                self._asks = GuaranteedAsks()
            self._starved = check_queues(self.tree, self._last, self._starved, plan, view, place, self.leaf,
                                         self.guarantees,
                                         None if smallest is None else (lambda q: (j for _, j in lists[q])),
                                         smallest, leaves, u, free, self._asks)


# ---------------------------------------------------------------------------------------------------
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


class _Leaves(Mapping[str, int]):
    """``{job id: its leaf}`` read from the book's ``where`` as asked (not built for every planned job)."""

    __slots__ = ("where",)

    def __init__(self, where: Mapping[str, tuple[int, bool]]) -> None:
        self.where = where

    def __getitem__(self, jid: str) -> int:
        return self.where[jid][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def _keeps_tier(hit: TierA, ended: Sequence[int], strict: bool) -> bool:
    """Whether a leaf's guaranteed tier ``hit`` holds after jobs of the ranks ``ended`` left its list (in rank
    order: no priority sorts it), nothing else having changed.  Without ``strict`` the tier's walk takes each
    job that fits what the jobs taken before it leave, passing the others (its early stops only skip jobs
    that could not fit): the list up to the tier's last job is the same, so the same jobs are taken there
    with the same sums in the same order, and past it the list is the old one less some jobs, none of
    which fitted before any more than now (nothing taken since).  The jobs past the tier (``after``) are read
    by position from the tier's end, which does not move.  Strict quotas stop at the first job passed, which
    may have ended."""
    if strict:
        return False
    mine = hit[0]
    return not mine or min(ended) > mine[-1][0]


def _resume_tier(hit: TierA, first: int) -> tuple[list[tuple[int, Job]], list[Triple], list[tuple[int, Job]],
                                                   list[tuple[int, Job]], int]:
    """The state of a leaf's guaranteed tier walk (without ``strict``, no priority) as it reached the job of rank
    ``first``, the first of its jobs to end since it made the tier ``hit``, that job being at or before the tier's
    last (else the tier holds: :func:`_keeps_tier`): the jobs it took before it and what each asks, the jobs it
    passed before its last take there (``gaps``) and after it (``passed``), and ``span``.  The walk read every job
    of the list up to there, in rank order (ended jobs leave it, arrived ones join its end): each was taken or
    passed, and each passed one lies before a later take (the tier's last job is past ``first``), so in the
    tier's gaps.  Going on from there over the list without the ended jobs walks what the whole walk walks: up to
    there the same jobs with the same sums in the same order, so the same steps, except that the whole walk may
    stop at a job passed once no job left would fit (fewer are left now) and this one reads on, taking none of
    them (what is left only shrinks) nor passing one before a take: the same tier, gaps and span."""
    mine, ds, _, _, gaps, _ = hit
    k = bisect.bisect_left(mine, first, key=_rank)
    last = mine[k - 1][0] if k else -1
    g = bisect.bisect_left(gaps, last, key=_rank) if k else 0
    p = bisect.bisect_left(gaps, first, key=_rank)
    return mine[:k], ds[:k], gaps[:g], gaps[g:p], (k + g if k else 0)


def _takes_none(hit: TierA, new: Sequence[Job], owed: Triple, per_gpu: tuple[float, float]) -> bool:
    """Whether a leaf's guaranteed tier ``hit`` holds after ``new`` jobs joined the end of its list (in rank
    order), nothing else having changed: none of them fits in what the tier leaves of the guarantee ``owed``
    (no limits: the cache is kept only then).  The walk is the same up to the end of the old list, and then
    passes each new job (nothing is taken meanwhile); strict quotas stop before them or at the first."""
    u = hit[3]
    for j in new:
        d = _demand(j, per_gpu)
        if u[0] + d[0] <= owed[0] + _EPS and u[1] + d[1] <= owed[1] + _EPS and u[2] + d[2] <= owed[2] + _EPS:
            return False
    return True


def _fitting(jobs: Iterable[tuple[int, Job]], allocs: Collection[str], most: float) -> Iterator[Job]:
    """The jobs of ``jobs`` (rank, job) not in ``allocs`` asking at most ``most`` GPUs, lazily: a reader
    that stops early (reclaim once the room is used up) does not read a queue's whole backlog."""
    return (j for _, j in jobs if j.id not in allocs and j.spec.gpus <= most)


def _without(jobs: Iterable[tuple[int, Job]], ids: Collection[str]) -> Iterator[tuple[int, Job]]:
    """The (rank, job)s of ``jobs`` whose job is not in ``ids``, lazily."""
    return (x for x in jobs if x[1].id not in ids) if ids else iter(jobs)


def _merge_by_rank(lists: Sequence[Iterator[tuple[int, Job]]]) -> Iterator[tuple[int, tuple[int, Job]]]:
    """(list index, (rank, job)) over every item of ``lists``, lowest head rank first, each list's order
    kept."""
    heap = []
    for k, it in enumerate(lists):
        x = next(it, None)
        if x is not None:
            heap.append((x[0], k, x))
    heapq.heapify(heap)
    while heap:
        _, k, x = heapq.heappop(heap)
        yield k, x
        nxt = next(lists[k], None)
        if nxt is not None:
            heapq.heappush(heap, (nxt[0], k, nxt))
