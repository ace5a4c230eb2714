"""Failure isolation in the service's rounds: one bad job must not stop scheduling for everyone.

Submission checks what it can (:mod:`.admission`); what still fails inside a
round is handled here:

* :func:`culprits` finds the jobs a failing plan cannot be made with: it
  plans (without acting) for a growing set of the active jobs, in arrival
  order, with their current allocations, and names each job whose addition
  makes planning raise.  Those jobs are failed with the error as their
  reason; the rest are planned again at once.
* :class:`Backoff` spaces out rounds that keep failing for another reason
  (0.1 s doubling to 30 s) and logs the first failure with its traceback and
  later ones in one line, with a note when rounds work again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from ...core.job import Job
from ...driver import Driver
from ...policies.base import View
from ...policies.free import FreeState

log = logging.getLogger("gpuloom.service")


def _plans(driver: Driver, jobs: Sequence[Job], now: float) -> str | None:
    """None if the scheduler can plan for ``jobs`` alone (with their current allocations), else the error."""
    current = {j.id: driver.current[j.id] for j in jobs if j.id in driver.current}
    # groups must not name jobs outside the set
    view = View(now, driver.cluster, list(jobs), current, driver.model, np.random.default_rng(0), driver.rounds,
                free=FreeState.of(driver.cluster, current))
    try:
        rnd = driver.scheduler.schedule(view)
        if driver.check:
            driver.scheduler.check(rnd, view)
        by_id = {j.id: j for j in jobs}
        for jid, a in rnd.plan.allocations.items():
            driver.model.speed(by_id[jid], a)
    except Exception as e:  # any error of a policy or the model is what we look for
        return f"{type(e).__name__}: {e}"
    return None


def culprits(driver: Driver, now: float) -> list[tuple[Job, str]]:
    """The jobs whose presence makes planning fail, with the error each caused (see the module notes).

    Jobs holding resources were planned before: they form the starting set when it plans on its own."""
    jobs = list(driver.jobs.values())
    holding = [j for j in jobs if j.id in driver.current]
    if holding and _plans(driver, holding, now) is None:
        kept, candidates = holding, [j for j in jobs if j.id not in driver.current]
    else:
        kept, candidates = [], jobs
    bad: list[tuple[Job, str]] = []
    for job in candidates:
        err = _plans(driver, [*kept, job], now)
        if err is None:
            kept.append(job)
        else:
            bad.append((job, err))
    return bad


class Backoff:
    """Exponential backoff and log-once for rounds that fail."""

    def __init__(self, base: float = 0.1, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def failed(self, store_down: BaseException | None = None) -> float:
        """Note a failed round (logging it); returns how long to wait before the next.  A round that failed
        on the store's state (``store_down``: its disk full, the database unreachable) is logged in one line:
        its traceback says nothing the error does not."""
        self.failures += 1
        delay = min(self.cap, self.base * 2 ** (self.failures - 1))
        if self.failures == 1 and store_down is not None:
            log.error("scheduling round failed: the store cannot answer (%s); retrying", str(store_down).splitlines()[0])
        elif self.failures == 1:
            log.exception("scheduling round failed; retrying with backoff (up to %.0f s); "
                          "further failures are logged in one line", self.cap)
        else:
            log.debug("scheduling round failed again (%d in a row); next try in %.1f s", self.failures, delay)
        return delay

    def succeeded(self) -> None:
        if self.failures:
            log.warning("scheduling rounds work again after %d failed ones", self.failures)
            self.failures = 0
