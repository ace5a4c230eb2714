"""The queue stage's book of active jobs per leaf queue, and the lazy walk of what it admits.

Admission (:mod:`.queues`) walks each leaf queue's jobs in the order policy's
order.  Under FIFO that order is the order in which the driver admitted the jobs
(:class:`~gpuloom.policies.order.FIFO` hands on ``View.jobs`` as it is), so a
:class:`QueueBook` that hears the driver's admissions and ends
(:class:`~gpuloom.driver.Listener`) keeps every leaf's jobs in order, and a round
reads the front of each leaf instead of sorting tens of thousands of queued jobs
into leaves: O(changes + what it reads).  A book is used only for views of the
driver it follows (``View.tally``) whose jobs it counts; anything else (a test's
view, another driver) is admitted from the ordered jobs as before.

:class:`Walk` is the sequence placement reads: the guaranteed jobs, then the
borrowing ones as a generator yields them (the cross-queue walk goes only as
far as placement reads: :func:`~gpuloom.policies.incremental.prefix_plan` stops
at the prefix that fills the cluster and at the end of its backfill).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, overload

from ..core.job import Job

if TYPE_CHECKING:
    from .base import View
    from .incremental import Tally


class QueueBook:
    """Per leaf, its active jobs as ``id -> (rank, job)`` in the driver's admission order (see the module
    notes), and how many of them have a priority (``prioritised``)."""

    __slots__ = ("tally", "size", "seq", "pending", "leaves", "where", "prioritised", "version", "changed", "ended",
                 "arrived", "idle", "sizes", "held", "exact")

    def __init__(self, tally: Tally | None = None) -> None:
        self.tally = tally  # the driver followed (its tally identifies its views)
        self.size = 0  # active jobs heard of
        self.seq = 0
        self.pending: dict[str, tuple[int, Job]] = {}  # admitted, not put in a leaf yet (its queue may be new)
        self.leaves: dict[int, dict[str, tuple[int, Job]]] = {}
        self.where: dict[str, tuple[int, bool]] = {}  # job id -> its leaf, whether it has a priority
        self.prioritised: dict[int, int] = {}  # leaf -> its jobs with a priority
        self.version: Any = None  # the tree the leaves were filled for
        self.changed: set[int] = set()  # leaves whose jobs changed since the reader last cleared this
        #: leaf -> the ranks of its jobs that ended since the reader last cleared this, when that is all that
        #: changed of them (else the leaf is in ``changed``; an ended job with a priority puts it there)
        self.ended: dict[int, list[int]] = {}
        #: leaf -> the jobs :meth:`fill` put last in it since the reader last cleared this (the leaf is in
        #: ``changed`` too when the tree changed)
        self.arrived: dict[int, list[Job]] = {}
        self.idle: dict[int, dict[int, int]] = {}  # leaf -> {GPUs asked: its waiting jobs asking that many}
        self.sizes: dict[int, dict[int, int]] = {}  # leaf -> {GPUs asked: its jobs asking that many}
        #: leaf -> [GPUs, cores, MB] its filled jobs hold now (each job's share, as usage() counts it)
        self.held: dict[int, list[float]] = {}
        #: no job of a group was ever held since the leaves were filled: every share summed in ``held`` is a
        #: whole number, so the sums are exact in any order (a group's share is a fraction)
        self.exact = True

    # the driver's changes (a Listener) ---------------------------------------------------------
    def on_admit(self, job: Job) -> None:
        self.seq += 1
        self.pending[job.id] = (self.seq, job)
        self.size += 1

    def on_hold(self, job: Job, old: Any, new: Any) -> None:
        w = self.where.get(job.id)
        if (old is None) != (new is None) and w is not None:
            self._count(w[0], job.spec.gpus, 1 if new is None else -1)
        if w is not None:
            if old is not None:
                self._hold(w[0], old, -1)
            if new is not None:
                self._hold(w[0], new, 1)

    def _hold(self, q: int, a: Any, sign: int) -> None:
        if a.group:
            self.exact = False
        u = self.held.get(q)
        if u is None:
            u = self.held[q] = [0.0, 0.0, 0.0]
        u[0] += sign * (a.num_gpus / (1 + len(a.group)))
        u[1] += sign * float(a.cpus)
        u[2] += sign * float(a.mem_mb)

    def _count(self, q: int, gpus: int, sign: int, into: dict[int, dict[int, int]] | None = None) -> None:
        into = self.idle if into is None else into
        sizes = into.get(q)
        if sizes is None:
            sizes = into[q] = {}
        n = sizes.get(gpus, 0) + sign
        if n:
            sizes[gpus] = n
        else:
            del sizes[gpus]

    def on_end(self, job: Job) -> None:
        jid = job.id
        if self.pending.pop(jid, None) is None:
            w = self.where.pop(jid, None)
            if w is not None:
                rank = self.leaves[w[0]].pop(jid)[0]
                if w[1]:
                    self.changed.add(w[0])
                else:
                    ended = self.ended.get(w[0])
                    if ended is None:
                        self.ended[w[0]] = [rank]
                    else:
                        ended.append(rank)
                self._count(w[0], job.spec.gpus, -1, self.sizes)
                if job.alloc is None:
                    self._count(w[0], job.spec.gpus, -1)
                if w[1]:
                    self.prioritised[w[0]] -= 1
        self.size -= 1

    # reading -------------------------------------------------------------------------------------
    def follows(self, view: View) -> bool:
        """Whether this book counts exactly ``view``'s active jobs (a view of the driver it follows)."""
        return self.tally is not None and view.tally is self.tally and self.size == len(view.jobs)

    def new_jobs(self) -> list[Job]:
        """The jobs admitted since the last :meth:`fill`."""
        return [j for _, j in self.pending.values()]

    def fill(self, version: Any,
             leaf_of: Callable[[Job], tuple[int, bool]]) -> dict[int, dict[str, tuple[int, Job]]]:
        """Put the jobs admitted since the last call in their leaves (``leaf_of``: a job's leaf, and whether it
        has a priority; every job again when the tree changed: ``version``) and return the leaves."""
        if version != self.version:
            every = sorted([*self.pending.values(), *(x for d in self.leaves.values() for x in d.values())],
                           key=lambda x: x[0])
            self.leaves, self.where, self.prioritised, self.version = {}, {}, {}, version
            self.idle, self.sizes, self.held, self.exact = {}, {}, {}, True
            self.ended, self.arrived = {}, {}
            changed = self.changed
        else:
            every = list(self.pending.values())
            changed = None
        arrived = self.arrived
        self.pending = {}
        leaves, where, prioritised = self.leaves, self.where, self.prioritised
        for x in every:
            j = x[1]
            q, prio = leaf_of(j)
            where[j.id] = (q, prio)
            d = leaves.get(q)
            if d is None:
                d = leaves[q] = {}
            d[j.id] = x
            if changed is not None:
                changed.add(q)
            else:
                new = arrived.get(q)
                if new is None:
                    arrived[q] = [j]
                else:
                    new.append(j)
            self._count(q, j.spec.gpus, 1, self.sizes)
            if j.alloc is None:
                self._count(q, j.spec.gpus, 1)
            else:
                self._hold(q, j.alloc, 1)
            if prio:
                prioritised[q] = prioritised.get(q, 0) + 1
        return leaves


    def smallest_waiting(self, q: int) -> float:
        """The fewest GPUs a waiting job of leaf ``q`` asks for (``inf``: none waits); filled leaves only."""
        sizes = self.idle.get(q)
        return min(sizes) if sizes else math.inf


class Walk(Sequence[Job]):
    """The guaranteed jobs, then the borrowing ones ``more`` yields, read as one sequence; each job read is
    kept in ``over`` (the admission's list), so reading again from the start costs no new walk."""

    __slots__ = ("guaranteed", "over", "more", "go_on")

    def __init__(self, guaranteed: list[Job], over: list[Job], more: Iterator[Job | None] | None) -> None:
        self.guaranteed = guaranteed
        self.over = over
        self.more = more
        #: asked when the walk waits at its bound (``Admission.paused``) as a reader reads on: True when it lifted
        #: the bound (the reading goes on), else the reading ends there
        self.go_on: Callable[[], bool] | None = None

    def _pull(self) -> bool:
        more = self.more
        if more is None:
            return False
        for _ in more:  # (one job: the generator appends it to over; or None, a wait at the walk's bound)
            return True
        self.more = None
        return False

    def finish(self) -> None:
        """Read to the end (``over`` is then the whole of what the admission hands on)."""
        while self._pull():
            pass

    def __iter__(self) -> Iterator[Job]:
        # the lists' own iterators where they suffice (they see what is appended meanwhile): no generator
        # frame resumed per job for the guaranteed jobs, nor for a walk read to its end
        if self.more is None:
            return chain(self.guaranteed, self.over)
        return chain(self.guaranteed, self._walked())

    def _walked(self) -> Iterator[Job]:
        over = self.over
        i = 0
        while True:
            n = len(over)
            if i < n:  # (what was read already, by this iterator or another; then look again)
                yield from islice(over, i, n)
                i = n
                continue
            more = self.more
            if more is None:
                return
            # the walk's jobs one by one, as yielded (the generator appends each to over, at index i)
            for j in more:
                if j is None:  # (the walk waits at its bound, Admission.paused: this reading ends there, unless
                    # the bound is lifted now)
                    go_on = self.go_on
                    if go_on is not None and go_on():
                        continue
                    return
                i += 1
                yield j
                if len(over) != i:  # (another reader pulled meanwhile, or over changed: read it again)
                    break
            else:
                self.more = None
                if len(over) <= i:
                    return

    def __len__(self) -> int:
        self.finish()
        return len(self.guaranteed) + len(self.over)

    @overload
    def __getitem__(self, i: int) -> Job: ...
    @overload
    def __getitem__(self, i: slice) -> list[Job]: ...
    def __getitem__(self, i: int | slice) -> Job | list[Job]:
        if isinstance(i, slice) and i.stop is not None and i.stop >= 0 and (i.start or 0) >= 0:
            need = i.stop - len(self.guaranteed)
            while len(self.over) < need and self._pull():
                pass
            return (self.guaranteed + self.over)[i]
        self.finish()
        return (self.guaranteed + self.over)[i]
