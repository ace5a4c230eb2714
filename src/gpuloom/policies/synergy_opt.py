"""Synergy-OPT: the two linear programs (allocation, then placement), TUNE for what they leave.

Split from :mod:`gpuloom.policies.synergy` (the shared sizer machinery, GREEDY
and TUNE); the algorithm is described there, under ``opt``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.job import Job
from ..core.plan import Part, Plan
from ..perf.sensitivity import DEFAULT_THRESHOLD, default_grid
from .base import Request, View, register, split_parts
from .synergy import _ref_node, _Round, _SynergySizer

log = logging.getLogger("gpuloom.policies.synergy")


# ---------------------------------------------------------------------------
def _candidates(
    sizer: _SynergySizer, job: Job, view: View, req: Request
) -> tuple[list[tuple[int, int]], list[float]]:
    """Pareto-efficient (cores, MB) points at least as fast as proportional, with their relative speeds."""
    rn = _ref_node(view)
    node = view.cluster.nodes[rn]
    g = req.gpus
    pc, pm = view.cluster.proportional(rn, g) if g <= node.gpus else (
        view.cluster.total_cpus * g // max(view.cluster.num_gpus, 1),
        view.cluster.total_mem_mb * g // max(view.cluster.num_gpus, 1),
    )
    p = sizer.profile(job, view)
    if p is None or g > node.gpus:
        c = pc if req.cpus is None else req.cpus
        m = pm if req.mem_mb is None else req.mem_mb
        return [(c, m)], [1.0]
    base = p.throughput_at(pc, pm, g)
    if base <= 0:
        return [(pc, pm)], [1.0]
    cps, mps = default_grid(p, g, node.cpus, node.mem_mb)
    pts = {(c, m): p.throughput_at(c, m, g) / base for c in cps for m in mps}
    pts[(pc, pm)] = 1.0
    good = [(c, m, s) for (c, m), s in pts.items() if s >= 1.0 - 1e-12]
    # Pareto: drop points dominated (more or equal resources, no more speed)
    good.sort(key=lambda t: (t[0], t[1], -t[2]))
    keep: list[tuple[int, int, float]] = []
    for c, m, s in good:
        if any(kc <= c and km <= m and ks >= s - 1e-12 for kc, km, ks in keep):
            continue
        keep.append((c, m, s))
    return [(c, m) for c, m, _ in keep], [s for _, _, s in keep]


def _closed(rnd: _Round, reqs: Sequence[Request]) -> tuple[int, int, int]:
    """The free GPUs, and the cores and memory, of nodes out of service now (``View.blocked``) that
    ``reqs`` may not use: all but what their jobs running there hold and keep (a drain that waits)."""
    blocked = rnd.view.blocked
    if blocked is None:
        return 0, 0, 0
    closed = {n for n, room in blocked.room.items() if room < 0}
    if not closed:
        return 0, 0, 0
    nodes = rnd.cluster.nodes
    g = sum(int(rnd.free.gpu_counts[n]) for n in closed)
    c = sum(nodes[n].cpus for n in closed)
    m = sum(nodes[n].mem_mb for n in closed)
    for p in rnd.free.outside:  # (counted with the held parts)
        if p.node in closed:
            c -= p.cpus
            m -= p.mem_mb
    for r in reqs:
        prev = r.prev
        if prev is not None and blocked.keeps(r.jobs, prev.parts, True):
            for p in prev.parts:
                if p.node in closed:
                    g, c, m = g - len(p.gpus), c - p.cpus, m - p.mem_mb
    return max(g, 0), max(c, 0), max(m, 0)


@register("size", "opt", "synergy-opt")
class Opt(_SynergySizer):
    """Synergy-OPT: allocation LP + placement LP with HiGHS (see the module notes)."""

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        profiles: str | None = None,
        time_limit: float = 10.0,
        max_jobs: int = 1024,
    ) -> None:
        super().__init__(threshold, profiles)
        if not time_limit > 0:
            raise ValueError(f"time_limit must be > 0, got {time_limit}")
        if int(max_jobs) < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
        self.time_limit = float(time_limit)
        self.max_jobs = int(max_jobs)
        self.last_objective: float | None = None
        self.last_fallback: str | None = None
        self._last_window: frozenset[str] | None = None
        self._last_plan: Plan | None = None
        self.lp_rounds = 0
        self.reused_rounds = 0
        self._cands: dict[tuple[Any, ...], tuple[list[tuple[int, int]], list[float]]] = {}
        self._highs: Any = None  # the HiGHS solver (False: highspy missing, scipy's linprog instead)
        self._last_lp: dict[str, tuple[tuple[Any, ...], _LPResult]] = {}  # kind -> (its input, its answer)
        self.repeated_lps = 0  # LPs answered from the last one of their kind (the same input)
        self.unbound_lps = 0  # allocation LPs answered by every job's fastest point (_fastest_fit)

    def _run(self, rnd: _Round, order: list[Request]) -> None:
        rnd.register(order)
        self.last_fallback = None
        self.last_objective = None
        # window: in order, while GPUs fit the cluster
        cap = rnd.free.free_gpus - _closed(rnd, order)[0]
        window: list[Request] = []
        rest: list[Request] = []
        strict = not rnd.place.backfill
        for r in order:
            # a strict queue's window ends at the first request that does not fit
            if len(window) < self.max_jobs and r.gpus <= cap and not (strict and rest):
                window.append(r)
                cap -= r.gpus
            else:
                rest.append(r)
        if not window:
            return
        key = frozenset(r.job.id for r in window)
        last = self._last_plan
        if (
            key == self._last_window
            and rnd.view.blocked is None  # (a node out of service: the LPs see it, the last plan did not)
            and last is not None
            and set(last.allocations) == key
            and all(rnd.view.current.get(j) == a for j, a in last.allocations.items())
        ):
            # same window, placed in full and running as planned: the LPs would
            # reproduce this plan, and no job outside the window fits the GPUs left
            for a in last.allocations.values():
                rnd.free.take(a.parts)
                rnd.plan.add(a)
            self.reused_rounds += 1
            return
        self.lp_rounds += 1
        try:
            chosen = self._allocation_lp(rnd, window)
            placed = self._placement_lp(rnd, window, chosen)
        except _SolverFailure as e:
            self.last_fallback = str(e)
            log.warning("synergy-opt: %s; this round falls back to TUNE", e)
            rnd.tune_all(order)
            return
        rnd.tune_all([r for r in order if r.job.id not in placed])
        self._last_window = key
        self._last_plan = Plan(dict(rnd.plan.allocations))

    # -- LP 1: allocation -----------------------------------------------------
    def _allocation_lp(self, rnd: _Round, window: list[Request]) -> list[tuple[int, int, float]]:
        view = rnd.view
        cands = []
        for r in window:
            p = self.profile(r.job, view)
            key = (p, r.gpus) if p is not None else (None, r.gpus, r.cpus, r.mem_mb)
            cd = self._cands.get(key)
            if cd is None:
                cd = self._cands[key] = _candidates(self, r.job, view, r)
            cands.append(cd)
        _, out_c, out_m = _closed(rnd, window)
        out_c += sum(p.cpus for p in rnd.free.outside)
        out_m += sum(p.mem_mb for p in rnd.free.outside)
        tc, tm = max(rnd.cluster.total_cpus - out_c, 0), max(rnd.cluster.total_mem_mb - out_m, 0)
        fastest = self._fastest_fit(cands, tc, tm)
        if fastest is not None:
            self.unbound_lps += 1
            self.last_objective = sum(s for _, _, s in fastest)
            return fastest
        # the variables, job by job (built as lists: numpy's per-element writes cost more)
        cost_l: list[float] = []
        cpu_l: list[int] = []
        mem_l: list[int] = []
        owner_l: list[int] = []
        for j, (pts, spd) in enumerate(cands):
            cost_l.extend([-s for s in spd])
            cpu_l.extend([c for c, _ in pts])
            mem_l.extend([m for _, m in pts])
            owner_l.extend([j] * len(pts))
        n = len(cost_l)
        cost = np.array(cost_l, dtype=float)
        cpu = np.array(cpu_l, dtype=float)
        mem = np.array(mem_l, dtype=float)
        owner = np.array(owner_l, dtype=np.int64)
        b_ub = np.array([tc, tm], dtype=float)
        # rows: total cores, total memory (<=), one per job: its points' shares sum to 1 (=)
        cols = np.arange(n)
        ub = _Sparse.of(np.concatenate([np.zeros(n, np.int64), np.ones(n, np.int64)]), np.concatenate([cols, cols]),
                        np.concatenate([cpu, mem]), 2, n, drop_zeros=True)
        eq = _Sparse.of(owner, cols, np.ones(n), len(window), n)
        res = self._solve("allocation", cost, ub, b_ub, eq, np.ones(len(window)))
        x = res.x.tolist()
        self.last_objective = float(-res.fun)
        chosen: list[tuple[int, int, float]] = []
        k = 0
        for pts, spd in cands:
            xs = x[k : k + len(pts)]
            k += len(pts)
            used = [i for i, v in enumerate(xs) if v > 1e-7]
            top = max(xs)
            if len(used) == 1 or top >= 1 - 1e-7:
                i = xs.index(top)  # (the first largest, as numpy's argmax)
            else:  # split by the LP: round to the cheaper point
                i = min(used, key=lambda i: pts[i][0] / tc + pts[i][1] / tm)
            chosen.append((pts[i][0], pts[i][1], spd[i]))
        return chosen

    @staticmethod
    def _fastest_fit(cands: list[tuple[list[tuple[int, int]], list[float]]], cpus: int,
                     mem_mb: int) -> list[tuple[int, int, float]] | None:
        """Every job's fastest point, when each job has one fastest point and they fit the cluster's
        cores and memory together; None otherwise.

        That is then the allocation LP's one optimum: each job's shares sum to 1, so any share on
        a slower point lowers the objective, and nothing else binds.  A simplex solver stops on
        that vertex, whose shares are 1 on the fastest points, so the LP would choose exactly
        these points.  "One fastest point" asks every other point to be slower by ``_MARGIN``,
        well above what the solver's optimality tolerance (1e-7 per variable) adds up to over a
        window of ``max_jobs`` (1,024: about 1e-4), so it could not stop on a near tie either (the
        smallest such gap in bench_synergy's candidates is 0.06).  Measured on bench_synergy's
        1,000 jobs on 16 x 8 GPUs, every allocation LP of a run is of this kind (1,760 under SRTF,
        1,545 under FIFO); a cluster short of cores or memory for its jobs' fastest points still
        solves the LP.
        """
        out: list[tuple[int, int, float]] = []
        for pts, spd in cands:
            top = max(spd)
            i = spd.index(top)
            if any(s > top - _MARGIN for k, s in enumerate(spd) if k != i):
                return None
            c, m = pts[i]
            cpus -= c
            mem_mb -= m
            out.append((c, m, top))
        return out if cpus >= 0 and mem_mb >= 0 else None

    # -- LP 2: placement -------------------------------------------------------
    def _placement_lp(self, rnd: _Round, window: list[Request], chosen: list[tuple[int, int, float]]) -> set[str]:
        """Place the window's single-node jobs with a configuration LP over job types.

        Jobs with the same (GPUs, cores, MB) are one *type*; ``y[t, s]`` is how
        many jobs of type ``t`` node ``s`` hosts (fractional in the LP).  This
        is the placement LP with its node symmetry removed: a few thousand
        variables instead of jobs x nodes.  Each node takes ``floor(y)`` whole
        jobs of a type; the fractional remainders (jobs the LP split across
        nodes) are rounded to whole-GPU gangs by TUNE's steps afterwards.
        Jobs larger than a node are also left to TUNE's steps.
        """
        free = rnd.free
        ns = rnd.cluster.num_nodes
        node_max = int(rnd.node_gpus_total.max())
        types: dict[tuple[int, int, int], list[int]] = {}
        for j, r in enumerate(window):
            if r.gpus <= node_max:
                types.setdefault((r.gpus, int(chosen[j][0]), int(chosen[j][1])), []).append(j)
        if not types:
            return set()
        keys = list(types)
        nt = len(keys)
        # current jobs of each type per node: those placements cost nothing (no move)
        # (counted in lists and read from lists below: numpy's per-element access costs more here)
        prev_node = [-1] * len(window)  # the one node each window job runs on now, or -1
        for j, r in enumerate(window):
            prev = r.prev
            if prev is not None and len(prev.parts) == 1:
                prev_node[j] = prev.parts[0].node
        cur_l = [[0.0] * ns for _ in range(nt)]
        for t, key in enumerate(keys):
            row = cur_l[t]
            for j in types[key]:
                if prev_node[j] >= 0:
                    row[prev_node[j]] += 1
        cur = np.array(cur_l, dtype=float).reshape(nt, ns)
        tt, ss = np.nonzero(np.ones((nt, ns)))
        st, sn = np.nonzero(cur)
        var_t = np.concatenate([tt, st])
        var_s = np.concatenate([ss, sn])
        nv = var_t.size
        cost = np.concatenate([1.0 + ss / max(ns, 1) * 1e-2, np.zeros(st.size)])
        gt = np.array([k[0] for k in keys], dtype=float)
        ct = np.array([k[1] for k in keys], dtype=float)
        mt = np.array([k[2] for k in keys], dtype=float)
        cnt = np.array([len(types[k]) for k in keys], dtype=float)
        ub = np.concatenate([np.minimum(cnt[tt], free.node_gpus[ss] // gt[tt]), cur[st, sn]])
        blocked = rnd.view.blocked
        if blocked is not None:
            # a type starts only on nodes all its jobs may start on; jobs stay only where not evicted
            ok = np.array([blocked.masks(rnd.cluster, [m for j in types[k] for m in window[j].jobs])[0]
                           for k in keys],
                          dtype=bool).reshape(nt, ns)
            stay = np.array([n not in blocked.evicts for n in range(ns)], dtype=bool)
            ub *= np.concatenate([ok[tt, ss], stay[sn]])
        rows = np.concatenate([var_s, ns + var_s, 2 * ns + var_s])
        cols = np.concatenate([np.arange(nv)] * 3)
        vals = np.concatenate([gt[var_t], ct[var_t], mt[var_t]])
        b_ub = np.concatenate([free.node_gpus, free.node_cpus, free.node_mem]).astype(float)
        res = self._solve("placement", cost, _Sparse.of(rows, cols, vals, 3 * ns, nv), b_ub,
                          _Sparse.of(var_t, np.arange(nv), np.ones(nv), nt, nv), cnt, np.c_[np.zeros(nv), ub])
        y = np.zeros((nt, ns))
        np.add.at(y, (var_t, var_s), res.x)
        slots = np.floor(y + 1e-7).astype(np.int64).tolist()
        placed: set[str] = set()
        for t, key in enumerate(keys):
            g, c, m = key
            members = types[key]
            srow = slots[t]
            todo: list[tuple[int, int]] = []  # (job index, node)
            # sticky first: jobs whose previous node has a slot of their type
            rest = []
            for j in members:
                node = prev_node[j]
                if node >= 0 and srow[node] > 0:
                    srow[node] -= 1
                    todo.append((j, node))
                else:
                    rest.append(j)
            it = iter(rest)
            for node in [n for n, k in enumerate(srow) if k != 0]:
                for _ in range(srow[node]):
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    todo.append((nxt, node))
            for j, node in todo:
                r = window[j]
                prev = r.prev
                prev_gpus = prev.parts[0].gpus if prev is not None and prev.parts[0].node == node else ()
                req = Request(r.jobs, g, c, m)
                parts: tuple[Part, ...] | None = None
                if prev is not None and prev_gpus and len(prev.parts) == 1 and list(prev_gpus) == sorted(prev_gpus):
                    # back on its node: when its GPUs are free, keep_parts gives what picking them
                    # (_pick offers them first) and splitting would, its parts again for an unchanged
                    # request (sorted GPUs, as split_parts gives them)
                    parts = rnd.place.keep_parts(req, free, rnd.view)
                if parts is None:
                    parts = split_parts(rnd.cluster, req, {node: rnd._pick(node, g, prev_gpus)})
                    if len(parts[0].gpus) != g or not free.fits(parts):
                        continue  # left to TUNE's steps
                if blocked is not None and not blocked.keeps(r.jobs, parts, prev is not None and parts == prev.parts):
                    continue  # (a changed job on a node out of service: TUNE's steps, through choose_for)
                rnd.commit(req, parts)
                rnd.stats["best"] += 1
                placed.add(r.job.id)
        return placed

    def _solve(self, what: str, c: np.ndarray, a_ub: _Sparse, b_ub: np.ndarray, a_eq: _Sparse, b_eq: np.ndarray,
               bounds: Any = (0, 1)) -> _LPResult:
        """min c.x subject to a_ub x <= b_ub, a_eq x = b_eq, ``bounds`` (per variable or for all), with HiGHS.

        The LPs are small (tens to hundreds of variables) and solved thousands of times in a
        run: they go to HiGHS directly (one solver object, reused), as the model
        ``scipy.optimize.linprog(method="highs")`` would pass it (its input checks cost three
        times the solve); linprog itself where highspy cannot be imported.
        """
        n = len(c)
        b = np.asarray(bounds, dtype=float)
        lb, ub = (np.full(n, b[0]), np.full(n, b[1])) if b.ndim == 1 else (b[:, 0].copy(), b[:, 1].copy())
        # the same LP as the last one of its kind (a round after arrivals that joined no window, on
        # the state the last round left): its answer again.  HiGHS starts every solve from a cleared
        # model, so an LP's answer depends on the LP alone
        key = (c.tobytes(), a_ub.rows.tobytes(), a_ub.cols.tobytes(), a_ub.vals.tobytes(), a_ub.shape,
               np.asarray(b_ub, dtype=float).tobytes(), a_eq.rows.tobytes(), a_eq.cols.tobytes(),
               a_eq.vals.tobytes(), a_eq.shape, np.asarray(b_eq, dtype=float).tobytes(), lb.tobytes(), ub.tobytes())
        hit = self._last_lp.get(what)
        if hit is not None and hit[0] == key:
            self.repeated_lps += 1
            return hit[1]
        res = self._solve_new(what, c, a_ub, b_ub, a_eq, b_eq, lb, ub)
        self._last_lp[what] = (key, res)
        return res

    def _solve_new(self, what: str, c: np.ndarray, a_ub: _Sparse, b_ub: np.ndarray, a_eq: _Sparse, b_eq: np.ndarray,
                   lb: np.ndarray, ub: np.ndarray) -> _LPResult:
        try:
            h = self._solver()
            if h is None:
                return _linprog(what, self.time_limit, c, a_ub, b_ub, a_eq, b_eq, np.c_[lb, ub])
            h.setOptionValue("presolve", "off" if what == "placement" else "on")  # (see _solver; ~1 us a call)
            return _highs_solve(h, what, c, lb, ub, a_ub.stack(a_eq),
                                np.concatenate([np.full(len(b_ub), -np.inf), b_eq]), np.concatenate([b_ub, b_eq]))
        except _SolverFailure:
            raise
        except Exception as e:  # the solver itself failed: never crash the round
            raise _SolverFailure(f"{what} LP raised {type(e).__name__}: {e}") from None

    def _solver(self) -> Any:
        """The HiGHS object, made on first use; None where highspy cannot be imported.

        Presolve is off for the placement LP (:meth:`_solve_new` sets it per LP): it is small,
        and simplifying each one first costs more than it saves.  On 400 of bench_synergy's
        placement LPs under OPT SRTF (about 220 variables, 60 rows), a solve through
        :func:`_highs_solve` took 1.40-1.67 ms with presolve and 0.78-0.84 ms without; the slots
        their answers give were the same.  Its costs break ties between nodes, and every record
        of bench_synergy's OPT runs and of Synergy's deployment trace (FIFO and SRTF) is the same
        either way.  The allocation LP keeps presolve: its optimum is often not one point (jobs
        whose points tie), and without presolve HiGHS stopped on other optima of the deployment
        trace's LPs (mean JCT 12,713 -> 12,707 s under FIFO, 11,037 -> 10,968 s under SRTF).
        """
        if self._highs is False:
            return None
        if self._highs is None:
            try:
                import highspy
            except ImportError:
                self._highs = False
                return None
            with _stdout_muted():  # HiGHS prints a banner when the object is made, before any option
                h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            h.setOptionValue("time_limit", self.time_limit)
            self._highs = h
        return self._highs


_MARGIN = 1e-3  # a job's fastest point beats its others by at least this much (_fastest_fit)


@dataclass(slots=True)
class _Sparse:
    """A matrix as (row, column, value) triplets."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def of(cls, rows: Any, cols: Any, vals: Any, nrows: int, ncols: int, drop_zeros: bool = False) -> _Sparse:
        rows, cols, vals = np.asarray(rows, np.int64), np.asarray(cols, np.int64), np.asarray(vals, float)
        if drop_zeros:  # as a dense matrix becomes sparse
            keep = vals != 0
            rows, cols, vals = rows[keep], cols[keep], vals[keep]
        return cls(rows, cols, vals, (nrows, ncols))

    def stack(self, below: _Sparse) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """[self; below] column-wise (CSC: starts, row indices sorted in each column, values), and its rows."""
        rows = np.concatenate([self.rows, below.rows + self.shape[0]])
        cols = np.concatenate([self.cols, below.cols])
        vals = np.concatenate([self.vals, below.vals])
        order = np.lexsort((rows, cols))
        start = np.zeros(self.shape[1] + 1, dtype=np.int32)
        np.cumsum(np.bincount(cols, minlength=self.shape[1]), out=start[1:])
        return start, rows[order].astype(np.int32), vals[order], self.shape[0] + below.shape[0]

    def scipy(self) -> Any:
        from scipy.sparse import coo_matrix

        return coo_matrix((self.vals, (self.rows, self.cols)), shape=self.shape).tocsr()


@dataclass(slots=True)
class _LPResult:
    x: np.ndarray
    fun: float


def _highs_solve(h: Any, what: str, c: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                 a: tuple[np.ndarray, np.ndarray, np.ndarray, int], row_lo: np.ndarray, row_hi: np.ndarray) -> _LPResult:
    """One LP on the HiGHS object ``h``: min c.x, row_lo <= A x <= row_hi, lb <= x <= ub (A column-wise).

    The arrays go to HiGHS in one call (``passModel``'s array form) rather than through a
    ``HighsLp`` filled field by field, and the objective is read alone rather than with the whole
    ``HighsInfo``: on bench_synergy's placement LPs (about 220 variables, 60 rows) that saves
    about 0.25 ms of a 1 ms solve.  A highspy without the array form (or whose array form refuses
    the model) gets the ``HighsLp``; a model refused both ways is a solver failure.
    """
    import highspy

    start, index, value, nrows = a
    n = len(c)
    h.clearModel()
    status = None
    try:
        # (columns, rows, nonzeros, column-wise, minimise, offset, ..., every column continuous)
        status = h.passModel(n, nrows, len(value), 1, 1, 0.0, np.asarray(c, dtype=float), lb, ub, row_lo, row_hi,
                             start, index, value, np.zeros(n, dtype=np.int32))
    except TypeError:  # a highspy without this form
        pass
    if status is None or status == highspy.HighsStatus.kError:  # (or one that reads it otherwise: the HighsLp)
        h.clearModel()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, nrows
        lp.col_cost_ = np.asarray(c, dtype=float)
        lp.col_lower_, lp.col_upper_ = lb, ub
        lp.row_lower_, lp.row_upper_ = row_lo, row_hi
        m = lp.a_matrix_
        m.format_ = highspy.MatrixFormat.kColwise
        m.num_col_, m.num_row_ = n, nrows
        m.start_, m.index_, m.value_ = start, index, value
        status = h.passModel(lp)
    if status == highspy.HighsStatus.kError:
        raise _SolverFailure(f"{what} LP: HiGHS refused the model")
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise _SolverFailure(f"{what} LP: {h.modelStatusToString(status)}")
    return _LPResult(np.array(h.getSolution().col_value), float(h.getObjectiveValue()))


def _linprog(what: str, time_limit: float, c: np.ndarray, a_ub: _Sparse, b_ub: np.ndarray, a_eq: _Sparse,
             b_eq: np.ndarray, bounds: np.ndarray) -> Any:
    from scipy.optimize import linprog

    res = linprog(c=c, A_ub=a_ub.scipy(), b_ub=b_ub, A_eq=a_eq.scipy(), b_eq=b_eq, bounds=bounds, method="highs",
                  options={"time_limit": time_limit, "presolve": True})  # type: ignore[call-overload]
    if res.status != 0 or res.x is None:
        raise _SolverFailure(f"{what} LP: {res.message} (status {res.status})")
    return res


@contextmanager
def _stdout_muted() -> Iterator[None]:
    """File descriptor 1 to /dev/null for a moment (output written from C, not through sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _SolverFailure(RuntimeError):
    pass
