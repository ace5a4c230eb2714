"""What this machine has: GPUs (NVML or ``nvidia-smi``), CPU cores, memory.

Sources, first that answers wins:

1. a **declared** inventory (``gpus=8``, e.g. ``gpuloom serve --gpus 8``): the
   service runs, and is tested, on machines without GPUs.  Declared GPUs are
   of type ``declared`` (or the name given); declared CPU and memory default to the host's;
2. **NVML** through ``nvidia-ml-py`` (``pynvml``): count, names, memory, UUIDs,
   PCI bus ids - no subprocess, and the same numbering as
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which the executor sets;
3. ``nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits``;
4. none: a node with zero GPUs (logged as a warning).

Whenever ``nvidia-smi`` exists its ``topo -m`` matrix is captured as text
(:attr:`Inventory.topology_text`); the topology policies parse it
(``gpuloom.perf.topology``), discovery only records it.

Each GPU's device file is ``/dev/nvidia<minor>``, where the minor number is the driver's (NVML's
``nvmlDeviceGetMinorNumber``, else ``Device Minor`` in ``/proc/driver/nvidia/gpus/<bus id>/information``),
not the GPU's index: :func:`discover_gpu_devices` gives them in index order, for the executor's
devices cgroup (a job may open only its own GPUs' files).

CPU cores are the ones this process may run on (``os.sched_getaffinity``), because
those are the ids the executor can pin jobs to; memory is ``MemTotal`` from
``/proc/meminfo``.  The result converts to the scheduler's plain data:
:meth:`Inventory.node`, :func:`local_cluster`; :func:`discover` goes straight to
the one-node :class:`Cluster`.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuloom.core.cluster import Cluster, ClusterError, Node

log = logging.getLogger(__name__)

SMI_QUERY = "index,name,uuid,memory.total,pci.bus_id"
PROC_GPUS = "/proc/driver/nvidia/gpus"


class DiscoveryError(ValueError):
    """An inventory that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # node-local index (CUDA_VISIBLE_DEVICES with PCI_BUS_ID order)
    name: str
    uuid: str = ""
    memory_mb: int = 0
    pci_bus_id: str = ""
    minor: int | None = None  # the driver's minor number: the device file is /dev/nvidia<minor>


@dataclass(frozen=True, slots=True)
class Inventory:
    """One machine's resources and where the figures came from."""

    name: str
    gpus: tuple[GpuInfo, ...]
    cpus: int
    mem_mb: int
    source: str  # "declared" | "nvml" | "nvidia-smi" | "none"
    topology_text: str | None = None  # `nvidia-smi topo -m` output, when available
    core_ids: tuple[int, ...] = ()  # the CPU ids jobs may be pinned to

    @property
    def gpu_type(self) -> str:
        names = {g.name for g in self.gpus}
        if not names:
            return "none"
        if len(names) > 1:
            log.warning("node %s has mixed GPU models %s; typed as the first", self.name, sorted(names))
        return self.gpus[0].name

    def topology(self):  # -> gpuloom.perf.topology.Topology | None
        """The parsed ``nvidia-smi topo -m`` matrix (None when none was captured)."""
        if not self.topology_text:
            return None
        from gpuloom.perf.topology import parse_topology

        return parse_topology(self.topology_text, source=f"topology of {self.name}")

    def node(self, rack: int = 0) -> Node:
        return Node(self.name, len(self.gpus), self.cpus, self.mem_mb, self.gpu_type, rack)


def host_core_ids() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def host_mem_mb(meminfo: str | Path = "/proc/meminfo") -> int:
    """``MemTotal`` in MB of 10^6 bytes (the unit of jobs' memory and of the executor's limits)."""
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            kib = int(parts[1])  # /proc/meminfo's "kB" are KiB
            return kib * 1024 // 10**6
    raise DiscoveryError(f"{meminfo}: no MemTotal line")


def discover_nvml() -> list[GpuInfo] | None:
    """GPUs through NVML; None when the library or the driver is absent."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("NVML unavailable: %s", e)
        return None
    try:
        out: list[GpuInfo] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            try:
                minor: int | None = int(pynvml.nvmlDeviceGetMinorNumber(h))
            except Exception:  # not supported on every platform: the driver's /proc tree may tell
                minor = None
            out.append(
                GpuInfo(
                    i,
                    name.decode() if isinstance(name, bytes) else str(name),
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    int(mem),
                    bus.decode() if isinstance(bus, bytes) else str(bus),
                    minor,
                )
            )
        return out
    except Exception as e:
        log.warning("NVML query failed: %s", e)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def parse_smi_csv(text: str, source: str = "nvidia-smi") -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits``."""
    out: list[GpuInfo] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 5:
            raise DiscoveryError(f"{source}: line {n}: expected 5 columns ({SMI_QUERY}), got {len(cols)}: {line!r}")
        try:
            index = int(cols[0])
            mem = int(float(cols[3])) if cols[3] not in ("[N/A]", "N/A") else 0
        except ValueError as e:
            raise DiscoveryError(f"{source}: line {n}: {e}") from None
        out.append(GpuInfo(index, cols[1], cols[2], mem, cols[4]))
    return out


def _bus_key(bus_id: str) -> str:
    """A PCI bus id as the driver's /proc tree names it: NVML's ``00000000:07:00.0`` -> ``0000:07:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if rest else domain


def proc_minors(proc_dir: str | Path = PROC_GPUS) -> dict[str, int]:
    """Bus id (as :func:`_bus_key` writes it) -> minor number, from the driver's ``<bus>/information``
    files (``Device Minor: 3``); empty where the driver is not loaded."""
    out: dict[str, int] = {}
    try:
        entries = sorted(Path(proc_dir).iterdir())
    except OSError:
        return out
    for d in entries:
        try:
            text = (d / "information").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor":
                try:
                    out[_bus_key(d.name)] = int(value)
                except ValueError:
                    raise DiscoveryError(f"{d / 'information'}: Device Minor is not a number: {value.strip()!r}") from None
    return out


def with_minors(gpus: list[GpuInfo], proc_dir: str | Path = PROC_GPUS) -> list[GpuInfo]:
    """``gpus`` with the minor numbers NVML did not give filled in from the driver's /proc tree."""
    if all(g.minor is not None for g in gpus):
        return gpus
    minors = proc_minors(proc_dir)
    return [g if g.minor is not None else replace(g, minor=minors.get(_bus_key(g.pci_bus_id))) for g in gpus]


def gpu_device_files(gpus: Sequence[GpuInfo], dev_dir: str = "/dev") -> tuple[str, ...]:
    """Each GPU's device file in index order (``/dev/nvidia<minor>``); empty, with a warning, when a
    GPU's minor number is unknown (isolating some GPUs but not others would be a false promise)."""
    ordered = sorted(gpus, key=lambda g: g.index)
    unknown = [g.index for g in ordered if g.minor is None]
    if unknown:
        if ordered:
            log.warning("no device minor number for GPU(s) %s: GPU device files are not isolated", unknown)
        return ()
    return tuple(f"{dev_dir}/nvidia{g.minor}" for g in ordered)


def discover_gpu_devices(use_nvml: bool = True, smi: str = "nvidia-smi",
                         proc_dir: str | Path = PROC_GPUS) -> tuple[str, ...]:
    """This machine's GPU device files in GPU index order (NVML, else ``nvidia-smi`` and the driver's
    /proc tree); empty where there are no GPUs or their minor numbers are unknown."""
    for probe in (discover_nvml if use_nvml else None, lambda: discover_smi(smi)):
        got = probe() if probe is not None else None
        if got:
            return gpu_device_files(with_minors(got, proc_dir))
    return ()


def _run(args: list[str], timeout: float = 10.0) -> str | None:
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("%s failed: %s", args[0], e)
        return None
    if r.returncode != 0:
        log.debug("%s exited %d: %s", " ".join(args), r.returncode, r.stderr.strip())
        return None
    return r.stdout


def discover_smi(smi: str = "nvidia-smi") -> list[GpuInfo] | None:
    exe = shutil.which(smi)
    if exe is None:
        return None
    text = _run([exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"])
    return None if text is None else parse_smi_csv(text)


def topology_text(smi: str = "nvidia-smi") -> str | None:
    """The ``nvidia-smi topo -m`` matrix as text, or None where there is no nvidia-smi."""
    exe = shutil.which(smi)
    return None if exe is None else _run([exe, "topo", "-m"])


def discover_inventory(
    gpus: int | None = None,
    cpus: int | None = None,
    mem_mb: int | None = None,
    name: str | None = None,
    gpu_name: str = "declared",
    use_nvml: bool = True,
    smi: str = "nvidia-smi",
    topology_file: str | Path | None = None,
) -> Inventory:
    """This machine's inventory; any of ``gpus``/``cpus``/``mem_mb`` given overrides what is found.

    ``topology_file``: saved ``nvidia-smi topo -m`` output to use instead of this machine's
    (a declared 8-GPU node can then be given a real NVLink topology); it must describe as
    many GPUs as the inventory has.
    """
    for field_name, v in (("gpus", gpus), ("cpus", cpus), ("mem_mb", mem_mb)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise DiscoveryError(f"declared {field_name} must be an integer >= 0, got {v!r}")
    core_ids = host_core_ids()
    if cpus is not None and cpus > len(core_ids):
        log.warning("declared %d CPU cores but this process may use only %d: launches on the missing ids will fail",
                    cpus, len(core_ids))
    n_cpus = cpus if cpus is not None else len(core_ids)
    n_mem = mem_mb if mem_mb is not None else host_mem_mb()
    node_name = name or socket.gethostname() or "local"
    topo: str | None
    if topology_file is not None:
        try:
            topo = Path(topology_file).read_text()
        except OSError as e:
            raise DiscoveryError(f"topology file {topology_file}: {e.strerror or e}") from None
    else:
        topo = topology_text(smi)
    inv = _inventory(gpus, gpu_name, use_nvml, smi, node_name, n_cpus, n_mem, topo, core_ids)
    if topology_file is not None:
        t = inv.topology()
        if t is not None and t.num_gpus != len(inv.gpus):
            raise DiscoveryError(f"topology file {topology_file} describes {t.num_gpus} GPUs, "
                                 f"the inventory has {len(inv.gpus)}")
    return inv


def _inventory(gpus: int | None, gpu_name: str, use_nvml: bool, smi: str, node_name: str, n_cpus: int,
               n_mem: int, topo: str | None, core_ids: tuple[int, ...]) -> Inventory:
    if gpus is not None:
        found = [GpuInfo(i, gpu_name) for i in range(gpus)]
        return Inventory(node_name, tuple(found), n_cpus, n_mem, "declared", topo, core_ids)
    for source, probe in (("nvml", discover_nvml if use_nvml else None), ("nvidia-smi", lambda: discover_smi(smi))):
        if probe is None:
            continue
        got = probe()
        if got:
            return Inventory(node_name, tuple(with_minors(got)), n_cpus, n_mem, source, topo, core_ids)
    log.warning("no GPUs found (NVML and nvidia-smi unavailable); declare an inventory, e.g. --gpus 8")
    return Inventory(node_name, (), n_cpus, n_mem, "none", topo, core_ids)


def discover(
    gpus: int | None = None,
    cpus: int | None = None,
    mem_mb: int | None = None,
    name: str | None = None,
    gpu_name: str = "declared",
) -> Cluster:
    """This machine as a one-node :class:`Cluster` (see :func:`discover_inventory` for the details)."""
    return local_cluster(discover_inventory(gpus, cpus, mem_mb, name, gpu_name))


def local_cluster(inventory: Inventory) -> Cluster:
    """A one-node :class:`Cluster` for this machine."""
    try:
        return Cluster((inventory.node(),))
    except ClusterError as e:
        raise DiscoveryError(f"inventory {inventory.name}: {e}") from None
