"""What the service refuses at submission (and fails at recovery): jobs that can never run."""

from __future__ import annotations

from ..core.cluster import Cluster


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
