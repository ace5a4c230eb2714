"""Topology-aware GPU choice inside a node (Hadoop YARN-8821): ``topo-pack`` and ``topo-spread``.

The node topologies come from the throughput model's ``topology`` factor
(:class:`~gpuloom.perf.topology.TopologyFactor`, added with
:func:`~gpuloom.perf.topology.add_topology`), so the costs that place a job
are the costs that slow it down.  ``topo-pack`` and ``topo-spread`` are one
policy with two defaults; a job overrides it with
``JobSpec.attrs["topology"] = "pack" | "spread"`` (YARN reads the container's
``NVIDIA_TOPO_POLICY`` variable the same way).

A job that fits on one node is placed on the node whose chosen set is the
cheapest (PACK) or the most expensive (SPREAD); ties go to the node with the
fewest free GPUs (best fit), then the lower node index.  Inside the node the
set comes from :meth:`~gpuloom.perf.topology.Topology.choose`, with YARN's
fallbacks (one GPU, all free GPUs, fewer than three free: the first free
ones).  Nodes without a known topology rank after those with one.  A job
no single node can take is placed like ``packed`` (fewest nodes):
topology inside a node does not decide anything there.  Sticky, like YARN
(a container keeps its devices).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..core.plan import Part
from ..perf.topology import PACK, SPREAD, TopologyFactor
from .base import FreeState, PlacePolicy, PolicyError, Request, View, need_on, register, split_parts
from .place import packed_choice


@register("place", "topo-pack", "topo")
class TopologyPlace(PlacePolicy):
    sticky = True
    mode: ClassVar[str] = PACK
    requires_factors = {"topology": None}  # node topologies have no default: --topology FILE

    def _factor(self, view: View) -> TopologyFactor:
        f = view.model.get("topology")
        if not isinstance(f, TopologyFactor):
            raise PolicyError(
                f"place policy {self.name!r} needs node topologies: add a topology factor to the throughput model "
                "(gpuloom.perf.topology.add_topology)"
            )
        return f

    def job_mode(self, req: Request) -> str:
        attrs = req.job.spec.attrs
        m = attrs.get("topology", self.mode) if attrs else self.mode
        m = str(m).lower()
        if m not in (PACK, SPREAD):
            raise PolicyError(f"job {req.job.id}: topology must be 'pack' or 'spread', got {m!r}")
        return m

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        f = self._factor(view)
        mode = self.job_mode(req)
        k = req.gpus
        cl = free.cluster
        cand = np.flatnonzero(free.node_gpus >= k)
        best: tuple[float, int, int] | None = None
        best_ids: list[int] = []
        sign = 1.0 if mode == PACK else -1.0
        for node in cand.tolist():
            c, m = need_on(cl, req, node, k)
            if free.cpu_counts[node] < c or free.mem_counts[node] < m:
                continue
            ids = free.free_on(node)
            off = int(cl.gpu_offset[node])
            topo = f.per_node[node]
            if topo is None:
                local: tuple[int, ...] = tuple(g - off for g in ids[:k])
                key = (np.inf, len(ids), node)
            else:
                got = topo.choose([g - off for g in ids], k, mode)
                if got is None:
                    continue
                local = got
                key = (sign * topo.set_cost(local), len(ids), node)
            if best is None or key < best:
                best, best_ids = key, [g + off for g in local]
        if best is not None:
            node = best[2]
            parts = split_parts(cl, req, {node: best_ids})
            if free.fits(parts, len(req.jobs)):
                return parts
        return packed_choice(req, free, view)


@register("place", "topo-spread")
class TopologySpread(TopologyPlace):
    mode = SPREAD
