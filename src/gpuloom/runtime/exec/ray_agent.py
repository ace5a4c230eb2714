"""The node agent of a Ray cluster: a :class:`~.local.NodeAgent` inside an actor pinned to its node.

:class:`AgentActor` is a plain class; :mod:`.ray_executor` makes it a Ray actor
(``ray.remote``) that is *named* (``gpuloom-agent:<node>`` in the service's
namespace), *detached* (it outlives the service that created it, so a
restarted service finds it again and the jobs it launched) and *pinned* to its
node (``NodeAffinitySchedulingStrategy(node_id, soft=False)``), using no CPU or
GPU of Ray's.  Every launch, stop, poll and adoption is the local executor's
code, unchanged: ``CUDA_VISIBLE_DEVICES`` with the node's GPU indices, pinned
cores (``fold_cores``: the plan's core ``c`` is the node's ``c``-th usable
core), a cgroup memory limit under the service's cgroup parent, SIGTERM →
checkpoint → SIGKILL, exit records in a node-local run directory.

What the actor adds:

* **exits pushed back**: :meth:`AgentActor.wait_exits` returns as soon as a
  job process ended (or after its timeout), so the service keeps one call
  outstanding per node instead of polling each node every tick.  An exit is
  repeated in every answer until the caller acknowledges it (in its next
  call): a service killed while an answer was on its way loses nothing, its
  successor gets the exit;
* **logs through the agent**: :meth:`AgentActor.read_logs` reads byte ranges of
  node-local log files (whole lines), for a service whose log directory is not
  shared with the nodes;
* **a fence** (:func:`fence_main`, a small process of its own per node): when
  the node's raylet dies - the node left the Ray cluster, and the service will
  requeue its jobs elsewhere - it stops every job process the agent recorded
  (SIGTERM, the grace period, SIGKILL), so a job never runs twice.  The agent
  itself may outlive its raylet for a while: from the moment the raylet is gone
  it answers every call with :class:`NodeLost` and reports no exit (those the
  fence causes are not the jobs' own ends; the service requeues the jobs).
  Killing the agent alone is not a node loss: the raylet lives, the jobs keep
  running, and a new agent adopts them (:meth:`AgentActor.adopt`);
* :meth:`AgentActor.info`: what the node has (cores, memory, GPU models from
  NVML or ``nvidia-smi``), its address, its Ray node id and the agent's memory.

Run as ``python -m gpuloom.runtime.exec.ray_agent fence ...`` it is the fence (no
Ray import).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from .cgroups import CgroupManager
from .executor import LaunchSpec, ProcInfo, free_port
from .gpustats import GpuReading, GpuSampler
from .local import DEFAULT_ENV_ALLOW, NodeAgent, identity, same_process

#: how often the fence checks its raylet, and the long poll re-checks exits (seconds)
FENCE_PERIOD_S = 0.2
EXIT_POLL_S = 0.02
#: how long the fence waits for the processes it SIGKILLed to be gone (a SIGKILL acts when they next run)
FENCE_KILL_WAIT_S = 10.0
#: the most bytes of one log one read_logs call returns (a log with more left is read again)
READ_LIMIT = 1 << 20


class NodeLost(RuntimeError):
    """The agent's raylet is gone: the node has left the Ray cluster (its jobs are being fenced)."""


class AgentActor:
    """One node's agent (see the module notes).  Thread-safe: the actor runs several calls at once."""

    def __init__(self, node: str, run_dir: str, cgroup_parent: str | None, grace_s: float,
                 env_allow: Sequence[str] = DEFAULT_ENV_ALLOW, private_tmp: bool = True) -> None:
        self.node = node
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cgroup_parent = cgroup_parent
        cg = CgroupManager(parent=cgroup_parent) if cgroup_parent else CgroupManager()
        from .discovery import discover_gpu_devices

        # this node's GPU device files (none without GPUs): a job may open only its own
        self.agent = NodeAgent(cg, self.run_dir / "exits", fold_cores=True, env_allow=env_allow,
                               gpu_devices=discover_gpu_devices(), private_tmp=private_tmp)
        self.grace_s = float(grace_s)
        self.raylet_pid = os.getppid()  # Ray workers are the raylet's children
        self._unacked: dict[str, tuple[int, int | None]] = {}  # executor id -> (pid, exit code)
        self._exit_lock = threading.Lock()
        self._fence_lock = threading.Lock()
        self.fence_pid = self._start_fence()
        self.gpus = GpuSampler()  # this node's NVML telemetry, sampled from the first ask

    def _node(self) -> None:
        """Raise :class:`NodeLost` once the raylet is gone (this process was handed to another parent)."""
        if os.getppid() != self.raylet_pid:
            raise NodeLost(f"node {self.node}: its raylet (pid {self.raylet_pid}) is gone")

    # -- the NodeAgent's calls ----------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> ProcInfo:
        self._node()
        try:
            info = self.agent.launch(spec)
        finally:
            self._record()
        return info

    def stop(self, job_id: str, grace_s: float) -> int | None:
        self._node()
        try:
            return self.agent.stop(job_id, grace_s)
        finally:
            self._record()

    def poll(self) -> dict[str, int | None]:
        self._node()
        out = self.agent.poll()
        if out:
            self._record()
        return out

    def wait_exits(self, timeout_s: float, ack: list[tuple[str, int]] | None = None) -> dict[str, tuple[int, int | None]]:
        """Every exit not yet acknowledged, ``{executor id: (pid, code)}``, as soon as there is one
        (``{}`` after ``timeout_s``).  ``ack``: the ``(executor id, pid)`` pairs the caller has received."""
        with self._exit_lock:
            for e, pid in ack or ():
                if e in self._unacked and self._unacked[e][0] == pid:
                    del self._unacked[e]
        end = time.monotonic() + timeout_s
        while True:
            with self._exit_lock:
                pids = {e: p.pid for e, p in self.agent.running().items()}
                for e, code in self.poll().items():
                    self._unacked[e] = (pids.get(e, 0), code)
                if self._unacked or time.monotonic() >= end:
                    return dict(self._unacked)
            time.sleep(EXIT_POLL_S)

    def adopt(self, info: ProcInfo) -> bool:
        self._node()
        try:
            return self.agent.adopt(info)
        finally:
            self._record()

    def alive(self, job_id: str) -> bool:
        self._node()
        return self.agent.alive(job_id)

    def exit_code(self, info: ProcInfo) -> int | None:
        self._node()
        return self.agent.exit_code(info)

    def launched(self, job_id: str, attempt: int) -> ProcInfo | None:
        self._node()
        return self.agent.launched(job_id, attempt)

    def running(self) -> dict[str, ProcInfo]:
        return self.agent.running()

    def exit_time(self, info: ProcInfo) -> float | None:
        self._node()
        return self.agent.exit_time(info)

    def stopped(self, info: ProcInfo) -> bool:
        self._node()
        return self.agent.stopped(info)

    def end_reason(self, job_id: str) -> str | None:
        return self.agent.end_reason(job_id)

    def orphans(self, known: list[str]) -> list[ProcInfo]:
        """Live processes here that the caller does not know (``known``: the executor ids it tracks):
        those this agent runs for nobody, and untracked ones that left pid files (the NodeAgent's)."""
        self._node()
        mine = [p for j, p in self.agent.running().items() if j not in set(known) and self.agent.alive(j)]
        return mine + self.agent.orphans()

    # -- what the agent adds --------------------------------------------------------------------
    def ping(self) -> str:
        self._node()
        return self.node

    def free_port(self) -> int:
        return free_port()

    def read_logs(self, wants: list[tuple[str, int, bool]], limit: int = READ_LIMIT) -> list[bytes]:
        """For each ``(path, offset, whole)``: the file's bytes from ``offset`` (at most ``limit``),
        cut after the last newline unless ``whole`` (the writer has ended)."""
        out = []
        for path, offset, whole in wants:
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(limit)
            except OSError:
                data = b""
            if not whole and len(data) < limit:
                data = data[: data.rfind(b"\n") + 1]
            out.append(data)
        return out

    def gpu_readings(self) -> dict[int, GpuReading]:
        """This node's GPUs' latest NVML readings, by index (empty without NVML)."""
        return self.gpus.readings()

    def info(self) -> dict[str, Any]:
        """The node as the agent sees it (address, Ray node id, cores, memory, GPUs) and the agent's own use."""
        import ray

        from .discovery import discover_inventory

        self._node()
        inv = discover_inventory()
        ctx = ray.get_runtime_context()
        me = psutil.Process()
        return {
            "node": self.node,
            "node_id": ctx.get_node_id(),
            "hostname": socket.gethostname(),
            "address": ray.util.get_node_ip_address(),
            "cores": len(self.agent.available_cpus),
            "mem_mb": inv.mem_mb,
            "gpu_names": [g.name for g in inv.gpus],
            "gpu_source": inv.source,
            "cgroups": self.agent.cgroups.mode,
            "pid": me.pid,
            "raylet_pid": self.raylet_pid,
            "rss_mb": me.memory_info().rss / 2**20,
            "fence_pid": self.fence_pid,
            "jobs": len(self.agent.running()),
        }

    # -- the fence --------------------------------------------------------------------------------
    def _record(self) -> None:
        """Write the processes the fence must stop if the node dies (atomically)."""
        procs = {j: fence_entry(p) for j, p in self.agent.running().items()}
        with self._fence_lock:
            tmp = self.run_dir / "fence.json.tmp"
            tmp.write_text(json.dumps({"grace_s": self.grace_s, "cgroup_parent": self.cgroup_parent,
                                       "procs": procs}))
            os.replace(tmp, self.run_dir / "fence.json")

    def _start_fence(self) -> int:
        """The node's fence process (one per raylet: an earlier agent's is reused while it lives)."""
        raylet = self.raylet_pid
        pidfile = self.run_dir / "fence.pid"
        try:
            pid, began, watched, *who = pidfile.read_text().split()
            known = (float(who[0]), who[1]) if len(who) == 2 else (None, None)
            if int(watched) == raylet and same_process(ProcInfo("", "", int(pid), float(began), "", "", *known)):
                return int(pid)
        except (OSError, ValueError):
            pass
        self._record()
        p = subprocess.Popen(
            [sys.executable, "-m", "gpuloom.runtime.exec.ray_agent", "fence", str(raylet), str(self.run_dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
        start = psutil.Process(p.pid).create_time()
        since, boot = identity(p.pid)
        pidfile.write_text(f"{p.pid} {start} {raylet}" + (f" {since!r} {boot}" if since is not None else "") + "\n")
        return p.pid


def fence_entry(p: ProcInfo) -> list[Any]:
    """A process as the fence's record keeps it: pid, wall creation time, and what identifies it
    across a wall-clock step (:func:`.local.same_process`)."""
    return [p.pid, p.start_time, p.since_boot, p.boot]


def fence_proc(job_id: str, entry: Sequence[Any]) -> ProcInfo:
    """The process of a :func:`fence_entry` (or of an older record's ``[pid, start time]``)."""
    since, boot = (entry[2], entry[3]) if len(entry) >= 4 else (None, None)
    return ProcInfo(job_id, "", int(entry[0]), float(entry[1]), "", "", None if since is None else float(since),
                    None if boot is None else str(boot))


def stop_orphan(p: ProcInfo, grace_s: float, run_dir: str, cgroup_parent: str | None) -> int | None:
    """Runs on the process's node: adopt it and stop it (SIGTERM, grace, SIGKILL); its exit code."""
    agent = NodeAgent(CgroupManager(parent=cgroup_parent) if cgroup_parent else CgroupManager(),
                      Path(run_dir) / "exits", fold_cores=True)
    if not agent.adopt(p):
        return agent.exit_code(p)
    return agent.stop(p.job_id, grace_s)


def _still_running(procs: list[ProcInfo], timeout: float, period: float) -> list[ProcInfo]:
    """Those of ``procs`` still running after waiting up to ``timeout`` seconds for them all to end."""
    end = time.monotonic() + timeout
    while procs and time.monotonic() < end:
        time.sleep(period)
        procs = [p for p in procs if same_process(p)]
    return procs


def fence_main(raylet_pid: int, run_dir: str) -> int:
    """Wait for the raylet to die; then stop the processes in ``run_dir/fence.json`` (TERM, grace, KILL)."""
    try:
        raylet = psutil.Process(raylet_pid)
    except psutil.NoSuchProcess:
        raylet = None
    while raylet is not None and raylet.is_running() and raylet.status() != psutil.STATUS_ZOMBIE:
        time.sleep(FENCE_PERIOD_S)
    try:
        rec = json.loads((Path(run_dir) / "fence.json").read_text())
    except (OSError, ValueError):
        return 0
    procs = [fence_proc(j, e) for j, e in rec.get("procs", {}).items()]
    live = [p for p in procs if same_process(p)]
    for p in live:
        _killpg(p.pid, signal.SIGTERM)
    live = _still_running(live, float(rec.get("grace_s", 10.0)), 0.05)
    for p in live:
        _killpg(p.pid, signal.SIGKILL)
    # gone before the fence removes their cgroups (a cgroup with a process left in it is not removed)
    # and ends: its end means its processes have ended
    _still_running(live, FENCE_KILL_WAIT_S, 0.02)
    parent = rec.get("cgroup_parent")
    cg = CgroupManager(parent=parent) if parent else CgroupManager()
    if cg.mode != "none":
        for p in procs:
            cg.remove(p.job_id)
        if parent:  # the node's own parent cgroup(s): nothing of the service is left on a node that left
            for d in {q.parent for q in cg.job("-").paths()}:
                try:
                    d.rmdir()
                except OSError:
                    pass
    return 0


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fence":
        sys.exit(fence_main(int(sys.argv[2]), sys.argv[3]))
    print("usage: python -m gpuloom.runtime.exec.ray_agent fence RAYLET_PID RUN_DIR", file=sys.stderr)
    sys.exit(2)
