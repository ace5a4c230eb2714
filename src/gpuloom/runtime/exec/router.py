"""An executor that routes each call to the executor serving the launch's node.

The service talks to one :class:`~.executor.Executor`; a cluster of several
nodes is served by one executor per node (a local executor on each machine,
or, on one machine, one per declared node of a fake inventory).  The router
remembers which node each executor id was launched or adopted on, so
``stop``/``alive`` need only the id, and ``poll`` merges every node's exits.
A multi-machine executor (Ray) can be one of its members or replace it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ...core.cluster import Cluster
from .executor import Executor, ExecutorError, LaunchSpec, ProcInfo
from .gpustats import GpuReading


class RoutingError(RuntimeError):
    """A call for a node or job no member executor serves; the message names it."""


class NodeRouter(Executor):
    def __init__(self, executors: Mapping[str, Executor]) -> None:
        if not executors:
            raise ValueError("a router needs at least one node executor")
        self.executors = dict(executors)
        self.where: dict[str, str] = {}  # executor job id -> node

    def _for_node(self, node: str, job_id: str) -> Executor:
        ex = self.executors.get(node)
        if ex is None:
            raise RoutingError(f"job {job_id}: no executor serves node {node!r} (serving: {', '.join(self.executors)})")
        return ex

    def _for_job(self, job_id: str) -> Executor:
        node = self.where.get(job_id)
        if node is None:
            raise RoutingError(f"job {job_id}: not launched or adopted through this router")
        return self.executors[node]

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        info = self._for_node(spec.node, spec.job_id).launch(spec)
        self.where[spec.job_id] = spec.node
        return info

    def stop(self, job_id: str, grace_s: float) -> int | None:
        code = self._for_job(job_id).stop(job_id, grace_s)
        self.where.pop(job_id, None)
        return code

    def poll(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for ex in self.executors.values():
            out.update(ex.poll())
        for job_id in out:
            self.where.pop(job_id, None)
        return out

    def adopt(self, info: ProcInfo) -> bool:
        ok = self._for_node(info.node, info.job_id).adopt(info)
        if ok:
            self.where[info.job_id] = info.node
        return ok

    def alive(self, job_id: str) -> bool:
        node = self.where.get(job_id)
        return node is not None and self.executors[node].alive(job_id)

    def exit_code(self, info: ProcInfo) -> int | None:
        ex = self.executors.get(info.node)
        fn = getattr(ex, "exit_code", None)
        return None if fn is None else fn(info)

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        return self._for_node(node, job_id).launched(job_id, node, attempt, user)

    def exit_time(self, info: ProcInfo) -> float | None:
        ex = self.executors.get(info.node)
        return None if ex is None else ex.exit_time(info)

    def stopped(self, info: ProcInfo) -> bool:
        ex = self.executors.get(info.node)
        return ex is not None and ex.stopped(info)

    def end_reason(self, job_id: str) -> str | None:
        for ex in self.executors.values():
            r = ex.end_reason(job_id)
            if r is not None:
                return r
        return None

    def orphans(self) -> list[ProcInfo]:
        return [p for ex in self.executors.values() for p in ex.orphans()]

    def gpu_readings(self) -> dict[str, dict[int, GpuReading]]:
        out: dict[str, dict[int, GpuReading]] = {}
        for ex in self.executors.values():
            out.update(ex.gpu_readings())
        return out

    def close(self) -> None:
        for ex in self.executors.values():
            ex.close()


def local_executor(
    cluster: Cluster, run_dir: str | Path, fold_cores: bool = False, cgroup_parent: str | None = None,
    env_allow: Sequence[str] | None = None, pids_max: int | None = None, gpu_devices: Sequence[str] = (),
    private_tmp: bool = True, tmp_dir: str | Path | None = None,
) -> Executor:
    """Executors for a cluster whose nodes all live on this machine: one local
    executor per node behind a :class:`NodeRouter` (a declared inventory of
    several fake nodes), or the node's own executor for a one-node cluster.
    ``fold_cores``: declared core ids beyond this machine's run on its cores.
    ``cgroup_parent``: the cgroup under which job cgroups are made (one per
    service, so two services on a machine never share a job cgroup name).
    ``pids_max``: processes per job (None: the default, 0: no limit).  ``gpu_devices``: this
    machine's GPU device files in GPU index order, one per GPU of every node (jobs may open only
    their own; empty: not isolated).  ``private_tmp``, ``tmp_dir``: each job's own /tmp and
    /dev/shm (:class:`.local.NodeAgent`)."""
    from .cgroups import DEFAULT_PARENT, DEFAULT_PIDS_MAX, CgroupError, CgroupManager
    from .local import DEFAULT_ENV_ALLOW, LocalExecutor

    if gpu_devices and (bad := [f"{n.name} has {n.gpus}" for n in cluster.nodes if n.gpus != len(gpu_devices)]):
        raise ExecutorError(f"{len(gpu_devices)} GPU device files given, one per GPU of a node, but node "
                            f"{'; '.join(bad)}")
    run = Path(run_dir)
    cgroups = CgroupManager(parent=cgroup_parent or DEFAULT_PARENT,
                            pids_max=DEFAULT_PIDS_MAX if pids_max is None else pids_max)
    try:
        execs: dict[str, Executor] = {
            n.name: LocalExecutor(n.name, cgroups=cgroups, run_dir=run / n.name, fold_cores=fold_cores,
                                  env_allow=DEFAULT_ENV_ALLOW if env_allow is None else env_allow,
                                  gpu_devices=gpu_devices, private_tmp=private_tmp,
                                  tmp_dir=Path(tmp_dir) / n.name if tmp_dir else None)
            for n in cluster.nodes
        }
    except CgroupError:  # a GPU device file that is not one: leave no parent cgroup behind
        cgroups.remove_parent()
        raise
    return next(iter(execs.values())) if len(execs) == 1 else NodeRouter(execs)
