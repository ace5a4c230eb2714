"""What the service refuses at submission (and fails at recovery): jobs that can never run.

Everything a round will need is checked here, so one job cannot fail the
rounds of everyone: sizes against the cluster (:func:`refuse_reason`), the
fields elastic sizing and Muri grouping read (:func:`check_policy_fields`),
and where the job's checkpoints go (:func:`check_checkpoint_dir`: under an
allowed root, creatable by the job's OS account).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..core.cluster import Cluster
from .identity import Account, creatable


class SubmitError(ValueError):
    """A job the service refuses; ``field`` names the offending field when there is one."""

    def __init__(self, msg: str, field: str | None = None, kind: str = "never_fits") -> None:
        super().__init__(msg)
        self.field = field
        self.kind = kind  # the 422's ``type``


class PermissionDenied(PermissionError):
    pass


class NotFound(KeyError):
    pass


def refuse_reason(cluster: Cluster, gpus: int, cpus: int | None, mem_mb: int | None) -> tuple[str, str] | None:
    """Why a job can never run on ``cluster`` (field, message), or None if it can."""
    if gpus > cluster.num_gpus:
        return "gpus", f"needs {gpus} GPUs, the cluster has {cluster.num_gpus}"
    if cpus is not None and cpus > cluster.total_cpus:
        return "cpus", f"needs {cpus} CPU cores, the cluster has {cluster.total_cpus}"
    if mem_mb is not None and mem_mb > cluster.total_mem_mb:
        return "mem", f"needs {mem_mb} MB of memory, the cluster has {cluster.total_mem_mb}"
    if gpus <= cluster.max_node_gpus:
        # fits on one node by GPUs: some node must also hold its CPU and memory
        ok = any(
            n.gpus >= gpus and (cpus is None or cpus <= n.cpus) and (mem_mb is None or mem_mb <= n.mem_mb)
            for n in cluster.nodes
        )
        if not ok and gpus <= min(n.gpus for n in cluster.nodes if n.gpus > 0):
            what = "cpus" if cpus is not None and all(cpus > n.cpus for n in cluster.nodes) else "mem"
            return what, (
                f"{gpus} GPUs with {cpus if cpus is not None else 'proportional'} cores and "
                f"{mem_mb if mem_mb is not None else 'proportional'} MB fit on no node"
            )
    return None


def check_submittable(cluster: Cluster, spec: dict) -> None:
    """Raise :class:`SubmitError` naming the field if ``spec`` can never run on ``cluster``."""
    reason = refuse_reason(cluster, int(spec["gpus"]), spec.get("cpus"), spec.get("mem_mb"))
    if reason is not None:
        raise SubmitError(f"job can never run on this cluster: {reason[1]}", reason[0])


# -- fields the policies read: checked against the cluster at submission ---------------------------
def check_policy_fields(cluster: Cluster, spec: dict) -> None:
    """Raise :class:`SubmitError` for elastic (``throughput``, ``min_gpus``) and Muri (``resource_times``,
    ``iteration_time``) fields the scheduler could not use on ``cluster``."""
    from ..perf.interleave import DEFAULT_RESOURCES, ProfileError, layout_for, stage_profile
    from ..perf.scaling import ScalingCurve, ScalingError

    gpus = int(spec["gpus"])
    lo = spec.get("min_gpus")
    if lo is not None:
        if lo > cluster.num_gpus:
            raise SubmitError(f"min_gpus {lo} is more than the cluster's {cluster.num_gpus} GPUs", "min_gpus", "unusable")
        if lo > gpus:
            raise SubmitError(f"min_gpus {lo} is more than the {gpus} GPUs asked for", "min_gpus", "unusable")
    table = spec.get("throughput")
    if table is not None:
        try:
            curve = ScalingCurve.parse(table, "throughput")
        except ScalingError as e:
            raise SubmitError(str(e), "throughput", "unusable") from None
        over = [n for n in curve.points if n > cluster.num_gpus]
        if over:
            raise SubmitError(f"throughput given at {over[0]} GPUs, the cluster has {cluster.num_gpus}", "throughput", "unusable")
        at = lo if lo is not None else min(gpus, curve.min_gpus)
        try:
            f = curve(at)
        except Exception as e:  # evaluation of the user's table
            raise SubmitError(f"throughput curve cannot be evaluated at {at} GPUs: {e}", "throughput", "unusable") from None
        if not f > 0:
            raise SubmitError(f"throughput is 0 at {at} GPUs: a job must make progress at its smallest size",
                              "throughput", "unusable")
    rt = spec.get("resource_times")
    if rt is not None:
        if not sum(rt) > 0:
            raise SubmitError("resource_times must not all be 0: an iteration takes time", "resource_times", "unusable")
        try:
            layout_for(len(rt), DEFAULT_RESOURCES)
            stage_profile(rt, spec.get("iteration_time"))
        except ProfileError as e:
            raise SubmitError(f"resource_times: {e}", "resource_times", "unusable") from None
    elif spec.get("iteration_time") is not None and not spec["iteration_time"] > 0:
        raise SubmitError("iteration_time must be > 0", "iteration_time", "unusable")


# -- where checkpoints may go ------------------------------------------------------------------------
def check_checkpoint_dir(path: str, roots: Sequence[str | Path], account: Account) -> None:
    """Raise :class:`SubmitError` unless ``path`` lies under one of ``roots`` (after resolving symbolic
    links) and ``account`` can create it (or write into it)."""
    if ".." in Path(path).parts:
        raise SubmitError(f"checkpoint_dir {path!r} must not contain '..'", "checkpoint_dir", "not_allowed")
    real = Path(os.path.realpath(path))
    for r in roots:
        root = Path(os.path.realpath(r))
        if real == root or root in real.parents:
            break
    else:
        allowed = ", ".join(str(r) for r in roots) or "(none)"
        raise SubmitError(f"checkpoint_dir {path!r} is outside the allowed roots ({allowed})", "checkpoint_dir", "not_allowed")
    why = creatable(real, account)
    if why is not None:
        raise SubmitError(f"checkpoint_dir {path!r} cannot be created by the job's account: {why}",
                          "checkpoint_dir", "not_allowed")
