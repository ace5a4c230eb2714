"""The executors ``gpuloom serve`` can run jobs with, by name (``--executor``).

An executor factory takes an :class:`ExecutorContext` (what ``serve`` was told) and returns the
:class:`~gpuloom.runtime.exec.executor.Executor` and, when the executor brings its own inventory (Ray's
nodes), the inventory that follows it (:class:`Following`); None keeps the
declared or discovered one (``ExecutorContext.inventory``).  ``local``, ``ray`` and ``slurm`` are built in;
outside factories come by the ``gpuloom.executors`` entry points or as ``--executor module:function``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import typer

from ..core.cluster import Cluster
from ..core.registry import Registry, RegistryError
from ..runtime.exec.executor import Executor, InventorySource


@dataclass(frozen=True, slots=True)
class ExecutorContext:
    """What ``serve`` knows when it builds the executor."""

    state_dir: Path
    service_id: str
    inventory: Cluster | None  # --cluster / --gpus or this machine; None with --ray (Ray's nodes)
    declared: bool  # the inventory was declared (--cluster, --gpus), not discovered
    env_allow: tuple[str, ...]  # environment variables passed on to jobs
    grace_s: float
    private_tmp: bool  # each job gets its own /tmp (not --shared-tmp)
    shared_dir: Path | None
    job_dir: Path | None
    switch_users: bool  # jobs run as their submitters' accounts
    pids_max: int
    gpu_devices: str  # --gpu-devices, as given
    ray_address: str | None
    gpus: int | None
    cpus_per_node: int | None
    slurm: str | None = None  # --slurm: all, or a partition


class Following(InventorySource, Protocol):
    """An inventory that follows the executor's nodes: ``current`` now, changes by ``poll``."""

    current: Cluster


Factory = Callable[[ExecutorContext], tuple[Executor, Following | None]]


def _factory(obj: Any, where: str) -> Factory:
    if not callable(obj) or isinstance(obj, type):
        raise RegistryError(f"{where}: an executor is a function make(context) -> (executor, inventory or None), "
                            f"got {obj!r}")
    return obj


EXECUTORS: Registry[Factory] = Registry("executor", group="gpuloom.executors", check=_factory,
                                        outside="module:function")


@EXECUTORS.register("local")
def local(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Processes on this machine, in cgroups where they are writable."""
    from ..runtime.exec.router import local_executor
    from ..runtime.service.security import default_job_dir
    from .service import _gpu_devices

    if ctx.inventory is None:
        raise typer.BadParameter("the local executor needs an inventory: give no --ray")
    devices = _gpu_devices(ctx.gpu_devices, declared=ctx.declared)
    # each job's own /tmp goes in the job directory (a directory of the server's, 0700)
    tmp_dir = Path(ctx.job_dir or default_job_dir(ctx.state_dir, ctx.service_id, ctx.switch_users)) / "tmp"
    try:
        return local_executor(ctx.inventory, ctx.state_dir / "run", fold_cores=ctx.declared,
                              cgroup_parent=f"gpuloom-{ctx.service_id}", env_allow=ctx.env_allow,
                              pids_max=ctx.pids_max, gpu_devices=devices, private_tmp=ctx.private_tmp,
                              tmp_dir=tmp_dir), None
    except (RuntimeError, OSError) as e:  # ExecutorError, CgroupError: a bad device file or count
        raise typer.BadParameter(f"--gpu-devices: {e}") from None


@EXECUTORS.register("ray")
def ray(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Node agents on a Ray cluster (``--ray ADDRESS``); the inventory follows Ray's nodes."""
    from .service import _ray_executor

    if ctx.ray_address is None:
        raise typer.BadParameter("the ray executor needs --ray ADDRESS")
    return _ray_executor(ctx.ray_address, ctx.service_id, ctx.grace_s, ctx.shared_dir is not None, ctx.env_allow,
                         ctx.gpus, ctx.cpus_per_node, ctx.private_tmp)


@EXECUTORS.register("slurm")
def slurm(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Slurm batch jobs on the Slurm cluster of this machine's slurm.conf (``--slurm all|PARTITION``); the
    inventory follows Slurm's nodes."""
    from .service import _slurm_executor

    if ctx.slurm is None:
        raise typer.BadParameter("the slurm executor needs --slurm all or --slurm PARTITION")
    return _slurm_executor(ctx.slurm, ctx.service_id, ctx.grace_s, ctx.state_dir, ctx.job_dir, ctx.shared_dir,
                           ctx.switch_users)
