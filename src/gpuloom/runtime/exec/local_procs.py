"""Which process a launch is: creation times (since the boot, or wall clock), the check that a recorded
pid is still the process launched, and :class:`_Proc`, one tracked launch (our child, or adopted)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

import psutil

from .cgroups import JobCgroup
from .clock import boot_id
from .executor import ProcInfo
from .local_records import read_exit_record

#: How close the creation time of a pid must be to the recorded one to be the same process.
START_TIME_TOLERANCE_S = 0.05


def process_start_time(pid: int) -> float | None:
    """Creation time of ``pid`` (seconds since the epoch), None if there is no such live process."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_since_boot(pid: int) -> float | None:
    """Creation time of ``pid`` in seconds since the boot (``/proc/PID/stat``: no wall clock in it),
    None if there is no such live process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()  # (the command name before it may hold anything)
    if len(rest) < 20 or rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19]) / _CLK_TCK


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def identity(pid: int) -> tuple[float | None, str | None]:
    """(creation time since the boot, boot id) of ``pid``: what :func:`same_process` checks first."""
    since = process_since_boot(pid)
    return since, boot_id() if since is not None else None


def same_process(info: ProcInfo) -> bool:
    """Is ``info.pid`` still the process we launched (alive, not a zombie, same creation time)?

    Recorded with its creation time since the boot (and this boot's id), that is compared: the
    wall-clock creation time moves with every step of the wall clock."""
    if info.since_boot is not None and info.boot is not None:
        return info.boot == boot_id() and process_since_boot(info.pid) == info.since_boot
    t = process_start_time(info.pid)
    return t is not None and abs(t - info.start_time) <= START_TIME_TOLERANCE_S


@dataclass(slots=True)
class _Proc:
    info: ProcInfo
    popen: subprocess.Popen[bytes] | None  # None: adopted after a restart
    cgroup: JobCgroup | None
    killed: bool = False  # we sent SIGKILL
    stopping: bool = False  # a stop() is in progress: poll() leaves the exit to it

    def ended(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        return not same_process(self.info)

    def exit_code(self) -> int | None:
        rec = read_exit_record(self.info.exit_path)
        if rec is not None:
            return rec
        if self.popen is not None and self.popen.returncode is not None:
            rc = self.popen.returncode
            return 128 - rc if rc < 0 else rc  # killed wrapper: report it shell-style
        return 128 + signal.SIGKILL if self.killed else None
