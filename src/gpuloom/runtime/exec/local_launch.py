"""Launching a job process on this machine (:class:`LaunchAgent`, the base of
:class:`~.local.NodeAgent`): the chain of processes from the root wrapper down to the job's account,
the job's environment and payload, its private ``/tmp`` and ``/dev/shm``, and the clean-up of an
ended launch.

What a launch does
------------------
Nothing a user controls reaches a process running as root: every root process of a
launch gets a fixed environment (:data:`ROOT_ENV`), runs in ``/`` and calls its tools
by absolute path, resolved once from that environment's ``PATH``.  The job's
environment, working directory and command reach only its own account's shell,
through a descriptor, never through argv or a root process's environment::

    /bin/sh -c WRAPPER gpuloom-job PID-RECORD EXIT-RECORD                # root: records the end
      [unshare --mount -- /bin/sh -c MOUNTS gpuloom-job mount TMP OPTS MASK N DEV...]  # root: /tmp, /dev/shm, GPUs
      [setpriv --reuid=... --regid=... --groups=... --inh-caps=-all --]   # the drop
      env -i /bin/sh -c JOB_SIDE gpuloom-job /usr/bin/cat                # the job's account

* the server writes the *payload* (``export NAME='value'`` lines in a function,
  then ``set -- COMMAND WORKDIR FALLBACK NOTE MKDIR CHECKPOINT_DIR``, every value
  quoted by :func:`shlex.quote`) to a memfd given as the wrapper's stdin; the job
  side, already the job's account and with an empty environment, reads it
  (``$(cat)``), enters its directory (its home, then ``/``, with a note in the log
  when a given one is missing), creates its checkpoint directory, applies its
  environment, and runs the command with ``eval``;
* the wrapper and the job side survive the SIGTERM sent to the job's process
  group until their foreground child has exited (``/bin/sh`` may not ``exec`` the
  last command: dash does not), so the job's own SIGTERM handler can checkpoint;
  a caught trap is reset to the default in children, so every process of the job
  still receives the signal.  The job side's trap exits with the child's status
  instead of running the rest of a command list (``a.py; b.py`` does not start
  ``b.py`` after a preemption); the wrapper records that status;
* the wrapper is the leader of a new session (``start_new_session``), so jobs
  survive a crash of the service and one ``killpg`` reaches the whole job;
* between fork and exec the wrapper joins the job's cgroups (memory limit and
  cpuset, :mod:`gpuloom.runtime.exec.cgroups`) and sets its CPU affinity with
  ``sched_setaffinity`` - both where possible, affinity alone where cgroups are
  not writable - so the command starts already constrained, and everything it
  forks inherits the constraints.  The cgroup ``cgroup.procs`` files are opened
  by the parent before the fork: the child only calls ``os.write`` and
  ``os.sched_setaffinity`` (no locks, safe with a threaded service);
* a job that drops to another account gets its own mount namespace: a directory
  made by root (owned by the job's account, 0700) bound over ``/tmp`` and a fresh
  tmpfs on ``/dev/shm`` sized to its memory limit (its pages count against the
  job's memory cgroup); both go with the job.  A job running as root could undo
  it, so it gets none; where mount namespaces are not available jobs share the
  machine's, with a warning logged once.  Where no devices cgroup denies other
  GPUs' device files (cgroup v2, or none), the namespace also covers each of them
  with :data:`MASK_NAME` (root's, mode 0: ``EACCES``), under ``--shared-tmp`` too;
* the environment gets ``CUDA_VISIBLE_DEVICES`` (node-local GPU indices, comma
  separated; ``""`` for a job with no GPUs, which hides every GPU),
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so indices mean what NVML and ``nvidia-smi``
  call them), ``OMP_NUM_THREADS`` = number of cores (unless given), ``PATH``
  :data:`DEFAULT_PATH` (unless given), ``GPULOOM_JOB_ID``, ``GPULOOM_CPUS``,
  ``GPULOOM_MEM_MB`` and whatever the spec adds (``GPULOOM_RESUME``,
  ``GPULOOM_CHECKPOINT_DIR``...);
* stdout and stderr are appended to the job's log (nothing else is written
  there: the log is the job's own output; the service records launches).
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .cgroups import CgroupError, CgroupManager, JobCgroup, cgroup_name, format_cpus
from .executor import ExecutorError, LaunchSpec, ProcInfo
from .identity import IdentityError, private_dir
from .local_procs import _Proc, identity, process_start_time
from .local_records import exit_path_for, exposed, launch_mark, make_record, open_log, remove_tree

log = logging.getLogger("gpuloom.service")

SH = "/bin/sh"
#: the whole environment of every root process of a launch: nothing of the server's, nothing of the job's
ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_ENV = {"PATH": ROOT_PATH, "LC_ALL": "C"}

# root, in / with ROOT_ENV; $1 pid record, $2 exit record (both made by the server), then the chain to the job
_WRAPPER = (
    'printf "%d\\n" "$$" 1<>"$1"; '  # the pid first: a launch the service did not live to record is found by it
    "ex=$2; shift 2; "
    "trap : TERM INT HUP; "
    '"$@"; rc=$?; '
    'printf "%d\\n" "$rc" 1<>"$ex"; '  # over the placeholder, in place
    'exit "$rc"'
)
# root, in the job's new mount namespace; $1 mount, $2 the job's /tmp ("": the machine's), $3 tmpfs options for
# /dev/shm, $4 the mask (an empty root-owned file, mode 0), $5 how many device files it covers, then those files
# (the masks first: the mask, like the job's /tmp directory, may lie under the machine's /tmp)
_MOUNTS = ('m=$1; t=$2; o=$3; k=$4; n=$5; shift 5; '
           'while [ "$n" -gt 0 ]; do "$m" --bind -- "$k" "$1" || exit 125; shift; n=$((n - 1)); done; '
           '[ -z "$t" ] || { "$m" --bind -- "$t" /tmp && "$m" -t tmpfs -o "$o" -- gpuloom-shm /dev/shm; } || exit 125; '
           'unset m t o k n; exec "$@"')
#: the file bound over other GPUs' device files in a job's mount namespace (beside the run records, root's)
MASK_NAME = "gpuloom-hidden-device"
# the job's account, empty environment; $1 cat; stdin the payload (see the module notes)
_JOB_SIDE = (
    'eval "$("$1")" && [ "$#" = 6 ] || { echo "gpuloom: cannot read the job\'s launch payload" >&2; exit 126; }; '
    "exec </dev/null; "
    'd=$2; cd -- "$d" 2>/dev/null || { d=$3; cd -- "$d" 2>/dev/null || { d=/; cd /; }; }; '
    '[ -z "$4" ] || [ "$d" = "$2" ] || printf "gpuloom: no directory %s on this node; running in %s\\n" "$2" "$d"; '
    "unset d; "
    '[ -z "$6" ] || "$5" -p -- "$6" || exit 126; '
    "gpuloom_env; unset -f gpuloom_env; "  # the job's environment: only now, after cd (CDPATH) and mkdir
    'set -- "$1"; '
    "trap 'exit $?' TERM INT HUP; "
    'eval "$1"'
)
#: variables bash (as /bin/sh) keeps read-only: exporting one would end the job side, so each is tried first
_BASH_READONLY = frozenset({"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"})
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: the server's environment variables a job inherits (everything else comes from the job's spec): what describes
#: the machine, never where the server's own programs and libraries come from (PATH, LD_LIBRARY_PATH)
DEFAULT_ENV_ALLOW = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM",
                     "CUDA_HOME", "CUDA_PATH", "NVIDIA_DRIVER_CAPABILITIES")
#: a job's PATH unless its spec sets one
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_warned_shared_tmp = False


def root_tool(name: str) -> str | None:
    """``name``'s absolute path, found on :data:`ROOT_PATH` (never on the server's or a job's PATH)."""
    return shutil.which(name, path=ROOT_PATH)


@functools.cache
def mount_namespaces(unshare: str | None, mount: str | None) -> str | None:
    """None if this process can give a job a mount namespace of its own with a fresh tmpfs, else why not."""
    if os.geteuid() != 0:
        return "the server is not root"
    if unshare is None or mount is None:
        return f"unshare or mount (util-linux) not found on {ROOT_PATH}"
    try:
        r = subprocess.run([unshare, "--mount", "--propagation", "private", "--", mount, "-t", "tmpfs", "-o",
                            "size=4k", "--", "gpuloom-probe", "/dev/shm"], env=ROOT_ENV, cwd="/",
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.decode(errors="replace").strip() or f"exit {r.returncode}")


def gpu_isolation(devices_cgroup: bool, unshare: str | None, mount: str | None) -> str:
    """How a job of another account is kept off other jobs' GPU device files here: ``cgroup`` (a writable
    devices cgroup denies them), ``namespace`` (hidden in its own mount namespace) or ``none``
    (``CUDA_VISIBLE_DEVICES`` alone)."""
    if devices_cgroup:
        return "cgroup"
    return "namespace" if mount_namespaces(unshare, mount) is None else "none"


def _make_mask(path: str) -> None:
    """The empty file of mode 0 bound over hidden device files: made once, in a directory only root writes
    (the run records'), never through a link; anything else found there is an error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0)
    except OSError as e:
        raise OSError(f"cannot make {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_size:
            raise OSError(f"{path} is not an empty file of root's")
        if stat.S_IMODE(st.st_mode):
            os.fchmod(fd, 0)
    finally:
        os.close(fd)


class LaunchAgent:
    """The state of a :class:`~.local.NodeAgent` (its arguments are described there) and its launches."""

    def __init__(self, cgroups: CgroupManager | None = None, run_dir: str | Path | None = None,
                 fold_cores: bool = False, env_allow: Sequence[str] = DEFAULT_ENV_ALLOW,
                 gpu_devices: Sequence[str] = (), private_tmp: bool = True,
                 tmp_dir: str | Path | None = None) -> None:
        self.cgroups = cgroups if cgroups is not None else CgroupManager()
        self.env_allow = tuple(env_allow)
        self.tools = {name: root_tool(name) for name in ("env", "cat", "mkdir", "setpriv", "unshare", "mount")}
        # GPU i's device file is gpu_devices[i]: a job may open only its own GPUs' (devices cgroup); where no
        # devices cgroup is writable (v2 needs eBPF), a job of another account gets the others' files hidden
        # in its own mount namespace (a root-owned file of mode 0 bound over each: EACCES), which it cannot undo
        self.gpu_devices = tuple(gpu_devices)
        self.hide_devices = bool(self.gpu_devices) and gpu_isolation(
            self.cgroups.support.devices, self.tools["unshare"], self.tools["mount"]) == "namespace"
        self._gpu_numbers = self.cgroups.gpu_devices(self.gpu_devices, hidden=self.hide_devices)
        self._oom: set[str] = set()  # jobs whose cgroup saw the OOM killer, until end_reason() is asked
        self._pids_hit: dict[str, int] = {}  # jobs refused a fork at their pids limit -> the limit
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.RLock()
        self.available_cpus = tuple(sorted(os.sched_getaffinity(0)))
        # absolute from the start: a relative path must never be resolved from a job's directory
        self.run_dir = Path(os.path.abspath(run_dir)) if run_dir is not None else None
        if self.run_dir is not None:
            try:
                private_dir(self.run_dir, 0o700)
            except IdentityError as e:
                raise ExecutorError(f"run directory: {e}") from None
        self.tmp_dir = Path(os.path.abspath(tmp_dir)) if tmp_dir is not None else None
        self.private_tmp = private_tmp
        self.fold_cores = fold_cores
        missing = [n for n in ("env", "cat", "mkdir") if self.tools[n] is None]
        if missing:
            raise ExecutorError(f"{', '.join(missing)} not found on {ROOT_PATH}: jobs cannot be launched here")

    def exit_path(self, job_id: str, log_path: str) -> str:
        if self.run_dir is not None:
            return str(self.run_dir / f"{cgroup_name(job_id)}.exit")
        return exit_path_for(os.path.abspath(log_path)) if log_path else ""

    @staticmethod
    def pid_path(exit_path: str) -> str:
        """Where a launch's wrapper writes its pid, first thing (see :meth:`.local.NodeAgent.orphans`)."""
        return exit_path.removesuffix(".exit") + ".pid" if exit_path else os.devnull

    def tmp_path(self, job_id: str, exit_path: str) -> str:
        """The directory bound over a job's ``/tmp`` (when it gets a private one)."""
        if self.tmp_dir is not None:
            return str(self.tmp_dir / cgroup_name(job_id))
        return exit_path.removesuffix(".exit") + ".tmp" if exit_path else ""

    def machine_cores(self, cpus: tuple[int, ...]) -> tuple[int, ...]:
        """The cores of this machine a plan's core ids run on (see ``fold_cores``)."""
        if not self.fold_cores:
            return cpus
        n = len(self.available_cpus)
        return tuple(sorted({self.available_cpus[c % n] for c in cpus}))

    def _finish(self, job_id: str, p: _Proc) -> int | None:
        code = p.exit_code()
        if p.cgroup is not None:
            if code not in (0, None) and p.cgroup.oom_kills() > 0:
                self._oom.add(job_id)
            elif code not in (0, None) and (limit := p.cgroup.pids_limit_hit()):
                self._pids_hit[job_id] = limit
            p.cgroup.remove()
        if p.info.exit_path:
            Path(self.pid_path(p.info.exit_path)).unlink(missing_ok=True)
        self._remove_tmp(job_id, p.info.exit_path)
        self._procs.pop(job_id, None)
        return code

    def _remove_tmp(self, job_id: str, exit_path: str) -> None:
        path = self.tmp_path(job_id, exit_path)
        if path:
            remove_tree(path)
    # -- launching --------------------------------------------------------------
    def _check(self, spec: LaunchSpec) -> None:
        bad = [] if self.fold_cores else [c for c in spec.cpus if c not in self.available_cpus]
        if bad:
            raise ExecutorError(
                f"job {spec.job_id}: CPU core(s) {bad} do not exist here (available: {format_cpus(self.available_cpus)})"
            )
        if len(set(spec.cpus)) != len(spec.cpus):
            raise ExecutorError(f"job {spec.job_id}: repeated CPU core ids {list(spec.cpus)}")
        if any(g < 0 for g in spec.gpus):
            raise ExecutorError(f"job {spec.job_id}: negative GPU index in {list(spec.gpus)}")
        if spec.mem_mb < 0:
            raise ExecutorError(f"job {spec.job_id}: negative memory limit {spec.mem_mb}")
        if not spec.log_path:
            raise ExecutorError(f"job {spec.job_id}: no log path")
        for k in spec.env:
            if not _SHELL_NAME.match(k):
                raise ExecutorError(f"job {spec.job_id}: environment variable name {k[:40]!r} is not a shell name "
                                    "(letters, digits and _, not starting with a digit)")

    def environment(self, spec: LaunchSpec, home: str | None = None) -> dict[str, str]:
        """The job's environment: the allowed variables of ours (``env_allow``), then the spec's, then
        gpuloom's own.  Never the rest of the server's environment (its secrets stay there)."""
        env = {k: os.environ[k] for k in self.env_allow if k in os.environ and _SHELL_NAME.match(k)}
        env.setdefault("PATH", DEFAULT_PATH)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if spec.user is not None:
            env.update(USER=spec.user, LOGNAME=spec.user, HOME=home or "/")
        if spec.cpus:
            env["OMP_NUM_THREADS"] = str(len(spec.cpus))
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        env["GPULOOM_JOB_ID"] = spec.job_id
        env["GPULOOM_CPUS"] = format_cpus(spec.cpus)
        env["GPULOOM_MEM_MB"] = str(spec.mem_mb)
        return env

    def account(self, spec: LaunchSpec) -> tuple[list[str], pwd.struct_passwd | None]:
        """(command prefix that drops to ``spec.user``, its account) - no prefix for the executor's own
        account, and no account either without a user."""
        if spec.user is None:
            return [], None
        try:
            pw = pwd.getpwnam(spec.user)
        except KeyError:
            raise ExecutorError(f"job {spec.job_id}: no OS account {spec.user!r} here") from None
        if pw.pw_uid == os.geteuid():
            return [], pw
        if os.geteuid() != 0:
            raise ExecutorError(f"job {spec.job_id}: cannot run as {spec.user!r}: this executor is not root")
        setpriv = self.tools["setpriv"]
        if setpriv is None:
            raise ExecutorError(f"job {spec.job_id}: cannot switch to {spec.user!r}: setpriv (util-linux) not "
                                f"found on {ROOT_PATH}")
        groups = sorted(set(os.getgrouplist(spec.user, pw.pw_gid)))
        return [setpriv, f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                f"--groups={','.join(str(g) for g in groups)}" if groups else "--clear-groups",
                "--inh-caps=-all", "--"], pw

    def _namespaces(self) -> bool:
        """Whether jobs may get a private /tmp and /dev/shm here (warns once per process when they may not)."""
        global _warned_shared_tmp
        if not self.private_tmp:
            return False
        why = mount_namespaces(self.tools["unshare"], self.tools["mount"])
        if why is not None and not _warned_shared_tmp:
            _warned_shared_tmp = True
            log.warning("jobs share this machine's /tmp and /dev/shm (no private ones: %s)", why)
        return why is None

    def _payload(self, spec: LaunchSpec, env: dict[str, str], workdir: str, fallback: str) -> bytes:
        """What the job side reads from its stdin (module notes); every value quoted."""
        lines = ["gpuloom_env() {", ":"]
        for k, v in env.items():
            a = f"{k}={shlex.quote(v)}"
            lines.append(f"(export {a}) 2>/dev/null && export {a}" if k in _BASH_READONLY else f"export {a}")
        lines.append("}")
        args = (spec.command, workdir, fallback, "1" if spec.workdir is not None else "", self.tools["mkdir"] or "",
                env.get("GPULOOM_CHECKPOINT_DIR", ""))
        lines.append("set -- " + " ".join(shlex.quote(a) for a in args))
        text = "\n".join(lines) + "\n"
        if "\x00" in text:
            raise ValueError("embedded null byte in the command or the environment")
        return text.encode("utf-8", "surrogateescape")

    def _job_tmp(self, path: str, pw: pwd.struct_passwd) -> None:
        """(Re)make the directory bound over the job's /tmp: ours to create (in a directory of ours), the job's
        account's to use (0700)."""
        parent = Path(path).parent
        if self.tmp_dir is not None and parent == self.tmp_dir:
            private_dir(parent, 0o700)
        why = exposed(parent)
        if why is not None:
            raise OSError(f"cannot make the job's /tmp in {parent}: {why}")
        remove_tree(path)
        os.mkdir(path, 0o700)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise OSError(f"{path} is not a directory")
        os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        self._check(spec)
        with self._lock:
            old = self._procs.get(spec.job_id)
            if old is not None and (old.stopping or not old.ended()):
                raise ExecutorError(f"job {spec.job_id}: already running as pid {old.info.pid}")
            if old is not None:  # ended, exit not collected yet: it is superseded
                self._finish(spec.job_id, old)
            log_path = Path(os.path.abspath(spec.log_path))
            log_path.parent.mkdir(parents=True, exist_ok=True)
            exit_path = self.exit_path(spec.job_id, str(log_path))
            pid_path = self.pid_path(exit_path)
            if os.geteuid() == 0:  # root keeps its log and records only where no job can plant a link
                for d in {log_path.parent, Path(exit_path).parent}:
                    why = exposed(d)
                    if why is not None:
                        raise ExecutorError(f"job {spec.job_id}: cannot keep its log and run records in {d}: {why}")
            drop, pw = self.account(spec)
            home = pw.pw_dir if pw is not None else None
            # the job's directory (the submitter's, by default, as sbatch); where this node lacks it the job
            # runs in its account's home (else /) and its log says so first (Slurm goes to /tmp); with neither a
            # directory nor an account of its own it stays in the server's.  Entered by the job side.
            try:
                here = os.getcwd()
            except OSError:  # removed under us
                here = "/"
            workdir = spec.workdir if spec.workdir is not None else (
                home if spec.user is not None and home is not None else here)
            chain = [*drop, self.tools["env"] or "", "-i", SH, "-c", _JOB_SIDE, "gpuloom-job", self.tools["cat"] or ""]
            tmp = shm = mask = ""
            if drop and pw is not None and self._namespaces():
                tmp = self.tmp_path(spec.job_id, exit_path)
                shm = f"nosuid,nodev,mode=0700,uid={pw.pw_uid},gid={pw.pw_gid}"
                if spec.mem_mb:
                    shm += f",size={spec.mem_mb * 10**6}"
            hide = [f for i, f in enumerate(self.gpu_devices) if i not in spec.gpus] if (
                drop and self.hide_devices) else []
            if hide:
                mask = str(Path(exit_path).parent / MASK_NAME)
            if tmp or hide:
                chain = [self.tools["unshare"] or "", "--mount", "--propagation", "private", "--",
                         SH, "-c", _MOUNTS, "gpuloom-job", self.tools["mount"] or "", tmp, shm, mask,
                         str(len(hide)), *hide, *chain]

            cores = self.machine_cores(spec.cpus)
            cg: JobCgroup | None = None
            fds: list[int] = []
            if self.cgroups.mode != "none":
                try:
                    cg = self.cgroups.create(spec.job_id, cores, spec.mem_mb, spec.gpus, self._gpu_numbers)
                    fds = [os.open(d / "cgroup.procs", os.O_WRONLY) for d in cg.paths()]
                except (CgroupError, OSError) as e:
                    for fd in fds:
                        os.close(fd)
                    raise ExecutorError(f"job {spec.job_id}: {e}") from None
            cpus = set(cores)

            def enter() -> None:  # runs in the child between fork and exec: no locks, no imports
                pid = str(os.getpid()).encode()
                for fd in fds:
                    os.write(fd, pid)
                if cpus:
                    os.sched_setaffinity(0, cpus)

            payload = -1
            try:
                data = self._payload(spec, self.environment(spec, home), workdir, home or "/")
                mark = launch_mark(spec.attempt)  # (dates the records: an earlier launch's are told apart)
                make_record(exit_path, mark)
                make_record(pid_path, mark)
                if tmp:
                    assert pw is not None
                    self._job_tmp(tmp, pw)
                if mask:
                    _make_mask(mask)
                payload = os.memfd_create("gpuloom-payload")
                os.write(payload, data)
                os.lseek(payload, 0, os.SEEK_SET)
                # the log is the server's (0600): the job writes it through the descriptor only
                with open(open_log(log_path), "ab") as out:
                    popen = subprocess.Popen(
                        [SH, "-c", _WRAPPER, "gpuloom-job", pid_path, exit_path, *chain],
                        stdin=payload,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd="/",
                        env=ROOT_ENV,
                        start_new_session=True,
                        preexec_fn=enter,
                        close_fds=True,
                    )
            except Exception as e:  # OSError, SubprocessError, ValueError (a NUL byte): nothing is left behind
                if cg is not None:
                    cg.remove()
                if tmp:
                    remove_tree(tmp)
                raise ExecutorError(f"job {spec.job_id}: launch failed: {e}") from None
            finally:
                for fd in fds:
                    os.close(fd)
                if payload >= 0:
                    os.close(payload)
            since, boot = identity(popen.pid)
            start = process_start_time(popen.pid)
            if start is None:  # ended already (e.g. `true`): creation time from /proc is gone
                start = time.time()
            info = ProcInfo(spec.job_id, "", popen.pid, start, str(log_path), exit_path, since, boot)
            self._procs[spec.job_id] = _Proc(info, popen, cg)
            return info
