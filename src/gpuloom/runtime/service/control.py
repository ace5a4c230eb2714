"""Operator control: node drain, resume and maintenance windows; job hold, release and requeue.

As Slurm's ``scontrol`` has them.  What is decided here is stored in the store's ``meta`` table
(``node_control``, ``job_holds``: JSON) before the API answers, so it survives a restart; the loop
applies it in its observe phase (:meth:`Control.observe`).

* **Nodes** stay in the cluster the driver plans over (running jobs keep their allocations and
  the dashboard keeps showing them).  While any node is drained or has a maintenance window,
  the place policy keeps new work off it and moves running work off a node that evicts it (the view's
  ``blocked`` nodes, :meth:`Control.blocked`); a plan hook (:meth:`Control.hook`) marks the jobs taken
  off and leaves out whatever another stage still puts there (it waits).  ``wait`` drains let the
  node's running jobs finish; ``checkpoint`` drains, and a maintenance window once it has begun,
  take them off too (the driver stops them through the normal preempt path: SIGTERM, checkpoint,
  requeue) and they resume elsewhere.  Before a window starts at ``T`` the node takes only jobs
  whose time limit ends by ``T``; at ``T + D`` the window ends and the node resumes by itself.
* **Holds** keep a queued job out of the driver (the pending reason says ``JobHeldUser`` or
  ``JobHeldAdmin``); a release hands it back to the gate of arrays and dependencies, or to the
  driver.  A user's hold is released by the user or an admin, an admin's only by an admin.
* **Requeue** stops a running job (checkpoint on SIGTERM) and puts it back in the queue: one
  new attempt, as a preemption gives.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...core.cluster import Cluster
from ...core.lifecycle import JobState
from ...core.plan import Plan, drop_job
from ...policies.base import Blocked
from .admission import refuse_reason
from .errors import NotFound, PermissionDenied
from .states import FINAL_STATES, QUEUED_STATES

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ...core.job import Job
    from ...driver import Driver
    from ...policies.base import View
    from ...scheduler import Scheduler
    from ..exec.clock import Clock
    from ..state.store import JobRow, Store
    from .actuator import Actuator
    from .deps import Gate
    from .mirror import Mirror
    from .queues import QueueAdmin

log = logging.getLogger("gpuloom.service")
S = JobState

NODES_KEY = "node_control"
HOLDS_KEY = "job_holds"
MODES = ("wait", "checkpoint")
HELD_USER, HELD_ADMIN = "JobHeldUser", "JobHeldAdmin"  # Slurm's pending reasons
PRUNE_S = 10.0  # holds of jobs that ended (cancelled) are forgotten at most this often
UPDATABLE = ("gpus", "time_limit", "queue", "priority")


class ControlError(ValueError):
    """A control request that cannot be carried out; ``field`` names what is wrong."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class NodeHold:
    """A node's operator state: a drain (``mode`` wait/checkpoint) or a maintenance window [start, end)."""

    kind: str  # "drain" | "maint"
    reason: str
    by: str
    since: float  # wall time it was set
    mode: str = "wait"
    start: float = 0.0  # maintenance: wall times
    end: float = 0.0

    def active(self, t: float) -> bool:
        """Whether the node is out of service at wall time ``t`` (a drain always; a window inside it)."""
        return self.kind == "drain" or self.start <= t < self.end

    def evicts(self, t: float) -> bool:
        """Whether running jobs are taken off the node at ``t``."""
        return (self.kind == "drain" and self.mode == "checkpoint") or (self.kind == "maint" and self.active(t))

    def admits(self, t: float, time_limit: float | None) -> bool:
        """Whether a job of ``time_limit`` seconds (None: none) may start on the node at ``t``."""
        if self.active(t):
            return False
        # before a window: only a job that will have ended by its start
        return time_limit is not None and t + time_limit <= self.start

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "by": self.by, "since": self.since, "mode": self.mode,
                "start": self.start, "end": self.end}


class Controlled(Protocol):
    """What the controls use of the service."""

    parked: dict[int, float]
    last_id: int

    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def store(self) -> Store: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def mirror(self) -> Mirror: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def actuator(self) -> Actuator: ...
    @property
    def queues(self) -> QueueAdmin: ...
    @property
    def telemetry(self) -> Any: ...
    def now(self) -> float: ...
    def wake(self) -> None: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def validate(self, spec: Mapping[str, Any], user: str | None = None) -> None: ...
    def fits_or_fail(self, row: JobRow) -> bool: ...
    def admit_row(self, row: JobRow, state: JobState, arrival: float | None = None) -> Job: ...


class Control:
    """The operator's node and job controls of one service (see the module notes)."""

    def __init__(self, svc: Controlled) -> None:
        self.svc = svc
        self.lock = threading.Lock()  # the dicts below: API threads vs the loop
        raw = svc.store.get_meta(NODES_KEY)
        self.nodes: dict[str, NodeHold] = {k: NodeHold(**v) for k, v in json.loads(raw or "{}").items()}
        raw = svc.store.get_meta(HOLDS_KEY)
        self.holds: dict[int, str] = {int(k): v for k, v in json.loads(raw or "{}").items()}
        self._to_hold: set[int] = set()  # held since the loop last looked
        self._to_release: set[int] = set()
        self._to_requeue: set[int] = set()
        self.requeued: set[int] = set()  # stopped by a requeue, not yet back in the queue
        self._prune_at = 0.0  # (monotonic) when holds of jobs that ended are next forgotten
        self._sync_hook()
        svc.telemetry.registry.register(_Gauges(self))

    # -- stored state ------------------------------------------------------------------
    def _save_nodes(self) -> None:
        self.svc.store.set_meta(NODES_KEY, json.dumps({k: v.to_json() for k, v in sorted(self.nodes.items())}))

    def _save_holds(self) -> None:
        self.svc.store.set_meta(HOLDS_KEY, json.dumps({str(k): v for k, v in sorted(self.holds.items())}))

    def _sync_hook(self) -> None:
        """The plan hook is in the scheduler exactly while some node is drained or has a window
        (a hook turns off the scheduler's shortcuts)."""
        want = bool(self.nodes or self.requeued)
        sched = self.svc.scheduler
        for hooks in (sched.hooks, sched.final_hooks):  # (the last word too: over a queue stage's reclaims)
            if want and self.hook not in hooks:
                hooks.append(self.hook)
            elif not want and self.hook in hooks:
                hooks.remove(self.hook)
        sched.blocked = self.blocked if self.nodes else None

    # -- nodes (API side) ----------------------------------------------------------------
    def _node(self, name: str) -> str:
        if name not in {n.name for n in self.svc.cluster.nodes}:
            raise NotFound(f"node {name!r}")
        return name

    def drain(self, name: str, reason: str, mode: str, by: str) -> NodeHold:
        if mode not in MODES:
            raise ControlError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}", "mode")
        if not reason.strip():
            raise ControlError("reason: give why the node is drained (Slurm requires one too)", "reason")
        with self.lock:
            h = self.nodes[self._node(name)] = NodeHold("drain", reason.strip(), by, self.svc.clock.time(), mode)
            self._save_nodes()
            self._sync_hook()
        log.info("node %s drained (%s) by %s: %s", name, mode, by, reason)
        self.svc.wake()
        return h

    def maintenance(self, name: str, start: float, duration: float, reason: str, by: str) -> NodeHold:
        if duration <= 0:
            raise ControlError(f"duration: must be positive, got {duration:g} s", "duration")
        if not reason.strip():
            raise ControlError("reason: give why the node goes into maintenance", "reason")
        with self.lock:
            h = self.nodes[self._node(name)] = NodeHold("maint", reason.strip(), by, self.svc.clock.time(),
                                                        "checkpoint", start, start + duration)
            self._save_nodes()
            self._sync_hook()
        log.info("node %s: maintenance from %.0f for %.0f s set by %s: %s", name, start, duration, by, reason)
        self.svc.wake()
        return h

    def resume(self, name: str, by: str) -> bool:
        """Back in service; False if it was not drained."""
        with self.lock:
            was = self.nodes.pop(self._node(name), None)
            if was is not None:
                self._save_nodes()
                self._sync_hook()
        if was is not None:
            log.info("node %s resumed by %s", name, by)
            self.svc.wake()
        return was is not None

    def node_json(self, name: str, used: int, total: int, t: float) -> dict[str, Any]:
        """A node's ``state`` as sinfo's (idle/mixed/alloc, drng/drain, maint), the ``reason`` and,
        for a window, its ``maintenance`` start and end (wall times)."""
        h = self.nodes.get(name)
        state = "mixed" if 0 < used < total else ("alloc" if used else "idle")
        if h is None:
            return {"state": state, "reason": None, "drain_mode": None, "maintenance": None}
        if h.kind == "maint":
            return {"state": "maint" if h.active(t) else state, "reason": h.reason, "drain_mode": None,
                    "maintenance": {"start": h.start, "end": h.end, "by": h.by}}
        return {"state": "drng" if used else "drain", "reason": h.reason, "drain_mode": h.mode, "maintenance": None}

    # -- the plan hook -------------------------------------------------------------------
    def _limit(self, jid: str) -> float | None:
        row = self.svc.mirror.rows.get(jid)
        tl = row.spec.get("time_limit") if row is not None else None
        return float(tl) if tl else None

    def blocked(self, view: View) -> Blocked | None:
        """The nodes held now, for the place policy: none may start a job while drained or in a
        window; before a window, a job whose time limit ends by its start may."""
        t = self.svc.clock.time()
        room = {i: (-1.0 if h.active(t) else h.start - t) for i, n in enumerate(view.cluster.nodes)
                if (h := self.nodes.get(n.name)) is not None}
        if not room:
            return None
        return Blocked(room, self._limit, frozenset(i for i, n in enumerate(view.cluster.nodes)
                                                    if (h := self.nodes.get(n.name)) is not None and h.evicts(t)))

    def hook(self, plan: Plan, view: View) -> Plan:
        """Keep new work off drained nodes, and take running work off evicting ones (module notes);
        jobs being requeued are left out (the driver stops them)."""
        if self.requeued:
            allocs = dict(plan.allocations)
            for j in self.requeued:
                if str(j) in allocs:
                    drop_job(allocs, str(j))
            plan = Plan(allocs)
        t = self.svc.clock.time()
        names = [n.name for n in view.cluster.nodes]
        holds = {i: self.nodes[n] for i, n in enumerate(names) if n in self.nodes}
        if not holds:
            return plan
        current = view.current
        off: list[str] = []
        for jid, a in plan.allocations.items():
            on = [p.node for p in a.parts if p.node in holds]
            if not on:
                continue
            if current.get(jid) == a:  # staying where it runs
                why = [holds[n] for n in on if holds[n].evicts(t)]
                if why:
                    off.append(jid)
                    self.svc.mirror.event(jid, "node-drain", {"nodes": [names[n] for n in on],
                                                              "reason": why[0].reason})
            elif any(not holds[n].admits(t, self._limit(jid)) for n in on):
                off.append(jid)
        self._evicted(plan, view, holds, t)
        if not off:
            return plan
        forgive = getattr(self.svc.scheduler.queue, "forgive", None)
        if forgive is not None:  # (a queue owed GPUs that are on a drained node is not starved by the plan)
            forgive()
        allocs = dict(plan.allocations)
        for jid in off:  # (the size and place policies keep off them: a guard for other stages' plans)
            drop_job(allocs, jid)
        return Plan(allocs)

    def _evicted(self, plan: Plan, view: View, holds: Mapping[int, NodeHold], t: float) -> None:
        """A ``node-drain`` event for each running job the plan takes off a node that evicts it (the
        place policy moves such jobs itself: :meth:`~gpuloom.policies.base.Blocked.keeps`)."""
        allocs = plan.allocations
        names = view.cluster.nodes
        requeued = {str(j) for j in self.requeued}
        for jid, a in view.current.items():
            why = [holds[p.node] for p in a.parts if p.node in holds and holds[p.node].evicts(t)]
            if why and allocs.get(jid) != a and jid not in requeued:
                self.svc.mirror.event(jid, "node-drain", {"nodes": [names[p.node].name for p in a.parts
                                                                    if p.node in holds],
                                                          "reason": why[0].reason})

    def amend_reasons(self, driver: Driver) -> list[Job]:
        """Waiting jobs that fit only on blocked nodes: their pending reason says so (Slurm's
        ``ReqNodeNotAvail``).  Returns the jobs whose reason changed."""
        if not self.nodes:
            return []
        t = self.svc.clock.time()
        blocked = sorted(n for n, h in self.nodes.items() if h.active(t) or h.kind == "drain")
        if not blocked:
            return []
        usable = tuple(n for n in self.svc.cluster.nodes if n.name not in blocked)
        cl = Cluster(usable) if usable else None
        why = f"ReqNodeNotAvail, UnavailableNodes:{','.join(blocked)}"
        # by shape first (the driver counts its waiting jobs by shape): most rounds find none to mark
        never = {sh for sh in list(driver.tally.waiting) if cl is None or refuse_reason(cl, *sh) is not None}
        out = []
        if never:
            for job in list(driver.tally.idle.values()):
                if job.shape in never and job.reason != why:
                    job.reason = why
                    out.append(job)
        return out

    # -- jobs (API side) -----------------------------------------------------------------
    def hold(self, row: JobRow, user: str, admin: bool) -> str:
        """Hold a queued job; what was done ("held", or why not)."""
        if row.state not in QUEUED_STATES:
            return f"not pending ({row.state})"
        with self.lock:
            if row.id in self.holds:
                return "already held"
            self.holds[row.id] = HELD_ADMIN if admin and row.user != user else HELD_USER
            self._save_holds()
            self._to_hold.add(row.id)
        self.svc.store.add_event(row.id, "hold", {"by": user, "reason": self.holds[row.id]})
        self.svc.wake()
        return "held"

    def release(self, row: JobRow, user: str, admin: bool) -> str:
        with self.lock:
            how = self.holds.get(row.id)
            if how is None:
                return "not held"
            if how == HELD_ADMIN and not admin:
                raise PermissionDenied(f"job {row.id} was held by an admin; only an admin may release it")
            del self.holds[row.id]
            self._save_holds()
            self._to_release.add(row.id)
        self.svc.store.add_event(row.id, "release", {"by": user})
        self.svc.wake()
        return "released"

    def requeue(self, row: JobRow, user: str) -> str:
        if row.state in FINAL_STATES or row.state in QUEUED_STATES:
            return f"not running ({row.state})"
        with self.lock:
            if row.id in self._to_requeue or row.id in self.requeued:
                return "already requeued"
            self._to_requeue.add(row.id)
        self.svc.store.add_event(row.id, "requeue-request", {"by": user})
        self.svc.wake()
        return "requeued"

    def held_reason(self, job_id: int) -> str | None:
        return self.holds.get(job_id)

    def update(self, job_id: int, changes: Mapping[str, Any], user: str, admin: bool) -> JobRow:
        """Change a pending job's ``gpus``, ``time_limit`` (seconds), ``queue`` or ``priority``, through the
        checks a submission passes (the cluster, the queue's permissions and priority limit).  Raises
        :class:`ControlError`, :class:`.errors.SubmitError`, ``QueueDenied``/``QueueError``."""
        svc = self.svc
        row = svc.store.get_job(job_id)
        if row is None:
            raise NotFound(job_id)
        if not admin and row.user != user:
            raise PermissionDenied(f"job {job_id} belongs to {row.user}; only its owner or an admin may update it")
        if row.state not in QUEUED_STATES:
            raise ControlError(f"job {job_id} is {row.state}: only a pending job can be updated", "job")
        bad = sorted(set(changes) - set(UPDATABLE))
        if bad or not changes:
            raise ControlError(f"update: give one or more of {', '.join(UPDATABLE)}"
                               + (f" (not {', '.join(bad)})" if bad else ""), bad[0] if bad else "update")
        spec = {**row.spec, **changes}
        spec = svc.queues.assign(spec, row.user, admin)  # the queue's permissions, its cap, the priority limit
        svc.validate(spec, row.user)
        with svc.lock:  # between rounds: the loop never holds the old spec while the store has the new one
            done = svc.store.update_job(job_id, {"spec": spec}, "update", {"by": user, **changes},
                                        expect_state=QUEUED_STATES, now=svc.clock.time())
            if not done:
                raise ControlError(f"job {job_id} is no longer pending", "job")
            self._take_out(job_id)
            self._hand_back([job_id])
        svc.wake()
        new = svc.store.get_job(job_id)
        assert new is not None
        return new

    # -- the loop's side -------------------------------------------------------------------
    def keeps_out(self, row: JobRow) -> bool:
        """Whether a job about to be admitted is held (its pending reason is then recorded)."""
        how = self.holds.get(row.id)
        if how is None:
            return False
        # (always: the gate that hands it over has just stored its own reason for it)
        self.svc.mirror.record(str(row.id), {"pending_reason": how})
        row.pending_reason = how
        return True

    def observe(self) -> None:
        """Apply holds, releases and requeues asked for since the last round; end maintenance windows."""
        svc = self.svc
        t = svc.clock.time()
        with self.lock:
            hold, self._to_hold = self._to_hold, set()
            release, self._to_release = self._to_release, set()
            requeue, self._to_requeue = self._to_requeue, set()
            over = [n for n, h in self.nodes.items() if h.kind == "maint" and t >= h.end]
            for n in over:  # the window is over: the node resumes by itself
                del self.nodes[n]
            if over:
                self._save_nodes()
                self._sync_hook()
        for n in over:
            log.info("node %s: maintenance window over, resumed", n)
        if self.holds and svc.clock.monotonic() >= self._prune_at:  # holds of jobs cancelled since
            self._prune_at = svc.clock.monotonic() + PRUNE_S
            asked = list(self.holds)  # (a hold added meanwhile is not looked at: its state was not read)
            states = svc.store.job_states(asked)
            with self.lock:
                gone = [j for j in asked if j in self.holds and states.get(j, ("",))[0] not in QUEUED_STATES]
                for j in gone:
                    del self.holds[j]
                if gone:
                    self._save_holds()
        for jid in sorted(hold):
            self._take_out(jid)
        if release:
            self._hand_back(release)
        if requeue:
            self._requeue(sorted(requeue))
        if self.requeued:  # stopped by a requeue: back in the queue (STANDBY), placed by the next round
            drv = svc.driver
            self.requeued = {j for j in self.requeued if str(j) in drv.current or str(j) in svc.actuator.running}
            if not self.requeued:
                with self.lock:
                    self._sync_hook()

    def _take_out(self, jid: int) -> None:
        svc = self.svc
        sid = str(jid)
        svc.gate.drop(jid)
        svc.parked.pop(jid, None)
        job = svc.driver.jobs.get(sid)
        if job is not None and sid not in svc.driver.current and sid not in svc.actuator.running:
            svc.driver.finish(job, svc.now(), S.CANCELLED)  # out of the driver (the stored state stays queued)
            svc.mirror.drop(sid)
        elif job is not None:  # it started meanwhile: a hold of a running job does nothing (as Slurm's)
            with self.lock:
                if self.holds.pop(jid, None) is not None:
                    self._save_holds()
            return
        how = self.holds.get(jid)
        if how is not None:
            svc.mirror.record(sid, {"pending_reason": how})

    def _hand_back(self, ids: Iterable[int]) -> None:
        svc = self.svc
        rows = svc.store.get_jobs(ids)
        for jid, row in sorted(rows.items()):
            if row.state not in QUEUED_STATES or str(jid) in svc.driver.jobs or jid in self.holds:
                continue
            if jid > svc.last_id:  # not read by the loop yet: it will be, as any new submission
                continue
            svc.mirror.record(str(jid), {"pending_reason": None})
            row.pending_reason = None
            if row.state == S.WAITING_FOR_INITIAL_CONTACT.value:
                svc.gate.add(row)  # arrays and dependencies decide, as for a new submission
            elif svc.fits_or_fail(row):
                svc.admit_row(row, JobState(row.state))

    def _requeue(self, ids: list[int]) -> None:
        """Stop running jobs as a preemption does; they come back to the queue once stopped."""
        svc = self.svc
        drv = svc.driver
        for jid in ids:
            sid = str(jid)
            job = drv.jobs.get(sid)
            if job is None or sid not in drv.current:
                continue
            self.requeued.add(jid)
            svc.mirror.event(sid, "requeue", {})
        with self.lock:
            self._sync_hook()


STATES = ("idle", "mixed", "alloc", "drng", "drain", "maint")


class _Gauges(Collector):
    """``gpuloom_node_state{node,state}`` (1 for the node's state, 0 for the others, as node exporters
    give states) and ``gpuloom_jobs_held{reason}``, read at scrape time."""

    def __init__(self, ctl: Control) -> None:
        self.ctl = ctl

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily("gpuloom_node_state", "1 for the node's state (sinfo's: idle, mixed, alloc, "
                                "drng, drain, maint), 0 for the others.", labels=["node", "state"])
        for n in self.ctl.svc.nodes():
            for st in STATES:
                fam.add_metric([n["name"], st], 1.0 if n["state"] == st else 0.0)
        yield fam
        held = GaugeMetricFamily("gpuloom_jobs_held", "Pending jobs held (scontrol hold), by pending reason.",
                                 labels=["reason"])
        how = list(self.ctl.holds.values())
        for r in (HELD_USER, HELD_ADMIN):
            held.add_metric([r], how.count(r))
        yield held

