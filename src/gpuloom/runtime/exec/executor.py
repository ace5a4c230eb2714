"""The executor interface: who carries a plan out on real machines.

The service turns each plan action into calls on an :class:`Executor`:
``start`` → :meth:`Executor.launch`, ``stop`` → :meth:`Executor.stop`, and
``move``/``resize`` → stop (SIGTERM, grace period for the job to checkpoint)
then launch on the new allocation with ``GPULOOM_RESUME=1`` in its environment.
Nothing in the scheduler assumes one machine: every launch names its node, and
a multi-machine executor (Ray) implements the same methods.

:class:`LaunchSpec` is fully concrete: node-local GPU indices (what
``CUDA_VISIBLE_DEVICES`` gets), concrete CPU core ids (the service picks them
with :class:`CoreAllocator` from the core *counts* in the plan), a memory limit.

Exit codes follow the shell: ``0`` success, ``128 + n`` for a job that died of
signal ``n`` (``143`` after SIGTERM, ``137`` after SIGKILL or the OOM killer).
``None`` means unknown: a process adopted after a restart that vanished without
leaving its exit record (see :mod:`gpuloom.runtime.exec.local` for the wrapper that
writes it).  :meth:`Executor.stop` consumes the exit: :meth:`Executor.poll` does
not report a stopped job again.

:class:`ProcInfo` is what the service stores to find a process again after a
restart.  ``log_path`` and ``exit_path`` (the file the job's wrapper writes its
exit code to) have defaults, so older records still load; with ``exit_path``
known, :meth:`Executor.exit_code` tells a job that *finished* while the service
was down (code 0: mark it done) from one that died (requeue, resume from its
checkpoint).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ...core.cluster import Cluster

if TYPE_CHECKING:
    from .gpustats import GpuReading


class ExecutorError(RuntimeError):
    """A launch or stop that cannot be carried out; the message names the job."""


class NodeUnavailable(ExecutorError):
    """The node cannot take a launch now (its agent is down or it is leaving): the job is not
    failed but stays queued, and a later round places it again."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    job_id: str
    command: str  # run by a /bin/sh of the job's own account (never in argv: see runtime/exec/local.py)
    node: str  # node name, as in the Cluster
    gpus: tuple[int, ...]  # node-local GPU indices -> CUDA_VISIBLE_DEVICES
    cpus: tuple[int, ...]  # concrete core ids -> CPU affinity / cpuset
    mem_mb: int  # memory limit
    log_path: str  # stdout and stderr go here (appended)
    # extra environment (GPULOOM_RESUME, GPULOOM_CHECKPOINT_DIR, ...), applied after the drop to ``user``; shell names
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None  # the OS account the command runs as (None: the executor's own)
    #: which launch of the job this is (its attempt, from 1; 0: none given): an executor that keeps run
    #: records marks them with it, so a restart tells this launch's from an earlier one's (:meth:`Executor.launched`)
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """Enough to find a launched process again after the service restarts."""

    job_id: str
    node: str
    pid: int
    start_time: float  # process creation time, wall (guards against pid reuse when adopting)
    log_path: str = ""
    exit_path: str = ""  # where the job's wrapper writes its exit code when it ends
    #: creation time in seconds since its node's boot, and that boot's id: the same guard, which a
    #: wall-clock step does not move (the wall creation time is the boot time plus this one)
    since_boot: float | None = None
    boot: str | None = None


class Executor(ABC):
    """Runs job processes on nodes.  Implementations: local processes; Ray across nodes."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> ProcInfo:
        """Start the job's process with exactly the given GPUs, cores and memory limit."""

    @abstractmethod
    def stop(self, job_id: str, grace_s: float) -> int | None:
        """SIGTERM, wait up to ``grace_s`` for the job to checkpoint and exit, then SIGKILL.

        Returns the exit code (``None`` if unknown)."""

    @abstractmethod
    def poll(self) -> dict[str, int | None]:
        """Exit codes of job processes that ended since the last poll (None: unknown)."""

    @abstractmethod
    def adopt(self, info: ProcInfo) -> bool:
        """Re-attach to a process launched before a service restart; False if it is gone."""

    @abstractmethod
    def alive(self, job_id: str) -> bool: ...

    def exit_code(self, info: ProcInfo) -> int | None:
        """For a process that is gone (``adopt`` returned False): its recorded exit code, if any."""
        return None

    def stopped(self, info: ProcInfo) -> bool:
        """For a process that is gone: whether its exit record says the service stopped it (a cancel, a
        time limit, a part stopped after another failed), so its exit status is a stop's, not an end of
        its own.  False where the record says not, or the executor keeps no such mark (this default)."""
        return False

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        """The process that launch ``attempt`` of ``job_id`` started on ``node`` and that was not stopped
        by the service, as the executor's own records of that very launch name it: for a launch whose
        confirmation the service never stored (a restart finds only its intent).  None where they name
        none (none was started, it was stopped, the records are an earlier launch's) or where the executor
        keeps no such records (this default).  ``user``: the OS account the launch ran as (None: the
        service's own); an executor whose records users can write takes only that account's.  Whether it
        still runs: :meth:`adopt`; how it ended: :meth:`exit_code`, :meth:`exit_time`."""
        return None

    def rendezvous(self, node: str) -> tuple[str, int]:
        """Where rank 0 of a job spanning nodes listens, on ``node``: (address, a free port).

        This machine by default (every node of a local executor is this machine)."""
        return "127.0.0.1", free_port()

    def exit_time(self, info: ProcInfo) -> float | None:
        """For a process that is gone: when it ended (its exit record's time), if known."""
        return None

    def end_reason(self, job_id: str) -> str | None:
        """Why a process reported by :meth:`poll` or :meth:`stop` ended, when the executor knows more than
        its exit code (the OOM killer); asked once, right after."""
        return None

    def orphans(self) -> list[ProcInfo]:
        """Live processes an earlier incarnation of the service launched that this executor does not track
        (after recovery adopted what the store records: launches the service did not live to record).
        Each can be adopted, then stopped."""
        return []

    def gpu_readings(self) -> dict[str, dict[int, GpuReading]]:
        """Per node served: the latest NVML reading of each GPU by node-local index (:mod:`.gpustats`);
        empty where nothing is sampled."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; running jobs are left running (they can be adopted)."""


def free_port(host: str = "") -> int:
    """A TCP port nothing listens on here now (the kernel's choice; free until someone takes it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class CoreAllocator:
    """Picks concrete CPU core ids on each node from the core counts in a plan.

    Lowest free ids first; ``take``/``release`` keep per-node sets of used cores.
    """

    def __init__(self, cores_per_node: dict[str, int]) -> None:
        self.total = dict(cores_per_node)
        self.used: dict[str, dict[str, tuple[int, ...]]] = {n: {} for n in cores_per_node}

    def free(self, node: str) -> list[int]:
        taken = {c for cs in self.used[node].values() for c in cs}
        return [c for c in range(self.total[node]) if c not in taken]

    def take(self, node: str, job_id: str, count: int) -> tuple[int, ...]:
        if job_id in self.used[node]:
            raise ValueError(f"job {job_id} already holds cores on {node}")
        free = self.free(node)
        if count > len(free):
            raise ValueError(f"node {node}: {count} cores wanted, {len(free)} free")
        cores = tuple(free[:count])
        self.used[node][job_id] = cores
        return cores

    def claim(self, node: str, job_id: str, cores: tuple[int, ...]) -> None:
        """Record cores an adopted process already holds."""
        self.used[node][job_id] = tuple(cores)

    def release(self, node: str, job_id: str) -> None:
        self.used[node].pop(job_id, None)


@dataclass(frozen=True, slots=True)
class InventoryChange:
    """What a cluster whose nodes come and go (Ray) reports: the nodes now, and those lost."""


    cluster: Cluster  # the nodes now usable
    lost: frozenset[str]  # names of nodes that left: their processes cannot be reached
    fence_s: float = 0.0  # how long jobs that ran on a lost node wait before they run again


class InventorySource(Protocol):
    def poll(self) -> InventoryChange | None:
        """The new inventory if it changed since the last call, else None (cheap: called every tick)."""
