"""The executor of a Ray cluster: one node agent per Ray node, and the inventory Ray reports.

``gpuloom serve --ray auto|ADDRESS`` runs the service against a Ray cluster
(the optional extra ``.[ray]``; nothing else imports Ray).

Nodes
-----
Every *alive* Ray node that declares GPUs (its ``GPU`` resource) is a node of
the service's :class:`~gpuloom.core.cluster.Cluster`: its GPUs, cores (the
``CPU`` resource), memory (the ``memory`` resource) and GPU model (the agent's
NVML or ``nvidia-smi`` reading, else Ray's ``accelerator_type:*``, else
``generic``).  A node is named by its label ``gpuloom.io/name`` when it has
one (``ray start --labels='{"gpuloom.io/name": "gpu-a"}'``), else
``<short hostname>-<first 6 hex digits of its Ray node id>``; a name never
changes while the node lives.  Nodes without GPUs (typically the head, where
the service runs) carry no jobs.

Agents
------
Each node gets an :class:`~.ray_agent.AgentActor`, named
``gpuloom-agent:<node>`` in the service's namespace, detached and pinned to
the node; a restarted service finds the same actors (``get_if_exists``) and
adopts their jobs.  Calls are forwarded as they are to the local executor,
with three differences:

* **exits** come back through one long call per node
  (:meth:`~.ray_agent.AgentActor.wait_exits`) that returns as soon as a job
  process ends; :meth:`RayExecutor.poll` only collects the calls that returned;
* **logs**: with a shared directory (``logs="shared"``) the job writes its log
  where the service reads it; otherwise (``logs="agent"``) it writes a
  node-local file and :meth:`RayExecutor.poll` appends what is new (whole lines)
  to the service's copy, remembering how far it got in ``<log>.mirror`` so a
  restarted service goes on from there.  A copy the service's disk refuses
  (full) is undone and made again from the same byte (:func:`.logmirror.copy_new`);
  an ended job's log is followed until copied to its end, at a later poll where
  the disk, or the node's agent, was not ready.  Part ``r >= 1`` of a job spanning
  nodes logs to ``<log>.<r>`` (one writer per file, also on NFS);
* **rendezvous** for jobs spanning nodes: rank 0's node address and a port the
  agent found free there.

Node loss and agent loss
------------------------
:class:`RayInventory` re-reads Ray's node table at most once a second.  A node
that is gone (not alive, or whose agent cannot be made again) is *lost*: its
processes are forgotten here, not reported as exits, and the service rebuilds
its state for the new inventory (:mod:`..service.inventory`), requeueing the jobs that
ran there (all parts of a job spanning nodes) after the fence period.  An agent
that died on a node that is still alive (killed) is replaced: the new agent
adopts its processes, and exits that happened meanwhile are read from their
exit records, so a killed agent loses no job.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...core.cluster import Cluster, ClusterError, Node
from . import fakenvml
from .cgroups import MB  # the service's memory unit: 10^6 bytes
from .executor import Executor, ExecutorError, InventoryChange, LaunchSpec, NodeUnavailable, ProcInfo
from .gpustats import GpuReading
from .local import DEFAULT_ENV_ALLOW
from .logmirror import copy_new, mirror_offset
from .ray_agent import READ_LIMIT, AgentActor, stop_orphan

log = logging.getLogger("gpuloom.service")

NAME_LABEL = "gpuloom.io/name"
AGENT_PREFIX = "gpuloom-agent:"


@dataclass(frozen=True, slots=True)
class RayNode:
    """One Ray node as the service sees it."""

    name: str
    node_id: str
    address: str
    gpus: int
    cpus: int
    mem_mb: int
    gpu_type: str

    def as_node(self) -> Node:
        return Node(self.name, self.gpus, self.cpus, self.mem_mb, self.gpu_type)


def node_name(n: dict[str, Any]) -> str:
    """The service's name for a node of ``ray.nodes()`` (see the module notes)."""
    label = (n.get("Labels") or {}).get(NAME_LABEL)
    if label:
        return str(label)
    host = str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node").split(".")[0]
    return f"{host}-{str(n['NodeID'])[:6]}"


def gpu_nodes(table: Iterable[dict[str, Any]]) -> list[RayNode]:
    """The alive nodes of ``ray.nodes()`` that declare GPUs, as :class:`RayNode`, sorted by name."""
    out = []
    for n in table:
        res = n.get("Resources") or {}
        if not n.get("Alive") or int(res.get("GPU", 0)) < 1:
            continue
        acc = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
        out.append(RayNode(node_name(n), str(n["NodeID"]), str(n.get("NodeManagerAddress", "")), int(res["GPU"]),
                           int(res.get("CPU", 0)), int(res.get("memory", 0) // MB), acc[0] if acc else "generic"))
    return sorted(out, key=lambda r: r.name)


class RayExecutor(Executor):
    """Runs job processes through one :class:`~.ray_agent.AgentActor` per Ray node (see the module notes).

    ``namespace``: the Ray namespace of the agents (one per service: the
    service id).  ``node_dir``: a node-local directory on every node (exit
    records, the fence, logs when they are not shared).  ``cgroup_parent``: each
    node's job cgroups go under ``<cgroup_parent>-<node>``.
    """

    def __init__(self, namespace: str, node_dir: str | None = None, cgroup_parent: str | None = None,
                 grace_s: float = 10.0, logs: str = "shared", exit_wait_s: float = 5.0, log_every_s: float = 0.5,
                 call_timeout_s: float = 60.0, env_allow: Sequence[str] | None = None, private_tmp: bool = True) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            raise ExecutorError("not connected to a Ray cluster (ray.init)")
        if logs not in ("shared", "agent"):
            raise ExecutorError(f"logs must be 'shared' or 'agent', got {logs!r}")
        self._ray = ray
        self._affinity = NodeAffinitySchedulingStrategy
        self._actor_cls: Any = ray.remote(AgentActor)
        self.namespace = namespace
        self.node_dir = node_dir or str(Path(tempfile.gettempdir()) / f"gpuloom-{namespace}")
        self.cgroup_parent = cgroup_parent
        self.grace_s = float(grace_s)
        self.env_allow = tuple(env_allow) if env_allow is not None else DEFAULT_ENV_ALLOW
        self.private_tmp = private_tmp  # each job's own /tmp and /dev/shm (:class:`.local.NodeAgent`)
        self.logs = logs
        self.exit_wait_s = float(exit_wait_s)
        self.log_every_s = float(log_every_s)
        self.call_timeout_s = float(call_timeout_s)
        self.nodes: dict[str, RayNode] = {}  # usable nodes (alive, agent answering), by name
        self.agents: dict[str, Any] = {}  # node name -> actor handle
        self.procs: dict[str, ProcInfo] = {}  # executor id -> process, launched or adopted through us
        self.remote_logs: dict[str, str] = {}  # executor id -> its node-local log (logs="agent")
        #: ended processes' node-local logs, (node, log) -> the service's copy, until copied to their end
        self._copying: dict[tuple[str, str], str] = {}
        self.exits: dict[str, int | None] = {}  # collected, not yet returned by poll()
        self._waits: dict[str, Any] = {}  # node -> outstanding wait_exits() reference
        self._acks: dict[str, list[tuple[str, int]]] = {}  # node -> exits received, acknowledged in the next call
        self._dead_agents: set[str] = set()  # nodes whose agent died: replaced at the next refresh
        self._gpu_asks: dict[str, Any] = {}  # node -> outstanding gpu_readings() reference
        self._gpus: dict[str, dict[int, GpuReading]] = {}  # node -> its agent's last answer
        self._ended_on: dict[str, str] = {}  # executor id -> node, for end_reason() right after its exit
        self._starting: dict[str, tuple[RayNode, Any, Any, float]] = {}  # node -> (node, actor, info(), since)
        self._last_logs = 0.0

    # -- nodes and agents ---------------------------------------------------------------------
    def _agent_options(self, node: RayNode) -> dict[str, Any]:
        env = {"RAY_kill_child_processes_on_worker_exit": "0"}
        if os.environ.get(fakenvml.ENV):  # a service on the fake NVML (tests, demos): its agents too
            env[fakenvml.ENV] = os.environ[fakenvml.ENV]
        return {"name": AGENT_PREFIX + node.name, "namespace": self.namespace, "lifetime": "detached",
                "get_if_exists": True, "num_cpus": 0, "num_gpus": 0, "max_concurrency": 64, "max_restarts": 0,
                "runtime_env": {"env_vars": env},
                "scheduling_strategy": self._affinity(node.node_id, soft=False)}

    def refresh(self, wait_s: float = 0.0) -> tuple[list[str], list[str]]:
        """Read Ray's node table; start agents on new nodes, replace dead agents, forget lost nodes.

        Agents start in the background: a node joins once its agent answers (waiting up to
        ``wait_s`` here); one that has not answered within the call timeout is tried again.
        Returns (names of nodes that joined, names of nodes lost)."""
        ray = self._ray
        table = {n.name: n for n in gpu_nodes(ray.nodes())}
        lost = [name for name in self.nodes if name not in table]
        for name in lost:
            self._forget(name)
        now = time.monotonic()
        for name in [m for m, (_, _, _, t) in self._starting.items() if m not in table or now - t > self.call_timeout_s]:
            del self._starting[name]
        for name, n in table.items():
            if (name not in self.nodes or name in self._dead_agents) and name not in self._starting:
                h = self._actor_cls.options(**self._agent_options(n)).remote(
                    name, str(Path(self.node_dir) / name), f"{self.cgroup_parent}-{name}" if self.cgroup_parent else None,
                    self.grace_s, self.env_allow, self.private_tmp)
                self._starting[name] = (n, h, h.info.remote(), now)
        refs = {ref: name for name, (_, _, ref, _) in self._starting.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s) if refs else ([], [])
        joined = []
        for ref in ready:
            n, h, _, _ = self._starting.pop(refs[ref])
            try:
                info = ray.get(ref)
            except Exception as e:  # the node is dying, or its agent cannot start: tried again next time
                log.warning("node %s: no agent (%s)", n.name, _why(e))
                continue
            gpu_names = info.get("gpu_names") or []
            if gpu_names and n.gpu_type == "generic":
                n = replace(n, gpu_type=str(gpu_names[0]))
            replaced = n.name in self._dead_agents
            self.agents[n.name] = h
            self._dead_agents.discard(n.name)
            if replaced:
                self._readopt(n.name)
            else:
                joined.append(n.name)
            self.nodes[n.name] = n
        return joined, lost

    def _readopt(self, node: str) -> None:
        """A replaced agent adopts the processes its predecessor ran; those gone report their recorded exit."""
        agent = self.agents[node]
        mine = {e: p for e, p in self.procs.items() if p.node == node}
        oks = self._ray.get([agent.adopt.remote(p) for p in mine.values()], timeout=self.call_timeout_s)
        gone = [(e, p) for (e, p), ok in zip(mine.items(), oks, strict=True) if not ok]
        codes = self._ray.get([agent.exit_code.remote(p) for _, p in gone], timeout=self.call_timeout_s)
        for (e, _), code in zip(gone, codes, strict=True):
            self.exits[e] = code  # poll() reports it
        log.info("node %s: new agent adopted %d process(es); %d ended meanwhile", node, len(mine) - len(gone), len(gone))

    def _forget(self, node: str) -> None:
        self.nodes.pop(node, None)
        self.agents.pop(node, None)
        self._waits.pop(node, None)
        self._acks.pop(node, None)
        self._dead_agents.discard(node)
        for e in [e for e, p in self.procs.items() if p.node == node]:
            self.procs.pop(e)
            self.remote_logs.pop(e, None)
        for k in [k for k in self._copying if k[0] == node]:  # (its files are out of reach: lost too)
            del self._copying[k]
        log.warning("node %s left the Ray cluster: its processes are lost", node)

    def cluster(self) -> Cluster:
        if not self.nodes:
            raise ClusterError("the Ray cluster has no node with GPUs (declare them: ray start --num-gpus N)")
        return Cluster(tuple(n.as_node() for n in sorted(self.nodes.values(), key=lambda n: n.name)))

    def agent_info(self) -> dict[str, dict[str, Any]]:
        """Each agent's :meth:`~.ray_agent.AgentActor.info` (memory, jobs, node id), by node."""
        refs = {n: a.info.remote() for n, a in self.agents.items()}
        return {n: self._ray.get(r, timeout=self.call_timeout_s) for n, r in refs.items()}

    def kill_agents(self) -> None:
        """Kill every agent (tests and teardown; their jobs keep running until their nodes go)."""
        for a in [*self.agents.values(), *(h for _, h, _, _ in self._starting.values())]:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        self.agents.clear()
        self._starting.clear()
        self._waits.clear()

    # -- calls --------------------------------------------------------------------------------
    def _agent(self, node: str, job_id: str) -> Any:
        a = self.agents.get(node)
        if a is None:
            raise ExecutorError(f"job {job_id}: node {node!r} has no agent (not in the Ray cluster now)")
        return a

    def _call(self, node: str, ref: Any, job_id: str, timeout: float | None = None) -> Any:
        ray = self._ray
        try:
            return ray.get(ref, timeout=timeout or self.call_timeout_s)
        except ray.exceptions.RayTaskError as e:  # raised by the agent: an ExecutorError, or a bug
            cause = e.cause if isinstance(e.cause, BaseException) else e
            raise ExecutorError(str(cause)) from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self._agent_died(node)
            raise ExecutorError(f"job {job_id}: the agent of node {node} is unreachable ({_why(e)})") from None

    def _agent_died(self, node: str) -> None:
        if node in self.agents:
            self.agents.pop(node)
            self._waits.pop(node, None)
            self._dead_agents.add(node)

    def _log_for(self, spec: LaunchSpec) -> str:
        rank = spec.job_id.rpartition(".")[2] if "." in spec.job_id else ""
        return spec.log_path + (f".{rank}" if rank.isdigit() and rank != "0" else "")

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        if spec.node not in self.agents and spec.node in self._dead_agents:
            self.refresh(wait_s=10.0)  # its agent died a moment ago: replace it first
        if spec.node not in self.agents:
            raise NodeUnavailable(f"job {spec.job_id}: node {spec.node!r} has no agent now")
        agent = self.agents[spec.node]
        local_log = self._log_for(spec)
        if self.logs == "agent":
            remote = str(Path(self.node_dir) / spec.node / "logs" / f"{spec.job_id}.log")
            sent = replace(spec, log_path=remote)
        else:
            sent = replace(spec, log_path=local_log)
        try:
            info = self._call(spec.node, agent.launch.remote(sent), spec.job_id)
        except ExecutorError as e:
            if spec.node in self._dead_agents or spec.node not in self.nodes:
                raise NodeUnavailable(str(e)) from None
            raise
        info = replace(info, node=spec.node, log_path=local_log)
        self.procs[spec.job_id] = info
        if self.logs == "agent":
            self.remote_logs[spec.job_id] = sent.log_path
            self._copying.pop((spec.node, sent.log_path), None)  # (its log goes on: copied as it runs)
        return info

    def stop(self, job_id: str, grace_s: float) -> int | None:
        p = self.procs.get(job_id)
        if p is None:
            raise ExecutorError(f"job {job_id}: not running through this executor")
        if job_id in self.exits:  # it ended on its own; the exit was collected, not yet polled
            code = self.exits.pop(job_id)
        elif p.node not in self.agents:  # the agent died a moment ago: stop it from a task on the node
            code = self._stop_on_node(p, grace_s)
        else:
            try:
                code = self._call(p.node, self.agents[p.node].stop.remote(job_id, grace_s), job_id,
                                  grace_s + self.call_timeout_s)
            except ExecutorError:
                code = self._exit_in_flight(p.node, job_id) if p.node in self.agents else self._stop_on_node(p, grace_s)
        self._end_logs([job_id])
        self._ended(job_id, p.node)
        self.procs.pop(job_id, None)
        self.exits.pop(job_id, None)
        return code

    def _take_exits(self, node: str, got: dict[str, tuple[int, int | None]]) -> None:
        """Exits a ``wait_exits`` answered: those of processes we run count; all are acknowledged."""
        for e, (pid, code) in got.items():
            p = self.procs.get(e)
            if p is not None and p.pid == pid:
                self.exits[e] = code
        self._acks.setdefault(node, []).extend((e, pid) for e, (pid, _) in got.items())

    def _stop_on_node(self, p: ProcInfo, grace_s: float) -> int | None:
        """Stop a process whose agent is gone, from a one-off task on its node (a NodeAgent that adopts
        and stops it), so a job stopped here never runs on unseen; fails if the node is gone too."""
        n = self.nodes.get(p.node)
        if n is None:
            raise ExecutorError(f"job {p.job_id}: node {p.node} is gone")
        task = self._ray.remote(stop_orphan).options(num_cpus=0, scheduling_strategy=self._affinity(n.node_id, soft=False))
        parent = f"{self.cgroup_parent}-{p.node}" if self.cgroup_parent else None
        return self._call(p.node, task.remote(p, grace_s, str(Path(self.node_dir) / p.node), parent), p.job_id,
                          grace_s + self.call_timeout_s)

    def _exit_in_flight(self, node: str, job_id: str) -> int | None:
        """The exit of a process the agent no longer runs: in the node's outstanding ``wait_exits``
        answer (it ended just before the stop), else the error stands."""
        ref = self._waits.get(node)
        if ref is not None:
            try:
                self._take_exits(node, self._ray.get(ref, timeout=self.exit_wait_s + self.call_timeout_s))
            except Exception:
                pass
            self._waits.pop(node, None)
        if job_id in self.exits:
            return self.exits.pop(job_id)
        raise ExecutorError(f"job {job_id}: not running on node {node}")

    def gpu_readings(self) -> dict[str, dict[int, GpuReading]]:
        """Each node's last NVML readings, never waited for: the answers that came since the last call
        are taken and each agent is asked again (an agent that does not answer keeps its last ones out)."""
        ray = self._ray
        for node, ref in list(self._gpu_asks.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                continue
            del self._gpu_asks[node]
            try:
                self._gpus[node] = ray.get(ref, timeout=0)
            except Exception as e:  # the agent died or the node left: no readings from it until it answers
                log.debug("node %s: no GPU readings (%s)", node, _why(e))
                self._gpus.pop(node, None)
        for node, agent in self.agents.items():
            if node not in self._gpu_asks:
                self._gpu_asks[node] = agent.gpu_readings.remote()
        return {n: r for n, r in self._gpus.items() if n in self.agents and r}

    def poll(self) -> dict[str, int | None]:
        ray = self._ray
        for node, agent in self.agents.items():
            if node not in self._waits:
                self._waits[node] = agent.wait_exits.remote(self.exit_wait_s, self._acks.pop(node, []))
        refs = {ref: node for node, ref in self._waits.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0) if refs else ([], [])
        for ref in ready:
            node = refs[ref]
            self._waits.pop(node, None)
            try:
                self._take_exits(node, ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                log.warning("node %s: agent lost (%s)", node, _why(err))
                self._agent_died(node)
        if self.logs == "agent" and time.monotonic() - self._last_logs >= self.log_every_s:
            self._last_logs = time.monotonic()
            self._mirror(list(self.remote_logs))
            self._copy_rest()
        out = {e: c for e, c in self.exits.items() if e in self.procs}
        self._end_logs(list(out))
        for e in out:
            self._ended(e, self.procs[e].node)
            self.procs.pop(e, None)
        self.exits.clear()
        return out

    def adopt(self, info: ProcInfo) -> bool:
        cur = self.procs.get(info.job_id)
        if cur is not None and cur.pid == info.pid and cur.node == info.node:
            return True
        agent = self._agent(info.node, info.job_id)
        ok = bool(self._call(info.node, agent.adopt.remote(info), info.job_id))
        if ok:
            self.procs[info.job_id] = info
            if self.logs == "agent":
                self.remote_logs[info.job_id] = str(Path(self.node_dir) / info.node / "logs" / f"{info.job_id}.log")
        return ok

    def alive(self, job_id: str) -> bool:
        p = self.procs.get(job_id)
        if p is None or p.node not in self.agents:
            return False
        if self.logs == "agent":
            self._mirror([job_id])
        return bool(self._call(p.node, self.agents[p.node].alive.remote(job_id), job_id))

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        """From the run records of the node's agent (its :class:`~.local.NodeAgent`'s, marked alike);
        raises where the node's agent does not answer (its launch is then treated as never started)."""
        agent = self._agent(node, job_id)
        info = self._call(node, agent.launched.remote(job_id, attempt), job_id)
        return None if info is None else replace(info, node=node)

    def exit_code(self, info: ProcInfo) -> int | None:
        return self._exit_record(info, "exit_code")

    def exit_time(self, info: ProcInfo) -> float | None:
        return self._exit_record(info, "exit_time")

    def stopped(self, info: ProcInfo) -> bool:
        return bool(self._exit_record(info, "stopped"))

    def _exit_record(self, info: ProcInfo, what: str) -> Any:
        """``what`` (an agent method reading the process's exit record) for ``info``; None when its
        node's agent is gone or does not answer."""
        agent = self.agents.get(info.node)
        if agent is None:
            return None
        try:
            return self._call(info.node, getattr(agent, what).remote(info), info.job_id)
        except ExecutorError:
            return None

    def _ended(self, job_id: str, node: str) -> None:
        self._ended_on[job_id] = node
        if len(self._ended_on) > 10_000:  # asked right after an exit, if at all: keep the recent ones
            del self._ended_on[next(iter(self._ended_on))]

    def end_reason(self, job_id: str) -> str | None:
        node = self._ended_on.pop(job_id, None)
        if node is None or node not in self.agents:
            return None
        return self._call(node, self.agents[node].end_reason.remote(job_id), job_id)

    def orphans(self) -> list[ProcInfo]:
        """Processes the agents run (or find) that this executor does not track: launched by a service
        that died before recording them.  Each can be adopted, then stopped."""
        known = list(self.procs)
        refs = {n: a.orphans.remote(known) for n, a in self.agents.items()}
        out = []
        for node, ref in refs.items():
            try:
                out += [replace(p, node=node) for p in self._call(node, ref, "orphans")]
            except ExecutorError as e:
                log.warning("node %s: cannot look for unrecorded processes: %s", node, e)
        return out

    def rendezvous(self, node: str) -> tuple[str, int]:
        n = self.nodes.get(node)
        if n is None:
            raise ExecutorError(f"node {node!r} is not in the Ray cluster now")
        return n.address, int(self._call(node, self._agent(node, "rendezvous").free_port.remote(), "rendezvous"))

    def close(self) -> None:
        self._waits.clear()  # the agents and their jobs live on (detached)

    # -- logs through the agents ----------------------------------------------------------------
    def _mirror(self, eids: list[str]) -> None:
        """Append what is new (whole lines) in the node-local logs of the running ``eids`` to the service's
        copies."""
        self._copy([(p.node, r, p.log_path) for e in eids
                    if (p := self.procs.get(e)) is not None and (r := self.remote_logs.get(e)) is not None], False)

    def _end_logs(self, eids: list[str]) -> None:
        """The processes of ``eids`` have ended: their logs are copied to their end, then forgotten."""
        for e in eids:
            p, remote = self.procs.get(e), self.remote_logs.pop(e, None)
            if p is not None and remote is not None:
                self._copying[(p.node, remote)] = p.log_path
        if eids:
            self._copy_rest()

    def _copy_rest(self) -> None:
        """Copy the rest of each ended process's log; one is kept for a later poll until read to its end and
        copied (the service's disk full, the node's agent not answering, or more than a read's worth left)."""
        for k in self._copy([(node, remote, local) for (node, remote), local in self._copying.items()], True):
            del self._copying[k]

    def _copy(self, logs: list[tuple[str, str, str]], final: bool) -> list[tuple[str, str]]:
        """Append what is new in each ``(node, node-local log, the service's copy)`` to the copy (whole lines
        unless ``final``: the process ended); the (node, log) of those copied to their end."""
        if self.logs != "agent":
            return []
        by_node: dict[str, list[tuple[str, str]]] = {}
        for node, remote, local in logs:
            if node in self.agents:
                by_node.setdefault(node, []).append((remote, local))
        done = []
        for node, items in by_node.items():
            offsets = [mirror_offset(local, node, remote) for remote, local in items]
            try:
                chunks = self._ray.get(self.agents[node].read_logs.remote(
                    [(remote, off, final) for (remote, _), off in zip(items, offsets, strict=True)]),
                    timeout=self.call_timeout_s)
            except Exception as e:
                log.warning("node %s: cannot read logs (%s)", node, _why(e))
                continue
            for (remote, local), off, data in zip(items, offsets, chunks, strict=True):
                # (a copy the disk refuses is undone: made again from the same byte)
                if (not data or copy_new(local, node, remote, off, data)) and len(data) < READ_LIMIT:
                    done.append((node, remote))
        return done


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


class RayInventory:
    """The service's inventory source on Ray (:class:`~.executor.InventorySource`): the executor's
    nodes, re-read at most every ``every_s`` seconds; a change comes with the nodes lost."""

    def __init__(self, executor: RayExecutor, every_s: float = 1.0, fence_s: float | None = None) -> None:
        self.executor = executor
        self.every_s = float(every_s)
        #: how long jobs of a lost node wait before they run elsewhere: the node's fence stops them
        #: within the grace period if the node still runs at all
        self.fence_s = executor.grace_s + 1.0 if fence_s is None else float(fence_s)
        self._last = 0.0
        executor.refresh(wait_s=executor.call_timeout_s)
        self.current = executor.cluster()

    def poll(self) -> InventoryChange | None:
        t = time.monotonic()
        if t - self._last < self.every_s:
            return None
        self._last = t
        joined, lost = self.executor.refresh()
        if not joined and not lost:
            return None
        try:
            new = self.executor.cluster()
        except ClusterError as e:
            log.error("%s", e)
            return None  # keep the last inventory until a GPU node is back
        log.info("inventory changed: joined %s, lost %s", joined or "-", lost or "-")
        self.current = new
        return InventoryChange(new, frozenset(lost), self.fence_s)
