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
on over a whole plan; :func:`check_actions` verifies the same invariants where
a plan differs from sound current allocations, in time proportional to the
actions (the drivers run it every round and the whole check now and then).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .cluster import Cluster

_SETATTR = object.__setattr__  # what a frozen dataclass's __init__ calls for each field


@dataclass(frozen=True, slots=True)
class Part:
    node: int
    gpus: tuple[int, ...]
    cpus: int
    mem_mb: int

    def __init__(self, node: int, gpus: tuple[int, ...], cpus: int, mem_mb: int) -> None:
        # written by hand, as Allocation's: the generated one looks up object.__setattr__ per field
        _set = _SETATTR
        _set(self, "node", node)
        _set(self, "gpus", gpus)
        _set(self, "cpus", cpus)
        _set(self, "mem_mb", mem_mb)


@dataclass(frozen=True, slots=True)
class Allocation:
    job_id: str
    parts: tuple[Part, ...]
    group: tuple[str, ...] = ()  # co-runners sharing these GPUs (excluding job_id)
    # what was asked for: (gpus, cpus, mem_mb, members); lets placement reuse an
    # allocation whose request did not change without rebuilding it
    key: tuple = field(default=(), compare=False, repr=False)
    # GPUs, cores and MB in all, computed once (read in every hot loop)
    num_gpus: int = field(init=False, compare=False, repr=False)
    cpus: int = field(init=False, compare=False, repr=False)
    mem_mb: int = field(init=False, compare=False, repr=False)

    def __init__(self, job_id: str, parts: tuple[Part, ...], group: tuple[str, ...] = (), key: tuple = ()) -> None:
        # written by hand (dataclass keeps an __init__ the class defines): the generated one and a
        # __post_init__ for the totals cost a second call and seven global lookups per allocation,
        # and every placement makes one; the fields are set as a frozen dataclass sets them
        g = c = m = 0
        for p in parts:  # (one loop, not three sums)
            g += len(p.gpus)
            c += p.cpus
            m += p.mem_mb
        _set = _SETATTR
        _set(self, "job_id", job_id)
        _set(self, "parts", parts)
        _set(self, "group", group)
        _set(self, "key", key)
        _set(self, "num_gpus", g)
        _set(self, "cpus", c)
        _set(self, "mem_mb", m)

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        out: tuple[int, ...] = ()
        for p in self.parts:
            out += p.gpus
        return out

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(p.node for p in self.parts)

    @property
    def spans_nodes(self) -> bool:
        return len(self.parts) > 1

    def same_place(self, other: Allocation | None) -> bool:
        return other is not None and sorted(self.gpu_ids) == sorted(other.gpu_ids)


@dataclass(slots=True)
class Plan:
    """A round's decision: ``allocations[job_id]`` for every job that should run."""

    allocations: dict[str, Allocation] = field(default_factory=dict)
    free_gpus: int | None = None  # GPUs left free, when the placer knows it
    #: with :meth:`extending`: the allocations the plan starts from, the jobs it adds to them (in
    #: order) and the jobs of ``base`` it takes out (:meth:`remove`)
    base: Mapping[str, Allocation] | None = field(default=None, repr=False, compare=False)
    added: list[str] = field(default_factory=list, repr=False, compare=False)
    removed: list[str] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def extending(cls, current: Mapping[str, Allocation]) -> Plan:
        """A plan that keeps every allocation of ``current`` but those taken out with :meth:`remove`,
        and adds jobs with :meth:`add` (:func:`diff` against ``current`` then costs O(changes)).

        (A dict is copied with ``copy``, which clones its table when few entries were deleted: the
        running jobs' dict churns, and ``dict(current)`` re-inserts entry by entry, about 6x slower
        at 150 jobs.)"""
        return cls(current.copy() if type(current) is dict else dict(current), base=current)

    def remove(self, job_id: str) -> None:
        """Take a job of ``base`` out of an :meth:`extending` plan (it may be added again)."""
        if self.base is None or job_id in self.added:
            raise PlanError(f"job {job_id}: only a job of the plan's base can be removed")
        del self.allocations[job_id]
        self.removed.append(job_id)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.allocations

    def __len__(self) -> int:
        return len(self.allocations)

    def add(self, alloc: Allocation) -> None:
        if alloc.job_id in self.allocations:
            raise PlanError(f"job {alloc.job_id} allocated twice in one plan")
        self.allocations[alloc.job_id] = alloc
        if self.base is not None:
            self.added.append(alloc.job_id)


class PlanError(AssertionError):
    """A plan that breaks an invariant."""


class ActionKind(StrEnum):
    START = "start"  # job holds nothing now, runs after
    STOP = "stop"  # job runs now, holds nothing after (preemption)
    MOVE = "move"  # different GPUs, same count (migration)
    RESIZE = "resize"  # different GPU count, or same GPUs with other CPU/memory
    REGROUP = "regroup"  # same resources, other co-runners


# the kinds as module constants: a class attribute of an Enum is read through EnumType.__getattr__
# (about 4x a plain class attribute), and diff makes one action per change
_START, _STOP, _MOVE, _RESIZE, _REGROUP = (ActionKind.START, ActionKind.STOP, ActionKind.MOVE, ActionKind.RESIZE,
                                           ActionKind.REGROUP)


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    job_id: str
    old: Allocation | None
    new: Allocation | None

    def __init__(self, kind: ActionKind, job_id: str, old: Allocation | None, new: Allocation | None) -> None:
        # written by hand, as Part's (diff makes one per change: every start of a run)
        _set = _SETATTR
        _set(self, "kind", kind)
        _set(self, "job_id", job_id)
        _set(self, "old", old)
        _set(self, "new", new)


def diff(current: Mapping[str, Allocation], plan: Plan) -> list[Action]:
    """Actions that take ``current`` to ``plan``: stops first, then changes, then starts.

    Stops come first so an executor frees resources before reusing them.
    Order within a kind follows the plan's (policy) order, deterministic.
    """
    new = plan.allocations
    extends = plan.base is current and len(new) == len(current) - len(plan.removed) + len(plan.added)
    if extends and not plan.removed:
        # everything in current kept as it is: only the added jobs start
        return [Action(_START, jid, None, new[jid]) for jid in plan.added]
    stops: list[Action] = []
    changes: list[Action] = []
    starts: list[Action] = []
    if not extends or any(jid not in new for jid in plan.removed):
        for jid, gone in current.items():
            if jid not in new:
                stops.append(Action(_STOP, jid, gone, None))
    # an extending plan changes only the jobs it added (in the order they were added: the order
    # of the whole plan with the unchanged jobs left out)
    for jid in plan.added if extends else new:
        a = new[jid]
        old = current.get(jid)
        if old is None:
            starts.append(Action(_START, jid, None, a))
        elif old is a or old == a:
            continue
        elif old.num_gpus != a.num_gpus:
            changes.append(Action(_RESIZE, jid, old, a))
        elif a.parts == old.parts:  # (the same GPUs, cores, memory and nodes: what the tests below find)
            changes.append(Action(_REGROUP, jid, old, a))
        elif not a.same_place(old):
            changes.append(Action(_MOVE, jid, old, a))
        elif (old.cpus, old.mem_mb) != (a.cpus, a.mem_mb) or old.nodes != a.nodes:
            changes.append(Action(_RESIZE, jid, old, a))
        else:
            changes.append(Action(_REGROUP, jid, old, a))
    return stops + changes + starts


def changes(current: Mapping[str, Allocation], plan: Plan) -> tuple[list[str], list[str]]:
    """The jobs whose allocation of ``current`` ``plan`` takes out or replaces, and those whose allocation of
    ``plan`` it adds or puts in place (a job may be in both): from an :meth:`Plan.extending` plan's own
    lists, else by comparing the two (an allocation counts as kept only when it is the same object)."""
    new = plan.allocations
    if plan.base is current and len(new) == len(current) - len(plan.removed) + len(plan.added):
        return plan.removed, plan.added
    return ([jid for jid, a in current.items() if new.get(jid) is not a],
            [jid for jid, a in new.items() if current.get(jid) is not a])


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
    if dup.size:
        sharing: dict[int, list[str]] = {}
        for d in dup.tolist():
            gid = int(gs[d])
            j1, j2 = ids[int(owner[order[d]])], ids[int(owner[order[d + 1]])]
            if j1 == j2:
                raise PlanError(f"job {j1}: GPU {gid} listed twice")
            sharers = sharing.setdefault(gid, [j1])
            sharers.append(j2)
        for gid, jobs in sharing.items():
            _check_sharing(gid, jobs, allocs)
    cpu = np.bincount(nodes, weights=cpus, minlength=n)
    mem = np.bincount(nodes, weights=mems, minlength=n)
    over = np.flatnonzero((cpu > cluster.cpu_caps) | (mem > cluster.mem_caps))
    if over.size:
        i = int(over[0])
        node = cluster.nodes[i]
        if cpu[i] > node.cpus:
            raise PlanError(f"node {node.name}: {int(cpu[i])} cores given, has {node.cpus}")
        raise PlanError(f"node {node.name}: {int(mem[i])} MB given, has {node.mem_mb}")


def check_actions(
    actions: Sequence[Action],
    plan: Plan | Mapping[str, Allocation],
    cluster: Cluster,
    free_cpus: Sequence[int] | np.ndarray,
    free_mem: Sequence[int] | np.ndarray,
    holders: Mapping[int, Collection[str]],
) -> None:
    """:func:`check_plan` for the allocations ``actions`` change, in O(actions).

    ``actions`` are ``diff(current, plan)`` for allocations ``current`` that are
    themselves sound; ``free_cpus``/``free_mem`` are the cores and memory per node
    ``current`` leaves free, ``holders[g]`` the jobs holding GPU ``g`` in it.  A
    plan passes exactly when :func:`check_plan` passes it: only a changed
    allocation can break an invariant, and each one is checked against what the
    unchanged ones hold.
    """
    allocs = plan.allocations if isinstance(plan, Plan) else plan
    changed: set[str] | None = None  # the jobs the actions change: made only if a claimed GPU is held
    dcpu: dict[int, int] = {}
    dmem: dict[int, int] = {}
    claims: dict[int, list[str]] = {}
    for act in actions:
        old = act.old
        a = act.new
        # a regroup on the same parts as a sound allocation: sound on its own, with the same cores and memory;
        # only its label and its GPUs' sharing are left to check (Muri-L: a fifth of its actions)
        same = act.kind is _REGROUP and old is not None and a is not None and a.parts == old.parts
        if old is not None and not same:
            for p in old.parts:
                node = p.node
                dcpu[node] = dcpu.get(node, 0) + p.cpus
                dmem[node] = dmem.get(node, 0) + p.mem_mb
        if a is None:
            continue
        jid = act.job_id
        if same:
            if a.job_id != jid:
                raise PlanError(f"allocation for {jid} is labelled {a.job_id}")
        else:
            _check_allocation(jid, a, cluster)
        for p in a.parts:
            if not same:
                node = p.node
                dcpu[node] = dcpu.get(node, 0) - p.cpus
                dmem[node] = dmem.get(node, 0) - p.mem_mb
            for g in p.gpus:
                c = claims.get(g)
                if c is None:
                    claims[g] = [jid]
                else:
                    c.append(jid)
    shared: set[tuple[str, ...]] = set()  # the sharing lists checked (a group's GPUs all give one)
    for g, claimants in claims.items():
        held = holders.get(g)
        if held:
            if changed is None:
                changed = {a.job_id for a in actions}
            sharing = claimants + [j for j in held if j not in changed]
        elif len(claimants) == 1:
            continue  # (a GPU nobody else holds: the common case)
        else:
            sharing = claimants
        if len(sharing) > 1:
            key = tuple(sharing)
            if key not in shared:  # (the same jobs pass or fail alike on every GPU they share)
                shared.add(key)
                _check_sharing(g, sharing, allocs)
    for node, dc in dcpu.items():  # (one pass in any order to find out; the first in node order is named)
        if free_cpus[node] + dc < 0 or free_mem[node] + dmem[node] < 0:
            break
    else:
        return
    for node in sorted(dcpu):
        cpu, mem = int(free_cpus[node]) + dcpu[node], int(free_mem[node]) + dmem[node]
        if cpu < 0 or mem < 0:
            n = cluster.nodes[node]
            if cpu < 0:
                raise PlanError(f"node {n.name}: {n.cpus - cpu} cores given, has {n.cpus}")
            raise PlanError(f"node {n.name}: {n.mem_mb - mem} MB given, has {n.mem_mb}")


_GPU_NODE: dict[int, tuple[Cluster, list[int]]] = {}


def _gpu_node(cluster: Cluster) -> list[int]:
    """``cluster.gpu_node`` as a list (cached per cluster object): read one GPU at a time."""
    hit = _GPU_NODE.get(id(cluster))
    if hit is None or hit[0] is not cluster:
        if len(_GPU_NODE) > 64:
            _GPU_NODE.clear()
        hit = _GPU_NODE[id(cluster)] = (cluster, cluster.gpu_node.tolist())
    return hit[1]


def _check_allocation(jid: str, a: Allocation, cluster: Cluster) -> None:
    """One allocation's own invariants (what :func:`check_plan` checks per allocation), same messages."""
    if a.job_id != jid:
        raise PlanError(f"allocation for {jid} is labelled {a.job_id}")
    held = 0
    seen: set[int] = set()
    gpu_node = _gpu_node(cluster)
    # cluster.num_nodes and num_gpus, read without their properties (a property read is a
    # function call; this runs for every allocation a round changes)
    n = len(cluster.nodes)
    ng = len(gpu_node)  # (one entry per GPU)
    for p in a.parts:
        if not 0 <= p.node < n:
            raise PlanError(f"unknown node {p.node} in the plan")
        if p.cpus < 0 or p.mem_mb < 0:
            raise PlanError(f"negative CPU or memory in a part on node {p.node}")
        for g in p.gpus:
            if not 0 <= g < ng:
                raise PlanError(f"job {jid}: unknown GPU {g}")
            if gpu_node[g] != p.node:
                raise PlanError(f"job {jid}: GPU {g} is not on node {p.node}")
            if g in seen:
                raise PlanError(f"job {jid}: GPU {g} listed twice")
            seen.add(g)
        held += len(p.gpus)
    if held == 0:
        raise PlanError(f"job {jid}: allocation holds no GPU")
    if len(a.parts) > 1 and len({p.node for p in a.parts}) != len(a.parts):
        raise PlanError(f"job {jid}: a node in two parts")


def _check_sharing(gid: int, jobs: Sequence[str], allocs: Mapping[str, Allocation]) -> None:
    """Jobs on one GPU must form a group: the same GPU set, each listing every other as a co-runner."""
    first = jobs[0]
    parts = allocs[first].parts
    mine: list[int] | None = None
    for other in jobs[1:]:
        a = allocs.get(other)
        if a is None:  # an unchanged holder the plan drops without a stop: not a sound current
            raise PlanError(f"GPU {gid} held by {other}, which the plan does not hold")
        if a.parts is parts:  # (a group placed together shares one parts tuple: the same GPUs)
            continue
        if mine is None:
            mine = sorted(allocs[first].gpu_ids)
        if sorted(a.gpu_ids) != mine:
            raise PlanError(f"GPU {gid} held by {first} and {other} with different GPU sets")
    for i, j1 in enumerate(jobs):
        for j2 in jobs[i + 1:]:
            if j2 not in allocs[j1].group or j1 not in allocs[j2].group:
                raise PlanError(f"GPU {gid} given twice: {j1} and {j2} are not a group")


def drop_job(allocs: dict[str, Allocation], jid: str) -> None:
    """Remove ``jid`` from the allocations of a plan being built; its co-runners keep their GPUs
    in a group without it."""
    a = allocs.pop(jid)
    for oid in a.group:
        o = allocs.get(oid)
        if o is not None:
            allocs[oid] = Allocation(o.job_id, o.parts, tuple(x for x in o.group if x != jid), o.key)

