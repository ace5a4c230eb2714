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

from ..core.plan import Plan
from ..core.queues import DecayedUsage, QueueTree
from .base import View, register
from .queues import QuotaQueues


@register("queue", "drf")
class DRFQueues(QuotaQueues):
    """Guarantees first, then weighted DRF between queues (progressive filling down the tree)."""

    #: the cluster, tree and tree version the per-queue factors below were worked out for, and the factors
    _inv: tuple[Any, Any, int, list[tuple[float, ...]]] | None = None
    _factors: list[tuple[float, ...]] | None = None  # the last share_key's, when the tree has one level

    def drf_factors(self) -> list[tuple[float, ...]] | None:
        return self._factors

    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any]:
        cl = view.cluster
        kept = self._inv
        if kept is not None and kept[0] is cl and kept[1] is tree and kept[2] == self.version:
            inv = kept[3]
        else:
            caps = (float(cl.num_gpus) or 1.0, float(cl.total_cpus) or 1.0, float(cl.total_mem_mb) or 1.0)
            # dominant share / relative weight = max over resources of use * (1 / (capacity * weight))
            inv = [tuple(1.0 / (c * w) for c in caps) for w in tree.sibling_weight]
            self._inv = (cl, tree, self.version, inv)
        paths = tree.path
        if tree.one_level:  # one level: the leaf's own share (ordered as the 1-tuples would be)
            def share(q: int) -> float:
                u, f = use[q], inv[q]
                return max(u[0] * f[0], u[1] * f[1], u[2] * f[2])

            self._factors = inv
            return share
        self._factors = None

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
    logs_walk = True

    def __init__(self, queues: Any = None, borrow: bool | str = True, priority: bool | str = True,
                 guarantees: bool | str = True, half_life: float = 7 * 86400.0) -> None:
        super().__init__(queues, borrow, priority, guarantees)
        if not (float(half_life) > 0):
            raise ValueError(f"half_life must be > 0 seconds, got {half_life}")
        self.half_life = float(half_life)
        self.decayed: DecayedUsage | None = None
        self._names: list[str] = []
        self._held: list[float] = []
        self._names_of: QueueTree | None = None  # the tree whose names are _names
        #: (the time usage last decayed to, until when the last settled round's walk chooses the same then)
        self._kept: tuple[float, float] | None = None
        #: the last share_key's terms, when the tree has one level (share_terms)
        self._terms: tuple[Sequence[float], float, Sequence[float]] | None = None

    def _tree_ready(self, tree: QueueTree, view: View) -> None:
        # (a tree's queues are a tuple of frozen queues: its names are those seen when it was last checked)
        if self._names_of is not tree and (self.decayed is None or self._names != tree.names):
            old = dict(zip(self._names, self.decayed.values, strict=True)) if self.decayed is not None else {}
            last = self.decayed.last if self.decayed is not None else None
            self.decayed = DecayedUsage(len(tree), self.half_life)
            self.decayed.values = [old.get(n, 0.0) for n in tree.names]
            self.decayed.last = last
            self._held = [0.0] * len(tree)
            self._names = tree.names
        self._names_of = tree
        # what the last round's plan gave each queue, held until now (a job that finished since counts
        # until now: exact when rounds follow completions)
        assert self.decayed is not None
        self.decayed.advance(view.now, self._held)

    def enforce(self, plan: Plan, view: View) -> Plan:
        plan = super().enforce(plan, view)
        tree = self.tree
        if tree is not None and (tree is self._names_of or self._names == tree.names):
            # (from the book's sums and the plan's changes when it can, the GPUs alone: the same sums as usage_of's)
            held = self._gpus_from_book(plan, view) if self.incremental else None
            self._held = held if held is not None else [h[0] for h in self.usage_of(plan, view)]
        return plan

    def share_key(self, tree: QueueTree, use: list[list[float]], view: View) -> Callable[[int], Any]:
        assert self.decayed is not None
        tau = self.half_life / math.log(2)
        past = self.decayed.values
        rel = tree.sibling_weight
        paths = tree.path

        if tree.one_level:  # one level: the leaf's own (ordered as the 1-tuples would be)
            def share(q: int) -> float:
                return (past[q] + use[q][0] * tau) / rel[q]

            self._terms = (past, tau, rel)  # (share's, for the walk to work it out inline: share_terms)
            return share
        self._terms = None

        def key(q: int) -> tuple[float, ...]:
            return tuple([(past[n] + use[n][0] * tau) / rel[n] for n in paths[q]])

        return key

    def share_terms(self) -> tuple[Sequence[float], float, Sequence[float]] | None:
        return self._terms

    def next_change(self, view: View) -> float:
        """When the borrowing walk of the last round could first choose another queue, as usage decays.

        After a round that changed nothing, every queue holds what it held (``_held``), so its decayed usage
        moves as ``U(t) = h·τ + (U(now) - h·τ)·k``, ``k = 2^(-(t - now)/half_life)``, and its key at the use
        ``u`` it had when the walk compared it, ``(U(t) + u·τ)/w``, is linear in ``k``.  The walk is the same
        while, at every step, the queue it chose keeps a key below every other queue then still walking: for
        each such pair the difference ``D(k) = A + B·k`` is worked out from the walk's log and the first ``k``
        at which it comes within rounding of zero is the pair's change.  Guaranteed tiers do not depend on
        time; placement and reclaim read only the walk.  A queue tree of more than one level, a near tie, or
        a starved or owed queue: the next round."""
        return self._change_after(view.now)

    def settled(self, done: bool) -> None:
        super().settled(done)
        self._kept = None

    def walk_kept(self, now: float) -> bool:
        """Up to the last settled round's next change (:meth:`next_change`'s analysis of its walk, from
        the usage of the last round, settled or keeping its plan) that walk chooses the same as usage
        decays, and its GPUs are still held (only jobs arrived since).  Worked out when asked, once per
        time usage decayed to."""
        d = self.decayed
        if not self._settled or d is None or d.last is None:
            return False
        kept = self._kept
        if kept is None or kept[0] != d.last:
            kept = self._kept = (d.last, self._change_after(d.last))
        return now < kept[1]

    def _change_after(self, now: float) -> float:
        """:meth:`next_change` for a round at ``now`` (the time usage last decayed to)."""
        tree, decayed, log = self.tree, self.decayed, self._last.log
        if self._starved or self._owed_before or tree is None or decayed is None or decayed.last != now:
            return now
        if log is None:  # strict quotas walk no borrowing tier: usage orders nothing
            return now if self.borrow else math.inf
        if any(len(p) != 1 for p in tree.path) or len(self._held) != len(tree):
            return now
        steps, start, heads = log
        if not steps:
            return math.inf
        tau = self.half_life / math.log(2)
        past, held, rel = decayed.values, self._held, tree.sibling_weight
        last: dict[int, int] = {}
        for s, (q, _) in enumerate(steps):
            last[q] = s
        use = list(start)
        # each queue's key at use u is (A + B·k) with A = τ(h + u)/w (it moves only when the queue's own job is
        # taken) and B = (U(now) - h·τ)/w (fixed), worked out once per queue, not once per pair and step
        A = [tau * (held[q] + use[q]) / rel[q] for q in range(len(use))]
        B = [(past[q] - held[q] * tau) / rel[q] for q in range(len(use))]
        absA, absB = [abs(x) for x in A], [abs(x) for x in B]
        # the queues a step's choice is compared with: those that had jobs left when the walk last stopped, and
        # those chosen at a later step (a set: the pairs' verdicts do not depend on their order)
        alive = {q for q in tree.leaves if heads[q] is not None}
        others = alive | last.keys()
        best = 0.0  # the largest k (the earliest time) at which a step could go otherwise
        for s, (c, d) in enumerate(steps):
            ac, bc, aac, abc = A[c], B[c], absA[c], absB[c]
            for o in others:
                if o == c:
                    continue
                ao, bo = A[o], B[o]
                a, b = ao - ac, bo - bc
                noise = 1e-9 * (absA[o] + aac + absB[o] + abc + 1.0)
                if a + b <= noise:
                    if past[o] == past[c] and held[o] == held[c] and use[o] == use[c] and rel[o] == rel[c]:
                        continue  # equal keys at every time: the tie is broken by rank, the same way
                    return now  # (a near tie: rounding could decide it either way)
                if a < noise:
                    x = (noise - a) / b
                    if x > best:
                        best = x
            if d is not None:
                use[c] += d[0]
                A[c] = x = tau * (held[c] + use[c]) / rel[c]
                absA[c] = abs(x)
            if last[c] == s and c not in alive:
                others.discard(c)  # (chosen at no later step)
        if best <= 0.0:
            return math.inf
        return now - self.half_life * math.log2(best) * (1.0 - 1e-9)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.decayed is not None:
            out["decayed_gpu_s"] = dict(zip(self._names, self.decayed.values, strict=True))
        return out
