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
    for jid, old in current.items():
        if jid not in new:
            stops.append(Action(ActionKind.STOP, jid, old, None))
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
    g = cluster.num_gpus
    owner: list[str | None] = [None] * g
    owner_set: dict[str, tuple[int, ...]] = {}
    cpu = np.zeros(cluster.num_nodes, dtype=np.int64)
    mem = np.zeros(cluster.num_nodes, dtype=np.int64)
    for jid, a in allocs.items():
        if a.job_id != jid:
            raise PlanError(f"allocation for {jid} is labelled {a.job_id}")
        if not a.parts or a.num_gpus == 0:
            raise PlanError(f"job {jid}: allocation holds no GPU")
        gset = tuple(sorted(a.gpu_ids))
        if len(set(gset)) != len(gset):
            raise PlanError(f"job {jid}: a GPU listed twice")
        seen_nodes = set()
        for p in a.parts:
            if not 0 <= p.node < cluster.num_nodes:
                raise PlanError(f"job {jid}: unknown node {p.node}")
            if p.node in seen_nodes:
                raise PlanError(f"job {jid}: node {p.node} in two parts")
            seen_nodes.add(p.node)
            rng = cluster.node_gpus(p.node)
            for gid in p.gpus:
                if gid not in rng:
                    raise PlanError(f"job {jid}: GPU {gid} is not on node {p.node}")
            if p.cpus < 0 or p.mem_mb < 0:
                raise PlanError(f"job {jid}: negative CPU or memory")
            cpu[p.node] += p.cpus
            mem[p.node] += p.mem_mb
        for gid in gset:
            other = owner[gid]
            if other is None:
                owner[gid] = jid
            else:
                if owner_set[other] != gset:
                    raise PlanError(f"GPU {gid} held by {other} and {jid} with different GPU sets")
                if other not in a.group and jid not in allocs[other].group:
                    raise PlanError(f"GPU {gid} given twice: {other} and {jid} are not a group")
        owner_set[jid] = gset
        if demands is not None and jid in demands and a.num_gpus != demands[jid]:
            raise PlanError(f"job {jid}: holds {a.num_gpus} GPUs, gang demand is {demands[jid]}")
    for i, node in enumerate(cluster.nodes):
        if cpu[i] > node.cpus:
            raise PlanError(f"node {node.name}: {cpu[i]} cores given, has {node.cpus}")
        if mem[i] > node.mem_mb:
            raise PlanError(f"node {node.name}: {mem[i]} MB given, has {node.mem_mb}")


def gpus_in_use(allocs: Iterable[Allocation]) -> set[int]:
    used: set[int] = set()
    for a in allocs:
        used.update(a.gpu_ids)
    return used
