"""What the service tells its operator: a log line per job transition, Prometheus metrics, recent history.

:class:`Telemetry` hangs off the service (what it reads of it: :class:`Watched`):

* it **listens to the store** (:attr:`Store.listeners <.store.Store.listeners>`):
  every committed job event becomes one log line on logger ``gpuloom.jobs``
  (submit, launch, resume, move, resize, preempt, finish, fail, cancel,
  requeue, adopt at INFO, failures at WARNING, intermediate lifecycle states
  at DEBUG) with the job id, its user (whose job), the actor (who caused it:
  :func:`..state.audit.event_actor`; a running job's cancel is its requester's),
  its name, queue, nodes and GPUs as structured fields (:mod:`.logfmt`), and
  counts it;
* it keeps **metrics** in a registry of its own (one per service, so tests
  may run several): counters and histograms updated as things happen, and
  gauges computed at scrape time from the service's current allocation and
  the store (:class:`_Collector`).  ``GET /metrics`` serves them;
* after every round it **samples** the cluster (GPUs allocated and busy, jobs
  pending and running, GPUs used per queue) for the dashboard's charts, at most
  one point per ``sample_s``: kept in a ring of recent points
  (``history_points``) and stored (:mod:`.series`); with each sample it
  attributes the nodes' NVML readings to jobs (:mod:`.gputel`).

GPUs *allocated* are those some job's allocation holds; *busy* those held by a
job whose process runs (``launching``, ``running_protected``, ``running``: not
waiting, checkpointing or stopping) and, where NVML samples the GPU
(:mod:`.gputel`), whose utilisation is above 0.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...core.lifecycle import PROGRESS_STATES, SHORT_STATE, JobState
from ...core.queues import QueueError
from ...core.queues import usage as queue_usage
from ..state.audit import event_actor
from ..state.store import unavailable
from . import opsmetrics
from .gputel import GpuCollector, JobGpus
from .health import Observed, readiness
from .series import SeriesRecorder

if TYPE_CHECKING:
    from ...core.plan import Action
    from .deps import Gate
    from .mirror import Mirror

jlog = logging.getLogger("gpuloom.jobs")
S = JobState

#: store event kind -> (logged event, level); other kinds (lifecycle states) are logged at DEBUG
EVENTS: Mapping[str, tuple[str, int]] = {
    "submit": ("submit", logging.INFO),
    "launch": ("launch", logging.INFO),
    "move": ("move", logging.INFO),
    "resize": ("resize", logging.INFO),
    "preempt": ("preempt", logging.INFO),
    "stop-for-move": ("stop", logging.INFO),
    "stop-for-resize": ("stop", logging.INFO),
    "finished": ("finish", logging.INFO),
    "failed": ("fail", logging.WARNING),
    "cancelled": ("cancel", logging.INFO),
    "cancel": ("cancel", logging.INFO),
    "requeue": ("requeue", logging.INFO),
    "adopt": ("adopt", logging.INFO),
    "profiled": ("profiled", logging.INFO),
    "unprofilable": ("unprofilable", logging.WARNING),
}
_VERB = {"submit": "submitted", "launch": "launched", "resume": "resumed", "move": "moved", "resize": "resized",
         "preempt": "preempted", "stop": "stopped", "finish": "finished", "fail": "failed", "cancel": "cancelled",
         "requeue": "requeued", "adopt": "adopted"}
_ENDS = ("finished", "failed", "cancelled", "cancel")
_PD_STATES = frozenset(s.value for s, code in SHORT_STATE.items() if code == "PD")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


def gpus_of(alloc: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """(node names, ``node:local GPU index`` labels) of a stored allocation."""
    nodes: list[str] = []
    gpus: list[str] = []
    for p in (alloc or {}).get("parts", []):
        nodes.append(str(p["node"]))
        gpus.extend(f"{p['node']}:{g}" for g in p.get("local_gpus", p.get("gpus", [])))
    return nodes, gpus


_Who = tuple[str | None, str | None, str | None, str | None]


class Watched(Observed, Protocol):
    """What telemetry reads of the service: what ``/ready`` reads, the mirror, the gate, the last round."""

    @property
    def mirror(self) -> Mirror: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def last_round_s(self) -> float: ...


class Telemetry:
    def __init__(self, service: Watched, sample_s: float = 2.0, history_points: int = 3600) -> None:
        self.svc = service
        self.sample_s = sample_s
        self.samples: deque[dict[str, float]] = deque(maxlen=history_points)
        self._last_sample = -1e18
        self._alloc: dict[int, Mapping[str, Any]] = {}  # last stored allocation per job (for stop/end lines)
        self._users: dict[int, _Who] = {}  # (user, array task, name, queue) per job until it ends
        self._cancel_by: dict[int, str] = {}  # who asked to cancel a running job, until it ends
        self._lock = threading.Lock()
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.rounds = Counter("gpuloom_rounds", "Scheduling rounds run.", registry=r)
        self.round_seconds = Histogram(
            "gpuloom_round_duration_seconds", "Duration of a scheduling round (observe + act).", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0))
        self.submit_seconds = Histogram(
            "gpuloom_submit_latency_seconds", "Time to validate and commit a submission (API).", registry=r,
            buckets=LATENCY_BUCKETS)
        self.launch_seconds = Histogram(
            "gpuloom_launch_latency_seconds", "Time from submission to a job's first launch.", registry=r,
            buckets=LATENCY_BUCKETS)
        self.events = Counter("gpuloom_job_events", "Job transitions, by event.", ["event"], registry=r)
        self.preemptions = Counter("gpuloom_preemptions", "Jobs stopped by the scheduler (preempted, or "
                                   "stopped to move or resize).", registry=r)
        self.failures = Counter("gpuloom_job_failures", "Jobs that failed.", registry=r)
        self.gpus = JobGpus(service)  # NVML readings attributed to jobs (gputel)
        self.series = SeriesRecorder(service.store, sample_s)  # the samples, stored (series)
        r.register(_Collector(self))
        r.register(GpuCollector(self.gpus))
        opsmetrics.register(r, service)  # type: ignore[arg-type]  # (its queues are made after its telemetry)
        service.store.listeners.append(self.on_event)

    def close(self) -> None:
        self.series.flush()
        try:
            self.svc.store.listeners.remove(self.on_event)
        except ValueError:
            pass

    # -- the store's events ------------------------------------------------------------------
    def on_event(self, job_id: int | None, kind: str, detail: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        if job_id is None:
            return
        event, level = EVENTS.get(kind, (kind, logging.DEBUG))
        if kind == "launch" and detail.get("resume"):
            event = "resume"
        alloc = fields.get("alloc")
        actor = event_actor(kind, detail)
        with self._lock:
            if alloc:
                self._alloc[job_id] = alloc
            elif kind in _ENDS or "alloc" in fields:
                alloc = self._alloc.pop(job_id, None) if kind in _ENDS else self._alloc.get(job_id)
            if kind == "cancel-request":
                self._cancel_by[job_id] = actor
            elif kind in _ENDS and (asked := self._cancel_by.pop(job_id, None)) is not None and "cancel" in kind:
                actor = asked
        if level >= logging.INFO:
            self.events.labels(event).inc()
        if event in ("preempt", "stop"):
            self.preemptions.inc()
        elif event == "fail":
            self.failures.inc()
        row = self.svc.mirror.rows.get(str(job_id))
        if kind == "launch" and fields.get("attempts") == 1 and row is not None and fields.get("first_start"):
            self.launch_seconds.observe(max(0.0, float(fields["first_start"]) - row.submit_time))
        if not jlog.isEnabledFor(level):
            return
        who = self._who(job_id, kind, detail, fields, row, level)
        nodes, gpus = gpus_of(alloc)
        extra: dict[str, Any] = {"event": event, "job": job_id}
        if who[0]:
            extra["user"] = who[0]
        extra["actor"] = actor
        if who[2]:
            extra["job_name"] = who[2]  # (written as "name": logging keeps that for the logger's)
        if who[3]:
            extra["queue"] = who[3]
        if nodes:
            extra["nodes"], extra["gpus"] = nodes, gpus
        for k in ("exit_code", "reason"):
            v = detail.get(k, fields.get(k))
            if v is not None:
                extra[k] = v
        if who[1]:
            extra["array"] = who[1]
        where = f" on {','.join(nodes)} GPUs {','.join(g.split(':', 1)[1] for g in gpus)}" if nodes else ""
        tail = f": {extra['reason']}" if extra.get("reason") else ""
        jlog.log(level, "job %s %s%s%s", job_id, _VERB.get(event, event), where, tail, extra=extra)

    def _who(self, job_id: int, kind: str, detail: Mapping[str, Any], fields: Mapping[str, Any], row: Any,
             level: int) -> _Who:
        """(user, array task label, name, queue) of a job, remembered from its first logged event until its end."""
        with self._lock:
            who = self._users.get(job_id)
        if who is None:
            if row is None and kind != "submit" and level >= logging.INFO:
                row = self.svc.store.get_job(job_id)  # e.g. a job that ended before the mirror loaded it
            user = detail.get("user") if kind == "submit" else (row.user if row is not None else None)
            arr = None if row is None or row.array_id is None else f"{row.array_id}_{row.array_task}"
            if kind == "submit" and fields.get("array_id") is not None:
                arr = f"{fields['array_id']}_{fields['array_task']}"
            if kind == "submit":
                name, queue = fields.get("name"), fields.get("queue")
            else:
                name, queue = (None, None) if row is None else (row.name, row.spec.get("queue"))
            who = (user, arr, name, queue or None)
        with self._lock:
            if kind in _ENDS:
                self._users.pop(job_id, None)
            else:
                self._users[job_id] = who
        return who

    # -- rounds ------------------------------------------------------------------------------
    def round_done(self, actions: Sequence[Action], seconds: float) -> None:
        self.rounds.inc()
        self.round_seconds.observe(seconds)
        m = self.svc.clock.monotonic()  # the interval: monotonic; the sample's time: wall, for people
        if m - self._last_sample >= self.sample_s:
            self._last_sample = m
            self.gpus.observe(m)
            point = self.sample()
            self.samples.append(point)
            self.series.add({**point, "queues": self.queue_gpus()})

    def sample(self, t: float | None = None) -> dict[str, float]:
        """The cluster now: GPUs total / allocated / busy, jobs pending / running."""
        snap = self.gpu_use()
        drv = self.svc.driver
        jobs = dict(drv.jobs)
        holding = set(dict(drv.current))
        return {
            "time": self.svc.clock.time() if t is None else t,
            "gpus": float(self.svc.cluster.num_gpus),
            "allocated": float(sum(len(v) for v in snap["allocated"].values())),
            "busy": float(sum(len(v) for v in snap["busy"].values())),
            # (counted over the holding jobs: a round's sample costs O(running jobs), not O(queue))
            "pending": float(len(jobs) - sum(1 for j in holding if j in jobs) + len(self.svc.gate)),
            "running": float(len(holding)),
        }

    def queue_gpus(self) -> dict[str, float]:
        """GPUs each queue's running jobs hold (summed up the tree; empty without queues): O(running jobs)."""
        queues = getattr(self.svc, "queues", None)
        stage = queues.stage if queues is not None and queues.enabled else None
        tree = stage.tree if stage is not None else None
        if stage is None or tree is None:
            return {}
        jobs = dict(self.svc.driver.jobs)
        current = dict(self.svc.driver.current)
        leaf: dict[str, int] = {}
        for jid in current:
            if jid in jobs:
                try:
                    leaf[jid] = stage.leaf(jobs[jid])
                except QueueError:
                    continue
        used = queue_usage(tree, current, leaf)
        return {q.name: used[i][0] for i, q in enumerate(tree.queues)}

    def gpu_use(self) -> dict[str, dict[str, set[int]]]:
        """Per node name: node-local GPU indices allocated, and busy (see the module notes)."""
        cl = self.svc.cluster
        current = dict(self.svc.driver.current)  # snapshots: the loop may be mid-round
        jobs = dict(self.svc.driver.jobs)
        alloc: dict[str, set[int]] = {n.name: set() for n in cl.nodes}
        busy: dict[str, set[int]] = {n.name: set() for n in cl.nodes}
        util = self.gpus.util
        for jid, a in current.items():
            job = jobs.get(jid)
            lc = job.lifecycle if job is not None else None
            # busy: its process runs (launched or making progress) and, where NVML samples the GPU, it computes
            running = lc is not None and (lc.state in PROGRESS_STATES or lc.state is S.LAUNCHING)
            for p in a.parts:
                name = cl.nodes[p.node].name
                local = {cl.local_index(g) for g in p.gpus}
                alloc[name] |= local
                if running:
                    busy[name] |= {g for g in local if (u := util(name, g)) is None or u > 0}
        return {"allocated": alloc, "busy": busy}

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    """Gauges read at scrape time: per-node GPUs, jobs by state, by queue and by pending reason."""

    def __init__(self, tel: Telemetry) -> None:
        self.tel = tel

    def describe(self) -> Iterator[Any]:
        return iter(())  # computed at scrape time (no fixed descriptions)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        svc = self.tel.svc
        use = self.tel.gpu_use()
        total = GaugeMetricFamily("gpuloom_node_gpus", "GPUs on the node.", labels=["node", "gpu_type"])
        allocated = GaugeMetricFamily("gpuloom_node_gpus_allocated", "GPUs some job's allocation holds.",
                                      labels=["node"])
        busy = GaugeMetricFamily("gpuloom_node_gpus_busy", "GPUs held by jobs making progress.", labels=["node"])
        for n in svc.cluster.nodes:
            total.add_metric([n.name, n.gpu_type], n.gpus)
            allocated.add_metric([n.name], len(use["allocated"][n.name]))
            busy.add_metric([n.name], len(use["busy"][n.name]))
        yield from (total, allocated, busy)
        _, body = readiness(svc)
        fam = GaugeMetricFamily("gpuloom_ready", "1 if the readiness check passes (GET /ready), else 0.",
                                labels=["check"])
        for check, verdict in body["checks"].items():
            fam.add_metric([check], 1.0 if verdict == "ok" else 0.0)
        yield fam
        fam = GaugeMetricFamily("gpuloom_unrecorded_changes", "Job changes the store has not taken yet (a full "
                                "disk, a database down); no job starts while any wait.")
        fam.add_metric([], len(svc.outbox))
        yield fam
        try:  # the one family read from the store: left out while it cannot answer
            counts = svc.store.count_by_state()
        except Exception as e:
            if not unavailable(e):
                raise
            counts = None
        if counts is not None:
            by_state = GaugeMetricFamily("gpuloom_jobs", "Jobs in the store, by lifecycle state and Slurm code.",
                                         labels=["state", "st"])
            for state in JobState:
                by_state.add_metric([state.value, SHORT_STATE[state]], counts.get(state.value, 0))
            yield by_state
        # jobs held back by the gate are counted as they come and go; the mirrored ones here
        by_queue: dict[tuple[str, str], int] = {(q, "PD"): n for q, n in dict(svc.gate.by_queue).items()}
        by_reason: dict[str, int] = dict(svc.gate.by_reason)
        # copies first (one C call each: nothing runs between its reads), then iterated: the loop changes
        # these dicts meanwhile, and iterating one live (even list(d.items()), whose allocations may run
        # the garbage collector and with it another thread) raised "dictionary changed size during iteration"
        jobs = dict(svc.driver.jobs)
        rows = dict(svc.mirror.rows)
        entries = [(r, jobs[jid].lifecycle) for jid, r in rows.items() if jid in jobs]
        for row, lc in entries:
            st = SHORT_STATE[lc.state] if lc is not None else "PD"
            q = str(row.spec.get("queue") or "")
            by_queue[q, st] = by_queue.get((q, st), 0) + 1
            if st == "PD" and row.pending_reason:
                r = row.pending_reason.split(":", 1)[0]
                by_reason[r] = by_reason.get(r, 0) + 1
        fam = GaugeMetricFamily("gpuloom_queue_jobs", "Active jobs by queue and Slurm state code (PD, R, CG).",
                                labels=["queue", "st"])
        for (q, code), count in sorted(by_queue.items()):
            fam.add_metric([q, code], count)
        yield fam
        # every pending job has a reason: those no round has given one yet (picked up since, or not yet
        # picked up from the store) count as Slurm's "None", so the reasons sum to gpuloom_jobs{st="PD"}
        given = sum(by_reason.values())
        if counts is not None:
            unreasoned = sum(n for s, n in counts.items() if s in _PD_STATES) - given
        else:
            unreasoned = len(svc.gate) - sum(svc.gate.by_reason.values()) + sum(
                1 for row, lc in entries if (lc is None or SHORT_STATE[lc.state] == "PD") and not row.pending_reason)
        if unreasoned > 0:
            by_reason["None"] = by_reason.get("None", 0) + unreasoned
        fam = GaugeMetricFamily("gpuloom_pending_jobs", "Pending jobs by reason (None: not looked at yet).",
                                labels=["reason"])
        for reason, count in sorted(by_reason.items()):
            fam.add_metric([reason], count)
        yield fam
        up = GaugeMetricFamily("gpuloom_last_round_seconds", "Duration of the last round.")
        up.add_metric([], svc.last_round_s)
        yield up
