"""Gavel (OSDI'20): heterogeneity-aware policies over effective throughput, and its round mechanism.

A job's *effective throughput* is its speed on each GPU type (the throughput
model's ``gpu_type`` factor, :mod:`gpuloom.perf.gputype`) weighted by the time
share ``X[j, t]`` it gets on that type.  A policy chooses ``X`` by solving a
linear program over the active jobs; the *mechanism* turns ``X`` into the
jobs that run in each round, and on which type:

* **policies** (``objective``), each a size stage:

  ======================  ==================================================================
  ``gavel`` (``las``)     max-min fairness (LAS): maximise the least effective throughput,
                          each normalised by the job's throughput under an equal split of
                          every type, times its GPUs, over its priority
                          (``attrs["priority"]``); Gavel's ``max_min_fairness_perf``
  ``gavel-ftf``           finish-time fairness: minimise the largest ratio of the finish
                          time under ``X`` to the one under an isolated share
                          (``finish_time_fairness_perf``), by bisection over the ratio
  ``gavel-makespan``      minimise the time by which every active job is done
                          (``min_total_duration_perf``), as one LP in 1/T
  ``gavel-throughput``    maximise the sum of the jobs' speeds (``max_sum_throughput_perf``)
  ``gavel-greedy``        no LP: in the order stage's order (FIFO, SRTF, ...), each job on
                          its fastest type with room (``fifo_perf``; with ``--order srtf``
                          the same over remaining work)
  ======================  ==================================================================

  ``-P aware=false`` gives the heterogeneity-*agnostic* baseline: the policy
  sees every type as equally fast (Gavel's ``max_min_fairness``: all
  throughputs 1; ``ftf``/``makespan``: the reference type's everywhere;
  ``greedy``: a random type with room), while jobs still run at their real speeds.

* **the round mechanism** (Gavel's ``scheduler.py``, simulation mode;
  :mod:`.gavel_rounds`): ``X`` is recomputed when the set of active jobs changed, at most every
  ``reset_interval`` seconds (1,920 s); then each job's time received per type
  is set back to half a round and what it was owed (``X`` times the time since
  the last reset, less what it got) is added to its *deficit*.  Each round,
  job ``j``'s priority on type ``t`` is ``X[j, t]`` over the fraction of type
  ``t``'s time it received (``X * 1e9`` before it received any; 0 where ``X``
  is 0 or it cannot run there).  Types are walked in turn (fastest first when
  aware, a seeded shuffle each round when agnostic), each type's jobs in order
  of (priority, deficit, share), and a job is given the first type with room
  for its GPUs; a job runs on one type per round.

The stage returns one request per job: those chosen this round ask for their
type (``Request.types``), the others for none (``()``), so placement (any
place policy, within the type's nodes) puts exactly the chosen jobs down,
largest first per type (Gavel's placement order), running jobs kept where they
are when their type is unchanged.  Time received is read from the jobs'
attained time between rounds, so rounds may come at any times (arrivals,
completions).  Queues compose: the queue stage admits, the LP shares what it
admitted.  Grouping (GPU sharing) does not: Gavel's space-sharing variant is
not implemented, and a stack with a group stage is refused when it is built.

The LPs go to HiGHS (:mod:`.gavel_lp`; interior point without crossover: an interior optimum,
as Gavel's ECOS gives, rather than a vertex that starves every job but the
least served).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..core.job import Job
from .base import View, register
from .gavel_lp import GavelError, solve_lp
from .gavel_rounds import Gavel

__all__ = ["Gavel", "GavelError", "GavelFTF", "GavelGreedy", "GavelLAS", "GavelMakespan", "GavelThroughput", "solve_lp"]


@register("size", "gavel", "gavel-las")
class GavelLAS(Gavel):
    """Max-min fairness over effective throughput (Gavel's LAS; see the module notes)."""

    objective = "las"
    symmetric = True

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        n, ntypes = speeds.shape
        r, k, gpus, caps = self._base(jobs, speeds)
        nvar = len(r)
        # each job's throughput under an equal split of every type (Gavel's ProportionalPolicy)
        prop = speeds @ (caps / caps.sum())
        coef = speeds[r, k] * gpus[r] / (self._weights(jobs)[r] * np.maximum(prop[r], 1e-12))
        # variables: x (nvar), z; maximise z with z <= sum_t coef x per job
        c = np.zeros(nvar + 1)
        c[-1] = -1.0
        z = np.full(n, nvar)
        rows = [r, np.arange(n)]
        cols = [np.arange(nvar), z]
        vals = [-coef, np.ones(n)]
        lo = [np.full(n, -np.inf)]
        hi = [np.zeros(n)]
        srows, scols, svals, slo, shi = self._share_rows(r, k, gpus, n, nvar, n, counts)
        lb = np.zeros(nvar + 1)
        ub = np.concatenate([np.ones(nvar), [np.inf]])
        x, obj = self._lp(c, lb, ub, rows + srows, cols + scols, vals + svals, np.concatenate(lo + [slo]),
                          np.concatenate(hi + [shi]), "max-min fairness")
        self.last_objective = -obj
        out = np.zeros((n, ntypes))
        out[r, k] = x[:nvar]
        return out


@register("size", "gavel-makespan")
class GavelMakespan(Gavel):
    """Minimise the time every active job needs to finish (Gavel's ``min_total_duration``)."""

    objective = "makespan"

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        n, ntypes = speeds.shape
        r, k, gpus, caps = self._base(jobs, speeds)
        nvar = len(r)
        rem = np.array([max(j.remaining_at(view.now), 1e-9) for j in jobs])
        # maximise u = 1/T: sum_t speed x >= remaining * u per job
        c = np.zeros(nvar + 1)
        c[-1] = -1.0
        u = np.full(n, nvar)
        rows = [r, np.arange(n)]
        cols = [np.arange(nvar), u]
        vals = [-speeds[r, k], rem]
        srows, scols, svals, slo, shi = self._share_rows(r, k, gpus, n, nvar, n)
        lb = np.zeros(nvar + 1)
        ub = np.concatenate([np.ones(nvar), [np.inf]])
        x, obj = self._lp(c, lb, ub, rows + srows, cols + scols, vals + svals,
                          np.concatenate([np.full(n, -np.inf), slo]), np.concatenate([np.zeros(n), shi]), "makespan")
        self.last_objective = 1.0 / -obj if obj < 0 else math.inf  # the makespan, seconds
        out = np.zeros((n, ntypes))
        out[r, k] = x[:nvar]
        return out


@register("size", "gavel-throughput")
class GavelThroughput(Gavel):
    """Maximise the sum of the jobs' speeds (Gavel's ``max_sum_throughput``, speeds relative to the reference)."""

    objective = "throughput"
    symmetric = True

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        n, ntypes = speeds.shape
        r, k, gpus, caps = self._base(jobs, speeds)
        nvar = len(r)
        srows, scols, svals, slo, shi = self._share_rows(r, k, gpus, n, nvar, 0, counts)
        weight = speeds[r, k] * (counts[r] if counts is not None else 1.0)
        x, obj = self._lp(-weight, np.zeros(nvar), np.ones(nvar), srows, scols, svals, slo, shi,
                          "total throughput")
        self.last_objective = -obj
        out = np.zeros((n, ntypes))
        out[r, k] = x
        return out


@register("size", "gavel-ftf")
class GavelFTF(Gavel):
    """Finish-time fairness (Themis' metric, Gavel's ``finish_time_fairness``): minimise the largest ratio
    of a job's finish time under ``X`` to its finish time under an isolated share of the cluster."""

    objective = "ftf"

    def __init__(self, aware: bool | str = True, reset_interval: float = 1920.0, round_len: float = 360.0,
                 shuffle_seed: int | None = None, solver: str = "ipm", time_limit: float = 60.0,
                 tolerance: float = 1e-3) -> None:
        super().__init__(aware, reset_interval, round_len, shuffle_seed, solver, time_limit)
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
        self.tolerance = float(tolerance)

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        n, ntypes = speeds.shape
        r, k, gpus, caps = self._base(jobs, speeds)
        nvar = len(r)
        now = view.now
        rem = np.array([max(j.remaining_at(now), 1e-9) for j in jobs])
        # isolated share (Gavel's IsolatedPolicy): 1/n of every type, over the job's GPUs, capped at 1
        xi = (caps / n)[None, :] / gpus[:, None]
        xi = xi / np.maximum(xi.sum(axis=1), 1.0)[:, None]
        iso = np.maximum((speeds * xi).sum(axis=1), 1e-12)
        spent = np.zeros(n)
        for i, j in enumerate(jobs):
            prev = self._iso.get(j.id)
            done = 0.0 if prev is None else prev[0] + max(prev[1] - rem[i], 0.0) / prev[2]
            spent[i] = done
            self._iso[j.id] = (done, float(rem[i]), float(iso[i]))
        isolated = spent + rem / iso
        since = np.array([now - j.spec.arrival for j in jobs])
        srows, scols, svals, slo, shi = self._share_rows(r, k, gpus, n, nvar, n)
        var = np.arange(nvar)

        def feasible(rho: float) -> np.ndarray | None:
            room = rho * isolated - since
            if np.any(room <= 0):
                return None
            need = rem / room  # each job's effective throughput must reach this
            try:
                x, _ = self._lp(np.zeros(nvar), np.zeros(nvar), np.ones(nvar), [r] + srows, [var] + scols,
                                [speeds[r, k]] + svals, np.concatenate([need, slo]),
                                np.concatenate([np.full(n, np.inf), shi]), "finish-time fairness")
            except GavelError:
                return None
            return x

        lo = max(float(np.max(since / isolated)), 1e-6)
        hi = max(lo * 2.0, 1.0)
        best = feasible(hi)
        while best is None and hi < 1e9:
            lo, hi = hi, hi * 4.0
            best = feasible(hi)
        if best is None:
            raise GavelError("finish-time fairness LP: no finite ratio is feasible")
        while hi - lo > self.tolerance * hi:
            mid = (lo + hi) / 2.0
            got = feasible(mid)
            if got is None:
                lo = mid
            else:
                hi, best = mid, got
        self.last_objective = hi
        out = np.zeros((n, ntypes))
        out[r, k] = best
        return out


@register("size", "gavel-greedy")
class GavelGreedy(Gavel):
    """No LP: the order stage's order, each job on its fastest type with room (Gavel's FIFO)."""

    objective = "greedy"

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError  # (never called: _choose walks the order)
