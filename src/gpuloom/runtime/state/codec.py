"""How the service stores allocations and processes (JSON in the store's ``jobs`` rows).

An allocation is stored with node *names* (not indices) and global GPU ids,
node-local GPU indices, core counts and concrete core ids, memory, and its
co-runners (``group``); :func:`alloc_from_json` checks it against the cluster,
so a store written for another inventory fails loudly at recovery.  It reads
GPUs back by node name and node-local index, so an inventory that changed
around a node (Ray nodes joining and leaving, :mod:`..service.inventory`) still finds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.cluster import Cluster
from ...core.plan import Allocation, Part
from ..exec.executor import ProcInfo


def alloc_to_json(alloc: Allocation, cluster: Cluster, cores: Mapping[str, Sequence[int]] | None = None) -> dict:
    parts = []
    for p in alloc.parts:
        name = cluster.nodes[p.node].name
        parts.append(
            {
                "node": name,
                "gpus": list(p.gpus),
                "local_gpus": [cluster.local_index(g) for g in p.gpus],
                "cpus": p.cpus,
                "mem_mb": p.mem_mb,
                "cores": list((cores or {}).get(name, ())),
            }
        )
    return {"parts": parts, "group": list(alloc.group)}


def alloc_from_json(job_id: str, d: Mapping[str, Any], cluster: Cluster) -> Allocation:
    """Inverse of :func:`alloc_to_json`; ``KeyError``/``ValueError`` if the cluster no longer matches."""
    parts = []
    for p in d["parts"]:
        node = cluster.node_index(p["node"])
        if "local_gpus" in p:  # by node-local index: the node may have another place in a rebuilt inventory
            n = cluster.nodes[node].gpus
            bad = [g for g in p["local_gpus"] if not 0 <= int(g) < n]
            if bad:
                raise ValueError(f"GPU index(es) {bad} not on node {p['node']} ({n} GPUs)")
            gpus = tuple(int(cluster.gpu_offset[node]) + int(g) for g in p["local_gpus"])
        else:
            gpus = tuple(int(g) for g in p["gpus"])
        for g in gpus:
            if g not in cluster.node_gpus(node):
                raise ValueError(f"GPU {g} is not on node {p['node']}")
        parts.append(Part(node, gpus, int(p["cpus"]), int(p["mem_mb"])))
    return Allocation(job_id, tuple(parts), tuple(str(x) for x in d.get("group", ())))


def proc_to_json(p: ProcInfo, cores: Sequence[int]) -> dict[str, Any]:
    """A launched process as stored: every :class:`ProcInfo` field plus its core ids."""
    return {**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, "cores": list(cores)}


def proc_from_json(d: Mapping[str, Any]) -> ProcInfo:
    names = {f.name for f in dataclasses.fields(ProcInfo)}
    return ProcInfo(**{k: v for k, v in d.items() if k in names})
