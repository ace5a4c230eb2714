"""Free GPUs, cores and memory per node while a plan is being built: :class:`FreeState`.

The driver keeps one up to date with the running allocations (``View.free``);
placement starts from a copy and changes only what moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..core.cluster import Cluster
from ..core.plan import Allocation, Part


class FreeState:
    """Free GPUs, cores and memory while a plan is being built (numpy arrays).

    The simulator keeps one up to date with the running allocations
    (``View.free``); sticky placement starts from a copy of it and releases
    only what changes, so a round costs O(changes), not O(running jobs).
    """

    __slots__ = ("cluster", "gpu_free", "node_gpus", "node_cpus", "node_mem")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.gpu_free = np.ones(cluster.num_gpus, dtype=bool)
        self.node_gpus = np.array([n.gpus for n in cluster.nodes], dtype=np.int64)
        self.node_cpus = np.array([n.cpus for n in cluster.nodes], dtype=np.int64)
        self.node_mem = np.array([n.mem_mb for n in cluster.nodes], dtype=np.int64)

    @classmethod
    def of(cls, cluster: Cluster, allocs: Mapping[str, Allocation]) -> FreeState:
        """The free state left by ``allocs`` (a group's GPUs taken once)."""
        free = cls(cluster)
        seen: set[tuple[int, ...]] = set()
        for a in allocs.values():
            g = a.gpu_ids
            free.take(a.parts, 1, gpus=g not in seen)
            seen.add(g)
        return free

    def copy(self) -> FreeState:
        new = FreeState.__new__(FreeState)
        new.cluster = self.cluster
        new.gpu_free = self.gpu_free.copy()
        new.node_gpus = self.node_gpus.copy()
        new.node_cpus = self.node_cpus.copy()
        new.node_mem = self.node_mem.copy()
        return new

    @property
    def free_gpus(self) -> int:
        return int(self.node_gpus.sum())

    def free_on(self, node: int) -> list[int]:
        lo, hi = self.cluster.gpu_offset[node], self.cluster.gpu_offset[node + 1]
        return (np.flatnonzero(self.gpu_free[lo:hi]) + lo).tolist()

    def fits(self, parts: Sequence[Part], members: int = 1) -> bool:
        for p in parts:
            if p.cpus * members > self.node_cpus[p.node] or p.mem_mb * members > self.node_mem[p.node]:
                return False
            if not self.gpu_free[list(p.gpus)].all():
                return False
        return True

    def take(self, parts: Sequence[Part], members: int = 1, gpus: bool = True) -> None:
        """Charge ``parts`` (CPU/memory once per member; GPUs unless ``gpus`` is False)."""
        for p in parts:
            if gpus:
                idx = list(p.gpus)
                if not self.gpu_free[idx].all():
                    raise AssertionError(f"GPU in {p.gpus} is not free")
                self.gpu_free[idx] = False
                self.node_gpus[p.node] -= len(idx)
            self.node_cpus[p.node] -= p.cpus * members
            self.node_mem[p.node] -= p.mem_mb * members

    def release(self, parts: Sequence[Part], members: int = 1, gpus: bool = True) -> None:
        for p in parts:
            if gpus:
                idx = list(p.gpus)
                self.gpu_free[idx] = True
                self.node_gpus[p.node] += len(idx)
            self.node_cpus[p.node] += p.cpus * members
            self.node_mem[p.node] += p.mem_mb * members
