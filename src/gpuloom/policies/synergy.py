"""Synergy's multi-resource allocators as "size" policies: ``greedy``, ``tune``, ``opt``.

Each job's *demand vector* is its GPUs plus the smallest CPU cores and memory
that reach its best throughput within ``threshold`` (default 10 %), from the
job's sensitivity profile (:mod:`gpuloom.perf.sensitivity`; the profile comes
from the throughput model's ``sensitivity`` factor, the single source of truth
about speed).  The demand is capped at one node and never gives less throughput
than the GPU-proportional share; jobs larger than a node, and jobs without a
profile, demand the proportional share (or their spec's explicit cpus/mem).

All three sizers keep GPU counts fixed and override
:meth:`~gpuloom.policies.base.SizePolicy.allocate`, placing job by job through
the place policy's ``keep_parts`` (stickiness) and ``choose`` over a
:class:`~gpuloom.policies.base.FreeState` that tracks free GPUs, cores and
memory per node.  A job whose GPUs fit on one node is never spread over nodes
just to get extra CPU or memory.  A unit must be one job (``--group none``).

Parameters (``-P name=value``): ``threshold`` (all), ``profiles`` (all: the
catalogue CSV; :func:`gpuloom.perf.assembly.build_model` adds the sensitivity
factor to the run's throughput model when it is given, and a sizer given it
refuses to run on a model without that factor), ``time_limit`` and
``max_jobs`` (opt).  Without a sensitivity factor every job is insensitive and
the sizers hand out the proportional share.

``greedy`` (Synergy-GREEDY)
    In policy order, give each job its best-case demand where it fits
    (first fit through ``choose``), else skip it.  Packing three dimensions
    greedily strands GPUs: CPU or memory runs out while GPUs sit idle.

``tune`` (Synergy-TUNE)
    In policy order: best-case demand if it fits; else the GPU-proportional
    share; else pick the node (best fit on free GPUs; when no node has the
    job's GPUs, the nodes the place policy would spread it over, asked for the
    GPUs alone: a consolidating policy makes a job that fits on a node wait, as
    it does under proportional sizing) and *demote* jobs already placed there that
    hold more than their proportional share – lowest priority first – to
    ``min(current, proportional)`` per dimension (exactly proportional if that
    would cost them throughput), until the job fits at its demand capped at the
    proportional share.  Jobs are skipped only when too few GPUs are free.
    Promises, checked by :func:`check_tune_invariants`:

    1. no job runs below its GPU-proportional throughput;
    2. the policy order is respected: a job waits only if the GPUs left by the
       jobs ahead of it are too few for it, or the place policy would not place
       it on them;
    3. no GPU is idle while a runnable job waits for CPU or memory (a job the
       place policy would place on the idle GPUs).

    (After demotions, freed resources are not handed back to other jobs in
    the same round; Synergy's TUNE does not either.)

``opt`` (Synergy-OPT)
    Two linear programs solved with HiGHS (through highspy; ``scipy.optimize.linprog`` without it):

    1. *allocation*: over the jobs selected in policy order while their GPUs
       fit the cluster, choose for each a convex combination of its
       Pareto-efficient (cores, memory) grid points – all at least as fast as
       proportional – maximising the sum of normalised throughputs subject to
       the cluster's total cores and memory (the cluster seen as one big
       machine).  A basic solution splits at most two jobs; each is rounded
       to its cheaper point.  When every job's fastest point is clearly its
       fastest and they all fit the cluster together, that is the LP's one
       optimum, taken without solving (``unbound_lps`` counts such rounds).
    2. *placement*: a configuration LP – jobs with equal (GPUs, cores, memory)
       form a *type*, ``y[t, s]`` is how many jobs of type ``t`` node ``s``
       hosts – under every node's GPU, core and memory capacity, minimising
       moves (placing a job on the node it runs on costs 0) then packing onto
       low-numbered nodes (first-fit order, keeping free space together).
       Grouping by type removes the nodes' symmetry: a few thousand variables
       instead of jobs x nodes (at 512 GPUs and 274 jobs the per-job LP took
       1.2 s, this one ~0.05 s).  Each node takes ``floor(y)`` whole jobs of
       each type (running jobs keep their GPUs where the LP leaves them on
       their node); the fractional remainders – jobs the LP split across
       nodes – are rounded to whole-GPU gangs by TUNE's steps (on one node
       when one has room, else spread over several).

    A job whose rounded placement does not fit, a job larger than a node, and
    every job the LPs did not cover goes through TUNE's steps (so no GPU is stranded).  On solver
    failure or time-out (``time_limit`` seconds per LP) the round falls back to
    TUNE and the reason is logged (``last_fallback``).  ``max_jobs`` caps the
    LP window (default 1024 jobs; a 512-GPU cluster holds at most 512).
    A round whose window is the last round's, placed in full and still running
    exactly as planned, reuses that plan without solving: the allocation LP
    sees the same jobs and the current placement costs 0 in the placement LP,
    so it is optimal there (``lp_rounds`` / ``reused_rounds`` count both kinds).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.job import Job
from ..core.plan import Allocation, Part, Plan, PlanError
from ..perf.sensitivity import (
    DEFAULT_THRESHOLD,
    CpuMemProfile,
    SensitivityFactor,
    default_grid,
    demand_vector,
)
from .base import FreeState, PlacePolicy, PolicyError, Request, SizePolicy, View, need_on, register, split_parts

log = logging.getLogger(__name__)
_EPS = 1e-9


def sensitivity_factor(view: View) -> SensitivityFactor | None:
    f = view.model.get("sensitivity")
    return f if isinstance(f, SensitivityFactor) else None


def _ref_node(view: View) -> int:
    """The node whose shape defines single-node demands (the one with most GPUs)."""
    gpus = [n.gpus for n in view.cluster.nodes]
    return int(np.argmax(gpus))


class _SynergySizer(SizePolicy):
    fixed_gpus = True
    needs_profiles = True
    sizes_groups = False  # (a demand vector per job: a group of jobs sharing GPUs has none)
    one_node = True  # (_Round.try_place: a job one node could host never spans nodes)
    #: the sizers read profiles from the model's sensitivity factor, which has no default: without
    #: --profiles, a trace that carries them, or the service's profiling, they would size like
    #: 'proportional' in silence, so a run without profiles is refused
    requires_factors = {"sensitivity": None}
    negotiates = True  # places job by job (allocate)

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, profiles: str | None = None) -> None:
        threshold = float(threshold)
        if not 0 <= threshold < 10:
            raise ValueError(f"threshold must be in [0, 10), got {threshold}")
        self.threshold = threshold
        # the catalogue file the run's throughput model loads (perf.assembly.build_model);
        # sizers read profiles from the model's sensitivity factor, never from here
        self.profiles = profiles
        # demand vectors by (profile, GPUs): every job of a model shares one
        self._demand: dict[tuple[Any, int], tuple[int | None, int | None]] = {}
        self.last_order: list[str] = []
        self.last_stats: dict[str, Any] = {}

    def profiling_threshold(self) -> float:
        return self.threshold

    # -- demand vectors ----------------------------------------------------
    def profile(self, job: Job, view: View, factor: SensitivityFactor | None = None) -> CpuMemProfile | None:
        """``job``'s profile (``factor``: the view's sensitivity factor, when the caller has it)."""
        f = sensitivity_factor(view) if factor is None else factor
        return None if f is None else f.profile_for(job)

    def demand(self, job: Job, view: View, rn: int | None = None,
               factor: SensitivityFactor | None = None) -> tuple[int | None, int | None]:
        """Best-case (cores, MB) totals; ``None`` = GPU-proportional on whichever node (``rn``: the
        reference node, ``factor`` the view's sensitivity factor, if known)."""
        p = self.profile(job, view, factor)
        g = job.spec.gpus
        rn = _ref_node(view) if rn is None else rn
        node = view.cluster.nodes[rn]
        if p is None or g > node.gpus:
            return (job.spec.cpus, job.spec.mem_mb)
        d = self._demand.get((p, g))
        if d is None:
            prop = view.cluster.proportional(rn, g)
            cps, mps = default_grid(p, g, node.cpus, node.mem_mb)
            dv = demand_vector(p, g, cps, mps, self.threshold, floor=prop)
            d = self._demand[(p, g)] = (dv.cpus, dv.mem_mb)
        return d

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        factor = sensitivity_factor(view)
        if units and factor is None:
            raise PolicyError(
                f"size policy {self.name!r} needs CPU/memory profiles: pass --profiles FILE (-P profiles=FILE), "
                "read a trace that carries them (Synergy traces find model_sensitivity_profiles.csv), or add "
                "them with perf.sensitivity.add_sensitivity; without them it would size like 'proportional'"
            )
        out = []
        rn = _ref_node(view)
        for unit in units:
            if len(unit) != 1:
                raise PolicyError(f"size policy {self.name!r} places one job per GPU set; use group 'none'")
            j = unit[0]
            c, m = self.demand(j, view, rn, factor)
            out.append(Request(tuple(unit), j.spec.gpus, c, m))
        return out

    # -- shared round machinery --------------------------------------------
    def allocate(self, requests: list[Request], view: View, place: PlacePolicy, preemptive: bool) -> Plan:
        if self.profiles and sensitivity_factor(view) is None:
            raise PolicyError(
                f"size policy {self.name!r}: profiles={self.profiles!r} given but the throughput model has no "
                "sensitivity factor (build it with gpuloom.perf.assembly.build_model or perf.sensitivity.add_sensitivity)"
            )
        # the place policy's order (PAL's class priority, running first if not preemptive)
        order = place.arrange(requests, view, preemptive)
        self.last_order = [r.job.id for r in order]
        rnd = _Round(self, view, place)
        self._run(rnd, order)
        self.last_stats = rnd.stats
        return rnd.plan

    def _run(self, rnd: _Round, order: list[Request]) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return dict(self.last_stats)


class _Round:
    """State of one allocation round: free resources, the plan, who sits where."""

    def __init__(self, sizer: _SynergySizer, view: View, place: PlacePolicy) -> None:
        self.sizer = sizer
        self.view = view
        self.place = place
        self.cluster = view.cluster
        self.free = FreeState(view.cluster)
        if view.blocked is not None and view.blocked.held:  # (work outside the plan: opt's LP reads the counts)
            self.free.take_held(view.blocked.held)
        self.plan = Plan()
        self.on_node: dict[int, list[str]] = {}
        self.rank: dict[str, int] = {}
        self.jobs: dict[str, Job] = {}
        self.stats: dict[str, Any] = {"best": 0, "proportional": 0, "reclaimed": 0, "demoted": 0, "skipped": 0}
        ncap = self.cluster.nodes
        self.node_gpus_total = np.array([n.gpus for n in ncap], dtype=np.int64)
        self.ref_node = _ref_node(view)
        self.factor = sensitivity_factor(view)

    # -- bookkeeping --------------------------------------------------------
    def commit(self, req: Request, parts: tuple[Part, ...]) -> None:
        """Take ``parts``, split from ``req`` (:func:`split_parts`, or ``choose`` which splits
        the same way), for the job: the allocation carries ``req``'s key, so the next round's
        ``keep_parts`` reuses the parts of an unchanged request instead of splitting again, and a
        job kept as it was keeps its allocation object."""
        job = req.job
        self.free.take(parts)
        key = req.key
        prev = job.alloc
        if prev is not None and prev.parts is parts and prev.key == key and not prev.group:
            self.plan.add(prev)
        else:
            self.plan.add(Allocation(job.id, parts, (), key))
        for p in parts:
            self.on_node.setdefault(p.node, []).append(job.id)

    def prop_parts(self, parts: Sequence[Part]) -> tuple[Part, ...]:
        return tuple(Part(p.node, p.gpus, *self.cluster.proportional(p.node, len(p.gpus))) for p in parts)

    # -- placing one request --------------------------------------------------
    def try_place(self, req: Request) -> tuple[Part, ...] | None:
        """Keep the job's GPUs (sticky) or ``choose``; never span a job that one node could host."""
        free = self.free
        if self.place.sticky:
            parts = self.place.keep_parts(req, free, self.view)
            if parts is not None:
                return parts
        g = req.gpus
        # a node with the GPUs free and the cores and memory the request needs there (its totals,
        # or the node's proportional share); node by node on the buffers (a few nodes: numpy's
        # per-call cost is most of the work)
        single = max(free.gpu_counts, default=0) >= g
        if single:
            ng, nc, nm = free.gpu_counts, free.cpu_counts, free.mem_counts
            c, m = req.cpus, req.mem_mb
            proportional = self.cluster.proportional
            for n in range(len(ng)):
                if ng[n] >= g:
                    if c is None or m is None:
                        pc, pm = proportional(n, g)
                        need_c = pc if c is None else c
                        need_m = pm if m is None else m
                    else:
                        need_c, need_m = c, m
                    if nc[n] >= need_c and nm[n] >= need_m:
                        break
            else:
                return None
        elif g > free.free_gpus:
            return None
        parts = self.place.choose_for(req, free, self.view)
        if parts is not None and len(parts) > 1 and single:
            return None
        return parts

    def place_best_or_proportional(self, req: Request, allow_prop: bool = True) -> str | None:
        parts = self.try_place(req)
        if parts is not None:
            self.commit(req, parts)
            return "best"
        if not allow_prop or (req.cpus is None and req.mem_mb is None):
            return None
        prop = Request(req.jobs, req.gpus, None, None)
        parts = self.try_place(prop)
        if parts is not None:
            self.commit(prop, parts)
            return "proportional"
        return None

    def capped_request(self, req: Request) -> Request:
        """The demand capped at the proportional share, if that keeps proportional throughput."""
        job = req.job
        rn = self.ref_node
        if req.gpus > self.cluster.nodes[rn].gpus or (req.cpus is None and req.mem_mb is None):
            return Request(req.jobs, req.gpus, None, None)
        pc, pm = self.cluster.proportional(rn, req.gpus)
        c = pc if req.cpus is None else min(req.cpus, pc)
        m = pm if req.mem_mb is None else min(req.mem_mb, pm)
        p = self.sizer.profile(job, self.view, self.factor)
        if p is not None and p.throughput_at(c, m, req.gpus) < p.throughput_at(pc, pm, req.gpus) * (1 - 1e-12):
            return Request(req.jobs, req.gpus, None, None)
        return Request(req.jobs, req.gpus, c, m)

    def demote(self, jid: str, node: int) -> bool:
        """Cut ``jid``'s part on ``node`` to its proportional share; False if it holds no more than that."""
        alloc = self.plan.allocations[jid]
        job = self.jobs[jid]
        new_parts = []
        changed = False
        for p in alloc.parts:
            if p.node != node:
                new_parts.append(p)
                continue
            pc, pm = self.cluster.proportional(node, len(p.gpus))
            if p.cpus <= pc and p.mem_mb <= pm:
                return False
            new_parts.append(Part(node, p.gpus, min(p.cpus, pc), min(p.mem_mb, pm)))
            changed = True
        if not changed:
            return False
        cand = Allocation(jid, tuple(new_parts), alloc.group)
        model = self.view.model
        floor = model.speed(job, Allocation(jid, self.prop_parts(alloc.parts), alloc.group))
        if model.speed(job, cand) < floor - _EPS:
            cand = Allocation(
                jid,
                tuple(
                    Part(p.node, p.gpus, *self.cluster.proportional(p.node, len(p.gpus))) if p.node == node else p
                    for p in alloc.parts
                ),
                alloc.group,
            )
        old = next(p for p in alloc.parts if p.node == node)
        new = next(p for p in cand.parts if p.node == node)
        dc, dm = old.cpus - new.cpus, old.mem_mb - new.mem_mb
        if self.free.cpu_counts[node] + dc < 0 or self.free.mem_counts[node] + dm < 0:
            return False
        self.free.cpu_counts[node] += dc
        self.free.mem_counts[node] += dm
        self.plan.allocations[jid] = cand
        self.stats["demoted"] += 1
        return True

    def make_room(self, node: int, need_c: int, need_m: int) -> bool:
        free = self.free
        if free.cpu_counts[node] >= need_c and free.mem_counts[node] >= need_m:
            return True
        # demote nobody on a node where even demoting everyone would not be enough
        rc = rm = 0
        for jid in self.on_node.get(node, ()):
            for p in self.plan.allocations[jid].parts:
                if p.node == node:
                    pc, pm = self.cluster.proportional(node, len(p.gpus))
                    rc += max(0, p.cpus - pc)
                    rm += max(0, p.mem_mb - pm)
        if free.cpu_counts[node] + rc < need_c or free.mem_counts[node] + rm < need_m:
            return False
        # lowest priority first
        victims = sorted(self.on_node.get(node, ()), key=lambda j: -self.rank.get(j, 0))
        for jid in victims:
            if free.cpu_counts[node] >= need_c and free.mem_counts[node] >= need_m:
                break
            self.demote(jid, node)
        return bool(free.cpu_counts[node] >= need_c and free.mem_counts[node] >= need_m)

    def reclaim(self, req: Request) -> tuple[tuple[Part, ...], Request] | None:
        """TUNE's last step: free CPU/memory on a node with enough GPUs by demoting over-share jobs.
        Returns the parts and the request they were split from."""
        free = self.free
        g = req.gpus
        prev = req.prev
        prev_on = {p.node: p.gpus for p in prev.parts} if prev is not None else {}
        cand = np.flatnonzero(free.node_gpus >= g)
        if cand.size:
            req = self.capped_request(req)
            # best fit on free GPUs; the job's previous node first
            order = sorted(cand.tolist(), key=lambda n: (n not in prev_on, free.gpu_counts[n], n))
            for node in order:
                c, m = need_on(self.cluster, req, node, g)
                if self.make_room(node, c, m):
                    gids = self._pick(node, g, prev_on.get(node, ()))
                    parts = split_parts(self.cluster, req, {node: gids})
                    if free.fits(parts):
                        return parts, req
            return None
        if free.free_gpus < g:
            return None
        # no node has the GPUs: the place policy says over which nodes the job may spread (a
        # consolidating one makes a job that fits on a node wait, as it does under proportional
        # sizing), asked for the GPUs alone, as if demotions could free any cores and memory
        probe = self.place.choose_for(Request(req.jobs, g, 0, 0), free, self.view)
        if probe is None:
            return None
        req = Request(req.jobs, g, None, None)
        for p in probe:
            c, m = need_on(self.cluster, req, p.node, len(p.gpus))
            if not self.make_room(p.node, c, m):
                return None
        parts = split_parts(self.cluster, req, {p.node: list(p.gpus) for p in probe})
        return (parts, req) if free.fits(parts) else None

    def _pick(self, node: int, k: int, prefer: Sequence[int] = ()) -> list[int]:
        avail = self.free.free_on(node)
        first = [g for g in prefer if self.free.gpu_free[g]]
        taken = set(first)
        rest = [g for g in avail if g not in taken]
        return (first + rest)[:k]

    def tune_one(self, req: Request) -> bool:
        """TUNE's steps for one job; returns whether it was placed."""
        if req.gpus > self.free.free_gpus:
            self.stats["skipped"] += 1
            return False
        how = self.place_best_or_proportional(req)
        if how is not None:
            self.stats[how] += 1
            return True
        got = self.reclaim(req)
        if got is None:
            self.stats["skipped"] += 1
            return False
        self.commit(got[1], got[0])
        self.stats["reclaimed"] += 1
        return True

    def tune_all(self, order: Sequence[Request]) -> None:
        """TUNE's steps in order; with the place policy's ``backfill`` off, stop at the first miss."""
        strict = not self.place.backfill
        for req in order:
            if not self.tune_one(req) and strict:
                break

    def register(self, order: Sequence[Request]) -> None:
        for i, r in enumerate(order):
            self.rank[r.job.id] = i
            self.jobs[r.job.id] = r.job


@register("size", "greedy", "synergy-greedy")
class Greedy(_SynergySizer):
    """Synergy-GREEDY: best-case demand first fit, in order; skip what does not fit."""

    def _run(self, rnd: _Round, order: list[Request]) -> None:
        rnd.register(order)
        strict = not rnd.place.backfill
        for req in order:
            if req.gpus <= rnd.free.free_gpus and rnd.place_best_or_proportional(req, allow_prop=False):
                rnd.stats["best"] += 1
                continue
            rnd.stats["skipped"] += 1
            if strict:  # a strict queue: nothing passes a request that got nothing
                break


@register("size", "tune", "synergy-tune")
class Tune(_SynergySizer):
    """Synergy-TUNE (see the module notes)."""

    def _run(self, rnd: _Round, order: list[Request]) -> None:
        rnd.register(order)
        rnd.tune_all(order)


# ---------------------------------------------------------------------------
def check_tune_invariants(
    plan: Plan | dict[str, Allocation],
    view: View,
    order: Sequence[str] | None = None,
    place: PlacePolicy | None = None,
) -> None:
    """Raise :class:`~gpuloom.core.plan.PlanError` unless TUNE's three promises hold.

    ``order`` is the effective order the sizer used (``Tune.last_order``);
    jobs of ``view.jobs`` not in it count as coming after it.  ``place`` is the
    place policy TUNE placed through: a job it would not place on the free GPUs
    (a consolidating policy keeps a job that fits on a node off GPUs spread over
    several) may wait beside them; without it any free GPUs would do.
    """
    allocs = plan.allocations if isinstance(plan, Plan) else plan
    by_id = {j.id: j for j in view.jobs}
    cluster = view.cluster
    model = view.model
    # 1. throughput floor
    for jid, a in allocs.items():
        job = by_id.get(jid)
        if job is None:
            raise PlanError(f"job {jid} planned but not active")
        prop = Allocation(
            jid, tuple(Part(p.node, p.gpus, *cluster.proportional(p.node, len(p.gpus))) for p in a.parts), a.group
        )
        s, s0 = model.speed(job, a), model.speed(job, prop)
        if s < s0 - 1e-9:
            raise PlanError(f"job {jid}: speed {s:.4f} below its GPU-proportional {s0:.4f}")

    def placeable(job: Job, free: FreeState) -> bool:
        """``job`` would get GPUs of ``free`` (``place``'s say, for the GPUs alone; any would do without it)."""
        g = job.spec.gpus
        if g > free.free_gpus:
            return False
        return place is None or place.choose_for(Request((job,), g, 0, 0), free, view) is not None

    def gpus_only(a: Allocation) -> tuple[Part, ...]:
        return tuple(Part(p.node, p.gpus, 0, 0) for p in a.parts)

    # 2. order: a waiting job did not fit in the GPUs the jobs ahead of it left
    if order is not None:
        ahead = FreeState(cluster)  # what the jobs ahead of the one in turn leave free
        for jid in order:
            job = by_id.get(jid)
            if job is None:
                continue
            if jid in allocs:
                ahead.take(gpus_only(allocs[jid]))
            elif placeable(job, ahead):
                raise PlanError(
                    f"job {jid} waits although the jobs ahead of it leave {ahead.free_gpus} GPUs (it needs {job.spec.gpus})"
                )
    # 3. no GPU idle while a runnable job waits for CPU or memory
    idle = FreeState(cluster)
    for a in allocs.values():
        idle.take(gpus_only(a))
    for job in view.jobs:
        if job.id not in allocs and placeable(job, idle):
            raise PlanError(f"job {job.id} waits for {job.spec.gpus} GPUs while {idle.free_gpus} GPUs are idle")


def tune_invariant_observer(sim: Any, event: str) -> None:
    """Simulator observer: check :func:`check_tune_invariants` after every round."""
    if event != "round":
        return
    jobs = [j for j in sim.active.values() if j.spec.gpus <= sim.cluster.num_gpus]
    view = View(sim.now, sim.cluster, jobs, sim.current, sim.model, sim.rng, sim.rounds)
    # the order promise is TUNE's own: OPT's placement LP packs its window as a whole, and a job
    # the rounded placement leaves out may find the GPUs the jobs ahead left spread by later ones
    size = sim.scheduler.size
    order = size.last_order if isinstance(size, Tune) else None
    check_tune_invariants(dict(sim.current), view, order, sim.scheduler.place)


def plan_throughput(plan: Plan, view: View) -> float:
    """Sum of the planned jobs' speeds under ``view.model`` (normalised throughput)."""
    by_id = {j.id: j for j in view.jobs}
    return float(sum(view.model.speed(by_id[jid], a) for jid, a in plan.allocations.items()))
