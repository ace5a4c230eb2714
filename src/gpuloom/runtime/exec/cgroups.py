"""Per-job control groups: memory limits, CPU sets, process limits and GPU device access for job processes.

Detection (:func:`detect`) happens once, when an executor starts:

* **cgroup v2** (unified): ``<root>/cgroup.controllers`` exists.  A job gets
  ``<root>/<parent>/<job>`` with ``memory.max``, ``memory.swap.max = 0`` and
  ``memory.oom.group = 1`` (where present: an OOM kills the whole job rather than
  leaving it crippled), ``cpuset.cpus``, ``cpuset.mems`` and ``pids.max``.  The ``memory``,
  ``cpuset`` and ``pids`` controllers are enabled in ``cgroup.subtree_control`` of the root
  and of the parent (v2's rule: a cgroup can only hand controllers it has to its children).
  v2 controls device access only through eBPF programs, which gpuloom does not load: there,
  a job is kept to its GPUs by ``CUDA_VISIBLE_DEVICES`` alone.
* **cgroup v1**: one hierarchy per controller, ``<root>/memory``, ``<root>/cpuset``,
  ``<root>/pids`` and ``<root>/devices`` (``<root>/cpu`` is detected and reported but not
  written: pinning through cpuset is stricter than a CFS quota).  A job gets
  ``<root>/memory/<parent>/<job>`` with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap accounting exists, so the job cannot
  escape its limit into swap), ``<root>/cpuset/<parent>/<job>`` with
  ``cpuset.cpus`` and ``cpuset.mems`` (copied from the parent, as v1 requires
  both before any task may join), ``<root>/pids/<parent>/<job>`` with ``pids.max``, and,
  where the node's GPU device files are known, ``<root>/devices/<parent>/<job>`` that denies
  (``devices.deny``) every GPU device file of the node but the job's own; everything else
  (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/null``...) stays allowed.
* **neither writable** (no root, read-only mount, a container without
  delegation): :class:`CgroupManager` reports ``mode == "none"`` and the
  executor degrades to CPU affinity alone; the warning is logged once per process.

Job cgroups live under a parent named ``gpuloom`` directly below each hierarchy's
root, like Slurm's ``slurm/``, rather than below the service's own cgroup: the
service may be restarted into another cgroup, and jobs must outlive it.
Writability is probed by creating that parent directory, not guessed from
permissions.

A job that reaches its ``pids.max`` cannot fork or start threads (``EAGAIN``); the count of
refused forks is in ``pids.events`` (``max N``), read by :meth:`JobCgroup.pids_limit_hit` as
:meth:`JobCgroup.oom_kills` reads memory events, so the job's end can name the limit.

A process joins its cgroups by writing its own pid to ``cgroup.procs``
(:meth:`JobCgroup.enter`) between fork and exec, so the job's command starts
already limited (no window in which it runs unconstrained).  Cleanup kills any
straggler still inside the cgroup and removes the directories.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/sys/fs/cgroup"
DEFAULT_PARENT = "gpuloom"
MB = 10**6  # the service's memory unit (see runtime/state/specs.py): limits are mem_mb x 10^6 bytes
#: processes and threads a job may have at once (``pids.max``; 0: no limit); see docs/executor.md
DEFAULT_PIDS_MAX = 4096
V2_DEVICES = "devices: cgroup v2 controls devices only through eBPF programs, which gpuloom does not load"

_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time only (per process)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class CgroupError(RuntimeError):
    """A cgroup operation failed; the message names the file."""


_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]")


def cgroup_name(job_id: str) -> str:
    """A directory name for ``job_id``: anything but ``[A-Za-z0-9_.-]`` becomes ``_``."""
    name = _NAME_OK.sub("_", job_id)
    if name in ("", ".", ".."):
        name = f"job_{name.replace('.', '_')}"
    return name


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupError(f"cannot write {value.strip()!r} to {path}: {e.strerror or e}") from None


def _read(path: Path) -> str:
    return path.read_text().strip()


def format_cpus(cpus: tuple[int, ...] | list[int]) -> str:
    """Core ids as a cpuset list: ``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    ids = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpus(text: str) -> tuple[int, ...]:
    """A cpuset list back to core ids: ``"0-2,5"`` -> ``(0, 1, 2, 5)``."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """What this machine lets us do."""

    version: int  # 2, 1, or 0 (no cgroup filesystem found)
    root: str
    memory: bool  # memory limits can be set
    cpuset: bool  # cpusets can be set
    controllers: tuple[str, ...] = ()  # controllers seen (v1: mounted hierarchies; v2: cgroup.controllers)
    reason: str = ""  # why something is unavailable
    pids: bool = False  # process limits (pids.max) can be set
    devices: bool = False  # GPU device files can be denied (v1's devices hierarchy)

    @property
    def mode(self) -> str:
        if self.version and (self.memory or self.cpuset or self.pids or self.devices):
            return f"v{self.version}"
        return "none"


def _probe_dir(path: Path) -> str | None:
    """Create ``path`` (a cgroup directory) if needed; None if it worked, else the reason."""
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if not os.access(path / "cgroup.procs", os.W_OK):
        return f"{path}/cgroup.procs is not writable"
    return None


def detect(root: str = DEFAULT_ROOT, parent: str = DEFAULT_PARENT) -> CgroupSupport:
    """Find the cgroup version under ``root`` and whether we can write job cgroups there."""
    r = Path(root)
    if (r / "cgroup.controllers").exists():
        ctrls = tuple(_read(r / "cgroup.controllers").split())
        reasons: list[str] = []
        usable: set[str] = set()
        p = r / parent
        why = _probe_dir(p)
        if why:
            reasons.append(why)
        else:
            for c in ("memory", "cpuset", "pids"):
                if c not in ctrls:
                    reasons.append(f"controller {c} not available in {r}/cgroup.controllers")
                    continue
                try:
                    for d in (r, p):
                        if c not in _read(d / "cgroup.subtree_control").split():
                            _write(d / "cgroup.subtree_control", f"+{c}")
                    usable.add(c)
                except (OSError, CgroupError) as e:
                    reasons.append(str(e))
        reasons.append(V2_DEVICES)
        return CgroupSupport(2, root, "memory" in usable, "cpuset" in usable, ctrls, "; ".join(reasons),
                             pids="pids" in usable)
    mounted = tuple(c for c in ("memory", "cpuset", "cpu", "pids", "devices") if (r / c / "cgroup.procs").exists())
    if not mounted:
        return CgroupSupport(0, root, False, False, (), f"no cgroup v1 or v2 hierarchy under {root}")
    reasons = []
    ok: dict[str, bool] = {}
    for c in ("memory", "cpuset", "pids", "devices"):
        if c not in mounted:
            reasons.append(f"no {c} hierarchy at {r / c}")
            ok[c] = False
            continue
        why = _probe_dir(r / c / parent)
        if why is None and c == "cpuset":
            # v1 cpusets start empty: a child needs cpus and mems before tasks can join.
            try:
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not _read(r / c / parent / f):
                        _write(r / c / parent / f, _read(r / c / f))
            except (OSError, CgroupError) as e:
                why = str(e)
        if why:
            reasons.append(why)
        ok[c] = why is None
    return CgroupSupport(1, root, ok["memory"], ok["cpuset"], mounted, "; ".join(reasons),
                         pids=ok["pids"], devices=ok["devices"])


@dataclass(slots=True)
class JobCgroup:
    """The cgroup directories of one job (one per hierarchy in v1, one in v2)."""

    support: CgroupSupport
    name: str
    dirs: dict[str, Path] = field(default_factory=dict)  # controller -> directory ("unified" in v2)

    def paths(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def enter(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into every directory of this job."""
        pid = pid or os.getpid()
        for d in self.paths():
            _write(d / "cgroup.procs", f"{pid}\n")

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.paths():
            try:
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return out

    def memory_limit_file(self) -> Path | None:
        if "memory" not in self.dirs:
            return None
        d = self.dirs["memory"]
        return d / ("memory.max" if self.support.version == 2 else "memory.limit_in_bytes")

    def kill_all(self, sig: int = signal.SIGKILL) -> int:
        """Signal every process still in the cgroup (stragglers that left the job's session)."""
        n = 0
        for pid in self.pids():
            try:
                os.kill(pid, sig)
                n += 1
            except ProcessLookupError:
                pass
        return n

    def oom_kills(self) -> int:
        """How many processes of this cgroup the OOM killer killed (``oom_kill`` in v2's ``memory.events``
        or v1's ``memory.oom_control``); 0 when unknown."""
        d = self.dirs.get("memory")
        if d is None:
            return 0
        f = d / ("memory.events" if self.support.version == 2 else "memory.oom_control")
        try:
            for line in f.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def pids_limit_hit(self) -> int:
        """The job's ``pids.max`` if a fork or thread creation was refused for reaching it (``max`` in
        ``pids.events``, v1 and v2), else 0."""
        d = self.dirs.get("pids")
        if d is None:
            return 0
        try:
            events = dict(line.split(" ", 1) for line in (d / "pids.events").read_text().splitlines() if " " in line)
            limit = _read(d / "pids.max")
            return int(limit) if int(events.get("max", "0")) > 0 and limit != "max" else 0
        except (OSError, ValueError):
            return 0

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kill stragglers and remove the directories; True if all are gone."""
        deadline = time.monotonic() + timeout_s
        if self.pids():
            self.kill_all()
        left = self.paths()
        while left:
            still: list[Path] = []
            for d in left:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    if e.errno in (errno.EBUSY, errno.ENOTEMPTY) and time.monotonic() < deadline:
                        still.append(d)
                    else:
                        log.warning("could not remove cgroup %s: %s", d, e.strerror or e)
                        return False
            left = still
            if left:
                self.kill_all()
                time.sleep(0.02)
        return True


def device_number(path: str) -> tuple[int, int]:
    """(major, minor) of the character device file ``path``."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CgroupError(f"GPU device file {path}: {e.strerror or e}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise CgroupError(f"GPU device file {path} is not a character device")
    return os.major(st.st_rdev), os.minor(st.st_rdev)


class CgroupManager:
    """Creates and removes job cgroups under one parent, for whatever this machine supports.

    ``pids_max``: the processes and threads each job may have at once (0: no limit).
    """

    def __init__(self, root: str = DEFAULT_ROOT, parent: str = DEFAULT_PARENT, enabled: bool = True,
                 pids_max: int = DEFAULT_PIDS_MAX) -> None:
        if not isinstance(pids_max, int) or pids_max < 0:
            raise CgroupError(f"pids_max must be an integer >= 0 (0: no limit), got {pids_max!r}")
        self.root = Path(root)
        self.parent = parent
        self.pids_max = pids_max
        if enabled:
            self.support = detect(root, parent)
        else:
            self.support = CgroupSupport(0, root, False, False, (), "cgroups disabled by configuration")
        s = self.support
        if s.mode == "none":
            warn_once(f"cgroups unavailable ({s.reason}): jobs are pinned by CPU affinity only, memory is not limited")
        elif not (s.memory and s.cpuset):
            warn_once(f"cgroups {s.mode} only partly usable ({s.reason}): "
                      f"memory limits {'on' if s.memory else 'off'}, cpusets {'on' if s.cpuset else 'off (affinity only)'}")
        if pids_max and not s.pids and s.mode != "none":
            warn_once(f"no pids cgroup ({s.reason}): the number of processes of a job is not limited")

    @property
    def mode(self) -> str:
        return self.support.mode

    def _dir(self, controller: str, name: str) -> Path:
        if self.support.version == 2:
            return self.root / self.parent / name
        return self.root / controller / self.parent / name

    def job(self, job_id: str) -> JobCgroup:
        """The (possibly not yet created) cgroup of ``job_id``."""
        name = cgroup_name(job_id)
        cg = JobCgroup(self.support, name)
        for c in ("memory", "cpuset", "pids", "devices"):
            if getattr(self.support, c):
                cg.dirs[c] = self._dir(c, name)
        return cg

    def gpu_devices(self, paths: Sequence[str], hidden: bool = False) -> tuple[tuple[int, int], ...]:
        """The device numbers of a node's GPU device files (index ``i``: GPU ``i``), checked once when
        an executor starts; a warning where they cannot be enforced.  ``hidden``: the executor hides the
        other GPUs' device files in each job's mount namespace where this manager cannot deny them."""
        numbers = tuple(device_number(p) for p in paths)
        if numbers and not self.support.devices:
            why = V2_DEVICES if self.support.version == 2 else f"no writable devices cgroup ({self.support.reason})"
            if hidden:
                warn_once(f"GPU device files are not denied by a cgroup ({why}): each job of another account gets "
                          "the other GPUs' device files hidden in its own mount namespace; jobs of the server's "
                          "own account are kept to their GPUs by CUDA_VISIBLE_DEVICES alone")
            else:
                warn_once(f"GPU device files are not isolated ({why}): jobs are kept to their GPUs by "
                          "CUDA_VISIBLE_DEVICES alone, which a job can unset")
        return numbers

    def create(self, job_id: str, cpus: tuple[int, ...], mem_mb: int, gpus: Sequence[int] = (),
               gpu_devices: Sequence[tuple[int, int]] = ()) -> JobCgroup:
        """Create (or reuse) the job's cgroup and set its limits.

        ``mem_mb <= 0`` means no memory limit; empty ``cpus`` means the parent's cpuset.
        ``gpu_devices``: the node's GPU device numbers (from :meth:`gpu_devices`); where given, the job
        may open only those of ``gpus`` (v1).  Without them no devices cgroup is made.
        """
        cg = self.job(job_id)
        if not gpu_devices:
            cg.dirs.pop("devices", None)
        elif bad := [g for g in gpus if not 0 <= g < len(gpu_devices)]:
            raise CgroupError(f"job {job_id}: GPU(s) {bad} have no device file (this node has {len(gpu_devices)})")
        for c, d in cg.dirs.items():
            try:
                d.mkdir(exist_ok=True)
            except OSError as e:
                raise CgroupError(f"cannot create cgroup {d}: {e.strerror or e}") from None
            if c == "memory":
                self._set_memory(d, mem_mb)
            elif c == "cpuset":
                self._set_cpuset(d, cpus)
            elif c == "pids":
                _write(d / "pids.max", f"{self.pids_max}\n" if self.pids_max else "max\n")
            else:
                self._set_devices(d, set(gpus), gpu_devices)
        return cg

    @staticmethod
    def _set_devices(d: Path, own: set[int], numbers: Sequence[tuple[int, int]]) -> None:
        # one rule per write (the kernel's format); allow first: a reused cgroup may deny what is now the job's
        for i, (major, minor) in enumerate(numbers):
            if i in own:
                _write(d / "devices.allow", f"c {major}:{minor} rwm\n")
        for i, (major, minor) in enumerate(numbers):
            if i not in own:
                _write(d / "devices.deny", f"c {major}:{minor} rwm\n")

    def _set_memory(self, d: Path, mem_mb: int) -> None:
        if self.support.version == 2:
            _write(d / "memory.max", f"{mem_mb * MB}\n" if mem_mb > 0 else "max\n")
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0\n" if mem_mb > 0 else "max\n")
            if (d / "memory.oom.group").exists():
                _write(d / "memory.oom.group", "1\n")  # an OOM kills the whole job, not one worker
            return
        value = f"{mem_mb * MB}\n" if mem_mb > 0 else "-1\n"
        memsw = d / "memory.memsw.limit_in_bytes"
        if not memsw.exists():
            _write(d / "memory.limit_in_bytes", value)
            return
        # v1 keeps memsw >= memory at every step: the order of the two writes depends on the direction.
        try:
            _write(d / "memory.limit_in_bytes", value)
            _write(memsw, value)
        except CgroupError:
            _write(memsw, value)
            _write(d / "memory.limit_in_bytes", value)

    def _set_cpuset(self, d: Path, cpus: tuple[int, ...]) -> None:
        parent = d.parent
        cpu_text = format_cpus(cpus) if cpus else _read(parent / "cpuset.cpus")
        if self.support.version == 2:
            _write(d / "cpuset.cpus", cpu_text + "\n")
            mems = _read(parent / "cpuset.mems.effective") if (parent / "cpuset.mems.effective").exists() else ""
            if mems:
                _write(d / "cpuset.mems", mems + "\n")
            return
        if not _read(d / "cpuset.mems"):
            _write(d / "cpuset.mems", _read(parent / "cpuset.mems") + "\n")
        _write(d / "cpuset.cpus", cpu_text + "\n")

    def set_cpus(self, job_id: str, cpus: tuple[int, ...]) -> None:
        """Change the cpuset of an existing job cgroup (its processes follow at once)."""
        cg = self.job(job_id)
        if "cpuset" in cg.dirs:
            self._set_cpuset(cg.dirs["cpuset"], cpus)

    def remove(self, job_id: str) -> bool:
        return self.job(job_id).remove()

    def remove_parent(self) -> None:
        """Remove this manager's parent cgroup(s) if no job cgroup is left in them (a service's own
        parent, at shutdown); the shared default parent is left alone."""
        if self.parent == DEFAULT_PARENT or self.support.mode == "none":
            return
        dirs = {self.root / self.parent} if self.support.version == 2 else {
            self.root / c / self.parent for c in ("memory", "cpuset", "pids", "devices") if getattr(self.support, c)}
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                pass  # jobs still running (a restarted service adopts them), or already gone


def process_cgroups(pid: int | str = "self") -> dict[str, str]:
    """Controller -> cgroup path of a process, from ``/proc/<pid>/cgroup`` (v2: key ``""``)."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def memory_limit_of(pid: int | str = "self", root: str = DEFAULT_ROOT) -> int | None:
    """The memory limit (bytes) of the cgroup a process is in; None if unlimited or unknown."""
    cgs = process_cgroups(pid)
    candidates: list[Path] = []
    if "memory" in cgs:
        candidates.append(Path(root) / "memory" / cgs["memory"].lstrip("/") / "memory.limit_in_bytes")
    if "" in cgs:
        candidates.append(Path(root) / cgs[""].lstrip("/") / "memory.max")
    for f in candidates:
        if f.exists():
            text = _read(f)
            if text == "max":
                return None
            v = int(text)
            return None if v >= 1 << 62 else v
    return None
