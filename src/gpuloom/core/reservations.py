"""Advance reservations (Slurm's ``scontrol create reservation``): resources kept for some users over a window.

A :class:`Reservation` holds either whole nodes (``nodes``, by name) or a number of GPUs (``gpus``, placed
by the place policy when the window comes, as a job of that size would be) from ``start`` to ``end``, for
the jobs of ``users``.  Jobs of those users may use the reserved resources; nobody else's job may hold them
inside the window (the scheduler's backfill hook, :mod:`gpuloom.policies.backfill`, keeps them off, and
stops a job of another user still holding them at ``start``).  Times are the caller's clock (simulated
seconds, or service time).  Plain data, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .cluster import Cluster

#: a reservation's name: what ``reservation delete NAME`` takes
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ReservationError(ValueError):
    """A reservation that cannot be made; the message names the reservation and the field."""


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    start: float
    end: float
    users: frozenset[str]
    nodes: tuple[str, ...] = ()  # whole nodes, by name; or
    gpus: int = 0  # a number of GPUs placed when the window comes

    def __post_init__(self) -> None:
        where = f"reservation {self.name!r}"
        if not NAME_RE.match(self.name):
            raise ReservationError(f"{where}: name must be 1-64 letters, digits, '_', '.' or '-', starting with a "
                                   "letter or digit")
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ReservationError(f"{where}: start and end must be finite times")
        if self.end <= self.start:
            raise ReservationError(f"{where}: duration must be > 0 (start {self.start:g}, end {self.end:g})")
        if not self.users or any(not u for u in self.users):
            raise ReservationError(f"{where}: users must name at least one user")
        if bool(self.nodes) == bool(self.gpus):
            raise ReservationError(f"{where}: give either nodes or gpus (a number > 0), not "
                                   + ("both" if self.nodes else "neither"))
        if self.gpus < 0:
            raise ReservationError(f"{where}: gpus must be > 0, got {self.gpus}")
        if len(set(self.nodes)) != len(self.nodes):
            raise ReservationError(f"{where}: a node is named twice in nodes")

    def check(self, cluster: Cluster) -> None:
        """Refuse what ``cluster`` cannot hold: an unknown node, more GPUs than it has."""
        names = {n.name for n in cluster.nodes}
        unknown = [n for n in self.nodes if n not in names]
        if unknown:
            raise ReservationError(f"reservation {self.name!r}: nodes: no node {unknown[0]!r} in this cluster "
                                   f"(nodes: {', '.join(sorted(names)[:8])}{', ...' if len(names) > 8 else ''})")
        if self.gpus > cluster.num_gpus:
            raise ReservationError(f"reservation {self.name!r}: gpus: {self.gpus} asked, the cluster has "
                                   f"{cluster.num_gpus}")

    def admits(self, user: str) -> bool:
        return user in self.users

    def live(self, now: float) -> bool:
        """Not over at ``now``."""
        return self.end > now


def check_overlaps(reservations: Iterable[Reservation]) -> None:
    """Refuse two reservations of the same node at overlapping times, and two of one name."""
    seen: dict[str, Reservation] = {}
    by_node: dict[str, list[Reservation]] = {}
    for r in reservations:
        if r.name in seen:
            raise ReservationError(f"reservation {r.name!r}: the name is taken")
        seen[r.name] = r
        for n in r.nodes:
            for o in by_node.get(n, []):
                if o.start < r.end and r.start < o.end:
                    raise ReservationError(f"reservation {r.name!r}: nodes: {n} is reserved by {o.name!r} "
                                           f"over an overlapping window")
            by_node.setdefault(n, []).append(r)
