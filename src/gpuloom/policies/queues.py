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

Modules: the contract in :mod:`.queue_base`, ``none`` and ``quota``'s
admission here, its state and accounting in :mod:`.queue_state`, what it says
after placement in :mod:`.queue_reclaim`, its cached guaranteed tiers in
:mod:`.queue_tiers`, ``drf`` and ``fairshare`` in :mod:`.queue_fair`, the
invariants in :mod:`.queue_checks`, the tree in :mod:`gpuloom.core.queues`.

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
import itertools
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from ..core.job import Job
from ..core.plan import Plan
from ..core.queues import INF, QueueTree
from .base import View, register
from .queue_base import Admission, QueuePolicy
from .queue_book import Walk
from .queue_reclaim import PRIORITY, WAITING_FOR_RECLAIM, QuotaReclaim
from .queue_state import _EPS, TierA, Triple, _demand, as_tree, job_priority, load_queue_file
from .queue_tiers import _keeps_tier, _rank, _resume_tier, _retaken, _takes_none

__all__ = ["PRIORITY", "QUEUE_AT_QUOTA", "WAITING_FOR_RECLAIM", "NoQueues", "QuotaQueues", "as_tree", "job_priority",
           "load_queue_file"]

QUEUE_AT_QUOTA = "QueueAtQuota"


@register("queue", "none")
class NoQueues(QueuePolicy):
    """No queues: the order policy's order over the whole cluster."""


@register("queue", "quota")
class QuotaQueues(QuotaReclaim):
    """Guarantees first, then borrowing in the order policy's order across queues (see the module notes)."""

    enabled = True
    dynamic = False
    #: the admission keeps the borrowing walk's choices (Admission.log) for next_change
    logs_walk = False
    #: False: a leaf's cached guaranteed tier is walked again whenever one of its jobs ends (tests compare)
    tiers_past_ends = True
    #: False: a leaf's guaranteed tier one of whose jobs ended within it is walked again from the start, not from
    #: that job on (tests compare)
    tiers_resumed = True
    #: False: a walk by rank with every job taken merges the leaves' lists too (tests compare)
    rank_walk = True
    #: False: a tier walked on from a job that ended reads its jobs past that job again one by one, even when the
    #: tier passed none (tests compare)
    tiers_forwarded = True
    #: False: a lazy walk (by rank or by shares) hands on no job before placement reads it (tests compare)
    read_ahead = True

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
        # per leaf, its last tier, the rank of the first of its jobs that ended and the ranks of all those that ended,
        # when its walk goes on from there
        resume: dict[int, tuple[TierA, int, Sequence[int]]] = {}
        flat = False
        # no limit anywhere: every job fits them (each is INF); one level: a leaf's use is its own
        limited, flat_tree = tree.limited, tree.one_level
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
                                resume[q] = (hit, min(ranks), ranks)
                for q, new in book.arrived.items():
                    hit = tiers.get(q)
                    if hit is not None and not (keep and not (self.priority and q in prioritised)
                                                and _takes_none(hit, new, owed[q], per_gpu)):
                        del tiers[q]
            book.changed.clear()
            book.ended.clear()
            book.arrived.clear()
            cache = self._tier_a
            flat = tree.one_level
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
                    hit, first, ended = res
                    mine, ds, gaps, passed, span = _resume_tier(hit, first)
                    u = use[q]
                    k = len(mine)
                    if not hit[4] and self.tiers_forwarded:
                        # no job passed before the tier's last: its jobs past the one that ended are taken again,
                        # each where it was (_retaken), and the walk reads on past them
                        more, more_ds = _retaken(hit, k, first, ended)
                        mine += more
                        ds += more_ds
                        span = len(mine)
                    for d in ds:
                        if flat_tree:
                            u[0] += d[0]
                            u[1] += d[1]
                            u[2] += d[2]
                        else:
                            take(q, d)
                    if len(ds) > k and u[0] > o[0] - 1 + _EPS:
                        jobs = ()  # (full after the last of them: the walk stops there, as it would have)
                    else:
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
        # (fair share's key in a one-level tree, as its terms read with the key: the walk works it out inline)
        terms = self.share_terms() if share_key is not None and flat_tree else None
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
            in_order = iter(ordered)
            started = False
            cap = cl.num_gpus
            if lazy and asked < cap and self.read_ahead:
                # the jobs placement reads whatever it decides: its first phase reads the walk until the GPUs of
                # the jobs it selected reach the cluster's, so it reads every job before which the walk's jobs ask
                # for fewer.  Those are handed on now, in this loop (one frame resumed per job fewer as they are
                # read); the walk goes on after them (its bound, twice the cluster, lies past them)
                over = adm.over
                for oj in in_order:
                    if oj.id not in taken:
                        over.append(oj)
                        asked += oj.spec.gpus
                        if asked >= cap:
                            break
                started = bool(over)
            adm.walk = Walk(adm.guaranteed, adm.over,
                            self._by_rank_walk(adm, in_order, taken, asked, bound, started, pauses))
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
            if terms is not None:
                past, tau, rel = terms
            heap: list[tuple[Any, int, int]]
            if key is None:
                heap = [(h[0], q, q) for q, h in enumerate(heads) if h is not None]
            else:
                heap = [(key(q), h[0], q) for q in tree.leaves if (h := heads[q]) is not None]
            heapq.heapify(heap)
            # (a leaf's next entry is pushed and the next step's popped in one call, heappushpop: the same entry
            # as a push then a pop, the entries being distinct, one per leaf; it is the next step's ``top``)
            pop, pushpop = heapq.heappop, heapq.heappushpop
            # read ahead (see ``ahead`` below): jobs taken without a yield while the walk's GPUs are below the
            # cluster's; then one yield (None, to admit) and the walk goes on as read
            ahead = reads_ahead
            top: tuple[Any, int, int] | None = None
            while True:
                if top is None:
                    if not heap:
                        break
                    top = pop(heap)
                k, rank, q = top
                top = None
                if stale:
                    assert key is not None
                    now_k = key(q)
                    if now_k > k:
                        top = pushpop(heap, (now_k, rank, q))
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
                        if ahead and asked + d[0] < enough:  # (read ahead: never to its bound, no pause)
                            over_append(j)
                            asked += d[0]
                            if asked >= cap:
                                ahead = False
                                yield None  # (to admit: read ahead so far)
                        else:
                            if ahead:
                                ahead = False
                                yield None
                            over_append(j)
                            yield j
                            asked += d[0]
                            if asked >= enough:
                                if pauses:
                                    # the reader sees the walk end here (None); read on, it goes on if read_whole
                                    # lifted the bound meanwhile, else it stops as it would have.  Whether jobs
                                    # are left past it (it would be cut short) is known now: its leaf's next is
                                    # peeked
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
                        top = pushpop(heap, (nxt[0], q, q))
                    elif factors is not None:  # (max(a, b, c) as max works it out: the first of the largest)
                        u, f = use[q], factors[q]
                        k = u[0] * f[0]
                        b = u[1] * f[1]
                        if b > k:
                            k = b
                        b = u[2] * f[2]
                        if b > k:
                            k = b
                        top = pushpop(heap, (k, nxt[0], q))
                    elif terms is not None:  # (fair share's key, the same operations on the same values)
                        top = pushpop(heap, ((past[q] + use[q][0] * tau) / rel[q], nxt[0], q))
                    else:
                        top = pushpop(heap, (key(q), nxt[0], q))
            if ahead:
                yield None  # (to admit: every job read ahead)
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

        # placement reads the walk until the GPUs of the jobs it selected reach the cluster's (prefix_plan's first
        # phase), so whatever it decides it reads every job before which the walk's jobs ask for fewer: the walk
        # hands those on at once, in its own loop (no frame resumed per job, here or in the walk's reader), and
        # waits after them (a yield admit takes) for placement to read on
        cap = cl.num_gpus
        reads_ahead = lazy and asked < cap and self.read_ahead
        walked = borrowing()
        if reads_ahead:
            next(walked)
        adm.walk = Walk(adm.guaranteed, adm.over, walked)
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
                      started: bool, pauses: bool) -> Iterator[Job | None]:
        """The borrowing walk by rank, every job taken (see :meth:`admit`): the jobs of ``jobs`` not in ``taken``,
        each appended to ``adm.over`` as it is handed on, until they ask for ``enough[0]`` GPUs (then it waits
        there when it ``pauses``, as the walk over the leaves does, and stops unless the bound was lifted;
        ``truncated`` when jobs are left).  ``started``: ``adm.over`` holds the jobs it handed on first (read
        ahead by admission, ``asked`` counting them); it goes on from the last of them."""
        over_append = adm.over.append
        # (the jobs not in taken read from jobs by loops here, not through a generator of their own: one frame
        # resumed per job handed on, not two)
        if not started:
            for j in jobs:
                if j.id not in taken:
                    break
            else:
                return
            over_append(j)
            yield j
            asked += j.spec.gpus  # (_demand's GPUs are float(spec.gpus): the same sum)
        while True:
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
            if nxt is None:
                return
            over_append(nxt)
            yield nxt
            asked += nxt.spec.gpus

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
        self._retire(last, None)

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
        if self._last is not adm:
            self._retire(self._last, view)
        self._last = adm

    #: the admissions superseded since the last admission in another view (another round), and that view
    #: (held weakly: a view kept past its round makes the driver copy its jobs at the next change)
    _retired: tuple[weakref.ref[View] | None, list[Admission]] | None = None

    def _retire(self, adm: Admission, view: View | None) -> None:
        """``adm`` was superseded, by an admission in ``view`` (None: by a copy, :meth:`note_appended`).  A lazy
        walk's generator holds the admission it fills, which holds the walk: a reference cycle that only the
        cyclic collector frees, and the simulator runs without it.  An admission superseded in a round may
        still be read in it; once another round admits, none is: those retired before let go of their walks
        (their generators are then freed with them)."""
        r = self._retired
        if r is not None and view is not None and (r[0] is None or r[0]() is not view):
            for a in r[1]:
                a.walk = None
            r = None
        if r is None:
            r = self._retired = (None if view is None else weakref.ref(view), [])
        r[1].append(adm)

    # the cross-queue order -------------------------------------------------------------------------
    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any] | None:
        """Key of a leaf in the progressive filling (lower first), or None: merge by the order policy's rank."""
        return None

    def share_terms(self) -> tuple[Sequence[float], float, Sequence[float]] | None:
        """After :meth:`share_key` of a one-level tree: ``(past, tau, weights)`` when the key of leaf ``q`` is
        ``(past[q] + use[q][0] * tau) / weights[q]`` (the walk then works it out inline); else None."""
        return None

    def drf_factors(self) -> Sequence[tuple[float, ...]] | None:
        """After :meth:`share_key` of a one-level tree: per leaf, the factors whose products with its use
        (GPUs, cores, MB) have the key as their largest, when the key is just that (the walk then works it
        out inline); else None."""
        return None


# ---------------------------------------------------------------------------------------------------
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

