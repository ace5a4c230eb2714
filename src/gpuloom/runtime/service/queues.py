"""The service's queues: the tree in the store, the scheduler's queue stage, submissions, usage.

The service schedules with the same queue stage as the simulator
(:mod:`gpuloom.policies.queues`); this module keeps its tree:

* **The store is the truth.**  The tree (its TOML form as JSON: queues, users'
  default queues, the default queue) is one row of its own table
  (``queue_config``), written before the scheduler sees it.  ``serve --queues
  FILE`` replaces the stored tree with the file's; without it a restarted
  service takes the stored one.  Every change (the admin API, ``gpuloom queues
  set|delete|user|default``) builds a new tree, validates it (parents, guarantees
  within limits and within the cluster) and refuses it if an active job would
  have no queue in it, so no accepted job is lost to a bad edit.
  A service that follows a changing cluster (``serve --ray``) does not refuse
  a tree whose guarantees exceed the nodes there are now: while nodes are
  missing the stage gets the stored tree with each guarantee the cluster is
  short of scaled down by one factor (:meth:`QueueAdmin.refit`).
* **Submissions** (:meth:`QueueAdmin.assign`): a job goes to the queue it names
  (``submit --queue``), else its user's default queue, else the default queue;
  the choice is stored in the job's spec (``queue``), so a later change of a
  user's default does not move submitted jobs.  A queue that does not exist, or
  has sub-queues, is refused (422).  A job larger than its queue can ever hold
  (its limits, or its guarantee under strict quotas) is refused: it could
  never run.
* **Access** (:class:`QueueDenied`, 403): a user submits only to queues they
  are a member of (:meth:`.QueueTree.member`: listed, by a group, by their
  default queue, or an open or default queue), with a priority up to the
  queue's ``max_priority`` (else ``serve --max-priority``, default 0: users
  may lower their priority, not raise it).  Naming a per-user parent (or
  ``<parent>.<user>``) puts the job in the user's own queue under it, made on
  first submission and stored with the tree.  With a queue stage but no tree
  (``serve --queue-policy drf`` alone) each user's jobs go to a queue of their
  own name: naming another is refused, so no one gains shares by inventing
  queues.  Admin tokens may submit anywhere at any priority.
* **Usage** (:meth:`QueueAdmin.usage`): per queue, the GPUs, cores and memory
  its running jobs hold (a job's GPUs divided among its group), against its
  guarantee and limit, and its jobs' pending reasons.

Decayed usage (``fairshare``) lives in the stage and starts again from zero
after a restart.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Column, Float, Integer, MetaData, Table, Text, insert, select, update

from ...core.job import Job
from ...core.queues import Queue, QueueError, QueueTree, parse_queues, usage
from .admission import PENDING, LimitExceeded
from .states import ACTIVE_STATES

if TYPE_CHECKING:
    from ...core.cluster import Cluster
    from ...driver import Driver
    from ...scheduler import Scheduler
    from ..exec.clock import Clock
    from ..exec.executor import InventorySource
    from ..state.store import Store
    from .admission import Limiter

log = logging.getLogger("gpuloom.service")

_meta = MetaData()
queue_config_t = Table(
    "queue_config",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("doc", Text, nullable=False),  # the tree's mapping (core.queues.parse_queues) as JSON
    Column("updated", Float, nullable=False),
)


POLICY_KEY = "queue_policy"  # (meta) the queue stage the stored tree was last scheduled with


def stored_queues(url: str, opened: Store | None = None) -> tuple[int, str] | None:
    """(queues, policy) of the tree stored in the database at ``url`` (or in the store ``opened``, left open),
    or None when none is (a service restarted without ``--queue-policy`` schedules with them)."""
    from sqlalchemy import inspect as sa_inspect

    from ..state.store import Store

    store = opened if opened is not None else Store(url)
    try:
        if not sa_inspect(store.engine).has_table(queue_config_t.name):
            return None
        with store.lock, store.engine.connect() as c:
            doc = c.execute(select(queue_config_t.c.doc).where(queue_config_t.c.id == 1)).scalar()
        if doc is None:
            return None
        queues = json.loads(doc).get("queue") or []
        return len(queues), store.get_meta(POLICY_KEY) or "quota"
    finally:
        if opened is None:
            store.close()


_ACCESS = ("users", "groups", "open", "max_priority", "max_pending", "per_user", "per_user_limit")


class QueueConflict(QueueError):
    """A change that would leave active jobs without a queue (HTTP 409)."""


class QueueDenied(QueueError):
    """A submission its user may not make (HTTP 403): a queue not open to them, a priority above the limit."""


class QueueHost(Protocol):
    """What the queue tree uses of the service."""

    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def store(self) -> Store: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def inventory(self) -> InventorySource | None: ...
    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def limits(self) -> Limiter: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def clock(self) -> Clock: ...


class QueueAdmin:
    """The tree of one service (see the module notes)."""

    def __init__(self, service: QueueHost) -> None:
        self.service = service
        # the queue stage (policies/queues.py: QuotaQueues and its kin, or the disabled base)
        stage: Any = service.scheduler.queue
        self.stage = stage
        store = service.store
        with store.lock:
            queue_config_t.create(store.engine, checkfirst=True)
        #: the tree as configured and stored; the stage schedules with it fitted to the cluster (:meth:`refit`)
        self.configured: QueueTree | None = None
        self._changes = threading.RLock()  # one change at a time: each builds on the tree the last one left
        doc = self._stored()
        if doc is not None and stage.enabled:
            self._use(parse_queues(doc, "stored queues"))
            if store.get_meta(POLICY_KEY) != stage.name:  # a policy given at start replaces the stored one
                store.set_meta(POLICY_KEY, stage.name)

    @property
    def enabled(self) -> bool:
        return bool(self.stage.enabled)

    @property
    def tree(self) -> QueueTree | None:
        """The tree the stage schedules with (None without a queue stage, or with one per queue name):
        the configured one, its guarantees scaled down while a changing cluster is short of them."""
        if not self.enabled or self.stage.auto:
            return None
        tree: QueueTree = self.stage.tree
        return tree

    def _use(self, tree: QueueTree) -> None:
        self.configured = tree
        self.stage.set_tree(self._fit(tree))

    def _fit(self, tree: QueueTree) -> QueueTree:
        """``tree`` for the cluster as it is: a service that follows a changing cluster (Ray) keeps scheduling
        when nodes leave, with every guarantee it is short of scaled by one factor; a fixed cluster must hold it."""
        if self.service.inventory is None:
            return tree
        fitted = tree.fitted(self.service.cluster)
        if fitted is not tree:
            log.warning("queues: the cluster (%d GPUs) is short of the guarantees; scheduling with them scaled "
                        "down until nodes come back", self.service.cluster.num_gpus)
        return fitted

    def refit(self) -> None:
        """The cluster changed (:func:`.inventory.rebuild`): fit the configured tree to it again."""
        if self.configured is not None and self.enabled:
            fitted = self._fit(self.configured)
            if fitted is not self.stage.tree:
                self.stage.set_tree(fitted)

    # -- the store ----------------------------------------------------------------------------------
    def _stored(self) -> dict[str, Any] | None:
        store = self.service.store
        with store.lock, store.engine.connect() as c:
            doc = c.execute(select(queue_config_t.c.doc).where(queue_config_t.c.id == 1)).scalar()
        return None if doc is None else json.loads(doc)

    def _put(self, tree: QueueTree) -> None:
        store = self.service.store
        doc = json.dumps(tree.as_mapping(), sort_keys=True)
        now = self.service.clock.time()
        with store.lock, store._begin(True) as c:
            if c.execute(select(queue_config_t.c.id).where(queue_config_t.c.id == 1)).first() is None:
                c.execute(insert(queue_config_t).values(id=1, doc=doc, updated=now))
            else:
                c.execute(update(queue_config_t).where(queue_config_t.c.id == 1).values(doc=doc, updated=now))

    # -- changes ------------------------------------------------------------------------------------
    def configure(self, tree: QueueTree) -> None:
        """``serve --queues FILE``: the file's tree replaces the stored one."""
        if not self.enabled:
            raise QueueError("queues need a queue stage: --queue-policy quota, drf or fairshare")
        self.commit(tree)

    def validate(self) -> None:
        """The tree in use (the stored one after a restart) against this cluster and every active job."""
        if self.tree is not None and self.configured is not None:
            self._check(self.configured)

    def commit(self, tree: QueueTree) -> QueueTree:
        """Validate ``tree`` against the cluster and every active job, store it, then schedule with it."""
        if not self.enabled:
            raise QueueError("this service runs without queues (serve --queue-policy quota|drf|fairshare)")
        self._check(tree)
        self._put(tree)
        self.service.store.set_meta(POLICY_KEY, self.stage.name)  # the policy a restart schedules it with
        with self.service.lock:
            self._use(tree)
        return tree

    def _check(self, tree: QueueTree) -> None:
        self._fit(tree).check_capacity(self.service.cluster)
        homeless = []
        for jid, attrs, user in self._active():
            try:
                tree.leaf_of(jid, attrs, user)
            except QueueError as e:
                homeless.append(f"job {jid}: {e}".replace(f"job {jid}: job {jid}: ", f"job {jid}: "))
        if homeless:
            raise QueueConflict("active jobs would have no queue: " + "; ".join(homeless[:5])
                                + (f" (and {len(homeless) - 5} more)" if len(homeless) > 5 else ""))

    def _active(self) -> list[tuple[str, Mapping[str, Any], str]]:
        """(id, attrs, user) of every active job: mirrored ones and those not picked up yet."""
        return [(str(r.id), {"queue": r.spec.get("queue")}, r.user)
                for r in self.service.store.list_jobs(ACTIVE_STATES)]

    def _base(self) -> QueueTree:
        return self.configured if self.tree is not None and self.configured is not None else QueueTree([])

    def set_queue(self, q: Queue) -> QueueTree:
        with self._changes:
            return self.commit(self._base().with_queue(q))

    def delete_queue(self, name: str) -> QueueTree:
        with self._changes:
            base = self._base()
            if name not in base.index:
                raise KeyError(name)
            return self.commit(base.without_queue(name))

    def set_user(self, user: str, queue: str | None) -> QueueTree:
        with self._changes:
            return self.commit(self._base().with_user(user, queue))

    def set_default(self, queue: str | None) -> QueueTree:
        with self._changes:
            return self.commit(self._base().with_default(queue))

    def set_group(self, group: str, users: Sequence[str] | None) -> QueueTree:
        with self._changes:
            return self.commit(self._base().with_group(group, users))

    # -- submissions --------------------------------------------------------------------------------
    def assign(self, spec: dict[str, Any], user: str, admin: bool = False) -> dict[str, Any]:
        """``spec`` with the queue the job goes to (see the module notes); :class:`QueueError` if none,
        :class:`QueueDenied` if ``user`` may not submit there or at that priority (``admin``: anywhere)."""
        named = spec.get("queue")
        if not self.enabled:
            if named:
                raise QueueError("this service runs without queues: submit without --queue")
            self._check_priority(spec, None, -1, admin)
            return spec
        tree = self.tree
        if tree is None:
            if named and named != user and not admin:
                raise QueueDenied(f"queue {named!r}: this service has no queue tree, so each user's jobs go to a "
                                  f"queue of their own ({user!r}); only an admin may name another")
            self._check_priority(spec, None, -1, admin)
            return {**spec, "queue": named or user}
        name = tree.queue_name({"queue": named}, user)
        if name is None:
            raise QueueError(f"name a queue: user {user!r} has no default queue and there is no default queue "
                             f"(queues: {', '.join(tree.leaf_names)})")
        parent = self._per_user_parent(tree, name, user)
        if parent >= 0:  # the user's own queue under an open parent
            if not admin and not tree.member(user, parent):
                raise QueueDenied(self._denied(tree, parent, user))
            tree, name = self._own_queue(parent, user)
        leaf = tree.leaf_index(name, "the job")
        if not admin and not tree.member(user, leaf):
            raise QueueDenied(self._denied(tree, leaf, user))
        # what the queue can ever hold: its limits up the tree, and its guarantee under strict quotas
        cap = min(tree.limit[n][0] for n in tree.path[leaf])
        if not self.stage.borrow:
            cap = min(cap, tree.guarantee[leaf][0])
        if int(spec.get("gpus") or 0) > cap:
            raise QueueError(f"queue {name!r} can never hold more than {cap:g} GPUs; the job asks for {spec['gpus']}")
        self._check_priority(spec, tree, leaf, admin)
        return {**spec, "queue": name}

    @staticmethod
    def _per_user_parent(tree: QueueTree, name: str, user: str) -> int:
        """The per-user parent ``name`` asks for: itself, or the parent of ``<parent>.<user>`` not made yet; else -1."""
        i = tree.index.get(name)
        if i is not None:
            return i if tree.queues[i].per_user else -1
        return next((k for k, q in enumerate(tree.queues) if q.per_user and name == f"{q.name}.{user}"), -1)

    def _own_queue(self, parent: int, user: str) -> tuple[QueueTree, str]:
        """(the tree, ``user``'s queue under per-user queue ``parent``), made and stored on first use."""
        tree = self.tree
        assert tree is not None and self.configured is not None
        want = tree.per_user_queue(parent, user)
        with self._changes:
            tree = self.tree
            assert tree is not None and self.configured is not None
            i = tree.index.get(want.name)
            if i is None:
                self.commit(self.configured.with_queue(want))
                log.info("queues: made %s for %s under %s", want.name, user, want.parent)
                from ..state.audit import record

                record(self.service.store, user, "queue.set", user, want.name, {"parent": want.parent, "per_user": True})
                tree = self.tree
                assert tree is not None
            elif tree.queues[i].parent != want.parent:
                raise QueueError(f"queue {want.name!r} exists outside {want.parent!r}: name another queue")
        return tree, want.name

    @staticmethod
    def _denied(tree: QueueTree, i: int, user: str) -> str:
        name = tree.queues[i].name
        mine = [n for n in tree.leaf_names if tree.member(user, tree.index[n])]
        mine += [q.name for k, q in enumerate(tree.queues) if q.per_user and tree.member(user, k)]
        return (f"queue {name!r} is not open to user {user!r} (it takes: {tree.members(i)}); ask an admin to add "
                f"you to its users or to one of its groups; queues open to you: {', '.join(mine) or 'none'}")

    def _check_priority(self, spec: Mapping[str, Any], tree: QueueTree | None, leaf: int, admin: bool) -> None:
        """A user's priority within the queue's ``max_priority``, else the service's (admins: any)."""
        p = spec.get("priority")
        if admin or p is None:
            return
        found = tree.priority_limit(leaf) if tree is not None else None
        if tree is not None and found is not None:
            limit, setter = found
            name = tree.queues[leaf].name
            what = f"queue {name!r}'s max_priority" + ("" if setter == name else f" (set on {setter!r})")
        else:
            limit = self.service.limits.limits.max_priority
            what = "this service's max_priority (serve --max-priority)"
        if int(p) > limit:
            raise QueueDenied(f"priority {p} is above {what} of {limit}: users may set a priority up to it "
                              "(lower is always allowed); an admin may set any")

    def check_pending(self, spec: Mapping[str, Any], tasks: int) -> None:
        """:class:`.admission.LimitExceeded` if ``tasks`` more jobs would take a queue on the job's path over
        its ``max_pending`` (jobs waiting in it and below it)."""
        tree = self.tree
        name = spec.get("queue")
        if tree is None or name not in tree.index:
            return
        store = self.service.store
        everyone: int | None = None  # all pending jobs: a bound that spares reading specs (an index count)
        for n in tree.path[tree.index[name]]:
            q = tree.queues[n]
            if q.max_pending is None:
                continue
            if everyone is None:
                everyone = store.count_of(PENDING)
            if everyone + tasks <= q.max_pending:
                continue
            have = store.count_of(PENDING, queues=[tree.queues[k].name for k in tree.subtree(n)])
            if have + tasks > q.max_pending:
                raise LimitExceeded(f"queue {q.name!r} has {have} pending jobs; with {tasks} more that is over its "
                                    f"max_pending of {q.max_pending}: wait for some to start or end")

    # -- usage --------------------------------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        """Usage vs quota per queue, users' default queues, the default queue (the API's ``GET /queues``)."""
        stage = self.stage
        if not self.enabled or stage.tree is None:
            return {"policy": stage.name, "queues": [], "users": {}, "default": None, "groups": {}}
        tree: QueueTree = stage.tree
        jobs: dict[str, Job] = dict(self.service.driver.jobs)  # C-level copies: safe beside the loop
        current = dict(self.service.driver.current)
        leaf: dict[str, int] = {}
        for jid, j in jobs.items():
            try:
                leaf[jid] = stage.leaf(j)
            except QueueError:
                continue
        used = usage(tree, {k: a for k, a in current.items() if k in leaf}, leaf)
        running = [0] * len(tree)
        pending = [0] * len(tree)
        reasons: list[dict[str, int]] = [{} for _ in range(len(tree))]
        for jid, lq in leaf.items():
            j = jobs[jid]
            for n in tree.path[lq]:
                if jid in current:
                    running[n] += 1
                else:
                    pending[n] += 1
                    if j.reason:
                        reasons[n][j.reason] = reasons[n].get(j.reason, 0) + 1
        held = [0] * len(tree)  # jobs the gate holds (dependencies, array limits): pending, not yet scheduled
        gate = getattr(self.service, "gate", None)
        for name, n in (dict(gate.by_queue) if gate is not None else {}).items():
            for k in tree.path[tree.index[name]] if name in tree.index else ():
                held[k] += n
        rows = []
        for i, q in enumerate(tree.queues):
            g = tree.guarantee[i]
            rows.append({
                "name": q.name, "parent": q.parent, "depth": len(tree.path[i]) - 1, "leaf": tree.is_leaf[i],
                "weight": q.weight,
                "guarantee": {"gpus": g[0], "cpus": g[1], "mem_mb": g[2]},
                "limit": {k: v for k, v in zip(("gpus", "cpus", "mem_mb"), tree.limit[i], strict=True)
                          if v != float("inf")},
                "used": {"gpus": used[i][0], "cpus": used[i][1], "mem_mb": used[i][2]},
                "borrowed": max(0.0, used[i][0] - g[0]),
                "running": running[i], "pending": pending[i], "held": held[i], "reasons": reasons[i],
                "default": q.name == tree.default,
                # who may submit and the queue's limits, as given (see core/queues.py)
                **{k: v for k, v in q.as_dict().items() if k in _ACCESS},
            })
        return {"policy": stage.name, "queues": rows, "users": dict(tree.users), "default": tree.default,
                "groups": {g: sorted(m) for g, m in tree.groups.items()}}

