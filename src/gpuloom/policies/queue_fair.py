"""The fair-share queue stages: weighted DRF and Slurm's fair share (see :mod:`.queues`).

Both admit the guarantees first, as ``quota`` does, and differ only in the
order in which they hand out what no guarantee claims: the queue (level by
level down the tree) with the lowest key next, by progressive filling.

* ``drf``: key = dominant share (max over GPUs, cores, memory of planned use /
  cluster total) divided by the queue's weight among its siblings;
* ``fairshare``: key = (decayed GPU usage + planned GPUs × h/ln 2) divided by
  the weight among siblings.  Decayed usage halves every ``half_life``
  (:class:`~gpuloom.core.queues.DecayedUsage`); the GPUs a queue was given by
  the last round's plan count as held until this round (exact when rounds
  follow completions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core.job import Job
from ..core.plan import Plan
from ..core.queues import DecayedUsage, QueueTree, usage
from .base import View, register
from .queue_base import Admission
from .queues import QuotaQueues


@register("queue", "drf")
class DRFQueues(QuotaQueues):
    """Guarantees first, then weighted DRF between queues (progressive filling down the tree)."""

    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any]:
        cl = view.cluster
        caps = (float(cl.num_gpus) or 1.0, float(cl.total_cpus) or 1.0, float(cl.total_mem_mb) or 1.0)
        # dominant share / relative weight = max over resources of use * (1 / (capacity * weight))
        inv = [tuple(1.0 / (c * w) for c in caps) for w in tree.sibling_weight]
        paths = tree.path
        if all(len(p) == 1 for p in paths):  # one level: the leaf's own share (ordered as the 1-tuples would be)
            def share(q: int) -> float:
                u, f = use[q], inv[q]
                return max(u[0] * f[0], u[1] * f[1], u[2] * f[2])

            return share

        def key(q: int) -> tuple[float, ...]:
            out = []
            for n in paths[q]:
                u, f = use[n], inv[n]
                out.append(max(u[0] * f[0], u[1] * f[1], u[2] * f[2]))
            return tuple(out)

        return key


@register("queue", "fairshare", "fair-share")
class FairShareQueues(QuotaQueues):
    """Guarantees first, then Slurm's fair share on decayed GPU usage (see the module notes)."""

    dynamic = True  # usage decays with time

    def __init__(self, queues: Any = None, borrow: bool | str = True, priority: bool | str = True,
                 guarantees: bool | str = True, half_life: float = 7 * 86400.0) -> None:
        super().__init__(queues, borrow, priority, guarantees)
        if not (float(half_life) > 0):
            raise ValueError(f"half_life must be > 0 seconds, got {half_life}")
        self.half_life = float(half_life)
        self.decayed: DecayedUsage | None = None
        self._names: list[str] = []
        self._held: list[float] = []

    def admit(self, ordered: Sequence[Job], view: View, strict: bool = False, full: bool = False,
              lazy: bool = False) -> Admission:
        tree = self._tree(ordered, view)
        if self.decayed is None or self._names != tree.names:
            old = dict(zip(self._names, self.decayed.values, strict=True)) if self.decayed is not None else {}
            last = self.decayed.last if self.decayed is not None else None
            self.decayed = DecayedUsage(len(tree), self.half_life)
            self.decayed.values = [old.get(n, 0.0) for n in tree.names]
            self.decayed.last = last
            self._held = [0.0] * len(tree)
            self._names = tree.names
        # what the last round's plan gave each queue, held until now (a job that finished since counts
        # until now: exact when rounds follow completions)
        self.decayed.advance(view.now, self._held)
        return super().admit(ordered, view, strict, full, lazy)

    def enforce(self, plan: Plan, view: View) -> Plan:
        plan = super().enforce(plan, view)
        tree = self.tree
        if tree is not None and self._names == tree.names:
            allocs = plan.allocations
            held = usage(tree, allocs, {j.id: self.leaf(j) for j in view.jobs if j.id in allocs})
            self._held = [h[0] for h in held]
        return plan

    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any]:
        assert self.decayed is not None
        tau = self.half_life / math.log(2)
        past = self.decayed.values
        rel = tree.sibling_weight
        paths = tree.path

        if all(len(p) == 1 for p in paths):  # one level: the leaf's own (ordered as the 1-tuples would be)
            def share(q: int) -> float:
                return (past[q] + use[q][0] * tau) / rel[q]

            return share

        def key(q: int) -> tuple[float, ...]:
            return tuple([(past[n] + use[n][0] * tau) / rel[n] for n in paths[q]])

        return key

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.decayed is not None:
            out["decayed_gpu_s"] = dict(zip(self._names, self.decayed.values, strict=True))
        return out
