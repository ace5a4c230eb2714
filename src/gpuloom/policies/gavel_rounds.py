"""Gavel's round mechanism (:mod:`.gavel` has the notes): the base class of its size stages, which keeps
each job's time received and deficit per GPU type, recomputes the allocation ``X`` on resets, walks the
types each round, and builds the LPs' shared rows (each policy's objective is in :mod:`.gavel`)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..core.cluster import Cluster
from ..core.fit import spec_types
from ..core.job import Job
from ..core.parse import normalise_gpu_type
from ..core.plan import Plan
from ..perf.gputype import GpuTypeFactor
from .base import GroupPolicy, PlacePolicy, Request, SizePolicy, Stage, View, parse_flag
from .gavel_lp import GavelError, solve_lp

log = logging.getLogger("gpuloom.policies.gavel")
_BIG = 1e9  # Gavel's priority for a share not yet served (so 2 x it > it)


def _default_factor(cluster: Cluster) -> Any:
    from ..perf.gputype import GpuTypeFactor, TypeSpeeds

    return GpuTypeFactor(TypeSpeeds(source="none: every type at the reference speed"), cluster)


class _Share:
    """One active job's mechanism state: time received per type since the last reset, deficit per type."""

    __slots__ = ("job", "time", "deficit", "seen", "ran_on")

    def __init__(self, job: Job, types: int, half_round: float, attained: float) -> None:
        self.job = job
        self.time = [half_round] * types
        self.deficit = [0.0] * types
        self.seen = attained  # attained time at the last accounting
        self.ran_on: int | None = None  # the type it was given at the last round


class Gavel(SizePolicy):
    """Gavel's policies and round mechanism (see the module notes); ``objective`` picks the policy."""

    dynamic: ClassVar[bool] = True
    requires_factors: ClassVar[Mapping[str, Any]] = {"gpu_type": _default_factor}
    objective: ClassVar[str] = "las"
    negotiates: ClassVar[bool] = True  # places type by type (allocate)

    def __init__(self, aware: bool | str = True, reset_interval: float = 1920.0, round_len: float = 360.0,
                 shuffle_seed: int | None = None, solver: str = "ipm", time_limit: float = 60.0) -> None:
        self.aware = parse_flag(aware, "aware")
        if not reset_interval >= 0:
            raise ValueError(f"reset_interval must be >= 0 seconds, got {reset_interval}")
        if not round_len > 0:
            raise ValueError(f"round_len must be > 0 seconds, got {round_len}")
        if solver not in ("ipm", "simplex"):
            raise ValueError(f"solver must be ipm or simplex, got {solver!r}")
        if not time_limit > 0:
            raise ValueError(f"time_limit must be > 0, got {time_limit}")
        self.reset_interval = float(reset_interval)
        self.round_len = float(round_len)
        self.solver = solver
        self.time_limit = float(time_limit)
        self._shuffle = None if shuffle_seed is None else random.Random(int(shuffle_seed))
        self._cluster: Cluster | None = None
        self._types: tuple[str, ...] = ()
        self._speeds: dict[str, tuple[Any, list[float]]] = {}  # job id -> (its speeds' cache entry, per type)
        self._caps: list[int] = []
        self._shares: dict[str, _Share] = {}
        self._worker = [0.0]  # time given per type since the last reset (Gavel's worker_time_so_far)
        self._alloc: dict[str, list[float]] = {}  # X: job id -> share per type
        self._last_reset: float | None = None
        self._alloc_jobs: frozenset[str] = frozenset()
        self._synced: tuple[float, int] | None = None
        self._last: tuple[tuple[float, int], list[Request]] | None = None
        # ftf: job -> (isolated time so far, remaining then, isolated speed then)
        self._iso: dict[str, tuple[float, float, float]] = {}
        self.lp_solves = 0
        self.lp_seconds = 0.0
        self.last_lp_seconds = 0.0
        self.last_objective: float | None = None
        self.last_fallback: str | None = None  # why the last allocation fell back to equal shares

    # -- the stack ----------------------------------------------------------------------------
    def refuse(self, stages: Mapping[str, Stage]) -> str | None:
        group = stages.get("group")
        if isinstance(group, GroupPolicy) and group.merges:
            return (f"size policy {self.name!r} time-shares whole GPUs; GPU sharing (group={group.name}) is "
                    f"Gavel's space-sharing variant, which gpuloom does not implement: use group=none")
        return None

    def pending_reasons(self, plan: Plan, view: View) -> Mapping[str, str]:
        """A job larger than every type it may use waits for good: Gavel runs a job on one type."""
        out: dict[str, str] = {}
        caps = dict(zip(self._types, self._caps, strict=True))
        for j in view.jobs:
            if j.id in plan.allocations:
                continue
            ask = spec_types(j.spec) if j.spec.attrs else None
            most = max((c for t, c in caps.items() if ask is None or t in ask), default=0)
            if j.spec.gpus > most:
                out[j.id] = f"GpuType (one type at most has {most} GPUs)"
        return out

    def stats(self) -> dict[str, Any]:
        return {"lp_solves": self.lp_solves, "lp_seconds": round(self.lp_seconds, 6),
                "last_lp_seconds": round(self.last_lp_seconds, 6)}

    # -- per-type data --------------------------------------------------------------------------
    def _setup(self, view: View) -> None:
        cl = view.cluster
        if cl is self._cluster:
            return
        self._cluster = cl
        types = cl.gpu_types
        if types != self._types:
            self._types = types
            caps = dict.fromkeys(types, 0)
            for n in cl.nodes:
                if n.gpus:
                    caps[normalise_gpu_type(n.gpu_type)] += n.gpus
            self._caps = [caps[t] for t in types]
            self._shares.clear()
            self._alloc.clear()
            self._worker = [0.0] * len(types)
            self._last_reset = None

    def speeds(self, job: Job, view: View) -> list[float]:
        """The job's speed on each type (0 where its own ask forbids the type)."""
        f = view.model.get("gpu_type")
        sp = f.speeds(job) if f is not None else {}  # type: ignore[attr-defined]
        hit = self._speeds.get(job.id)
        if hit is not None and hit[0] is sp:
            return hit[1]
        out = [sp.get(t, 1.0) for t in self._types]
        ask = spec_types(job.spec) if job.spec.attrs else None
        if ask is not None:
            out = [s if t in ask else 0.0 for s, t in zip(out, self._types, strict=True)]
        self._speeds[job.id] = (sp, out)
        return out

    def _seen_speeds(self, job: Job, view: View, real: list[float]) -> list[float]:
        """What the policy sees: the real speeds (aware), or every type alike (agnostic)."""
        if self.aware:
            return real
        if self.objective == "las":
            return [1.0 if r > 0 or not self._forbidden(job, t) else 0.0 for r, t in zip(real, self._types, strict=True)]
        ref = self._reference_speed(job, view, real)
        return [ref if r > 0 or not self._forbidden(job, t) else 0.0 for r, t in zip(real, self._types, strict=True)]

    def _forbidden(self, job: Job, t: str) -> bool:
        ask = spec_types(job.spec) if job.spec.attrs else None
        return ask is not None and t not in ask

    def _reference_speed(self, job: Job, view: View, real: list[float]) -> float:
        f = view.model.get("gpu_type")
        ref = f.matrix.reference if isinstance(f, GpuTypeFactor) else None
        if ref in self._types:
            return real[self._types.index(ref)] or max(real, default=1.0)
        return max(real, default=1.0)

    # -- accounting -------------------------------------------------------------------------------
    def _sync(self, view: View, jobs: Sequence[Job]) -> None:
        """Count the time each job received since the last round, on the type it was given."""
        shares = self._shares
        now = view.now
        worker = self._worker
        active = set()
        half = self.round_len / 2.0
        for j in jobs:
            jid = j.id
            active.add(jid)
            sh = shares.get(jid)
            att = j.attained_at(now)
            if sh is None:
                shares[jid] = _Share(j, len(self._types), half, att)
                continue
            t = sh.ran_on
            a = j.alloc
            if a is not None and t is None:  # running on what no round of ours gave it (a restart)
                t = self._type_of(a, view)
            if t is not None:
                dt = att - sh.seen
                if dt > 0:
                    sh.time[t] += dt
                    worker[t] += dt
            sh.seen = att
            sh.job = j
        for jid in [k for k in shares if k not in active]:
            sh = shares.pop(jid)
            self._alloc.pop(jid, None)
            self._speeds.pop(jid, None)
            self._iso.pop(jid, None)
            if sh.ran_on is not None:  # its last round counts for the type's total (Gavel's worker time)
                worker[sh.ran_on] += max(sh.job.attained_at(now) - sh.seen, 0.0)

    def _type_of(self, alloc: Any, view: View) -> int | None:
        t = normalise_gpu_type(view.cluster.nodes[alloc.parts[0].node].gpu_type)
        return self._types.index(t) if t in self._types else None

    def _reset(self, view: View) -> None:
        """Gavel's ``_reset_time_run_so_far``: deficits take what each job was owed since the last reset."""
        now = view.now
        elapsed = now - (self._last_reset if self._last_reset is not None else now)
        half = self.round_len / 2.0
        worker = [0.0] * len(self._types)
        for jid, sh in self._shares.items():
            x = self._alloc.get(jid)
            for t in range(len(self._types)):
                should = x[t] * elapsed if x is not None else 0.0
                sh.deficit[t] += should - (sh.time[t] - half)
                sh.time[t] = half
                worker[t] += half
        self._worker = worker
        self._last_reset = now

    # -- one round --------------------------------------------------------------------------------
    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        stamp = (view.now, view.round_index)
        last = self._last
        ids = [u[0].id for u in units]
        if last is not None and last[0] == stamp and [r.jobs[0].id for r in last[1]] == ids:
            return last[1]  # the same round asked again (a queue's second pass): the same answer
        for u in units:
            if len(u) != 1:
                raise GavelError(f"size policy {self.name!r} sizes lone jobs; got a group of {len(u)}")
        self._setup(view)
        jobs = [u[0] for u in units]
        if self._synced != stamp:
            self._sync(view, jobs)
            self._synced = stamp
        chosen = self._choose(jobs, view)
        out: list[Request] = []
        for j in jobs:
            sp = j.spec
            t = chosen.get(j.id)
            out.append(Request((j,), sp.gpus, sp.cpus, sp.mem_mb, () if t is None else (self._types[t],)))
            sh = self._shares.get(j.id)
            if sh is not None:
                sh.ran_on = t
        self._last = (stamp, out)
        return out

    def allocate(self, requests: list[Request], view: View, place: PlacePolicy, preemptive: bool) -> Plan:
        """Place the chosen jobs type by type (in the walk's type order), largest first within a type
        (Gavel's placement order), then the rest (which ask for no type: they stay waiting)."""
        rank = {t: i for i, t in enumerate(self._walk_types)} if self._walk_types else {}
        chosen = [(rank.get(r.types[0], 0), -r.gpus, i) for i, r in enumerate(requests) if r.types]
        chosen.sort()
        arranged = [requests[i] for _, _, i in chosen] + [r for r in requests if not r.types]
        return place.place(arranged, view, preemptive)

    _walk_types: tuple[str, ...] = ()

    def _choose(self, jobs: Sequence[Job], view: View) -> dict[str, int]:
        """Job id -> the type index it runs on this round."""
        real = {j.id: self.speeds(j, view) for j in jobs}
        if self.objective == "greedy":
            return self._greedy(jobs, view, real)
        active = frozenset(real)
        if active != self._alloc_jobs and (self._last_reset is None or self.reset_interval <= 0
                                           or view.now - self._last_reset >= self.reset_interval
                                           or self._last_reset == 0.0):
            self._reset(view)
            self._allocation(jobs, view, real)
            self._alloc_jobs = active
        return self._walk(jobs, view, real)

    def _type_order(self, view: View, speeds: np.ndarray) -> list[int]:
        n = len(self._types)
        if self.aware:
            # fastest first: by the mean speed of the active jobs (V100, P100, K80 for Gavel's jobs)
            mean = speeds.sum(axis=0).tolist() if len(speeds) else [0.0] * n
            return sorted(range(n), key=lambda t: -mean[t])
        order = list(range(n))
        if self._shuffle is None:
            self._shuffle = random.Random(int(view.rng.integers(2**31)))
        self._shuffle.shuffle(order)
        return order

    def _walk(self, jobs: Sequence[Job], view: View, real: Mapping[str, list[float]]) -> dict[str, int]:
        """Gavel's ``_schedule_jobs_on_workers_helper``: per type, jobs by (priority, deficit, share),
        ties by arrival; a job takes the first type whose turn reaches it with room for its GPUs.
        (In arrays: the same arithmetic as Gavel's, per element.)"""
        n, ntypes = len(jobs), len(self._types)
        ids = [j.id for j in jobs]
        speeds = np.array([real[i] for i in ids], dtype=float).reshape(n, ntypes)
        types = self._type_order(view, speeds)
        self._walk_types = tuple(self._types[t] for t in types)
        if not n:
            return {}
        zero = [0.0] * ntypes
        x = np.array([self._alloc.get(i, zero) for i in ids], dtype=float)
        shares = self._shares
        got = np.array([shares[i].time for i in ids], dtype=float)
        deficit = np.array([shares[i].deficit for i in ids], dtype=float)
        index = np.array([j.index for j in jobs])
        gpus = [j.spec.gpus for j in jobs]
        worker = self._worker
        left = list(self._caps)
        out: dict[str, int] = {}
        for t in types:  # each type's turn walks its whole queue before the next type's (Gavel's order)
            xt = x[:, t]
            w = worker[t]
            frac = got[:, t] / w if w > 0 else np.zeros(n)
            with np.errstate(divide="ignore", invalid="ignore"):
                prio = np.where(frac > 0, xt / frac, xt * _BIG)
            prio = np.where((xt == 0.0) | (speeds[:, t] <= 0), 0.0, prio)
            order = np.lexsort((index, -xt, -deficit[:, t], -prio))
            room = left[t]
            for i in order.tolist():
                if room <= 0:
                    break
                jid = ids[i]
                g = gpus[i]
                if jid in out or g > room or speeds[i, t] <= 0:
                    continue
                room -= g
                out[jid] = t
            left[t] = room
        return out

    def _type_order_fastest(self, jobs: Sequence[Job], real: Mapping[str, list[float]]) -> list[int]:
        n = len(self._types)
        mean = [sum(real[j.id][t] for j in jobs) for t in range(n)]
        return sorted(range(n), key=lambda t: -mean[t])

    def _greedy(self, jobs: Sequence[Job], view: View, real: Mapping[str, list[float]]) -> dict[str, int]:
        """In the given order, each job on its fastest type with room (agnostic: a random one)."""
        left = list(self._caps)
        n = len(self._types)
        fastest = self._type_order_fastest(jobs, real)
        self._walk_types = tuple(self._types[t] for t in fastest)
        out: dict[str, int] = {}
        if not self.aware and self._shuffle is None:
            self._shuffle = random.Random(int(view.rng.integers(2**31)))
        for j in jobs:
            g = j.spec.gpus
            sp = real[j.id]
            fit = [t for t in range(n) if left[t] >= g and sp[t] > 0]
            if not fit:
                if all(left[t] < 1 for t in range(n)):
                    break
                continue
            if self.aware:
                t = max(fit, key=lambda t: (sp[t], -fastest.index(t)))
            else:
                assert self._shuffle is not None
                t = fit[self._shuffle.randrange(len(fit))]
            left[t] -= g
            out[j.id] = t
        return out

    # -- the allocation LPs -----------------------------------------------------------------------
    def _allocation(self, jobs: Sequence[Job], view: View, real: Mapping[str, list[float]]) -> None:
        seen = {j.id: self._seen_speeds(j, view, real[j.id]) for j in jobs}
        runnable = [j for j in jobs if any(s > 0 for s in seen[j.id])]
        self._alloc = {}
        if not runnable:
            return
        t0 = time.process_time()  # (CPU seconds: what the solve costs, whatever else the machine runs)
        try:
            self._solve_all(runnable, view, seen)
        except GavelError as e:  # the solver found no optimum: an equal split of every type until the next reset
            self.last_fallback = str(e)
            log.warning("size policy %s: %s; equal shares until the next allocation", self.name, e)
            caps = np.array(self._caps, dtype=float)
            share = caps / max(float(caps.sum()), 1.0)  # Gavel's ProportionalPolicy: n_t / N of each type
            self._alloc = {j.id: [float(x) if s > 0 else 0.0 for x, s in zip(share, seen[j.id], strict=True)]
                           for j in runnable}
        self.last_lp_seconds = time.process_time() - t0
        self.lp_seconds += self.last_lp_seconds
        self.lp_solves += 1

    def _solve_all(self, runnable: Sequence[Job], view: View, seen: Mapping[str, list[float]]) -> None:
        if self.symmetric:
            # jobs alike (speeds, GPUs, priority) get alike shares at an optimum: solve for one of each kind,
            # with the kind's count in the capacity rows (26 job types of Gavel's: 78 variables, not 30,000)
            kinds: dict[tuple, list[Job]] = {}
            for j in runnable:
                kinds.setdefault((tuple(seen[j.id]), j.spec.gpus, self._weight(j)), []).append(j)
            reps = [m[0] for m in kinds.values()]
            counts = np.array([len(m) for m in kinds.values()], dtype=float)
            x = self.solve(reps, view, np.array([seen[j.id] for j in reps], dtype=float), counts)
            rows = np.clip(x, 0.0, 1.0).tolist()
            self._alloc = {j.id: row for m, row in zip(kinds.values(), rows, strict=True) for j in m}
        else:
            x = self.solve(runnable, view, np.array([seen[j.id] for j in runnable], dtype=float))
            self._alloc = {j.id: row for j, row in zip(runnable, np.clip(x, 0.0, 1.0).tolist(), strict=True)}

    #: the objective is symmetric in jobs alike (max-min, sums): the LP may be solved per kind of job
    symmetric: ClassVar[bool] = False

    def solve(self, jobs: Sequence[Job], view: View, speeds: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """The time shares ``X`` (jobs x types) of the objective, for ``speeds`` (jobs x types); ``counts``:
        how many jobs each row stands for (1 each by default)."""
        raise NotImplementedError

    # helpers shared by the LPs
    def _weights(self, jobs: Sequence[Job]) -> np.ndarray:
        return np.array([self._weight(j) for j in jobs])

    @staticmethod
    def _weight(j: Job) -> float:
        """The job's priority weight (``attrs["priority"]``, Gavel's ``priority_weight``; 1 by default)."""
        w = j.spec.attrs.get("priority", 1.0) if j.spec.attrs else 1.0
        try:
            w = float(w)
        except (TypeError, ValueError):
            raise GavelError(f"job {j.id}: priority must be a number, got {w!r}") from None
        if not w > 0:
            raise GavelError(f"job {j.id}: priority must be > 0, got {w}")
        return w

    def _base(self, jobs: Sequence[Job], speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row index, type index) of each variable (a job on a type where it can run), the jobs' GPUs,
        and the capacity of each type."""
        rows, cols = np.nonzero(speeds > 0)
        gpus = np.array([j.spec.gpus for j in jobs], dtype=float)
        return rows, cols, gpus, np.array(self._caps, dtype=float)

    def _lp(self, c: np.ndarray, lb: np.ndarray, ub: np.ndarray, rows: list[np.ndarray], cols: list[np.ndarray],
            vals: list[np.ndarray], row_lo: np.ndarray, row_hi: np.ndarray, what: str) -> tuple[np.ndarray, float]:
        """min c.x subject to row_lo <= A x <= row_hi, lb <= x <= ub (A from triplets) with HiGHS."""
        return solve_lp(c, lb, ub, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), row_lo, row_hi,
                        what, self.solver, self.time_limit)

    def _share_rows(self, r: np.ndarray, k: np.ndarray, gpus: np.ndarray, n: int, nvar: int,
                    first_row: int, counts: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                               list[np.ndarray], np.ndarray, np.ndarray]:
        """Rows of the constraints every policy shares: per type, the GPUs its shares use fit it; per
        job, its shares add up to at most 1.  Rows start at ``first_row``; ``counts``: jobs per row."""
        ntypes = len(self._types)
        var = np.arange(nvar)
        rows = [first_row + k, first_row + ntypes + r]
        cols = [var, var]
        vals = [gpus[r] * (counts[r] if counts is not None else 1.0), np.ones(nvar)]
        lo = np.full(ntypes + n, -np.inf)
        hi = np.concatenate([np.array(self._caps, dtype=float), np.ones(n)])
        return rows, cols, vals, lo, hi
