"""Storage bandwidth (Synergy): a job's data-loading demand against its node's disk bandwidth.

Synergy's profiles (``model_sensitivity_profiles.csv``) carry, per model, a
``speed`` column: the storage bandwidth (MB/s per GPU) the job reads at its
best-case CPU and memory (``jobs/model.py``: ``sspeed_per_gpu``; e.g. alexnet
125, m5 187.5, bert/gnmt/lstm 20).  Synergy's servers have 500 MB/s each
(``configs/*.ini``: ``sspeed_per_server``).  Synergy's own simulator tracks this
demand but never enforces it (``resources/server.py``: "no strict allocation
restriction on storage speed").

:class:`StorageFactor` (factor ``"storage"``) enforces it where a node's
bandwidth is given (``-P storage_mbps=500``): a job gets its GPU-proportional
share of each node's bandwidth and, if that is less than its demand, runs at
share / demand (a data-loading bound, the slowest part sets the pace).  Off by
default, as in Synergy: the measured throughput matrices were taken on
Synergy's servers and already include their storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..core.cluster import Cluster
from ..core.job import Job
from ..core.parse import normalise_model
from ..core.plan import Allocation
from .synergy_profiles import SensitivityError, read_profile_rows


def load_storage_demands(path: str | Path) -> dict[tuple[str, int], float]:
    """``(model, gpus) -> MB/s per GPU`` from the ``speed`` column of Synergy's profile file
    (read by :func:`~gpuloom.perf.synergy_profiles.read_profile_rows`, the one parser of that file)."""
    rows = read_profile_rows(path)
    if all(r.storage_mbps is None for r in rows):
        raise SensitivityError(f"{Path(path).name}: needs a speed column (storage MB/s per GPU)")
    return {(normalise_model(r.model), r.gpus): r.storage_mbps for r in rows if r.storage_mbps is not None}


class StorageFactor:
    """Speed bound by the node's storage bandwidth (see the module docstring)."""

    name = "storage"

    def __init__(self, demands: Mapping[tuple[str, int], float], cluster: Cluster, node_mbps: float) -> None:
        if not node_mbps > 0:
            raise ValueError(f"storage bandwidth must be > 0 MB/s, got {node_mbps}")
        self.demands = {(normalise_model(m), g): float(v) for (m, g), v in demands.items()}
        self.cluster = cluster
        self.node_mbps = float(node_mbps)

    def demand_per_gpu(self, job: Job) -> float | None:
        m = normalise_model(job.spec.model)
        for g in range(job.spec.gpus, 0, -1):
            d = self.demands.get((m, g))
            if d is not None:
                return d
        return None

    def __call__(self, job: Job, alloc: Allocation) -> float:
        d = self.demand_per_gpu(job)
        if not d:
            return 1.0
        worst = 1.0
        for p in alloc.parts:
            share = self.node_mbps / max(1, self.cluster.nodes[p.node].gpus)  # per GPU
            worst = min(worst, share / d)
        return worst

