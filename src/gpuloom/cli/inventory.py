"""``gpuloom inventory``: what this machine offers the service (GPUs, cores, memory, cgroups, topology)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import console, err_console


@app.command()
def inventory(
    gpus: Annotated[int | None, typer.Option(help="Declare N GPUs instead of discovering them.")] = None,
    cpus: Annotated[int | None, typer.Option(help="Declare N CPU cores (default: the cores this process may use).")] = None,
    mem_gb: Annotated[float | None, typer.Option(help="Declare the memory in GB (default: MemTotal).")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default: the host name).")] = None,
    topology: Annotated[Path | None, typer.Option(help="Saved `nvidia-smi topo -m` output to use.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show this machine as the service sees it: discovered or declared GPUs, cores, memory, cgroup support."""
    from ..perf.topology import TopologyError
    from ..runtime.exec.cgroups import CgroupManager
    from ..runtime.exec.discovery import DiscoveryError, discover_inventory, gpu_device_files
    from ..runtime.exec.local_launch import gpu_isolation, root_tool

    try:
        inv = discover_inventory(gpus, cpus, int(mem_gb * 1000) if mem_gb is not None else None, name,
                                 topology_file=topology)
        topo = inv.topology()
    except (DiscoveryError, TopologyError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    cg = CgroupManager().support
    isolation = gpu_isolation(cg.devices, root_tool("unshare"), root_tool("mount"))
    data = {
        "node": inv.name,
        "source": inv.source,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "memory_mb": g.memory_mb,
                  "pci_bus_id": g.pci_bus_id, "minor": g.minor} for g in inv.gpus],
        "cpus": inv.cpus,
        "core_ids": list(inv.core_ids),
        "mem_mb": inv.mem_mb,
        "cgroups": {"mode": cg.mode, "version": cg.version, "memory": cg.memory, "cpuset": cg.cpuset,
                    "pids": cg.pids, "devices": cg.devices, "reason": cg.reason},
        "gpu_device_isolation": isolation,
        "topology_gpus": topo.num_gpus if topo is not None else None,
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console.print(f"node {inv.name}: {len(inv.gpus)} GPUs ({inv.source}), {inv.cpus} cores, {inv.mem_mb} MB")
    for g in inv.gpus:
        extra = f"  {g.memory_mb} MB  {g.uuid}  {g.pci_bus_id}" if g.uuid else ""
        console.print(f"  GPU{g.index}  {g.name}{extra}", highlight=False)
    limits = (f"memory limits {'on' if cg.memory else 'off'}, cpusets {'on' if cg.cpuset else 'off'}, "
              f"pids limits {'on' if cg.pids else 'off'}, device isolation {'on' if cg.devices else 'off'}")
    console.print(f"cgroups: {cg.mode} ({limits})" + (f" - {cg.reason}" if cg.reason else ""), highlight=False)
    files = gpu_device_files(inv.gpus) if inv.source != "declared" else ()
    console.print("GPU device files: " + ("none known (declared GPUs: serve --gpu-devices lists them)" if not files
                                          else f"{', '.join(files)}; " + {
        "cgroup": "other jobs' denied by the devices cgroup",
        "namespace": "other jobs' hidden in each job's mount namespace (jobs of other accounts than the server's)",
        "none": "not isolated (CUDA_VISIBLE_DEVICES only)"}[isolation]), highlight=False)
    console.print(f"topology: {topo.num_gpus} GPUs" if topo is not None else "topology: none captured")
