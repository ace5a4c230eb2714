"""The ``ray`` executor: node agents on a Ray cluster (``--ray ADDRESS``)."""

from __future__ import annotations

import typer

from ...runtime.exec.executor import Executor
from ..executors import EXECUTORS, ExecutorContext, Following


@EXECUTORS.register("ray")
def ray(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Node agents on a Ray cluster (``--ray ADDRESS``); the inventory follows Ray's nodes."""
    from ..serving import _ray_executor

    if ctx.ray_address is None:
        raise typer.BadParameter("the ray executor needs --ray ADDRESS")
    return _ray_executor(ctx.ray_address, ctx.service_id, ctx.grace_s, ctx.shared_dir is not None, ctx.env_allow,
                         ctx.gpus, ctx.cpus_per_node, ctx.private_tmp)
