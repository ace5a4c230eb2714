"""Each leaf's guaranteed tier kept between rounds: whether a tier the queue stage's admission cached still holds
after jobs of its leaf ended or arrived, and where its walk goes on from when it does not (:mod:`.queues`'s
``QuotaQueues.admit`` walks the tiers; :data:`~.queue_state.TierA` is what it caches per leaf)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import itemgetter

from ..core.job import Job
from .queue_state import _EPS, TierA, Triple, _demand

_rank = itemgetter(0)


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


def _retaken(hit: TierA, k: int, first: int, ended: Sequence[int]) -> tuple[list[tuple[int, Job]], list[Triple]]:
    """The jobs a leaf's tier walk, gone on from the job of rank ``first`` (the ``k``-th it took: :func:`_resume_tier`),
    takes next, when the tier ``hit`` passed no job before its last (no gaps): its jobs past that one less those that
    ended (the ranks ``ended``), and what each asks.  The list there is the tier's jobs in order less the ended ones
    (jobs that arrive join its end), and each of them fits again: what the walk has summed before one is the old
    sum less the jobs that ended, and adding a job's non-negative demand to a float sum never lowers it, so the
    sums are at most those the tier met and (IEEE addition being monotone) each test that passed passes again; the
    walk did not stop before its last take, and stops no sooner with less summed.  No job is passed among them, so
    the tier is still without gaps."""
    mine, ds = hit[0], hit[1]
    if len(ended) == 1:  # (the one that ended is mine[k]: every job past it is taken again)
        return mine[k + 1:], ds[k + 1:]
    gone = set(ended)
    more, more_ds = [], []
    for x, d in zip(mine[k + 1:], ds[k + 1:], strict=True):
        if x[0] not in gone:
            more.append(x)
            more_ds.append(d)
    return more, more_ds


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


