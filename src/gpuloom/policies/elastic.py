"""Elastic sizing under slowdown fairness (F-scheduling), its hysteresis, and the static baseline.

``size elastic`` (:class:`ElasticSize`) decides how many GPUs each job gets
from its throughput curve f (:mod:`gpuloom.perf.scaling`):

1. *protected* running jobs (launching, being reallocated, or RUNNING_PROTECTED:
   see :func:`is_protected`) keep their current GPU count on their current
   node(s), whatever their place in the order;
2. in policy order, every other job gets its minimum (the smallest count with
   f > 0, or ``attrs["min_gpus"]``) while the cluster's free GPUs cover it;
   a job that does not fit on one node (fragmentation) is skipped; a running
   job stays on its node if it can, a new one goes to the node with the most
   free GPUs (room to grow);
3. the remaining GPUs are handed out one at a time: among the jobs whose next
   GPU raises their throughput (and whose node has a free GPU), those whose
   extra GPU keeps the variance of the running jobs' slowdowns within
   ``v_bound`` compete on total throughput (Σ f_j in iterations/s); if none
   does, the one leaving the lowest variance gets it.  A GPU that would raise
   no job's throughput stays free.

Slowdown: ``slowdown="fraction"`` (default, as specified) is S = f(R)/f(U) ∈
[0, 1]; its variance is at most 0.25, so ``v_bound >= 0.25`` never binds and
the allocator maximises throughput.  ``slowdown="factor"`` uses f(U)/f(R) ≥ 1
(the time-stretch reading of "slowdown"), under which a bound of 0.5 does bind.
Both are offered; ``gpuloom`` reports both in ``benchmarks/bench_elastic.py``.

Each job stays on one node unless ``span_nodes`` (then a job's maximum is the
cluster and placement decides the spread; the locality factor charges it).
The requests carry the chosen count (``fixed_gpus`` is not set: counts change),
assigned jobs first, in order, so placement never prefers a job the sizer left
out.  CPU and memory are GPU-proportional.

:class:`Hysteresis` is a :class:`~gpuloom.scheduler.Scheduler` plan hook (the
elastic sizer offers it through ``plan_hooks()``, threshold ``-P hysteresis=1``,
``-P hysteresis=null`` to switch it off; any scheduler can take it in ``hooks``): a
new plan never moves or resizes a protected job, and it replaces the running
one only if it raises total throughput by at least ``threshold`` iterations/s
or starts a waiting job; otherwise the running allocations stay as they are.

``size static`` + ``place static`` (param ``slot``): the baseline that cuts
every node into fixed slots of ``slot`` GPUs and runs one job per slot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.lifecycle import JobState
from ..core.plan import Allocation, Part, Plan
from ..perf.model import ThroughputModel
from ..perf.scaling import ScalingFactor
from .base import FreeState, PlacePolicy, PolicyError, Request, SizePolicy, View, register, split_parts

_DEFAULT_FACTOR = ScalingFactor()
_TRANSIENT = frozenset({JobState.LAUNCHING, JobState.CHECKPOINTING, JobState.STOPPING})


def scaling_of(model: ThroughputModel) -> ScalingFactor:
    """The model's ``scaling`` factor, or the default catalogue when it has none."""
    f = model.get("scaling")
    return f if isinstance(f, ScalingFactor) else _DEFAULT_FACTOR


def is_protected(job: Job, now: float) -> bool:
    """True if ``job`` must not be reallocated at ``now``.

    Reads the job's :class:`~gpuloom.core.lifecycle.Lifecycle`: protected while
    launching, checkpointing or stopping, and while RUNNING_PROTECTED before its
    ``protected_until``.  A job still busy with an overhead (``busy_until > now``)
    is protected too.  Jobs without a lifecycle (not arrived) are never protected.
    """
    lc = job.lifecycle
    if lc is None:
        return False
    return lc.state in _TRANSIENT or lc.is_protected(now) or job.busy_until > now


@register("size", "elastic", "f-scheduling")
class ElasticSize(SizePolicy):
    dynamic = True  # protection expires with time, so rounds matter (until next_change)
    #: throughput-model factors this sizer relies on (the simulator adds them to a default model)
    requires_factors = {"scaling": lambda cluster: ScalingFactor()}

    def __init__(
        self,
        v_bound: float = 0.5,
        slowdown: str = "fraction",
        respect_protection: bool = True,
        span_nodes: bool = False,
        hysteresis: float | None = 1.0,
    ) -> None:
        if not v_bound >= 0:
            raise ValueError(f"v_bound must be >= 0, got {v_bound}")
        if slowdown not in ("fraction", "factor"):
            raise ValueError(f"slowdown must be 'fraction' (f(R)/f(U)) or 'factor' (f(U)/f(R)), got {slowdown!r}")
        self.v_bound = float(v_bound)
        self.slowdown = slowdown
        self.respect_protection = bool(respect_protection)
        self.span_nodes = bool(span_nodes)
        if hysteresis is not None and hysteresis is not False and not float(hysteresis) >= 0:
            raise ValueError(f"hysteresis threshold must be >= 0 iterations/s (or None to disable), got {hysteresis}")
        self.hysteresis = None if hysteresis is None or hysteresis is False else float(hysteresis)
        self.last_unfairness = 0.0

    def next_change(self, view: View) -> float:
        """The first time an active job's protection (:func:`is_protected`) can change.

        Time enters this sizer, and its :class:`Hysteresis` hook, only through protection:
        the throughput curves, the order of ``units`` and the current allocations are the
        state a round left unchanged.  A job's protection is constant until its next
        planned lifecycle step (launching, checkpointing and stopping end there), the end
        of its RUNNING_PROTECTED window, or the end of its overhead (``busy_until``),
        whichever comes first; the soonest over the active jobs (the running ones are
        asked, and so are their co-runners) is when a round could plan differently.  A job
        in a transient state with no step planned (the service, where a process reports
        the step) could change at any moment: ``view.now``.
        """
        now = view.now
        best = math.inf
        for job in view.jobs:
            lc = job.lifecycle
            if lc is None:  # (never protected: is_protected)
                continue
            if lc.planned:
                best = min(best, lc.planned[0][0])
            elif lc.state in _TRANSIENT:
                return now
            if lc.state is JobState.RUNNING_PROTECTED and lc.protected_until is not None:
                best = min(best, lc.protected_until)
            if job.busy_until > now:
                best = min(best, job.busy_until)
            if best <= now:
                return now
        return best

    def least_gpus(self, job: Job, model: ThroughputModel) -> int | None:
        cl = model.cluster
        return self._bounds(job, scaling_of(model), cl.num_gpus if self.span_nodes else cl.max_node_gpus,
                            cl.num_gpus)[0]

    def plan_hooks(self) -> list[Hysteresis]:
        """The :class:`Hysteresis` hook (threshold ``hysteresis`` it/s) unless disabled with ``None``."""
        return [] if self.hysteresis is None else [Hysteresis(self.hysteresis)]

    def stats(self) -> dict[str, float]:
        return {"unfairness": self.last_unfairness}

    def _bounds(self, job: Job, sf: ScalingFactor, cap: int, total: int) -> tuple[int, int]:
        c = sf.curve(job)
        attrs = job.spec.attrs or {}
        if c is None:
            lo = hi = job.spec.gpus  # rigid unless the fallback says otherwise
            if sf.fallback == "linear":
                lo = 1
                hi = cap
        else:
            lo = c.min_gpus or job.spec.gpus
            hi = cap
        lo = int(attrs.get("min_gpus", lo))
        hi = int(attrs.get("max_gpus", hi))
        if lo > cap:  # larger than a node: it must span nodes, at its minimum
            if lo > total:
                raise PolicyError(f"job {job.id}: needs at least {lo} GPUs, the cluster has {total}")
            hi = lo
        if lo < 1 or hi < lo:
            raise PolicyError(f"job {job.id}: min_gpus {lo} / max_gpus {hi} are inconsistent")
        if sf.throughput(job, lo) <= 0:
            raise PolicyError(f"job {job.id}: its throughput curve is 0 at its minimum of {lo} GPUs")
        return lo, hi if lo > cap else min(hi, cap)

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        cl = view.cluster
        sf = scaling_of(view.model)
        node_free = np.array([n.gpus for n in cl.nodes], dtype=np.int64)
        cap = cl.num_gpus if self.span_nodes else cl.max_node_gpus
        now = view.now
        n_units = len(units)
        gpus = np.zeros(n_units, dtype=np.int64)
        hi = np.zeros(n_units, dtype=np.int64)
        node = np.full(n_units, -1, dtype=np.int64)  # -1: spans nodes / any
        fixed = np.zeros(n_units, dtype=bool)
        elastic_ok = np.array([len(u) == 1 for u in units], dtype=bool)  # groups stay rigid
        fu = np.ones(n_units)
        blocked = view.blocked
        if blocked is not None:
            for p in blocked.held:  # (what work outside the plan holds)
                node_free[p.node] -= len(p.gpus)
        # 1. protected running jobs keep what they hold (not on a node that evicts them); so do jobs
        # staying on a node out of service that lets them finish
        for i, u in enumerate(units):
            j = u[0]
            a = view.current.get(j.id)
            if a is None:
                continue
            if blocked is not None and any(p.node in blocked.room for p in a.parts):
                keep = blocked.keeps(u, a.parts, True)  # (a drain that waits, a window not begun)
            else:
                keep = self.respect_protection and any(is_protected(m, now) for m in u)
            if keep:
                gpus[i] = hi[i] = a.num_gpus
                fixed[i] = True
                for p in a.parts:
                    node_free[p.node] -= len(p.gpus)
                node[i] = a.parts[0].node if len(a.parts) == 1 else -1
        if blocked is not None:  # (a node out of service now takes no new GPUs)
            for n, room in blocked.room.items():
                if room < 0:
                    node_free[n] = 0
            np.maximum(node_free, 0, out=node_free)
        free_total = int(node_free.sum())
        # 2. minimum in policy order
        for i, u in enumerate(units):
            if fixed[i]:
                continue
            j = u[0]
            if elastic_ok[i]:
                lo, hi[i] = self._bounds(j, sf, cap, cl.num_gpus)
            else:
                lo = hi[i] = max(m.spec.gpus for m in u)
            if lo > free_total:
                break
            if self.span_nodes or lo > cl.max_node_gpus:
                gpus[i] = lo
                free_total -= lo
                node[i] = -1
                _take_anywhere(node_free, lo)
                continue
            prev = view.current.get(j.id)
            may = node_free >= lo
            if blocked is not None:  # (a window ahead: only jobs that end by its start)
                may &= blocked.masks(cl, u)[0].astype(bool)
            cand = np.flatnonzero(may)
            if cand.size == 0:
                continue  # fragmented: skip, later jobs may still fit
            pick = -1
            if prev is not None and len(prev.parts) == 1 and may[prev.parts[0].node]:
                pick = prev.parts[0].node
            if pick < 0:
                pick = int(cand[np.argmax(node_free[cand])])  # most room to grow
            gpus[i] = lo
            node[i] = pick
            node_free[pick] -= lo
            free_total -= lo
        assigned = gpus > 0
        # 3. one GPU at a time
        if assigned.any():
            for i in np.flatnonzero(assigned).tolist():
                fu[i] = sf.cluster_throughput(units[i][0], cl)  # >= f(minimum) > 0
            self._grow(units, sf, gpus, hi, node, node_free, fixed | ~elastic_ok, assigned, fu)
        reqs: list[Request] = []
        rest: list[Request] = []
        for i, u in enumerate(units):
            if assigned[i]:
                reqs.append(Request(tuple(u), int(gpus[i])))
            else:
                lo = max(m.spec.gpus for m in u) if not elastic_ok[i] else self._bounds(u[0], sf, cap, cl.num_gpus)[0]
                rest.append(Request(tuple(u), lo))
        return reqs + rest

    def _s(self, f: np.ndarray, fu: np.ndarray) -> np.ndarray:
        if self.slowdown == "fraction":
            return f / fu
        out = np.full(f.shape, np.inf)
        np.divide(fu, f, out=out, where=f > 0)
        return out

    def _grow(self, units, sf, gpus, hi, node, node_free, frozen, assigned, fu) -> None:  # noqa: ANN001
        idx = np.flatnonzero(assigned)
        jobs = [units[i][0] for i in idx]
        g = gpus[idx].copy()

        def tput(k: int, n: int) -> float:
            return sf.throughput(jobs[k], n)

        f = np.array([tput(k, int(g[k])) for k in range(len(idx))])
        fnext = np.array([tput(k, int(g[k]) + 1) if g[k] < hi[idx[k]] else 0.0 for k in range(len(idx))])
        fu_a = fu[idx]
        m = len(idx)
        free_total = int(node_free.sum())
        nodes_a = node[idx]
        on_node = nodes_a >= 0
        node_ix = np.maximum(nodes_a, 0)
        growable = ~frozen[idx]
        hi_a = hi[idx]
        while free_total > 0:
            s = self._s(f, fu_a)
            room = ~on_node | (node_free[node_ix] > 0)
            cand = np.flatnonzero(growable & (g < hi_a) & room & (fnext > f))
            if cand.size == 0:
                break
            s1, s2 = s.sum(), (s * s).sum()
            snew = self._s(fnext[cand], fu_a[cand])
            t1 = s1 - s[cand] + snew
            t2 = s2 - s[cand] ** 2 + snew**2
            var = np.maximum(t2 / m - (t1 / m) ** 2, 0.0) if m > 1 else np.zeros(cand.size)
            gain = fnext[cand] - f[cand]
            ok = var <= self.v_bound + 1e-12
            if ok.any():
                sel = np.flatnonzero(ok)
                best = sel[np.lexsort((cand[sel], var[sel], -gain[sel]))[0]]
            else:
                best = np.lexsort((cand, -gain, var))[0]
            k = int(cand[best])
            i = idx[k]
            g[k] += 1
            f[k] = fnext[k]
            fnext[k] = tput(k, int(g[k]) + 1) if g[k] < hi[i] else 0.0
            if node[i] >= 0:
                node_free[node[i]] -= 1
            else:
                _take_anywhere(node_free, 1)
            free_total -= 1
        gpus[idx] = g
        s = self._s(f, fu_a)
        self.last_unfairness = float(s.var()) if m > 1 and np.isfinite(s).all() else 0.0


def _take_anywhere(node_free: np.ndarray, k: int) -> None:
    for nd in np.argsort(-node_free, kind="stable"):
        t = min(k, int(node_free[nd]))
        node_free[nd] -= t
        k -= t
        if k == 0:
            return


# ---------------------------------------------------------------------------
@dataclass
class Hysteresis:
    """Plan hook: protect jobs, and apply a new plan only when it is worth it.

    ``threshold`` is in iterations/s (the model's ``iterations_per_second``).
    A candidate plan that would move or resize a protected job is repaired:
    protected jobs keep their allocation, other jobs take their new one if it
    is still free, else keep their old one; a plan that cannot keep every
    running job is rejected.  Plans with GPU sharing (groups) are not repaired
    but rejected whenever they touch a protected job.  Jobs on a node that evicts
    them (``View.blocked``) are left out of the running plan it keeps or compares.
    """

    threshold: float = 1.0
    protect: bool = True
    # counters, not configuration: a hook equals a fresh one of the same settings (the scheduler
    # tells a stage's own hooks from foreign ones by equality: Scheduler.next_change)
    applied: int = field(default=0, compare=False)
    rejected: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not self.threshold >= 0:
            raise ValueError(f"hysteresis threshold must be >= 0, got {self.threshold}")

    def _keep(self, view: View, cur: Mapping[str, Allocation]) -> Plan:
        self.rejected += 1
        return Plan(dict(cur))

    def __call__(self, plan: Plan, view: View) -> Plan:
        cur = view.current
        blocked = view.blocked
        if blocked is not None and blocked.evicts:
            # the running plan without the jobs a node evicts: those go where the new plan puts them
            cur = {jid: a for jid, a in cur.items() if blocked.keeps((), a.parts, True)}
        new = plan.allocations
        if new == dict(cur):
            return plan
        jobs = {j.id: j for j in view.jobs}
        if self.protect:
            prot = [jid for jid in cur if jid in jobs and is_protected(jobs[jid], view.now)]
            if any(new.get(jid) != cur[jid] for jid in prot):
                repaired = self._repair(plan, view, cur, set(prot))
                if repaired is None:
                    return self._keep(view, cur)
                plan, new = repaired, repaired.allocations
                if new == dict(cur):
                    return plan
        if any(jid not in cur for jid in new):
            self.applied += 1
            return plan  # a waiting job starts
        if plan_throughput(new, view) >= plan_throughput(dict(cur), view) + self.threshold:
            self.applied += 1
            return plan
        return self._keep(view, cur)

    def _repair(self, plan: Plan, view: View, cur: Mapping[str, Allocation], prot: set[str]) -> Plan | None:
        if any(a.group for a in cur.values()) or any(a.group for a in plan.allocations.values()):
            return None
        free = FreeState(view.cluster)
        out = Plan()
        for jid in prot:
            free.take(cur[jid].parts)
            out.add(cur[jid])
        for jid, a in plan.allocations.items():
            if jid in prot:
                continue
            if free.fits(a.parts):
                free.take(a.parts)
                out.add(a)
            elif jid in cur:
                old = cur[jid]
                if not free.fits(old.parts):
                    return None
                free.take(old.parts)
                out.add(old)
        for jid in cur:
            if jid not in out.allocations and jid in plan.allocations:
                return None
        return out


# ---------------------------------------------------------------------------
def _check_slot(slot: int) -> int:
    if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or slot < 1:
        raise ValueError(f"slot must be an integer >= 1, got {slot!r}")
    return int(slot)


@register("size", "static")
class StaticSize(SizePolicy):
    """Every job gets one slot of ``slot`` GPUs (throughput f(slot), whatever it asked for)."""

    requires_factors = {"scaling": lambda cluster: ScalingFactor()}
    shared_params = frozenset({"slot"})  # -P slot=N sizes and places the same slots

    def __init__(self, slot: int = 1) -> None:
        self.slot = _check_slot(slot)

    def least_gpus(self, job: Job, model: ThroughputModel) -> int | None:
        return self.slot

    def never_sizes(self, job: Job, model: ThroughputModel) -> str | None:
        if scaling_of(model).speed_at(job, self.slot) <= 0:
            return (f"{job.spec.model or 'no model'}, {job.spec.gpus} GPUs: no throughput on a static slot of "
                    f"{self.slot} GPUs (give attrs['throughput'] or another slot)")
        return None

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        if self.slot > view.cluster.max_node_gpus:
            raise PolicyError(f"static slot of {self.slot} GPUs is larger than any node")
        out = []
        for u in units:
            for j in u:  # (the simulator refuses such jobs before it starts: Scheduler.never_runs)
                why = self.never_sizes(j, view.model)
                if why is not None:
                    raise PolicyError(f"job {j.id} cannot run: {why}")
            out.append(Request(tuple(u), self.slot))
        return out


@register("place", "static")
class StaticPlace(PlacePolicy):
    """Fixed slots: node GPUs ``[k*slot, (k+1)*slot)`` (local ids); a request takes whole free slots on one node."""

    sticky = True
    shared_params = frozenset({"slot"})

    def __init__(self, slot: int = 1) -> None:
        self.slot = _check_slot(slot)

    def never_places(self, gpus: int, cluster: Cluster) -> str | None:
        n = self.slot
        most = max((nd.gpus // n for nd in cluster.nodes), default=0)
        if gpus % n or gpus // n > most:
            return (f"asks {gpus} GPUs; place policy 'static' places whole slots of {n} GPU{'s' if n > 1 else ''} "
                    f"on one node, at most {most * n}")
        return None

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        n = self.slot
        if req.gpus % n:
            return None
        k = req.gpus // n
        cl = free.cluster
        for nd in range(cl.num_nodes):
            lo = int(cl.gpu_offset[nd])
            slots = [
                list(range(lo + s * n, lo + (s + 1) * n))
                for s in range(cl.nodes[nd].gpus // n)
                if free.gpu_free[lo + s * n : lo + (s + 1) * n].all()
            ]
            if len(slots) >= k:
                parts = split_parts(cl, req, {nd: [g for s in slots[:k] for g in s]})
                if free.fits(parts, len(req.jobs)):
                    return parts
        return None


def plan_throughput(plan: Plan | Mapping[str, Allocation], view: View) -> float:
    """Σ iterations/s of the plan's jobs (what :class:`Hysteresis` compares)."""
    allocs = plan.allocations if isinstance(plan, Plan) else plan
    jobs = {j.id: j for j in view.jobs}
    return sum(view.model.iterations_per_second(jobs[jid], a) for jid, a in allocs.items() if jid in jobs)
