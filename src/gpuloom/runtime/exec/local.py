"""Running job processes on this machine.

Two layers, so that a multi-machine executor reuses the launch logic unchanged:

* :class:`NodeAgent` launches, stops, polls and adopts processes *on the machine
  it runs on*.  It knows nothing about node names.  A Ray executor runs one
  ``NodeAgent`` inside one actor per node and forwards the same calls to it.
* :class:`LocalExecutor` is the :class:`~gpuloom.runtime.exec.executor.Executor` for a
  one-node cluster: it serves one node name and refuses launches for any other.

The parts: :mod:`.local_records` makes and reads the run records and the server's files,
:mod:`.local_procs` tells whether a recorded pid is still the process launched,
:mod:`.local_launch` launches (:class:`~.local_launch.LaunchAgent`, whose notes say what a launch
does); here :class:`NodeAgent` adds re-pinning, stops, polls and adoption, and :class:`LocalExecutor`
serves node names.

The run records
---------------
The pid record (``<job>.pid``) and the exit record (``<job>.exit``) live in the
run directory (root's; without one, beside the log).  The server creates both at
launch, without following links (``O_EXCL | O_NOFOLLOW``), as blank placeholders;
the wrapper overwrites them in place (``1<>``, no truncation: no new block is
needed on a full disk) with its pid first and the job's exit status last.  A
placeholder reads as "no record yet".  A process
that is our child is reaped through :class:`subprocess.Popen`; a process
*adopted* after a restart is not our child, so its end is detected by pid
liveness (a zombie or a pid reused by another process - different creation time -
counts as gone) and its exit code is read from the exit record.  Only a SIGKILL
of the wrapper itself (by :meth:`NodeAgent.stop` after the grace period, or by
someone else) leaves no record: the code is then ``137`` when we sent the
SIGKILL, ``None`` (unknown) otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from .cgroups import CgroupManager
from .executor import Executor, ExecutorError, LaunchSpec, ProcInfo
from .gpustats import GpuReading, GpuSampler
from .local_launch import DEFAULT_ENV_ALLOW, LaunchAgent
from .local_procs import _Proc, identity, same_process
from .local_records import (
    RECORD_ROOM,
    STOPPED,
    _read_record,
    exit_path_for,
    launch_mark,
    mark_stopped,
    read_exit_record,
    record_fields,
    record_mark,
)

__all__ = ["DEFAULT_ENV_ALLOW", "RECORD_ROOM", "ExecutorError", "LaunchAgent", "LocalExecutor", "NodeAgent",
           "exit_path_for", "identity", "read_exit_record", "same_process"]


class NodeAgent(LaunchAgent):
    """Launches and controls job processes on the machine it runs on.

    ``cgroups=None`` creates a :class:`CgroupManager` (detecting v1/v2 once);
    pass ``CgroupManager(enabled=False)`` for affinity-only operation.

    ``run_dir``: where the run records go (``<run_dir>/<job>.exit``, ``.pid``), so
    that a restarted service finds them from the job id alone; a directory of the
    server's own account (made 0700).  Without it they go next to the job's log
    (``<log>.exit``) and :class:`ProcInfo` carries the path.

    ``private_tmp``: give jobs that drop to another account their own ``/tmp`` and
    ``/dev/shm`` (:mod:`.local_launch`'s notes); their ``/tmp`` directories go in ``tmp_dir``
    (default: beside the run records, ``<job>.tmp``).

    ``fold_cores``: a declared inventory may have more cores than this machine
    (tests of a 24-core node on a laptop).  Strict by default (a core id that does
    not exist is refused); folded, plan core ``c`` runs on the machine's
    ``c mod n``-th core.  ``GPULOOM_CPUS`` always carries the plan's ids.
    """
    # -- controlling ----------------------------------------------------------------
    def repin(self, job_id: str, cpus: tuple[int, ...]) -> int:
        """Move a running job to other CPU cores in place (no restart): cpuset and every process's affinity.

        The number of threads or workers a job chose at start stays what it was, so
        the service resizes by restart; this is for cores that must be vacated at
        once and for measurements that compare allocations within one run.
        Returns the number of processes re-pinned.
        """
        with self._lock:
            p = self._procs.get(job_id)
            if p is None or p.ended():
                raise ExecutorError(f"job {job_id}: not running here")
            spec_like = LaunchSpec(job_id, "", "", (), tuple(cpus), 0, "-")
            self._check(spec_like)
            cores = set(self.machine_cores(tuple(cpus))) or set(self.available_cpus)
            try:
                pids = {q.pid for q in psutil.Process(p.info.pid).children(recursive=True)} | {p.info.pid}
            except psutil.NoSuchProcess:
                pids = set()
            if p.cgroup is not None:
                pids |= p.cgroup.pids()
            try:
                old = set(os.sched_getaffinity(p.info.pid))
            except ProcessLookupError:
                old = set()
            # a task's affinity must lie inside its cpuset: widen the cpuset first, narrow it last
            if p.cgroup is not None and "cpuset" in p.cgroup.dirs and not cores <= old:
                self.cgroups.set_cpus(job_id, tuple(sorted(cores | old)))
            n = 0
            for pid in pids:
                try:
                    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                except OSError:
                    continue
                for tid in tids:  # affinity is per thread
                    try:
                        os.sched_setaffinity(tid, cores)
                    except (ProcessLookupError, PermissionError):
                        pass
                n += 1
            if p.cgroup is not None and "cpuset" in p.cgroup.dirs:
                self.cgroups.set_cpus(job_id, tuple(sorted(cores)))
            return n

    def alive(self, job_id: str) -> bool:
        with self._lock:
            p = self._procs.get(job_id)
            return p is not None and not p.ended()

    def running(self) -> dict[str, ProcInfo]:
        with self._lock:
            return {j: p.info for j, p in self._procs.items()}

    def _signal(self, p: _Proc, sig: int) -> None:
        try:
            os.killpg(p.info.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL and p.cgroup is not None:
            p.cgroup.kill_all(signal.SIGKILL)  # stragglers that left the process group

    def _wait(self, p: _Proc, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if p.popen is not None:
                try:
                    p.popen.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
                    return True
                except subprocess.TimeoutExpired:
                    pass
            elif p.ended():
                return True
            else:
                time.sleep(0.02)
            if time.monotonic() >= deadline:
                return p.ended()
    def stop(self, job_id: str, grace_s: float) -> int | None:
        """SIGTERM to the job's process group, ``grace_s`` to exit, then SIGKILL. Returns its exit code."""
        with self._lock:  # not held during the grace period: stops of several jobs run in parallel
            p = self._procs.get(job_id)
            if p is None or p.stopping:
                raise ExecutorError(f"job {job_id}: not running here" if p is None else f"job {job_id}: already stopping")
            p.stopping = True
        try:
            if not p.ended():
                if p.info.exit_path:  # what its wrapper records now is a stop's end, not the job's own
                    mark_stopped(p.info.exit_path)
                self._signal(p, signal.SIGTERM)
                if not self._wait(p, grace_s):
                    p.killed = True
                    self._signal(p, signal.SIGKILL)
                    if not self._wait(p, 5.0):
                        raise ExecutorError(f"job {job_id}: pid {p.info.pid} survived SIGKILL")
        except BaseException:
            p.stopping = False
            raise
        with self._lock:
            return self._finish(job_id, p)

    def poll(self) -> dict[str, int | None]:
        with self._lock:
            done = {j: p for j, p in self._procs.items() if not p.stopping and p.ended()}
            return {j: self._finish(j, p) for j, p in done.items()}

    # -- restarts --------------------------------------------------------------------
    def adopt(self, info: ProcInfo) -> bool:
        """Track a process launched by an earlier incarnation of the service, if it is still the same one."""
        with self._lock:
            cur = self._procs.get(info.job_id)
            if cur is not None:
                return cur.info.pid == info.pid and not cur.ended()
            cg = self.cgroups.job(info.job_id) if self.cgroups.mode != "none" else None
            if not same_process(info):
                if cg is not None:
                    cg.remove()
                self._remove_tmp(info.job_id, info.exit_path or self.exit_path(info.job_id, info.log_path))
                return False
            try:
                if os.getpgid(info.pid) != info.pid:
                    return False  # not the session leader we started
            except ProcessLookupError:
                return False
            if not info.exit_path and self.run_dir is not None:
                info = replace(info, exit_path=self.exit_path(info.job_id, info.log_path))
            self._procs[info.job_id] = _Proc(info, None, cg)
            return True

    def exit_code(self, info: ProcInfo) -> int | None:
        return read_exit_record(info.exit_path or self.exit_path(info.job_id, info.log_path))

    def stopped(self, info: ProcInfo) -> bool:
        fields = record_fields(info.exit_path or self.exit_path(info.job_id, info.log_path))
        return fields is not None and STOPPED.decode() in fields

    def exit_time(self, info: ProcInfo) -> float | None:
        path = info.exit_path or self.exit_path(info.job_id, info.log_path)
        if read_exit_record(path) is None:  # none, or the placeholder made at launch
            return None
        try:
            return os.stat(path).st_mtime
        except OSError:
            return None

    def end_reason(self, job_id: str) -> str | None:
        with self._lock:
            if job_id in self._oom:
                self._oom.discard(job_id)
                return "killed by the OOM killer: the job used more memory than its limit"
            if job_id in self._pids_hit:
                return (f"hit its limit of {self._pids_hit.pop(job_id)} processes: "
                        "forks and new threads beyond it failed")
        return None

    def launched(self, job_id: str, attempt: int) -> ProcInfo | None:
        """The wrapper that launch ``attempt`` of ``job_id`` started here, from its run records (marked
        with ``attempt``, :mod:`.local_records`), unless the server stopped it (its exit record says so):
        live, with its identity (a session leader running our wrapper for that pid record, as in
        :meth:`orphans`), so that :meth:`adopt` takes it; or gone (an identity no process has: never
        adopted), its end in its exit record, its start time when its pid record was written (0 where the
        server consumed its end and removed that record; pid 0 then).  None where neither record of that
        launch says a process started, or without a run directory."""
        if self.run_dir is None or attempt <= 0:
            return None
        mark = launch_mark(attempt)
        exit_path = self.exit_path(job_id, "")
        pid_path = self.pid_path(exit_path)
        fields = record_fields(exit_path)
        if not fields or fields[-1] != mark or STOPPED.decode() in fields:
            return None  # none of this launch (not made yet, or an earlier one's), or stopped by the server
        pid = _read_record(pid_path) if record_mark(pid_path) == mark else None
        if pid is None:  # its wrapper never wrote its pid, or its end was consumed (the exit code tells)
            return None if read_exit_record(exit_path) is None else ProcInfo(job_id, "", 0, 0.0, "", exit_path,
                                                                              -1.0, "")
        try:
            began = os.stat(pid_path).st_mtime  # (wall) when its wrapper wrote its pid: its start
        except OSError:
            began = 0.0
        gone = ProcInfo(job_id, "", pid, began, "", exit_path, -1.0, "")  # an identity no process has
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE or os.getpgid(pid) != pid:
                return gone
            cmd = p.cmdline()
            if "gpuloom-job" not in cmd or pid_path not in cmd:
                return gone  # the pid is another process's now
            since, boot = identity(pid)
            return ProcInfo(job_id, "", pid, p.create_time(), "", exit_path, since, boot)
        except (OSError, psutil.Error):
            return gone

    def orphans(self) -> list[ProcInfo]:
        """Live wrappers launched here that nobody tracks, from the pid files they write first thing.

        Each must be a session leader running our wrapper for that very pid file (pid reuse)."""
        if self.run_dir is None:
            return []
        out = []
        with self._lock:
            for f in sorted(self.run_dir.glob("*.pid")):
                job_id = f.stem
                if job_id in self._procs:
                    continue
                try:
                    pid = _read_record(str(f))
                    if pid is None:
                        continue
                    p = psutil.Process(pid)
                    if p.status() == psutil.STATUS_ZOMBIE or os.getpgid(pid) != pid:
                        continue
                    # the wrapper that wrote this record names it in its command line (not a reused pid;
                    # creation times are not compared: a wall-clock step since would move them)
                    cmd = p.cmdline()
                    if "gpuloom-job" not in cmd or str(f) not in cmd:
                        continue
                    since, boot = identity(pid)
                    out.append(ProcInfo(job_id, "", pid, p.create_time(), "", self.exit_path(job_id, ""), since, boot))
                except (OSError, ValueError, psutil.Error):
                    continue
        return out


class LocalExecutor(Executor):
    """The executor for this machine, known to the scheduler as ``node``.

    ``node`` may also be a list of names, all run on this machine, or ``None``
    (the default): every node of a plan runs here.  Several names on one box
    serve to try multi-node plans out (as the service's tests do); their core ids
    overlap on the same physical cores, so combine with ``fold_cores`` as needed.
    Launches for a node not served are refused.
    """

    def __init__(self, node: str | Sequence[str] | None = None, agent: NodeAgent | None = None,
                 cgroups: CgroupManager | None = None, run_dir: str | Path | None = None,
                 fold_cores: bool = False, env_allow: Sequence[str] = DEFAULT_ENV_ALLOW,
                 gpu_devices: Sequence[str] = (), private_tmp: bool = True,
                 tmp_dir: str | Path | None = None) -> None:
        if node is None:
            self.node, self.nodes = "local", None
        else:
            names = [node] if isinstance(node, str) else list(node)
            if not names or not all(names):
                raise ExecutorError("LocalExecutor needs at least one non-empty node name")
            self.node, self.nodes = names[0], frozenset(names)
        self.agent = agent if agent is not None else NodeAgent(cgroups, run_dir, fold_cores, env_allow,
                                                                     gpu_devices, private_tmp, tmp_dir)
        self.gpus = GpuSampler()  # NVML telemetry of this machine's GPUs, sampled from the first ask

    def _own(self, node: str, job_id: str) -> None:
        if node and self.nodes is not None and node not in self.nodes:
            served = ", ".join(repr(n) for n in sorted(self.nodes))
            raise ExecutorError(f"job {job_id}: node {node!r} is not served here (this executor runs {served})")

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        self._own(spec.node, spec.job_id)
        info = self.agent.launch(spec)
        return replace(info, node=spec.node or self.node)

    def stop(self, job_id: str, grace_s: float) -> int | None:
        return self.agent.stop(job_id, grace_s)

    def poll(self) -> dict[str, int | None]:
        return self.agent.poll()

    def adopt(self, info: ProcInfo) -> bool:
        self._own(info.node, info.job_id)
        return self.agent.adopt(info)

    def alive(self, job_id: str) -> bool:
        return self.agent.alive(job_id)

    def repin(self, job_id: str, cpus: tuple[int, ...]) -> int:
        return self.agent.repin(job_id, cpus)

    def exit_code(self, info: ProcInfo) -> int | None:
        return self.agent.exit_code(info)

    def exit_time(self, info: ProcInfo) -> float | None:
        return self.agent.exit_time(info)

    def stopped(self, info: ProcInfo) -> bool:
        return self.agent.stopped(info)

    def end_reason(self, job_id: str) -> str | None:
        return self.agent.end_reason(job_id)

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        self._own(node, job_id)
        info = self.agent.launched(job_id, attempt)
        return None if info is None else replace(info, node=node or self.node)

    def orphans(self) -> list[ProcInfo]:
        return [replace(p, node=self.node) for p in self.agent.orphans()]

    def gpu_readings(self) -> dict[str, dict[int, GpuReading]]:
        got = self.gpus.readings()
        return {n: got for n in (self.nodes or (self.node,))} if got else {}

    def close(self) -> None:
        self.agent.cgroups.remove_parent()  # only if empty: running jobs keep theirs
        self.gpus.close()

    @property
    def cgroup_mode(self) -> str:
        return self.agent.cgroups.mode
