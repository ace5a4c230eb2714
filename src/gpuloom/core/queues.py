"""Queues shared by teams: a tree of queues with guaranteed quotas, limits and weights (plain data).

A cluster shared by teams is cut into *queues* (Philly's virtual clusters,
Slurm's accounts, Kueue's ClusterQueues in a cohort, KAI/Volcano queues).  They
form a tree, e.g. org → team; jobs are submitted to the *leaves*.  Each queue has

* a **guarantee** (:class:`Quota`): GPUs, optionally CPU cores and memory, it is
  owed whenever it has work for them.  An inner queue's guarantee is at least
  the sum of its children's (the default); a surplus is shared by its subtree
  before other queues borrow it.  The top-level guarantees must fit the cluster;
* a **limit**: it never holds more (``None``: no limit).  A limit applies to
  the whole subtree below a queue;
* a **weight**: its share when queues compete for what no guarantee claims
  (weighted DRF, or Slurm's fair-share factor).

A job names its queue by ``JobSpec.attrs["queue"]`` (a trace field such as
Philly's virtual cluster, or ``submit --queue``), else its user's default queue
(``users``), else the tree's ``default`` queue; anything else is a
:class:`QueueError` that names the job and the queues there are.

Usage is counted per queue and summed up the tree (:func:`usage`): a job holds
its allocation's GPUs divided among the members of its group (jobs interleaved
on one GPU set share it), its own cores and memory.  :class:`DecayedUsage` keeps
Slurm's decayed usage (GPU-seconds halved every ``half_life``).

A tree is written as (TOML; the same mapping comes from the service's store)::

    default = "shared"              # queue of jobs that name none
    [users]
    alice = "vision"
    [[queue]]
    name = "research"
    guarantee = 16                  # GPUs, or {gpus = 16, cpus = 192, mem_gb = 1024}
    limit = 32
    weight = 2
    [[queue]]
    name = "vision"
    parent = "research"
    guarantee = 8

**Who may submit** (the service reads these; the simulator ignores them, so
a tree gives the same results with or without them): a queue lists ``users``
and ``groups`` (defined in the tree's ``[groups]`` table, group = [users]);
membership is inherited down the tree; a user's ``[users]`` default queue makes
them a member of it; the ``default`` queue and every queue marked ``open``
(and what is below it) take everyone.  ``max_priority`` caps the priority a
user may give a job (inherited down the tree), ``max_pending`` the jobs waiting
in a queue (its subtree).  A ``per_user`` queue is an open parent: each user who
may submit to it (everyone when it lists no users or groups) gets a child queue
``<parent>.<user>`` of their own on first submission, weight 1, no guarantee of
its own, limited to ``per_user_limit``; a child of a per-user queue takes only
the users it lists::

    [groups]
    cv = ["alice", "carol"]
    [[queue]]
    name = "vision"
    parent = "research"
    groups = ["cv"]
    max_priority = 100
    [[queue]]
    name = "students"
    guarantee = 2
    per_user = true
    per_user_limit = 1

No I/O: :func:`parse_queues` reads a mapping; the faces read files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .cluster import Cluster

#: resources a quota may name, in the order of every usage triple
RESOURCES = ("gpus", "cpus", "mem_mb")
INF = math.inf


class QueueError(ValueError):
    """A queue tree or a job's queue that cannot be used; the message says what and where."""


@dataclass(frozen=True, slots=True)
class Quota:
    """GPUs, CPU cores and memory (MB); ``None`` leaves a resource unconstrained."""

    gpus: float | None = None
    cpus: float | None = None
    mem_mb: float | None = None

    def triple(self, missing: float) -> tuple[float, float, float]:
        """(gpus, cpus, mem_mb) with ``missing`` where a resource is not given."""
        return tuple(missing if v is None else float(v) for v in (self.gpus, self.cpus, self.mem_mb))  # type: ignore[return-value]

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in zip(RESOURCES, (self.gpus, self.cpus, self.mem_mb), strict=True) if v is not None}

    @property
    def empty(self) -> bool:
        return self.gpus is None and self.cpus is None and self.mem_mb is None


#: the priorities a job may have (the API's bound); ``max_priority`` lies within them
MAX_PRIORITY = 10**9


@dataclass(frozen=True, slots=True)
class Queue:
    """One queue: ``parent`` None puts it at the top level.  The fields after ``weight`` are the
    service's access rules and limits (see the module notes); scheduling ignores them."""

    name: str
    parent: str | None = None
    guarantee: Quota = field(default_factory=Quota)
    limit: Quota = field(default_factory=Quota)
    weight: float = 1.0
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    open: bool = False
    max_priority: int | None = None
    max_pending: int | None = None
    per_user: bool = False
    per_user_limit: Quota = field(default_factory=Quota)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.parent is not None:
            d["parent"] = self.parent
        if not self.guarantee.empty:
            d["guarantee"] = self.guarantee.as_dict()
        if not self.limit.empty:
            d["limit"] = self.limit.as_dict()
        d["weight"] = self.weight
        for key in ("users", "groups"):
            if getattr(self, key):
                d[key] = list(getattr(self, key))
        for key in ("open", "per_user"):
            if getattr(self, key):
                d[key] = True
        for key in ("max_priority", "max_pending"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if not self.per_user_limit.empty:
            d["per_user_limit"] = self.per_user_limit.as_dict()
        return d


class QueueTree:
    """A validated tree of queues, with the arrays admission walks.

    Queues are numbered depth-first from the top (children in the order
    given); ``path[n]`` lists ``n`` and its ancestors, top-level first.
    ``guarantee[n]``/``limit[n]`` are (gpus, cpus, mem_mb) triples: 0 / ``inf``
    where not given; an inner queue's guarantee is at least its children's sum.
    """

    def __init__(self, queues: Sequence[Queue], default: str | None = None,
                 users: Mapping[str, str] | None = None, where: str = "queues",
                 groups: Mapping[str, Iterable[str]] | None = None) -> None:
        self.where = where
        names = [q.name for q in queues]
        seen: set[str] = set()
        for q in queues:
            if not q.name or not isinstance(q.name, str):
                raise QueueError(f"{where}: a queue has no name")
            if q.name in seen:
                raise QueueError(f"{where}: queue {q.name!r} is defined twice")
            seen.add(q.name)
            if not (q.weight > 0 and math.isfinite(q.weight)):
                raise QueueError(f"{where}: queue {q.name!r}: weight must be a positive number, got {q.weight}")
            _check_access(q, where)
            for label, quota in (("guarantee", q.guarantee), ("limit", q.limit), ("per_user_limit", q.per_user_limit)):
                for res, v in zip(RESOURCES, (quota.gpus, quota.cpus, quota.mem_mb), strict=True):
                    if v is not None and not (v >= 0):
                        raise QueueError(f"{where}: queue {q.name!r}: {label} {res} must be >= 0, got {v}")
        by_name = {q.name: q for q in queues}
        for q in queues:
            if q.parent is not None and q.parent not in by_name:
                raise QueueError(f"{where}: queue {q.name!r}: parent {q.parent!r} is not a queue "
                                 f"(queues: {', '.join(names)})")
        # depth-first order from the top, children in the order given; a cycle leaves queues unreached
        children: dict[str | None, list[str]] = {}
        for q in queues:
            children.setdefault(q.parent, []).append(q.name)
        order: list[str] = []

        def visit(name: str) -> None:
            order.append(name)
            for c in children.get(name, ()):
                visit(c)

        for top in children.get(None, ()):
            visit(top)
        if len(order) != len(queues):
            lost = sorted(set(names) - set(order))
            raise QueueError(f"{where}: queues {', '.join(lost)} form a cycle of parents")
        self.queues: tuple[Queue, ...] = tuple(by_name[n] for n in order)
        self.index = {q.name: i for i, q in enumerate(self.queues)}
        n = len(self.queues)
        self.parent: list[int] = [-1 if q.parent is None else self.index[q.parent] for q in self.queues]
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.parent):
            if p >= 0:
                self.children[p].append(i)
        self.path: list[tuple[int, ...]] = []
        for i in range(n):
            p, chain = i, []
            while p >= 0:
                chain.append(p)
                p = self.parent[p]
            self.path.append(tuple(reversed(chain)))
        #: one level: every queue is a top-level leaf, its path the queue alone (a leaf's use is its own)
        self.one_level = all(len(p) == 1 for p in self.path)
        self.leaves: tuple[int, ...] = tuple(i for i in range(n) if not self.children[i])
        self.is_leaf = [not c for c in self.children]
        self.weight = [q.weight for q in self.queues]
        self.limit = [q.limit.triple(INF) for q in self.queues]
        #: some queue has a limit
        self.limited = any(v != INF for lim in self.limit for v in lim)
        # guarantees: leaves as given; inner queues at least the children's sum (post-order)
        g: list[tuple[float, float, float]] = [q.guarantee.triple(0.0) for q in self.queues]
        for i in reversed(range(n)):
            kids = self.children[i]
            if not kids:
                continue
            s = tuple(sum(g[c][r] for c in kids) for r in range(3))
            given = self.queues[i].guarantee
            for r, name in enumerate(RESOURCES):
                if getattr(given, name) is not None and g[i][r] < s[r] - 1e-9:
                    raise QueueError(f"{where}: queue {self.queues[i].name!r}: guarantee {name} {g[i][r]:g} is less "
                                     f"than its sub-queues' guarantees together ({s[r]:g})")
            g[i] = tuple(max(a, b) for a, b in zip(g[i], s, strict=True))  # type: ignore[assignment]
        self.guarantee = g
        # what admission checks a guarantee against: GPUs always; cores and memory only where some
        # queue's guarantee names them (elsewhere they are not quota'd: inf)
        named = [any(getattr(q.guarantee, res) is not None for q in self.queues) for res in RESOURCES]
        named[0] = True
        self.owed: list[tuple[float, float, float]] = [
            tuple(v if named[r] else INF for r, v in enumerate(g[i])) for i in range(n)]  # type: ignore[misc]
        #: inner queues whose own guarantee exceeds their children's: deepest first
        self.surplus = tuple(
            i for i in sorted(range(n), key=lambda i: -len(self.path[i]))
            if self.children[i] and any(g[i][r] > sum(g[c][r] for c in self.children[i]) + 1e-9 for r in range(3)))
        #: a queue's weight as a fraction of its siblings' (top-level queues are siblings)
        sib = [sum(self.weight[c] for c in (self.children[p] if p >= 0 else
                                             [k for k in range(n) if self.parent[k] < 0])) for p in self.parent]
        self.sibling_weight = [self.weight[i] / sib[i] for i in range(n)]
        for i, q in enumerate(self.queues):
            for r, name in enumerate(RESOURCES):
                if g[i][r] > self.limit[i][r] + 1e-9:
                    raise QueueError(f"{where}: queue {q.name!r}: guarantee {name} {g[i][r]:g} exceeds its "
                                     f"limit {self.limit[i][r]:g}")
        self.users = dict(users or {})
        self.default = default
        for who, qn in [("default", default), *((f"user {u!r}", q) for u, q in self.users.items())]:
            if qn is None:
                continue
            k = self.index.get(qn)
            if k is None or not self.queues[k].per_user:  # a per-user queue's jobs go to a child made for them
                self.leaf_index(qn, f"{where}: {who}")
        self.groups: dict[str, frozenset[str]] = {}
        for gname, members in (groups or {}).items():
            if not isinstance(gname, str) or not gname or isinstance(members, str) or not all(
                    isinstance(m, str) and m for m in members):
                raise QueueError(f"{where}: group {gname!r}: expected a list of user names")
            self.groups[gname] = frozenset(members)
        for q in self.queues:
            for gname in q.groups:
                if gname not in self.groups:
                    raise QueueError(f"{where}: queue {q.name!r}: no group {gname!r} "
                                     f"(groups: {', '.join(sorted(self.groups)) or 'none'})")

    # -- look-ups -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.queues)

    def __repr__(self) -> str:  # stable (no address): results print a run's parameters with it
        return f"QueueTree({', '.join(self.names)})"

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queues]

    def leaf_index(self, name: str, who: str) -> int:
        """The index of leaf queue ``name``; :class:`QueueError` saying ``who`` names what does not exist."""
        i = self.index.get(name)
        if i is None:
            raise QueueError(f"{who}: no queue {name!r} (queues: {', '.join(self.leaf_names) or 'none'})")
        if not self.is_leaf[i]:
            kids = ", ".join(self.queues[c].name for c in self.children[i])
            raise QueueError(f"{who}: queue {name!r} has sub-queues ({kids}); jobs go to a sub-queue")
        return i

    @property
    def leaf_names(self) -> list[str]:
        return [self.queues[i].name for i in self.leaves]

    def queue_name(self, attrs: Mapping[str, Any] | None, user: str = "") -> str | None:
        """The queue a job names: ``attrs["queue"]``, else its user's default, else the tree's default."""
        q = (attrs or {}).get("queue")
        if q:
            return str(q)
        if user and user in self.users:
            return self.users[user]
        return self.default

    def leaf_of(self, job_id: str, attrs: Mapping[str, Any] | None, user: str = "") -> int:
        """The leaf index of a job's queue; :class:`QueueError` naming the job otherwise."""
        name = self.queue_name(attrs, user)
        if name is None:
            raise QueueError(f"job {job_id}: names no queue, its user {user!r} has no default queue and there is "
                             f"no default queue (queues: {', '.join(self.leaf_names)})")
        return self.leaf_index(name, f"job {job_id}")

    # -- who may submit (the service's; see the module notes) --------------------------------------
    def per_user_parent(self, i: int) -> int:
        """The index of ``i``'s parent if that is a per-user queue, else -1."""
        p = self.parent[i]
        return p if p >= 0 and self.queues[p].per_user else -1

    def member(self, user: str, i: int) -> bool:
        """Whether ``user`` may submit to queue ``i`` (a leaf; a per-user parent: may have a queue under it)."""
        if self.per_user_parent(i) >= 0:  # someone's own queue: only the users it lists
            return user in self.queues[i].users
        if self.queues[i].name == self.default or self.users.get(user) == self.queues[i].name:
            return True
        q = self.queues[i]
        if q.per_user and not q.users and not q.groups:  # an open parent: anyone gets a queue of their own
            return True
        for n in self.path[i]:
            q = self.queues[n]
            if q.open or user in q.users or any(user in self.groups[g] for g in q.groups):
                return True
        return False

    def members(self, i: int) -> str:
        """Who may submit to queue ``i``, in words (for a refusal's message)."""
        found = []
        for n in self.path[i]:
            q = self.queues[n]
            users = [*q.users, *(u for u, d in self.users.items() if n == i and d == q.name and u not in q.users)]
            if users:
                found.append(f"users {', '.join(users)}")
            if q.groups:
                found.append(f"groups {', '.join(q.groups)}")
        return "; ".join(found) or "no one named"

    def priority_limit(self, i: int) -> tuple[int, str] | None:
        """The ``max_priority`` nearest ``i`` on its path (its own, else its parent's, ...) and the queue that
        sets it, or None."""
        for n in reversed(self.path[i]):
            mp = self.queues[n].max_priority
            if mp is not None:
                return mp, self.queues[n].name
        return None

    def subtree(self, i: int) -> list[int]:
        """``i`` and every queue below it."""
        out, todo = [], [i]
        while todo:
            n = todo.pop()
            out.append(n)
            todo.extend(self.children[n])
        return out

    def per_user_queue(self, parent: int, user: str) -> Queue:
        """The queue ``<parent>.<user>`` a per-user parent makes for ``user`` (see the module notes)."""
        p = self.queues[parent]
        return Queue(f"{p.name}.{user}", p.name, Quota(), p.per_user_limit, 1.0, users=(user,))

    def check_capacity(self, cluster: Cluster) -> None:
        """The top-level guarantees must fit the cluster (else no guarantee can be honoured)."""
        caps = (cluster.num_gpus, cluster.total_cpus, cluster.total_mem_mb)
        tops = [i for i in range(len(self)) if self.parent[i] < 0]
        for r, name in enumerate(RESOURCES):
            s = sum(self.guarantee[i][r] for i in tops)
            if s > caps[r] + 1e-9:
                raise QueueError(f"{self.where}: the top-level queues' guarantees ask for {s:g} {name}, "
                                 f"the cluster has {caps[r]:g}")

    def fitted(self, cluster: Cluster) -> QueueTree:
        """This tree with every guarantee of a resource the cluster is short of scaled down by one factor
        (what it has / what the top level asks), so that it fits (a cluster that lost nodes); ``self`` if it fits."""
        caps = (cluster.num_gpus, cluster.total_cpus, cluster.total_mem_mb)
        tops = [i for i in range(len(self)) if self.parent[i] < 0]
        scale = [1.0, 1.0, 1.0]
        for r in range(3):
            s = sum(self.guarantee[i][r] for i in tops)
            if s > caps[r] + 1e-9:
                scale[r] = caps[r] / s
        if scale == [1.0, 1.0, 1.0]:
            return self

        def scaled(q: Queue) -> Queue:
            g = [None if v is None else v * f for v, f in zip((q.guarantee.gpus, q.guarantee.cpus, q.guarantee.mem_mb),
                                                               scale, strict=True)]
            return replace(q, guarantee=Quota(*g))

        return self._copy([scaled(q) for q in self.queues])

    # -- (de)serialisation ---------------------------------------------------------------------
    def as_mapping(self) -> dict[str, Any]:
        d: dict[str, Any] = {"queue": [q.as_dict() for q in self.queues]}
        if self.default is not None:
            d["default"] = self.default
        if self.users:
            d["users"] = dict(self.users)
        if self.groups:
            d["groups"] = {g: sorted(m) for g, m in self.groups.items()}
        return d

    def _copy(self, queues: Sequence[Queue] | None = None, default: Any = "", users: Mapping[str, str] | None = None,
              groups: Mapping[str, Iterable[str]] | None = None) -> QueueTree:
        """A validated copy with what is given changed (``default=""``: unchanged)."""
        return QueueTree(self.queues if queues is None else queues, self.default if default == "" else default,
                         self.users if users is None else users, self.where, self.groups if groups is None else groups)

    def with_queue(self, q: Queue) -> QueueTree:
        """A copy with ``q`` added, or replacing the queue of that name (validated)."""
        qs = [x for x in self.queues if x.name != q.name]
        at = next((k for k, x in enumerate(self.queues) if x.name == q.name), len(qs))
        qs.insert(at, q)
        return self._copy(qs)

    def with_default(self, queue: str | None) -> QueueTree:
        return self._copy(default=queue)

    def with_group(self, group: str, users: Sequence[str] | None) -> QueueTree:
        """A copy with ``group``'s members set (None removes it; a queue that names it must not remain)."""
        groups: dict[str, Iterable[str]] = dict(self.groups)
        if users is None:
            if group not in groups:
                raise QueueError(f"{self.where}: no group {group!r}")
            groups.pop(group)
        else:
            groups[group] = list(users)
        return self._copy(groups=groups)

    def without_queue(self, name: str) -> QueueTree:
        if name not in self.index:
            raise QueueError(f"{self.where}: no queue {name!r}")
        kids = [x.name for x in self.queues if x.parent == name]
        if kids:
            raise QueueError(f"{self.where}: queue {name!r} has sub-queues ({', '.join(kids)}); remove them first")
        users = {u: q for u, q in self.users.items() if q != name}
        return self._copy([x for x in self.queues if x.name != name], None if self.default == name else self.default,
                          users)

    def with_user(self, user: str, queue: str | None) -> QueueTree:
        users = dict(self.users)
        if queue is None:
            users.pop(user, None)
        else:
            users[user] = queue
        return self._copy(users=users)

    @classmethod
    def flat(cls, names: Iterable[str], weights: Mapping[str, float] | None = None,
             guarantees: Mapping[str, float] | None = None, limits: Mapping[str, float] | None = None,
             default: str | None = None) -> QueueTree:
        """Top-level queues only: GPU guarantees/limits and weights per name (what a trace's VCs make)."""
        w, g, lim = weights or {}, guarantees or {}, limits or {}
        qs = [Queue(n, None, Quota(gpus=g.get(n)), Quota(gpus=lim.get(n)), float(w.get(n, 1.0))) for n in names]
        return cls(qs, default)


# -- reading a mapping (TOML, JSON, the store) ------------------------------------------------------
_QUEUE_KEYS = ("name", "parent", "guarantee", "limit", "weight", "users", "groups", "open", "max_priority",
               "max_pending", "per_user", "per_user_limit")
_QUOTA_KEYS = {"gpus": 1.0, "cpus": 1.0, "mem_mb": 1.0, "mem_gb": 1000.0}  # MB = 10^6 bytes, GB = 10^9


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise QueueError(f"{what} must be a number, got {v!r}")
    return float(v)


def parse_quota(value: Any, where: str) -> Quota:
    """``8`` (GPUs) or a table ``{gpus = 8, cpus = 96, mem_gb = 512}`` (``mem_mb`` also accepted)."""
    if value is None:
        return Quota()
    if not isinstance(value, Mapping):
        return Quota(gpus=_number(value, where))
    unknown = sorted(set(value) - set(_QUOTA_KEYS))
    if unknown:
        raise QueueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_QUOTA_KEYS)}")
    if "mem_gb" in value and "mem_mb" in value:
        raise QueueError(f"{where}: give mem_gb or mem_mb, not both")
    vals = {k: _number(v, f"{where}: {k}") * _QUOTA_KEYS[k] for k, v in value.items()}
    mem = vals.get("mem_mb", vals.get("mem_gb"))
    return Quota(vals.get("gpus"), vals.get("cpus"), mem)


def parse_queues(data: Mapping[str, Any], where: str = "queues") -> QueueTree:
    """A :class:`QueueTree` from ``{"queue": [...], "default": ..., "users": {...}, "groups": {...}}`` (see the
    module notes)."""
    if not isinstance(data, Mapping):
        raise QueueError(f"{where}: expected a table with [[queue]] entries")
    unknown = sorted(set(data) - {"queue", "queues", "default", "users", "groups"})
    if unknown:
        raise QueueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: queue, default, users, groups")
    raw = data.get("queue", data.get("queues"))
    if not isinstance(raw, list) or not raw:
        raise QueueError(f"{where}: expected one or more [[queue]] tables")
    queues = []
    for k, q in enumerate(raw):
        at = f"{where}: queue {k + 1}"
        if not isinstance(q, Mapping):
            raise QueueError(f"{at}: expected a table, got {q!r}")
        if isinstance(q.get("name"), str):
            at += f" ({q['name']!r})"
        bad = sorted(set(q) - set(_QUEUE_KEYS))
        if bad:
            raise QueueError(f"{at}: unknown key(s) {', '.join(bad)}; known: {', '.join(_QUEUE_KEYS)}")
        name = q.get("name")
        if not isinstance(name, str) or not name.strip():
            raise QueueError(f"{at}: name must be a non-empty string")
        parent = q.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise QueueError(f"{at}: parent must be a queue name")
        weight = _number(q.get("weight", 1.0), f"{at}: weight")
        queues.append(Queue(name.strip(), parent, parse_quota(q.get("guarantee"), f"{at}: guarantee"),
                            parse_quota(q.get("limit"), f"{at}: limit"), weight,
                            users=_names(q.get("users"), f"{at}: users"), groups=_names(q.get("groups"), f"{at}: groups"),
                            open=_flag(q.get("open"), f"{at}: open"),
                            max_priority=_whole(q.get("max_priority"), f"{at}: max_priority"),
                            max_pending=_whole(q.get("max_pending"), f"{at}: max_pending"),
                            per_user=_flag(q.get("per_user"), f"{at}: per_user"),
                            per_user_limit=parse_quota(q.get("per_user_limit"), f"{at}: per_user_limit")))
    users = data.get("users") or {}
    if not isinstance(users, Mapping) or not all(isinstance(v, str) for v in users.values()):
        raise QueueError(f"{where}: users must be a table of user = \"queue\"")
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise QueueError(f"{where}: default must be a queue name")
    groups = data.get("groups") or {}
    if not isinstance(groups, Mapping):
        raise QueueError(f"{where}: groups must be a table of group = [\"user\", ...]")
    return QueueTree(queues, default, {str(k): v for k, v in users.items()}, where,
                     {str(g): _names(m, f"{where}: group {g!r}") for g, m in groups.items()})


def _names(v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list | tuple) or not all(isinstance(x, str) and x.strip() for x in v):
        raise QueueError(f"{what} must be a list of names, got {v!r}")
    return tuple(x.strip() for x in v)


def _flag(v: Any, what: str) -> bool:
    if v is None:
        return False
    if not isinstance(v, bool):
        raise QueueError(f"{what} must be true or false, got {v!r}")
    return v


def _whole(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise QueueError(f"{what} must be a whole number, got {v!r}")
    return v


def _check_access(q: Queue, where: str) -> None:
    """A queue's access fields, as :class:`Queue` holds them (built by hand or parsed)."""
    at = f"{where}: queue {q.name!r}"
    if q.max_priority is not None and not -MAX_PRIORITY <= q.max_priority <= MAX_PRIORITY:
        raise QueueError(f"{at}: max_priority must be within ±{MAX_PRIORITY}, got {q.max_priority}")
    if q.max_pending is not None and q.max_pending < 0:
        raise QueueError(f"{at}: max_pending must be >= 0, got {q.max_pending}")
    if not q.per_user and not q.per_user_limit.empty:
        raise QueueError(f"{at}: per_user_limit needs per_user = true")


# -- usage ----------------------------------------------------------------------------------------
def job_share(alloc: Any) -> tuple[float, float, float]:
    """What one job's allocation counts against its queue: its GPUs divided among the members of its
    group, its own cores and memory."""
    return alloc.num_gpus / (1 + len(alloc.group)), float(alloc.cpus), float(alloc.mem_mb)


def usage(tree: QueueTree, allocations: Mapping[str, Any], leaf: Mapping[str, int]) -> list[list[float]]:
    """Per queue [gpus, cpus, mem_mb] held by ``allocations`` (job id -> allocation), summed up the tree.

    ``leaf`` maps a job id to its leaf queue; jobs it lacks are not counted.
    """
    out = [[0.0, 0.0, 0.0] for _ in range(len(tree))]
    path = tree.path
    if tree.one_level:  # each job's share is added to its leaf alone
        for jid, a in allocations.items():
            q = leaf.get(jid)
            if q is not None:
                u = out[q]
                u[0] += a.num_gpus / (1 + len(a.group))
                u[1] += float(a.cpus)
                u[2] += float(a.mem_mb)
        return out
    for jid, a in allocations.items():
        q = leaf.get(jid)
        if q is None:
            continue
        g, c, m = a.num_gpus / (1 + len(a.group)), float(a.cpus), float(a.mem_mb)  # (job_share, inlined)
        for n in path[q]:
            u = out[n]
            u[0] += g
            u[1] += c
            u[2] += m
    return out


def summed_up(tree: QueueTree, leaf: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per queue [gpus, cpus, mem_mb] summed up the tree from each leaf's own ``leaf[q]`` (the leaves in order,
    each added to every node of its path: the same additions, so the same floats, wherever this is asked)."""
    out = [[0.0, 0.0, 0.0] for _ in range(len(tree))]
    path = tree.path
    for q in tree.leaves:
        g, c, m = leaf[q]
        for n in path[q]:
            u = out[n]
            u[0] += g
            u[1] += c
            u[2] += m
    return out


def summed_up_gpus(tree: QueueTree, leaf: Sequence[float]) -> list[float]:
    """:func:`summed_up` for one quantity (the GPUs)."""
    out = [0.0] * len(tree)
    path = tree.path
    for q in tree.leaves:
        x = leaf[q]
        for n in path[q]:
            out[n] += x
    return out


class DecayedUsage:
    """Slurm's decayed usage per queue: GPU-seconds, halved every ``half_life`` seconds.

    :meth:`advance` integrates the GPUs each queue held since the last call
    (held constant over the interval) with the decay applied continuously:
    ``U(t+dt) = U(t)·2^(-dt/h) + held·(h/ln 2)·(1 - 2^(-dt/h))``.  The values are
    worked out from the last time what was held changed (the *anchor*) in one step,
    so calls in between that bring nothing new (rounds that changed nothing) change
    no bit of them: a run gives the same usage whether such rounds are computed or
    skipped.
    """

    def __init__(self, size: int, half_life: float) -> None:
        if not (half_life > 0):
            raise QueueError(f"half_life must be > 0 seconds, got {half_life}")
        self.half_life = float(half_life)
        self.values = [0.0] * size
        self.last: float | None = None
        self._anchor: tuple[float, list[float], list[float]] | None = None  # (time, values then, held since)

    def advance(self, now: float, held: Sequence[float]) -> None:
        if self.last is None or now <= self.last:
            self.last = now if self.last is None else self.last
            return
        anchor = self._anchor
        if anchor is None or anchor[2] != list(held):  # held since the last call, which set the values
            anchor = self._anchor = (self.last, list(self.values), list(held))
        t0, start, h = anchor
        k = 2.0 ** (-(now - t0) / self.half_life)
        gain = self.half_life / math.log(2) * (1.0 - k)
        self.values = [u * k + x * gain for u, x in zip(start, h, strict=True)]
        self.last = now
