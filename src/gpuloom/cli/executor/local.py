"""The ``local`` executor: processes on this machine, in cgroups where they are writable."""

from __future__ import annotations

from pathlib import Path

import typer

from ...runtime.exec.executor import Executor
from ..executors import EXECUTORS, ExecutorContext, Following


@EXECUTORS.register("local")
def local(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Processes on this machine, in cgroups where they are writable."""
    from ...runtime.exec.router import local_executor
    from ...runtime.service.security import default_job_dir
    from ..serving import _gpu_devices

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
