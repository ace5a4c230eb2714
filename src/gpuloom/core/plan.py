"""Allocations, plans and the actions that turn one plan into the next.

An :class:`Allocation` says where a job runs: one :class:`Part` per node (global
GPU ids, CPU core count, memory MB on that node) plus the ids of the jobs that
share those GPUs with it (its interleaving *group*, Muri).  Members of a group
hold identical GPU sets; the CPU and memory of a part are charged to the node
once per member.

A :class:`Plan` is the whole decision of a round: job id → allocation.  Jobs
not in the plan hold nothing.  :func:`diff` compares the current allocations
with a plan and yields the :class:`Action` list the simulator or an executor
carries out.  :func:`check_plan` verifies the invariants every consumer relies
on; tests run it every round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .cluster import Cluster


@dataclass(frozen=True, slots=True)
class Part:
    node: int
    gpus: tuple[int, ...]
    cpus: int
    mem_mb: int


@dataclass(frozen=True, slots=True)
class Allocation:
    job_id: str
    parts: tuple[Part, ...]
    group: tuple[str, ...] = ()  # co-runners sharing these GPUs (excluding job_id)
    # what was asked for: (gpus, cpus, mem_mb, members); lets placement reuse an
    # allocation whose request did not change without rebuilding it
    key: tuple = field(default=(), compare=False, repr=False)

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        out: tuple[int, ...] = ()
        for p in self.parts:
            out += p.gpus
        return out

    @property
    def num_gpus(self) -> int:
        return sum(len(p.gpus) for p in self.parts)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(p.node for p in self.parts)

    @property
    def spans_nodes(self) -> bool:
        return len(self.parts) > 1

    @property
    def cpus(self) -> int:
        return sum(p.cpus for p in self.parts)

    @property
    def mem_mb(self) -> int:
        return sum(p.mem_mb for p in self.parts)

    def same_place(self, other: Allocation | None) -> bool:
        return other is not None and sorted(self.gpu_ids) == sorted(other.gpu_ids)


@dataclass(slots=True)
class Plan:
    """A round's decision: ``allocations[job_id]`` for every job that should run."""

    allocations: dict[str, Allocation] = field(default_factory=dict)
    free_gpus: int | None = None  # GPUs left free, when the placer knows it

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.allocations

    def __len__(self) -> int:
        return len(self.allocations)

    def add(self, alloc: Allocation) -> None:
        if alloc.job_id in self.allocations:
            raise PlanError(f"job {alloc.job_id} allocated twice in one plan")
        self.allocations[alloc.job_id] = alloc


class PlanError(AssertionError):
    """A plan that breaks an invariant."""


class ActionKind(StrEnum):
    START = "start"  # job holds nothing now, runs after
    STOP = "stop"  # job runs now, holds nothing after (preemption)
    MOVE = "move"  # different GPUs, same count (migration)
    RESIZE = "resize"  # different GPU count, or same GPUs with other CPU/memory
    REGROUP = "regroup"  # same resources, other co-runners


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    job_id: str
    old: Allocation | None
    new: Allocation | None


def diff(current: Mapping[str, Allocation], plan: Plan) -> list[Action]:
    """Actions that take ``current`` to ``plan``: stops first, then changes, then starts.

    Stops come first so an executor frees resources before reusing them.
    Order within a kind follows the plan's (policy) order, deterministic.
    """
    stops: list[Action] = []
    changes: list[Action] = []
    starts: list[Action] = []
    new = plan.allocations
    for jid, gone in current.items():
        if jid not in new:
            stops.append(Action(ActionKind.STOP, jid, gone, None))
    for jid, a in new.items():
        old = current.get(jid)
        if old is None:
            starts.append(Action(ActionKind.START, jid, None, a))
        elif old is a or old == a:
            continue
        elif old.num_gpus != a.num_gpus:
            changes.append(Action(ActionKind.RESIZE, jid, old, a))
        elif not a.same_place(old):
            changes.append(Action(ActionKind.MOVE, jid, old, a))
        elif (old.cpus, old.mem_mb) != (a.cpus, a.mem_mb) or old.nodes != a.nodes:
            changes.append(Action(ActionKind.RESIZE, jid, old, a))
        else:
            changes.append(Action(ActionKind.REGROUP, jid, old, a))
    return stops + changes + starts


def check_plan(
    plan: Plan | Mapping[str, Allocation],
    cluster: Cluster,
    demands: Mapping[str, int] | None = None,
) -> None:
    """Raise :class:`PlanError` unless the plan is feasible.

    * every GPU id exists, and every part's GPUs are on that part's node;
    * a GPU is held by one group only: jobs on the same GPU list each other as
      co-runners and hold exactly the same GPU set (gang + no double booking);
    * no node gives out more CPU cores or memory than it has;
    * when ``demands`` is given, each job holds exactly that many GPUs (gang).
    """
    allocs = plan.allocations if isinstance(plan, Plan) else plan
    # one Python pass gathers flat arrays; numpy checks them (this runs every round)
    ids = list(allocs)
    gpu_list: list[int] = []
    gpu_owner: list[int] = []
    part_node: list[int] = []
    part_cpu: list[int] = []
    part_mem: list[int] = []
    part_len: list[int] = []
    for k, jid in enumerate(ids):
        a = allocs[jid]
        if a.job_id != jid:
            raise PlanError(f"allocation for {jid} is labelled {a.job_id}")
        held = 0
        for p in a.parts:
            gl = p.gpus
            gpu_list.extend(gl)
            gpu_owner.extend([k] * len(gl))
            part_node.append(p.node)
            part_cpu.append(p.cpus)
            part_mem.append(p.mem_mb)
            part_len.append(len(gl))
            held += len(gl)
        if held == 0:
            raise PlanError(f"job {jid}: allocation holds no GPU")
        if len(a.parts) > 1 and len({p.node for p in a.parts}) != len(a.parts):
            raise PlanError(f"job {jid}: a node in two parts")
        if demands is not None and jid in demands and held != demands[jid]:
            raise PlanError(f"job {jid}: holds {held} GPUs, gang demand is {demands[jid]}")
    if not ids:
        return
    n = cluster.num_nodes
    nodes = np.asarray(part_node, dtype=np.int64)
    bad = np.flatnonzero((nodes < 0) | (nodes >= n))
    if bad.size:
        raise PlanError(f"unknown node {int(nodes[bad[0]])} in the plan")
    cpus = np.asarray(part_cpu, dtype=np.int64)
    mems = np.asarray(part_mem, dtype=np.int64)
    if (cpus < 0).any() or (mems < 0).any():
        k = int(np.flatnonzero((cpus < 0) | (mems < 0))[0])
        raise PlanError(f"negative CPU or memory in a part on node {int(nodes[k])}")
    G = np.asarray(gpu_list, dtype=np.int64)
    owner = np.asarray(gpu_owner, dtype=np.int64)
    bad = np.flatnonzero((G < 0) | (G >= cluster.num_gpus))
    if bad.size:
        raise PlanError(f"job {ids[int(owner[bad[0]])]}: unknown GPU {int(G[bad[0]])}")
    on = np.repeat(nodes, part_len)
    bad = np.flatnonzero(cluster.gpu_node[G] != on)
    if bad.size:
        i = int(bad[0])
        raise PlanError(f"job {ids[int(owner[i])]}: GPU {int(G[i])} is not on node {int(on[i])}")
    order = np.argsort(G, kind="stable")
    gs = G[order]
    dup = np.flatnonzero(gs[1:] == gs[:-1])
    for d in dup.tolist():
        gid = int(gs[d])
        j1, j2 = ids[int(owner[order[d]])], ids[int(owner[order[d + 1]])]
        if j1 == j2:
            raise PlanError(f"job {j1}: GPU {gid} listed twice")
        a1, a2 = allocs[j1], allocs[j2]
        if sorted(a1.gpu_ids) != sorted(a2.gpu_ids):
            raise PlanError(f"GPU {gid} held by {j1} and {j2} with different GPU sets")
        if j1 not in a2.group and j2 not in a1.group:
            raise PlanError(f"GPU {gid} given twice: {j1} and {j2} are not a group")
    cpu = np.bincount(nodes, weights=cpus, minlength=n)
    mem = np.bincount(nodes, weights=mems, minlength=n)
    over = np.flatnonzero((cpu > cluster.cpu_caps) | (mem > cluster.mem_caps))
    if over.size:
        i = int(over[0])
        node = cluster.nodes[i]
        if cpu[i] > node.cpus:
            raise PlanError(f"node {node.name}: {int(cpu[i])} cores given, has {node.cpus}")
        raise PlanError(f"node {node.name}: {int(mem[i])} MB given, has {node.mem_mb}")


def gpus_in_use(allocs: Iterable[Allocation]) -> set[int]:
    used: set[int] = set()
    for a in allocs:
        used.update(a.gpu_ids)
    return used
