"""Jobs submitted to Slurm directly, kept out of gpuloom's plan.

Users who bypass gpuloom still ``sbatch`` their own jobs.  What those jobs hold
(their GPU indices, cores and memory, read by the Slurm executor from
``scontrol show job -d`` at each poll) reaches the round's view through
:class:`ForeignJobs`: the scheduler takes :meth:`ForeignJobs.held_parts` into
``View.blocked`` (``Blocked.held``), so the place policy chooses around it with
its own topology and PM-score rules (Synergy's sizers, ``opt``'s LP included,
start from it too).  The same object, run as a plan hook after the stages,
checks the plan against it, for a stage that places on its own:

* a job that runs where it runs keeps its allocation (Slurm started it, so
  nothing directly submitted overlaps it);
* then each new or changed allocation that fits in what is left is kept;
* each other is not made: a running job keeps its current allocation if that
  still fits, and one not yet running waits for a later round.

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


def held_parts(cluster: Cluster, held: Mapping[str, Held]) -> tuple[Part, ...]:
    """``held`` as parts of ``cluster`` (global GPU ids; by node name: unknown nodes and GPU indices beyond
    a node's are ignored, cores and memory are capped at what the node has)."""
    out = []
    for i, node in enumerate(cluster.nodes):
        h = held.get(node.name)
        if h is not None:
            off = int(cluster.gpu_offset[i])
            ids = tuple(off + g for g in sorted(h.gpus) if 0 <= g < node.gpus)
            out.append(Part(i, ids, min(h.cpus, node.cpus), min(h.mem_mb, node.mem_mb)))
    return tuple(out)


def foreign_free(cluster: Cluster, held: Mapping[str, Held]) -> FreeState:
    """The cluster's free state with ``held`` taken (:func:`held_parts`)."""
    free = FreeState(cluster)
    free.take(held_parts(cluster, held))
    return free


def _fits(free: FreeState, a: Allocation, shared: bool) -> bool:
    """Whether ``a`` fits in ``free``; ``shared``: its GPUs are already taken by a co-runner kept."""
    if not shared:
        return free.fits(a.parts)
    return all(p.cpus <= free.cpu_counts[p.node] and p.mem_mb <= free.mem_counts[p.node] for p in a.parts)


class ForeignJobs:
    """What ``held()`` reports, for the view (:meth:`held_parts`) and as a plan hook checking the plan
    against it (see the module notes)."""

    def __init__(self, held: Callable[[], Mapping[str, Held]]) -> None:
        self.held = held

    def held_parts(self, cluster: Cluster) -> tuple[Part, ...]:
        return held_parts(cluster, self.held())

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
        for j in rest:  # then the others, in the plan's order: as they run, or not at all
            cur = current.get(j)  # (a co-runner dropped before it left it out of its group)
            if cur is not None and not cur.group and _fits(free, cur, False):
                allocs[j] = cur
                free.take(cur.parts)
            else:
                drop_job(allocs, j)
        return Plan(allocs)
