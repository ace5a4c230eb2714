"""Clusters: nodes with GPUs, CPU cores and memory.

Plain data, no I/O except :func:`load_cluster_file`, which reads a YAML or TOML
description.  GPUs carry *global* integer ids ``0..G-1`` numbered node by node;
``Cluster.local_index`` turns a global id into the index on its node (what
``CUDA_VISIBLE_DEVICES`` wants).

A cluster file looks like (TOML; YAML has the same keys)::

    [[nodes]]            # a group of identical nodes
    count = 4
    gpus = 8
    cpus = 24
    mem_gb = 500
    gpu_type = "V100"
    name = "v100"        # optional prefix: nodes are v100-0 .. v100-3

    [[nodes]]
    count = 2
    gpus = 4
    cpus = 32
    mem_gb = 256
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Per-GPU defaults for a homogeneous ``NxG`` cluster: Synergy's servers have
#: 8 GPUs, 24 cores and 500 GB, i.e. 3 cores and 62.5 GB per GPU.
DEFAULT_CPUS_PER_GPU = 3
DEFAULT_MEM_MB_PER_GPU = 64_000


class ClusterError(ValueError):
    """A cluster description that cannot be used; the message says where."""


@dataclass(frozen=True, slots=True)
class Node:
    """One machine: ``gpus`` GPUs, ``cpus`` cores, ``mem_mb`` MB of memory."""

    name: str
    gpus: int
    cpus: int
    mem_mb: int
    gpu_type: str = "generic"
    rack: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpus < 0 or self.mem_mb < 0:
            raise ClusterError(f"node {self.name}: negative capacity")


@dataclass(frozen=True, slots=True)
class Cluster:
    """An ordered set of nodes.  GPU ``g`` lives on node ``gpu_node[g]``."""

    nodes: tuple[Node, ...]
    gpu_node: np.ndarray = field(init=False, repr=False, compare=False)
    gpu_offset: np.ndarray = field(init=False, repr=False, compare=False)
    cpu_caps: np.ndarray = field(init=False, repr=False, compare=False)
    mem_caps: np.ndarray = field(init=False, repr=False, compare=False)
    _gpus: int = field(init=False, repr=False, compare=False)  # (num_gpus: read in every round)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ClusterError("a cluster needs at least one node")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ClusterError("node names must be unique")
        counts = np.array([n.gpus for n in self.nodes], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        object.__setattr__(self, "gpu_offset", offsets)
        object.__setattr__(
            self, "gpu_node", np.repeat(np.arange(len(self.nodes)), counts).astype(np.int64)
        )
        object.__setattr__(self, "cpu_caps", np.array([n.cpus for n in self.nodes], dtype=np.int64))
        object.__setattr__(self, "mem_caps", np.array([n.mem_mb for n in self.nodes], dtype=np.int64))
        object.__setattr__(self, "_gpus", int(offsets[-1]))

    # -- sizes -------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_gpus(self) -> int:
        return self._gpus

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)

    @property
    def total_mem_mb(self) -> int:
        return sum(n.mem_mb for n in self.nodes)

    @property
    def max_node_gpus(self) -> int:
        return max(n.gpus for n in self.nodes)

    def node_gpus(self, node: int) -> range:
        """Global ids of the GPUs on node index ``node``."""
        return range(int(self.gpu_offset[node]), int(self.gpu_offset[node + 1]))

    def local_index(self, gpu: int) -> int:
        return gpu - int(self.gpu_offset[self.gpu_node[gpu]])

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The nodes' GPU types, normalised (:func:`~gpuloom.core.parse.normalise_gpu_type`), in node order,
        each once; nodes without GPUs left out."""
        from .parse import normalise_gpu_type

        return tuple(dict.fromkeys(normalise_gpu_type(n.gpu_type) for n in self.nodes if n.gpus > 0))

    def node_index(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise KeyError(name)

    def proportional(self, node: int, gpus: int) -> tuple[int, int]:
        """The GPU-proportional (cpus, mem_mb) share of ``gpus`` GPUs on ``node``."""
        n = self.nodes[node]
        if n.gpus == 0:
            return 0, 0
        return n.cpus * gpus // n.gpus, n.mem_mb * gpus // n.gpus

    # -- constructors --------------------------------------------------------
    @classmethod
    def homogeneous(
        cls,
        num_nodes: int,
        gpus_per_node: int,
        cpus_per_node: int | None = None,
        mem_mb_per_node: int | None = None,
        gpu_type: str = "generic",
        prefix: str = "node",
    ) -> Cluster:
        if num_nodes <= 0 or gpus_per_node <= 0:
            raise ClusterError(f"cluster {num_nodes}x{gpus_per_node}: both sizes must be positive")
        cpus = cpus_per_node if cpus_per_node is not None else DEFAULT_CPUS_PER_GPU * gpus_per_node
        mem = mem_mb_per_node if mem_mb_per_node is not None else DEFAULT_MEM_MB_PER_GPU * gpus_per_node
        return cls(
            tuple(
                Node(f"{prefix}-{i}", gpus_per_node, cpus, mem, gpu_type)
                for i in range(num_nodes)
            )
        )

    @classmethod
    def from_groups(cls, groups: Sequence[dict], source: str = "cluster") -> Cluster:
        nodes: list[Node] = []
        for gi, g in enumerate(groups):
            where = f"{source}: nodes[{gi}]"
            unknown = set(g) - {"count", "gpus", "cpus", "mem_gb", "mem_mb", "gpu_type", "name", "rack"}
            if unknown:
                raise ClusterError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            try:
                count = int(g.get("count", 1))
                gpus = int(g["gpus"])
                cpus = int(g.get("cpus", DEFAULT_CPUS_PER_GPU * gpus))
                if "mem_mb" in g:
                    mem = int(g["mem_mb"])
                elif "mem_gb" in g:
                    mem = int(float(g["mem_gb"]) * 1000)
                else:
                    mem = DEFAULT_MEM_MB_PER_GPU * gpus
            except KeyError as e:
                raise ClusterError(f"{where}: missing field {e.args[0]!r}") from None
            except (TypeError, ValueError) as e:
                raise ClusterError(f"{where}: {e}") from None
            prefix = str(g.get("name", f"g{gi}"))
            for i in range(count):
                nodes.append(
                    Node(
                        f"{prefix}-{i}",
                        gpus,
                        cpus,
                        mem,
                        str(g.get("gpu_type", "generic")),
                        int(g.get("rack", 0)),
                    )
                )
        return cls(tuple(nodes))


_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
#: one group of a cluster by type: ``v100:36`` (36 nodes of one GPU) or ``v100:9x4`` (9 nodes of 4)
_TYPED = re.compile(r"^\s*([A-Za-z][\w.\-]*)\s*:\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*$")


def parse_cluster(spec: str, cpus_per_node: int | None = None, mem_gb_per_node: float | None = None) -> Cluster:
    """``"16x4"`` → 16 nodes of 4 GPUs; ``"v100:36,p100:9x4"`` → nodes by GPU type
    (:func:`typed_cluster`); anything else is read as a file path."""
    m = _SPEC.match(spec)
    mem = int(mem_gb_per_node * 1000) if mem_gb_per_node is not None else None
    if m:
        return Cluster.homogeneous(int(m.group(1)), int(m.group(2)), cpus_per_node, mem)
    if ":" in spec and not Path(spec).exists():
        return typed_cluster(spec, cpus_per_node, mem)
    path = Path(spec)
    if not path.exists():
        raise ClusterError(f"cluster {spec!r}: neither NODESxGPUS (e.g. 16x4), TYPE:GPUS,... (e.g. "
                           f"v100:36,p100:36,k80:36) nor an existing file")
    return load_cluster_file(path)


def typed_cluster(spec: str, cpus_per_node: int | None = None, mem_mb_per_node: int | None = None) -> Cluster:
    """A cluster by GPU type: ``"v100:36,p100:36,k80:36"`` (each type's GPUs on nodes of one GPU, as
    Gavel's simulated servers) or ``"v100:9x4"`` (9 nodes of 4 GPUs); nodes are named ``v100-0``, ...
    Cores and memory per node as :meth:`Cluster.homogeneous` (per GPU by default)."""
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, part in enumerate(spec.split(",")):
        m = _TYPED.match(part)
        if not m:
            raise ClusterError(f"cluster {spec!r}: group {i + 1} ({part.strip()!r}) is not TYPE:GPUS or "
                               f"TYPE:NODESxGPUS (e.g. v100:36 or v100:9x4)")
        gpu_type = m.group(1)
        if gpu_type.lower() in seen:
            raise ClusterError(f"cluster {spec!r}: GPU type {gpu_type!r} given twice")
        seen.add(gpu_type.lower())
        count, per = int(m.group(2)), m.group(3)
        n, g = (count, 1) if per is None else (count, int(per))
        if n <= 0 or g <= 0:
            raise ClusterError(f"cluster {spec!r}: {part.strip()!r} needs a positive number of nodes and GPUs")
        group = Cluster.homogeneous(n, g, cpus_per_node, mem_mb_per_node, gpu_type, prefix=gpu_type.lower())
        nodes.extend(group.nodes)
    return Cluster(tuple(nodes))


def load_cluster_file(path: str | Path) -> Cluster:
    path = Path(path)
    text = path.read_text()
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except Exception as e:  # parser errors carry line numbers in their text
        raise ClusterError(f"{path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ClusterError(f"{path}: expected a top-level 'nodes' list")
    return Cluster.from_groups(data["nodes"], source=str(path))
