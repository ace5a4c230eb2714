"""A minimal process executor: one local process per launch, no cgroups.

Used by the service tests and as the fallback of ``gpuloom serve`` when the
full local executor (cgroup memory limits, GPU discovery) is not available.
It honours the :class:`~.executor.Executor` contract:

* the command runs through ``/bin/sh -c`` in a **new session**
  (``start_new_session``), so it survives the service dying and can be adopted;
* ``CUDA_VISIBLE_DEVICES`` is the node-local GPU list, the process is pinned
  to the launch's cores with ``sched_setaffinity`` (core ids beyond this
  machine's are folded onto it: fake inventories on small machines), and the
  memory limit is exported as ``GPULOOM_MEM_MB`` (not enforced here);
* stdout and stderr are appended to the log file;
* ``stop`` sends SIGTERM to the process group, waits the grace period, then
  SIGKILL; ``adopt`` checks pid + process start time (psutil) so a reused pid
  is never mistaken for the job.

The command runs under a small ``sh`` wrapper that writes its exit code to
``RUN_DIR/ID.exit`` (atomically), so the exit code of an *adopted* process (not
our child after a service restart) is still known; ``-1`` if that file is
missing (the process was killed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil

from .executor import Executor, LaunchSpec, ProcInfo

# waits for the go-ahead on stdin (affinity set), then runs the command in a child shell (default signal dispositions), waits for it even
# when SIGTERM arrives (the trap), and records its exit code atomically
_WRAPPER = (
    'read -r _go; exec 0</dev/null; trap true TERM INT; rm -f "$2"; /bin/sh -c "$1"; code=$?; '
    'echo $code > "$2.tmp" && mv "$2.tmp" "$2"; exit $code'
)


def _start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


class ProcessExecutor(Executor):
    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = os.fspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}
        self.adopted: dict[str, psutil.Process] = {}
        self.codes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.ncpu = os.cpu_count() or 1

    def _exit_file(self, job_id: str) -> str:
        return os.path.join(self.run_dir, f"{job_id}.exit")

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        env = dict(os.environ)
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        env["GPULOOM_MEM_MB"] = str(spec.mem_mb)
        env["GPULOOM_CPUS"] = ",".join(str(c) for c in spec.cpus)
        cores = {c % self.ncpu for c in spec.cpus}
        os.makedirs(os.path.dirname(spec.log_path) or ".", exist_ok=True)
        # no preexec_fn, so Python can vfork; the wrapper waits on stdin until
        # the affinity is set, so the command never runs unpinned
        with open(spec.log_path, "ab") as log:
            p = subprocess.Popen(
                ["/bin/sh", "-c", _WRAPPER, "gpuloom-job", spec.command, self._exit_file(spec.job_id)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=spec.workdir,
                start_new_session=True,
            )
        try:
            if cores:
                os.sched_setaffinity(p.pid, cores)
        except OSError:
            p.kill()
            p.wait()
            raise
        finally:
            assert p.stdin is not None
            try:
                p.stdin.write(b"go\n")
                p.stdin.close()
            except BrokenPipeError:
                pass
        with self.lock:
            self.children[spec.job_id] = p
        try:
            st = _start_time(p.pid)
        except psutil.NoSuchProcess:
            st = time.time()
        return ProcInfo(spec.job_id, spec.node, p.pid, st)

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    def stop(self, job_id: str, grace_s: float) -> int | None:
        """SIGTERM the job's process group, wait until the whole group is gone
        (the job may still be writing its checkpoint after the wrapper ended),
        SIGKILL what is left after ``grace_s``."""
        with self.lock:
            child = self.children.pop(job_id, None)
            ad = self.adopted.pop(job_id, None)
        if child is None and ad is None:
            return None
        pid = child.pid if child is not None else ad.pid  # type: ignore[union-attr]
        self._signal(pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            if child is not None:
                child.poll()
            if not _group_alive(pid):
                break
            time.sleep(0.02)
        else:
            self._signal(pid, signal.SIGKILL)
            t = time.monotonic() + 5
            while _group_alive(pid) and time.monotonic() < t:
                if child is not None:
                    child.poll()
                time.sleep(0.02)
        if child is not None:
            try:
                return child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return None
        return self._read_exit(job_id)

    def poll(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.lock:
            for jid, p in list(self.children.items()):
                code = p.poll()
                if code is not None:
                    out[jid] = code
                    del self.children[jid]
            for jid, proc in list(self.adopted.items()):
                if not _running(proc):
                    out[jid] = self._read_exit(jid)
                    del self.adopted[jid]
        return out

    def _read_exit(self, job_id: str) -> int:
        try:
            with open(self._exit_file(job_id), encoding="ascii") as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return -1

    def exit_code(self, info: ProcInfo) -> int | None:
        """The recorded exit code of a process that is gone (None if it left no record)."""
        code = self._read_exit(info.job_id)
        return None if code == -1 else code

    def adopt(self, info: ProcInfo) -> bool:
        try:
            proc = psutil.Process(info.pid)
            if abs(proc.create_time() - info.start_time) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        with self.lock:
            self.adopted[info.job_id] = proc
        return True

    def alive(self, job_id: str) -> bool:
        with self.lock:
            p = self.children.get(job_id)
            if p is not None:
                return p.poll() is None
            a = self.adopted.get(job_id)
        return a is not None and _running(a)


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.info["pid"]) == pgid:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
