"""What ``gpuloom serve`` builds from its options besides the service itself: the inventory, the Ray and
Slurm executors, the listening sockets and their connection limits, the access log, and the checks of
options that go together."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import typer
from rich.markup import escape

from .common import err_console


def _access_log(target: str | None, fmt: str) -> logging.Handler | None:
    """``--access-log``'s handler, opened now: a file that cannot be written is a usage error."""
    if target is None:
        return None
    from ..runtime.api.access import open_log

    try:
        return open_log(target, fmt)
    except OSError as e:
        raise typer.BadParameter(f"--access-log {target}: {e.strerror or e}") from None


def _gpu_devices(option: str, declared: bool) -> tuple[str, ...]:
    """``--gpu-devices``: auto, none, or a comma-separated list of device files."""
    if option == "none":
        return ()
    if option == "auto":
        from ..runtime.exec.discovery import discover_gpu_devices

        return () if declared else discover_gpu_devices()
    paths = tuple(p.strip() for p in option.split(","))
    if not all(p.startswith("/") for p in paths):
        raise typer.BadParameter(f"--gpu-devices: give auto, none or absolute device file paths, got {option!r}")
    return paths


def _private_to_jobs(path: Path) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == Path(m) or Path(m) in real.parents for m in ("/tmp", "/dev/shm"))


def _connection_limits(max_connections: int | None, header_timeout: float, keep_alive: float,  # noqa: ANN202
                       send_timeout: float):
    from ..runtime.api.listen import ConnectionLimits, ListenError

    try:
        return ConnectionLimits.for_process(max_connections, header_timeout, keep_alive, send_timeout)
    except ListenError as e:
        raise typer.BadParameter(str(e)) from None


def _listen(sd: Path, host: str, port: int, socket_path: Path | None, tls: bool, backlog: int):  # noqa: ANN202
    """The server's TCP and Unix sockets, listening; exit 2 naming whoever holds them."""
    import atexit

    from ..runtime.api.listen import ListenError, Listeners, default_socket_path, remove_server_info

    remove_server_info(sd)  # a dead server's: nothing may point clients at a listener that is not this one
    try:
        listeners = Listeners(host, port, socket_path.absolute() if socket_path is not None else
                              lambda bound: default_socket_path(bound, sd), tls, backlog)
    except ListenError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    if listeners.unix_path is None:
        logging.getLogger("gpuloom.service").warning(
            "no Unix socket: %s is too long a path for one; give --socket", sd / "gpuloom.sock")
    atexit.register(listeners.close)  # a start that fails later leaves no socket file behind
    return listeners


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_slurm(slurm: str | None, ray_address: str | None, gpus: int | None, cluster: str | None) -> None:
    if slurm is None:
        return
    if ray_address is not None or gpus is not None or cluster is not None:
        raise typer.BadParameter("--slurm takes the inventory from Slurm's nodes: give no --ray, --gpus or --cluster")
    if slurm != "all" and not slurm.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise typer.BadParameter(f"--slurm: 'all' or a partition name, got {slurm!r}")


def _slurm_executor(slurm: str, service_id: str, grace: float, sd: Path, job_dir: Path | None,  # noqa: ANN202
                    shared_dir: Path | None, switch: bool, launcher: str = "sbatch"):
    """The Slurm executor (jobs named ``gpuloom-<service id>:<job>``) and the inventory that follows Slurm.

    Slurm writes jobs' output under the job directory (``slurm-out/<account>/``), which the nodes must share."""
    from ..core.cluster import ClusterError
    from ..runtime.exec.executor import ExecutorError
    from ..runtime.exec.identity import IdentityError, private_dir
    from ..runtime.exec.slurm import SlurmExecutor, SlurmInventory
    from ..runtime.service.security import default_job_dir

    base = job_dir or (shared_dir / "checkpoints" if shared_dir is not None else default_job_dir(sd, service_id, switch))
    try:
        private_dir(base, 0o711 if switch else 0o700)  # as the service makes it: job accounts pass through
        part, out = None if slurm == "all" else slurm, str(Path(base) / "slurm-out")
        if launcher == "steps":  # jobs as steps in allocations the service keeps (docs/slurm.md)
            from ..runtime.exec.slurm_steps import SlurmStepsExecutor

            ex: SlurmExecutor = SlurmStepsExecutor(f"gpuloom-{service_id}", part, grace_s=grace, out_dir=out)
        else:
            ex = SlurmExecutor(f"gpuloom-{service_id}", partition=part, grace_s=grace, out_dir=out, launcher=launcher)
        return ex, SlurmInventory(ex)
    except (ExecutorError, IdentityError, OSError) as e:
        raise ClusterError(f"--slurm: {e}") from None


def _ray_executor(address: str, service_id: str, grace: float, shared: bool,  # noqa: ANN202
                  env_allow: tuple[str, ...], gpus: int | None, cpus: int | None, private_tmp: bool):
    """The Ray executor (agents in the namespace ``gpuloom-<service id>``) and the inventory that follows Ray."""
    from ..runtime.exec.executor import ExecutorError
    from ..runtime.exec.ray_executor import RayExecutor, RayInventory
    from .common import ray_connect

    ray_connect(address, gpus, cpus)
    try:
        ex = RayExecutor(f"gpuloom-{service_id}", cgroup_parent=f"gpuloom-{service_id}", grace_s=grace,
                         logs="shared" if shared else "agent", env_allow=env_allow, private_tmp=private_tmp)
    except ExecutorError as e:
        from ..core.cluster import ClusterError

        raise ClusterError(str(e)) from None
    if not shared:
        logging.getLogger("gpuloom.service").warning(
            "no --shared-dir: logs are fetched through the node agents, and a job resumes from its checkpoint "
            "only on a node that sees its checkpoint_dir")
    return ex, RayInventory(ex)


def _inventory(gpus: int | None, cluster: str | None, cpus: int | None, mem_gb: float | None):  # noqa: ANN202
    """A declared cluster (``--cluster``), else this machine: discovered, or with ``--gpus N`` declared GPUs."""
    from ..core.cluster import Cluster, ClusterError, Node, parse_cluster

    if gpus is not None and cluster is not None:
        raise ClusterError("give --gpus or --cluster, not both")
    if cluster is not None:
        return parse_cluster(cluster, cpus, mem_gb)
    if gpus is not None and gpus < 1:
        raise ClusterError(f"--gpus must be >= 1, got {gpus}")
    mem_mb = int(mem_gb * 1000) if mem_gb is not None else None
    discover: Callable[..., Cluster] | None
    try:
        from ..runtime.exec.discovery import discover
    except ImportError:
        discover = None
    if discover is not None:
        try:
            cl = discover(gpus, cpus, mem_mb)
        except ValueError as e:  # DiscoveryError
            raise ClusterError(str(e)) from None
        if cl.num_gpus == 0:
            raise ClusterError("no GPUs found on this machine: declare an inventory with --gpus N or --cluster 2x4")
        return cl
    if gpus is None:
        raise ClusterError("no GPU discovery here: declare an inventory with --gpus N or --cluster 2x4")
    import psutil

    ncpu = cpus if cpus is not None else len(os.sched_getaffinity(0))
    mem = mem_mb if mem_mb is not None else psutil.virtual_memory().total // 10**6  # MB of 10^6 bytes
    return Cluster((Node("local", gpus, ncpu, mem),))
