"""An inventory that changes while the service runs: nodes that join and leave (a Ray cluster).

The driver, the throughput model and the core allocator are built for one
:class:`~gpuloom.core.cluster.Cluster`, and a ``Cluster`` is fixed.  A service
given an :class:`~..exec.executor.InventorySource` (``gpuloom serve --ray``) asks it on every
tick of its loop; when it reports a change, the service **rebuilds** its
in-memory state for the new cluster exactly as a restarted service does
(:func:`rebuild`): the store is the truth, so the new driver, model, mirror and
actuator are made from it and :mod:`.recovery` runs again.  That gives node
changes the restart's guarantees, with no second code path:

* a job whose processes all live on nodes still there is adopted and keeps
  running (its stored allocation is read back by node name and node-local GPU
  index, so nodes keep their GPUs wherever they sit in the new cluster);
* a job with a process on a lost node is requeued to resume from its
  checkpoint, and its parts on other nodes are stopped first: a job spanning
  nodes loses all its parts together.  It waits ``fence_s`` (the grace period
  plus a second) before it may run again: if the lost node still runs at all,
  its fence (:mod:`..exec.ray_agent`) has stopped the old processes by then, so no
  job runs twice;
* queued jobs stay queued; a job the smaller cluster cannot hold is not failed
  (as it is against a fixed inventory) but *parked*: kept out of the plan with
  the pending reason ``Nodes: ...`` until the inventory changes again;
* new nodes simply appear in the next plan;
* a queue tree whose guarantees the smaller cluster cannot hold is scheduled
  with them scaled down (:meth:`.queues.QueueAdmin.refit`), not refused: the
  stored tree is kept and used whole again once the nodes are back.

A rebuild costs what a restart's recovery costs (a read of the active jobs);
it runs only when nodes join or leave.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Protocol

from ...core.lifecycle import JobState
from ..exec.executor import InventoryChange
from .recovery import Recoverable, recover
from .states import HOLDING, QUEUED_STATES

if TYPE_CHECKING:
    from ...core.cluster import Cluster
    from ..exec.executor import InventorySource
    from .queues import QueueAdmin

log = logging.getLogger("gpuloom.service")


class Rebuildable(Recoverable, Protocol):
    """What following the inventory uses of the service: what recovery does, and the rebuild itself."""

    parked: dict[int, float]  # job id -> service time from which it may be planned again

    @property
    def inventory(self) -> InventorySource | None: ...
    @property
    def queues(self) -> QueueAdmin: ...
    def reap(self) -> bool: ...
    def assemble(self, cluster: Cluster) -> None: ...


def follow(svc: Rebuildable) -> bool:
    """Ask the service's inventory source for a change and rebuild for it; True if it changed, or
    if a parked job's wait is over (a round admits it)."""
    src = svc.inventory
    if src is None:
        return False
    now = svc.now()
    due = any(t <= now for t in svc.parked.values())
    try:
        change = src.poll()
    except Exception:  # a source that cannot answer now keeps the inventory as it is
        log.exception("inventory: cannot read the cluster")
        return due
    if change is None:
        return due
    rebuild(svc, change)
    return True


def rebuild(svc: Rebuildable, change: InventoryChange) -> None:
    """Rebuild the service's state for ``change.cluster`` (see the module notes)."""
    with svc.lock:
        svc.reap()  # exits already reported belong to the old state
        now = svc.now()
        lost_jobs = set()
        for row in svc.store.list_jobs(HOLDING):
            nodes = {p.get("node") for p in row.procs or []} | {p.get("node") for p in (row.alloc or {}).get("parts", [])}
            if nodes & change.lost:
                lost_jobs.add(row.id)
        # parked until the inventory changes: looked at again now; jobs of lost nodes wait for their fence
        svc.parked = {j: t for j, t in svc.parked.items() if not math.isinf(t)}
        for j in lost_jobs:
            svc.parked[j] = now + change.fence_s
        old = svc.cluster
        svc.assemble(change.cluster)
        svc.queues.refit()  # guarantees the cluster is now short of: scaled down until nodes come back
        recover(svc)
        log.info("inventory: %d -> %d nodes (%d GPUs); lost %s; %d job(s) requeued from lost nodes, %d parked",
                 old.num_nodes, change.cluster.num_nodes, change.cluster.num_gpus, sorted(change.lost) or "none",
                 len(lost_jobs), len(svc.parked))
        for j in lost_jobs:
            svc.mirror.event(str(j), "node-lost", {"nodes": sorted(change.lost), "wait_s": change.fence_s})


def unpark(svc: Rebuildable) -> None:
    """Admit parked jobs whose time has come (and that fit now)."""
    if not svc.parked:
        return
    now = svc.now()
    due = [j for j, t in svc.parked.items() if t <= now]
    for j in due:
        del svc.parked[j]
    for _, row in sorted(svc.store.get_jobs(due).items()):
        if row.state in QUEUED_STATES and svc.fits_or_fail(row):
            svc.admit_row(row, JobState(row.state))
