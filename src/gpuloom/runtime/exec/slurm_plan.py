"""Jobs submitted to Slurm directly, kept out of gpuloom's plan.

Users who bypass gpuloom still ``sbatch`` their own jobs.  What those jobs hold
(their GPU indices, cores and memory, read by the Slurm executor from
``scontrol show job -d`` at each poll) is subtracted from the plan by a plan
hook, :class:`ForeignJobs`, which the service runs after its own stages:

* a job that runs where it runs keeps its allocation (Slurm started it, so
  nothing directly submitted overlaps it);
* then each new or changed allocation that fits in what is left is kept;
* then, in the plan's order, each that did not is moved, part by part, to the
  first node with enough free GPUs, cores and memory left (its own node first),
  or, if nothing is left, dropped: a job not yet running waits for a later
  round, and a running one keeps its current allocation instead of the change.

Without this the plan kept choosing GPUs a direct job held, and every launch
onto them was refused, so a job waited even while other GPUs were free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...core.cluster import Cluster
from ...core.plan import Allocation, Part, Plan, drop_job
from ...policies.base import View
from ...policies.free import FreeState


@dataclass(frozen=True, slots=True)
class Held:
    """What running jobs submitted to Slurm directly hold on one node."""

    gpus: frozenset[int]  # node-local GPU indices
    cpus: int
    mem_mb: int


def foreign_free(cluster: Cluster, held: Mapping[str, Held]) -> FreeState:
    """The cluster's free state with ``held`` taken (by node name; unknown nodes and GPU indices
    beyond a node's are ignored, cores and memory are taken up to what the node has)."""
    free = FreeState(cluster)
    for i, node in enumerate(cluster.nodes):
        h = held.get(node.name)
        if h is None:
            continue
        off = int(cluster.gpu_offset[i])
        ids = tuple(off + g for g in sorted(h.gpus) if 0 <= g < node.gpus)
        free.take((Part(i, ids, min(h.cpus, free.cpu_counts[i]), min(h.mem_mb, free.mem_counts[i])),))
    return free


def _fits(free: FreeState, a: Allocation, shared: bool) -> bool:
    """Whether ``a`` fits in ``free``; ``shared``: its GPUs are already taken by a co-runner kept."""
    if not shared:
        return free.fits(a.parts)
    return all(p.cpus <= free.cpu_counts[p.node] and p.mem_mb <= free.mem_counts[p.node] for p in a.parts)


def _move(free: FreeState, a: Allocation) -> Allocation | None:
    """``a``'s parts (as many GPUs, cores and memory each) on distinct nodes with room, each on its
    own node first, then in node order; None if they do not fit."""
    out: list[Part] = []
    used: set[int] = set()
    for p in a.parts:
        order = [p.node] + [n for n in range(len(free.cluster.nodes)) if n != p.node]
        for n in order:
            if n in used:
                continue
            ids = free.free_on(n)
            if len(ids) >= len(p.gpus) and free.cpu_counts[n] >= p.cpus and free.mem_counts[n] >= p.mem_mb:
                out.append(Part(n, tuple(ids[:len(p.gpus)]), p.cpus, p.mem_mb))
                used.add(n)
                break
        else:
            return None
    return Allocation(a.job_id, tuple(out), (), a.key)


class ForeignJobs:
    """A plan hook keeping the plan off what ``held()`` reports (see the module notes)."""

    def __init__(self, held: Callable[[], Mapping[str, Held]]) -> None:
        self.held = held

    def __call__(self, plan: Plan, view: View) -> Plan:
        held = self.held()
        if not held:
            return plan
        free = foreign_free(view.cluster, held)
        allocs = dict(plan.allocations)
        current = view.current
        seen: set[tuple[int, ...]] = set()
        staying = [j for j, a in allocs.items() if current.get(j) == a]
        for j in staying:  # running where they run: Slurm holds their resources already
            a = allocs[j]
            g = a.gpu_ids
            free.take(a.parts, 1, gpus=g not in seen and all(free.gpu_free[x] for p in a.parts for x in p.gpus))
            seen.add(g)
        rest = []
        for j in [j for j in allocs if j not in staying]:  # then those that fit where the plan put them
            a = allocs[j]
            g = a.gpu_ids
            if _fits(free, a, g in seen):
                free.take(a.parts, 1, gpus=g not in seen)
                seen.add(g)
            else:
                rest.append(j)
        for j in rest:  # then the others, in the plan's order, in what is left
            a = allocs[j]  # (a co-runner dropped before it left it out of its group)
            cur = current.get(j)
            if cur is not None and not cur.group and _fits(free, cur, False):
                allocs[j] = cur  # running: it stays as it is rather than take what Slurm gave others
            elif (moved := None if a.group else _move(free, a)) is not None:
                allocs[j] = moved
            else:
                drop_job(allocs, j)
                continue
            free.take(allocs[j].parts)
            seen.add(allocs[j].gpu_ids)
        return Plan(allocs)
