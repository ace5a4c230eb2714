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

import heapq
import math
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.job import Job
from ..core.plan import Allocation, Plan, drop_job
from ..core.queues import INF, QueueError, QueueTree, parse_queues, usage
from .base import PlacePolicy, View, parse_flag, register
from .queue_base import Admission, Owed, QueuePolicy
from .queue_checks import above, check_queues

QUEUE_AT_QUOTA = "QueueAtQuota"
WAITING_FOR_RECLAIM = "WaitingForReclaim"
PRIORITY = "Priority"

_EPS = 1e-6
Triple = tuple[float, float, float]


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


@register("queue", "none")
class NoQueues(QueuePolicy):
    """No queues: the order policy's order over the whole cluster."""


@register("queue", "quota")
class QuotaQueues(QueuePolicy):
    """Guarantees first, then borrowing in the order policy's order across queues (see the module notes)."""

    enabled = True
    dynamic = False

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
        self._last = Admission()
        self._lists: list[list[tuple[int, Job]]] = []
        self._prioritised = False  # the last admission saw a job of non-zero priority
        self._starved: set[int] = set()
        self._owed_before: set[int] = set()  # queues still owed after the last round's hooks
        self.counters = {"guaranteed": 0, "borrowed": 0, "held": 0, "reclaim_passes": 0, "dropped": 0}

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

    # -- admission -------------------------------------------------------------------------------
    def admit(self, ordered: Sequence[Job], view: View, strict: bool = False, full: bool = False) -> Admission:
        tree = self._tree(ordered, view)
        nq = len(tree)
        cl = view.cluster
        per_gpu = (cl.total_cpus / cl.num_gpus, cl.total_mem_mb / cl.num_gpus) if cl.num_gpus else (0.0, 0.0)
        lists: list[list[tuple[int, Job]]] = [[] for _ in range(nq)]
        prioritised: set[int] = set()  # leaves with a job of non-zero priority
        version, look_up = self.version, self._look_up
        for i, j in enumerate(ordered):
            c = j.extra.get("queue_leaf")
            if c is None or c[0] != version or c[1] is not tree:
                c = look_up(j)
            lists[c[2]].append((i, j))
            if c[3]:
                prioritised.add(c[2])
        self._prioritised = bool(prioritised) and self.priority
        if self.priority:
            for q in prioritised:
                lists[q].sort(key=lambda x: -x[1].extra["queue_leaf"][3])

        def demand(j: Job) -> Triple:
            c = j.extra.get("queue_demand")
            if c is None or c[0] != per_gpu:
                s = j.spec
                g = s.gpus
                c = j.extra["queue_demand"] = (per_gpu, (
                    float(g), float(s.cpus) if s.cpus is not None else g * per_gpu[0],
                    float(s.mem_mb) if s.mem_mb is not None else g * per_gpu[1]))
            return c[1]

        self._lists = lists
        use = [[0.0, 0.0, 0.0] for _ in range(nq)]
        limit, owed, path = tree.limit, tree.owed, tree.path
        adm = Admission()
        taken: set[str] = set()

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

        # tier A: each leaf within its guarantee (and every limit on its path)
        if self.guarantees:
            tier_a: list[list[tuple[int, Job]]] = []
            for q in tree.leaves:
                o = owed[q]
                if o[0] < 1 - _EPS:
                    continue  # every job asks for at least one GPU
                mine: list[tuple[int, Job]] = []
                for i, j in lists[q]:
                    d = demand(j)
                    if fits(d, owed, (q,)) and fits(d, limit, path[q]):
                        take(q, d)
                        mine.append((i, j))
                        taken.add(j.id)
                        if use[q][0] > o[0] - 1 + _EPS:
                            break  # no room left for even one GPU
                    elif strict:
                        break
                tier_a.append(mine)
            # in the order policy's order across queues (running jobs first under FIFO), each queue's kept
            adm.guaranteed = [j for _, (_, j) in _merge_by_rank(tier_a)]
        rest = [[x for x in lists[q] if x[1].id not in taken] if taken else lists[q] for q in range(nq)]
        asked = sum(use[n][0] for n in range(nq) if tree.parent[n] < 0)
        # without ``full`` the walk hands on jobs asking for up to twice the cluster (placement rarely needs
        # more to fill it; the scheduler walks again with ``full`` when it does)
        enough = INF if full else 2.0 * cl.num_gpus
        # tier B, part 1: an inner queue's guarantee surplus goes to its own subtree
        if self.guarantees and tree.surplus:
            for n in tree.surplus:
                subtree = [q for q in tree.leaves if n in path[q]]
                for k, (_, j) in _merge_by_rank([rest[q] for q in subtree]):
                    q = subtree[k]
                    d = demand(j)
                    if fits(d, owed, (n,)) and fits(d, limit, path[q]):
                        take(q, d)
                        adm.over.append(j)
                        taken.add(j.id)
                        asked += d[0]
                rest = [[x for x in rest[q] if x[1].id not in taken] for q in range(nq)]
        if not self.borrow:
            for q in tree.leaves:
                for _, j in rest[q]:
                    adm.held[j.id] = QUEUE_AT_QUOTA
            self._remember(adm, view)
            return adm
        # tier B, part 2: everything else in the cross-queue order, within every limit
        key = self.share_key(tree, use, view)
        done = [0] * nq  # per leaf: jobs of ``rest`` walked
        blocked: set[int] = set()  # strict: a leaf stops at its first job a limit keeps out
        for q, (_, j) in self._cross(rest, key, tree):
            done[q] += 1
            if q in blocked:
                adm.held[j.id] = QUEUE_AT_QUOTA
                continue
            d = demand(j)
            if not fits(d, limit, path[q]):
                adm.held[j.id] = QUEUE_AT_QUOTA
                if strict:
                    blocked.add(q)
                continue
            take(q, d)
            adm.over.append(j)
            asked += d[0]
            if asked >= enough:
                break
        # beyond that: not handed on; those a limit keeps out still say so
        for q in tree.leaves:
            left = rest[q][done[q]:]
            if not left:
                continue
            adm.truncated = True
            if q in blocked:
                adm.held.update((j.id, QUEUE_AT_QUOTA) for _, j in left)
            elif any(limit[n][0] != INF or limit[n][1] != INF or limit[n][2] != INF for n in path[q]):
                adm.held.update((j.id, QUEUE_AT_QUOTA) for _, j in left if not fits(demand(j), limit, path[q]))
        self._remember(adm, view)
        return adm

    def _remember(self, adm: Admission, view: View) -> None:
        self._last = adm
        self.counters.update(guaranteed=len(adm.guaranteed), borrowed=len(adm.over), held=len(adm.held))

    # the cross-queue order -------------------------------------------------------------------------
    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any] | None:
        """Key of a leaf in the progressive filling (lower first), or None: merge by the order policy's rank."""
        return None

    def _cross(self, rest: list[list[tuple[int, Job]]], key: Callable[[int], Any] | None,
               tree: QueueTree) -> Iterator[tuple[int, tuple[int, Job]]]:
        """(leaf, (rank, job)) over the remaining jobs: by rank, or by lowest ``key`` (lazy heap: keys only
        grow as jobs are taken), each leaf's jobs in its own order.  A consumer may stop early."""
        if key is None:
            yield from _merge_by_rank(rest)
            return
        heap = [(key(q), rest[q][0][0], q) for q in tree.leaves if rest[q]]
        heapq.heapify(heap)
        pos = [0] * len(rest)
        while heap:
            k, rank, q = heapq.heappop(heap)
            now_k = key(q)
            if now_k > k:
                heapq.heappush(heap, (now_k, rank, q))
                continue
            lst = rest[q]
            yield q, lst[pos[q]]
            pos[q] += 1
            if pos[q] < len(lst):
                heapq.heappush(heap, (key(q), lst[pos[q]][0], q))

    # -- after placement -------------------------------------------------------------------------
    def enforce(self, plan: Plan, view: View) -> Plan:
        """Drop placed jobs of any queue over its limit (a sizer grew them, a hook kept them): first those a
        hook kept without admission, then the latest admitted."""
        tree = self.tree
        if tree is None or not tree.limited:
            return plan
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
        leaf = {j.id: self.leaf(j) for j in view.jobs if j.id in allocs}
        u = usage(tree, allocs, leaf)
        out = []
        for q in tree.leaves:
            room = min(tree.guarantee[q][0] - u[q][0], *(tree.limit[n][0] - u[n][0] for n in tree.path[q]))
            if room < 1 - _EPS:
                continue
            jobs = [j for _, j in self._lists[q] if j.id not in allocs and j.spec.gpus <= room + _EPS]
            if jobs:
                out.append(Owed(q, room, jobs, {j.id for _, j in self._lists[q]}))
        return out

    def lent(self, allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        tree = self.tree
        if not self.guarantees or tree is None:
            return []
        by_id = view.by_id if view.by_id is not None else {j.id: j for j in view.jobs}
        leaf = {jid: self.leaf(by_id[jid]) for jid in allocs if jid in by_id}
        u = usage(tree, allocs, leaf)
        g = tree.guarantee
        lenders = {q for q in tree.leaves if u[q][0] > g[q][0] + _EPS}
        if not lenders:
            return []
        adm = self._last
        kept = {j.id for j in adm.guaranteed}
        kept.update(guaranteed)
        over = [j for j in adm.over if j.id in allocs and leaf[j.id] in lenders and j.id not in kept]
        # placed without admission (a plan hook kept them): evicted first
        kept.update(j.id for j in adm.over)
        return over + [by_id[jid] for jid, q in leaf.items() if q in lenders and jid not in kept]

    def owed_again(self, owed: Sequence[Owed]) -> list[Owed]:
        again = [o for o in owed if o.queue in self._owed_before]
        self._owed_before = {o.queue for o in owed}
        return again

    def note_guaranteed(self, jobs: Sequence[Job]) -> None:
        adm = self._last
        ids = {j.id for j in jobs}
        adm.over = [j for j in adm.over if j.id not in ids]
        adm.guaranteed = adm.guaranteed + [j for j in jobs if j.id not in {x.id for x in adm.guaranteed}]
        for j in jobs:
            adm.held.pop(j.id, None)

    def pending_reasons(self, plan: Plan, view: View) -> Mapping[str, str]:
        adm = self._last
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
        return dict(self.counters)

    def next_change(self, view: View) -> float:
        """Admission reads only the jobs and the plan, so time alone changes nothing; except after a round
        that left a queue starved (:mod:`.queue_checks`) or still owed after the hooks: the next round must
        be computed, to reclaim over the hook and to check that the starvation did not last two rounds."""
        if self.dynamic or self._starved or self._owed_before:
            return view.now
        return math.inf

    def note_reclaim(self) -> None:
        self.counters["reclaim_passes"] += 1

    # -- invariants ------------------------------------------------------------------------------
    def check(self, plan: Plan, view: View, place: PlacePolicy) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` if a queue is over its limit, or a queue below its
        guarantee has waited two rounds in a row while GPUs it could use are lent (:mod:`.queue_checks`)."""
        if self.tree is not None:
            self._starved = check_queues(self.tree, self._last, self._starved, plan, view, place, self.leaf,
                                         self.guarantees)


# ---------------------------------------------------------------------------------------------------
def _merge_by_rank(lists: Sequence[list[tuple[int, Job]]]) -> Iterator[tuple[int, tuple[int, Job]]]:
    """(list index, (rank, job)) over every item of ``lists``, lowest head rank first, each list's order
    kept."""
    heap = [(lst[0][0], k, 0) for k, lst in enumerate(lists) if lst]
    heapq.heapify(heap)
    while heap:
        _, k, i = heapq.heappop(heap)
        lst = lists[k]
        yield k, lst[i]
        if i + 1 < len(lst):
            heapq.heappush(heap, (lst[i + 1][0], k, i + 1))

