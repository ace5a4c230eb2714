"""The ``slurm`` executor: Slurm batch jobs (``--slurm all|PARTITION``)."""

from __future__ import annotations

import typer

from ...runtime.exec.executor import Executor
from ..executors import EXECUTORS, ExecutorContext, Following


@EXECUTORS.register("slurm")
def slurm(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """Slurm batch jobs on the Slurm cluster of this machine's slurm.conf (``--slurm all|PARTITION``); the
    inventory follows Slurm's nodes."""
    from ..serving import _slurm_executor

    if ctx.slurm is None:
        raise typer.BadParameter("the slurm executor needs --slurm all or --slurm PARTITION")
    return _slurm_executor(ctx.slurm, ctx.service_id, ctx.grace_s, ctx.state_dir, ctx.job_dir, ctx.shared_dir,
                           ctx.switch_users)


@EXECUTORS.register("slurm-srun")
def slurm_srun(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """As ``slurm``, each job an allocation with one step (``srun``), which slurmctld places as it is asked
    rather than at its scheduling loop's next pass (docs/slurm.md)."""
    from ..serving import _slurm_executor

    if ctx.slurm is None:
        raise typer.BadParameter("the slurm-srun executor needs --slurm all or --slurm PARTITION")
    return _slurm_executor(ctx.slurm, ctx.service_id, ctx.grace_s, ctx.state_dir, ctx.job_dir, ctx.shared_dir,
                           ctx.switch_users, launcher="srun")


@EXECUTORS.register("slurm-steps")
def slurm_steps(ctx: ExecutorContext) -> tuple[Executor, Following | None]:
    """As ``slurm``, each job a step in an allocation of its account's that the service keeps open while
    that account has work on the node, so a hand-off to its next job is a step start (docs/slurm.md)."""
    from ..serving import _slurm_executor

    if ctx.slurm is None:
        raise typer.BadParameter("the slurm-steps executor needs --slurm all or --slurm PARTITION")
    return _slurm_executor(ctx.slurm, ctx.service_id, ctx.grace_s, ctx.state_dir, ctx.job_dir, ctx.shared_dir,
                           ctx.switch_users, launcher="steps")
