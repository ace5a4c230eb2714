"""The executors ``gpuloom serve`` can run jobs with, by name (``--executor``).

An executor factory takes an :class:`ExecutorContext` (what ``serve`` was told) and returns the
:class:`~gpuloom.runtime.exec.executor.Executor` and, when the executor brings its own inventory (Ray's
nodes), the inventory that follows it (:class:`Following`); None keeps the
declared or discovered one (``ExecutorContext.inventory``).  ``local``, ``ray`` and ``slurm`` are built in,
each in its own module of :mod:`gpuloom.cli.executor`, where it registers itself; outside factories come by
the ``gpuloom.executors`` entry points or as ``--executor module:function``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


#: executors by name: each built-in registers itself in its module of :mod:`gpuloom.cli.executor` (one file an
#: executor); outside ones by entry points or ``module:function``
EXECUTORS: Registry[Factory] = Registry("executor", home="gpuloom.cli.executor", group="gpuloom.executors",
                                        check=_factory, outside="module:function")
