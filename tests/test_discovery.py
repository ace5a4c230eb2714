"""GPU/CPU/memory discovery: declared inventories, nvidia-smi output, and whatever this machine has."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuloom.runtime.exec.discovery import (
    DiscoveryError,
    discover,
    discover_inventory,
    discover_nvml,
    host_mem_mb,
    local_cluster,
    parse_smi_csv,
)

# Captured from `nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits`
SMI_OUTPUT = """\
0, NVIDIA A100-SXM4-40GB, GPU-9f3c2a4e-0d1b-6c2f-8a43-1b0e5d7c9a11, 40960, 00000000:07:00.0
1, NVIDIA A100-SXM4-40GB, GPU-2b7d9e10-5c6a-4e3f-9d21-7a8b3c4d5e6f, 40960, 00000000:0F:00.0
"""


def test_declared_inventory_builds_a_one_node_cluster() -> None:
    inv = discover_inventory(gpus=8, cpus=16, mem_mb=64_000, name="box")
    assert inv.source == "declared"
    assert [g.index for g in inv.gpus] == list(range(8))
    assert inv.gpu_type == "declared"
    c = local_cluster(inv)
    assert c.num_nodes == 1 and c.num_gpus == 8
    n = c.nodes[0]
    assert (n.name, n.gpus, n.cpus, n.mem_mb, n.gpu_type) == ("box", 8, 16, 64_000, "declared")
    assert c.proportional(0, 2) == (4, 16_000)


def test_declared_gpus_take_host_cpus_and_memory() -> None:
    inv = discover_inventory(gpus=2, name="h")
    assert inv.cpus == len(os.sched_getaffinity(0)) == len(inv.core_ids)
    assert inv.mem_mb == host_mem_mb()
    assert inv.mem_mb > 0


def test_meminfo_parsing(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24684096 kB\nMemFree:        24500312 kB\n")
    assert host_mem_mb(f) == 25276  # 24684096 KiB in MB of 10^6 bytes
    f.write_text("MemFree: 1 kB\n")
    with pytest.raises(DiscoveryError, match="no MemTotal"):
        host_mem_mb(f)


def test_bad_declared_values_are_refused() -> None:
    with pytest.raises(DiscoveryError, match="declared gpus must be an integer >= 0, got -1"):
        discover_inventory(gpus=-1)
    with pytest.raises(DiscoveryError, match="declared mem_mb"):
        discover(gpus=1, mem_mb="lots")  # type: ignore[arg-type]


def test_nvidia_smi_csv() -> None:
    gpus = parse_smi_csv(SMI_OUTPUT)
    assert [(g.index, g.name, g.memory_mb, g.pci_bus_id) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-40GB", 40960, "00000000:07:00.0"),
        (1, "NVIDIA A100-SXM4-40GB", 40960, "00000000:0F:00.0"),
    ]
    assert gpus[1].uuid.startswith("GPU-2b7d")
    with pytest.raises(DiscoveryError, match="line 2: expected 5 columns"):
        parse_smi_csv("0, A, GPU-x, 10, 00:01.0\n1, B\n")
    with pytest.raises(DiscoveryError, match="line 1"):
        parse_smi_csv("zero, A, GPU-x, 10, 00:01.0\n")


def test_this_machine() -> None:
    inv = discover_inventory(name="here")
    nvml = discover_nvml()
    if nvml:
        assert inv.source == "nvml" and len(inv.gpus) == len(nvml)
        assert all(g.memory_mb > 0 and g.uuid.startswith("GPU-") for g in inv.gpus)
        assert inv.topology_text is None or "GPU0" in inv.topology_text
    else:
        assert inv.source in ("nvidia-smi", "none")
        if inv.source == "none":
            assert inv.gpus == () and inv.node().gpus == 0


def test_discover_returns_the_cluster() -> None:
    c = discover(gpus=4, cpus=8, mem_mb=32_000, name="n")
    assert c.num_nodes == 1 and c.num_gpus == 4 and c.nodes[0].name == "n" and c.total_cpus == 8


def test_declared_inventory_with_a_real_topology(data_dir: Path) -> None:
    f = data_dir / "topology" / "a100_hgx_8gpu_epyc7763_mlx5.txt"
    inv = discover_inventory(gpus=8, cpus=64, mem_mb=512_000, name="a100", topology_file=f)
    t = inv.topology()
    assert t is not None and t.num_gpus == 8
    with pytest.raises(DiscoveryError, match="describes 8 GPUs, the inventory has 4"):
        discover_inventory(gpus=4, topology_file=f)
    with pytest.raises(DiscoveryError, match="topology file .*missing.txt"):
        discover_inventory(gpus=4, topology_file=data_dir / "topology" / "missing.txt")
    if shutil.which("nvidia-smi") is None:
        assert discover_inventory(gpus=2).topology() is None  # nothing captured, nothing parsed


def test_inventory_command() -> None:
    import json

    from typer.testing import CliRunner

    from gpuloom.cli import app

    r = CliRunner().invoke(app, ["inventory", "--gpus", "2", "--cpus", "1", "--mem-gb", "3", "--name", "box", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert (data["node"], data["source"], len(data["gpus"]), data["cpus"], data["mem_mb"]) == ("box", "declared", 2, 1, 3000)
    assert data["cgroups"]["mode"] in ("v1", "v2", "none")
    r = CliRunner().invoke(app, ["inventory", "--gpus", "-3"])
    assert r.exit_code == 2 and "declared gpus must be an integer >= 0" in r.output
