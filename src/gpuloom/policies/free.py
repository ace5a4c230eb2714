"""Free GPUs, cores and memory per node while a plan is being built: :class:`FreeState`.

The driver keeps one up to date with the running allocations (``View.free``);
placement starts from a copy and changes only what moves.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..core.cluster import Cluster
from ..core.plan import Allocation, Part


class FreeState:
    """Free GPUs, cores and memory while a plan is being built.

    The simulator keeps one up to date with the running allocations
    (``View.free``); sticky placement starts from a copy of it and releases
    only what changes, so a round costs O(changes), not O(running jobs).

    The state lives in plain Python buffers, read and written one GPU and one
    node at a time by :meth:`fits`, :meth:`take` and :meth:`release` (several
    times faster than numpy on a few elements): ``gpu_counts`` holds the free
    GPUs per node in a ``bytearray`` (an ``array`` if a node has more than 255
    GPUs), whose ``in`` and ``index`` find the nodes with a given number of
    free GPUs at C speed (:func:`~gpuloom.policies.place.best_fit`);
    ``cpu_counts`` and ``mem_counts`` are lists of ints (not ``array("q")``,
    which converts every int it stores; docs/performance.md).  Sizers that
    move cores (Synergy's demotions) write ``cpu_counts`` and ``mem_counts``.

    For whole-cluster questions, ``gpu_free`` is a numpy view of the free
    flags (live: it sees every change; made on first use), and ``node_gpus``,
    ``node_cpus`` and ``node_mem`` are numpy *copies* of the counts made at
    each call: read them once per question, never write them.
    """

    __slots__ = ("cluster", "free_gpus", "gpu_counts", "cpu_counts", "mem_counts", "_gf", "_off", "_view", "outside")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        sizes = [n.gpus for n in cluster.nodes]
        self._set(bytearray(b"\x01" * cluster.num_gpus), [n.cpus for n in cluster.nodes],
                  [n.mem_mb for n in cluster.nodes], bytearray(sizes) if max(sizes, default=0) < 256 else array("q", sizes))
        self._off: list[int] = cluster.gpu_offset.tolist()
        self.free_gpus: int = cluster.num_gpus  #: free GPUs in all (``node_gpus.sum()``, kept as it changes)
        #: the parts of work outside the plan taken in (:meth:`take_held`; () if none)
        self.outside: Sequence[Part] = ()

    def _set(self, gf: bytearray, nc: list[int], nm: list[int], counts: bytearray | array) -> None:
        self._gf = gf
        self.gpu_counts, self.cpu_counts, self.mem_counts = counts, nc, nm
        self._view: np.ndarray | None = None

    @property
    def gpu_free(self) -> np.ndarray:
        """Whether each GPU is free (bool, by global GPU id)."""
        v = self._view
        if v is None:
            v = self._view = np.frombuffer(self._gf, dtype=bool)
        return v

    @property
    def node_gpus(self) -> np.ndarray:
        """Free GPUs per node (int64; a copy of ``gpu_counts``)."""
        return np.array(self.gpu_counts, dtype=np.int64)

    @property
    def node_cpus(self) -> np.ndarray:
        """Free cores per node (int64; a copy of ``cpu_counts``)."""
        return np.array(self.cpu_counts, dtype=np.int64)

    @property
    def node_mem(self) -> np.ndarray:
        """Free memory per node in MB (int64; a copy of ``mem_counts``)."""
        return np.array(self.mem_counts, dtype=np.int64)

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
        new._set(bytearray(self._gf), self.cpu_counts[:], self.mem_counts[:], self.gpu_counts[:])
        new._off = self._off
        new.free_gpus = self.free_gpus
        new.outside = self.outside
        return new

    def reset(self, other: FreeState) -> None:
        """Become a copy of ``other`` (of the same cluster) in place: the buffers are overwritten, so
        a ``gpu_free`` view already made stays valid."""
        self._gf[:] = other._gf
        self.cpu_counts[:] = other.cpu_counts
        self.mem_counts[:] = other.mem_counts
        self.gpu_counts[:] = other.gpu_counts  # type: ignore[assignment]  # (both of one type: one cluster)
        self.free_gpus = other.free_gpus
        self.outside = other.outside

    def masked(self, node_ok: np.ndarray, gpu_ok: np.ndarray) -> _Masked:
        """A context in which only the nodes ``node_ok`` marks (0/1 per node; ``gpu_ok`` the same per GPU)
        show free GPUs: the others look full (their cores and memory are left as they are).  Only read
        the state inside it: leaving it restores the buffers as they were on entry."""
        return _Masked(self, node_ok, gpu_ok)

    def holding(self, held: Sequence[Part]) -> _Holding:
        """A context in which what ``held`` holds (work outside the plan: its GPUs where free, its cores
        and memory up to what is left) looks taken.  Only read the state inside it: leaving it restores
        the buffers as they were on entry."""
        return _Holding(self, held)

    def take_held(self, held: Sequence[Part]) -> None:
        """Take what is free of ``held`` (work outside the plan): its GPUs that are free, its cores and
        memory up to what is left (never below zero).  Each once: ``outside`` remembers them."""
        if held is self.outside:
            return
        gf = self._gf
        for p in held:
            ids = [g for g in p.gpus if gf[g]]
            for g in ids:
                gf[g] = 0
            self.gpu_counts[p.node] -= len(ids)
            self.free_gpus -= len(ids)
            self.cpu_counts[p.node] -= min(max(p.cpus, 0), max(self.cpu_counts[p.node], 0))
            self.mem_counts[p.node] -= min(max(p.mem_mb, 0), max(self.mem_counts[p.node], 0))
        self.outside = held

    def free_on(self, node: int) -> list[int]:
        gf = self._gf
        return [g for g in range(self._off[node], self._off[node + 1]) if gf[g]]

    def first_free(self, node: int) -> int:
        """The first free GPU on ``node`` (``free_on(node)[0]``; ValueError if none is)."""
        off = self._off
        return self._gf.index(1, off[node], off[node + 1])

    def fits(self, parts: Sequence[Part], members: int = 1) -> bool:
        gf, nc, nm = self._gf, self.cpu_counts, self.mem_counts
        for p in parts:
            if p.cpus * members > nc[p.node] or p.mem_mb * members > nm[p.node]:
                return False
            for g in p.gpus:
                if not gf[g]:
                    return False
        return True

    def take_if_fits(self, parts: Sequence[Part]) -> bool:
        """:meth:`take` ``parts`` (one member) if they :meth:`fit <fits>`; whether they did.

        (:meth:`fits` and :meth:`take_back` with one reading of the buffers: after a long queue's
        round has placed something, it keeps the released running jobs it passes this way.)
        """
        gf, nc, nm = self._gf, self.cpu_counts, self.mem_counts
        for p in parts:
            node = p.node
            if p.cpus > nc[node] or p.mem_mb > nm[node]:
                return False
            for g in p.gpus:
                if not gf[g]:
                    return False
        self.free_gpus -= self.take_back((parts,))
        return True

    def take_back(self, held: Sequence[Sequence[Part]]) -> int:
        """:meth:`take` each ``parts`` of ``held`` (one member each, GPUs included), unchecked, and
        return the GPUs taken, leaving ``free_gpus`` to the caller: it knows they fit (running
        allocations released this round, taken back before anything else was taken: they ran side
        by side, so any of them fit together on what they left; or :meth:`take_if_fits`' own).

        (:func:`~gpuloom.policies.incremental.prefix_plan` defers such keeps and takes them back
        in one call before its next placement try, with ``free_gpus`` already counted.)
        """
        gf, nc, nm = self._gf, self.cpu_counts, self.mem_counts
        counts = self.gpu_counts
        taken = 0
        for parts in held:
            for p in parts:
                node = p.node
                ids = p.gpus
                for g in ids:
                    gf[g] = 0
                n = len(ids)
                counts[node] -= n
                taken += n
                nc[node] -= p.cpus
                nm[node] -= p.mem_mb
        return taken

    def release_all(self, allocs: Iterable[Allocation]) -> None:
        """:meth:`release` every allocation of ``allocs`` (one member each, GPUs included): one call, not
        one per job, for the running jobs a long queue's round leaves out."""
        gf, nc, nm = self._gf, self.cpu_counts, self.mem_counts
        counts = self.gpu_counts
        freed = 0
        for a in allocs:
            for p in a.parts:
                node = p.node
                ids = p.gpus
                for g in ids:
                    gf[g] = 1
                n = len(ids)
                counts[node] += n
                freed += n
                nc[node] += p.cpus
                nm[node] += p.mem_mb
        self.free_gpus += freed

    def take(self, parts: Sequence[Part], members: int = 1, gpus: bool = True) -> None:
        """Charge ``parts`` (CPU/memory once per member; GPUs unless ``gpus`` is False)."""
        gf = self._gf
        for p in parts:
            node = p.node
            if gpus:
                ids = p.gpus
                for g in ids:
                    if not gf[g]:
                        raise AssertionError(f"GPU in {ids} is not free")
                for g in ids:
                    gf[g] = 0
                self.gpu_counts[node] -= len(ids)
                self.free_gpus -= len(ids)
            self.cpu_counts[node] -= p.cpus * members
            self.mem_counts[node] -= p.mem_mb * members

    def release(self, parts: Sequence[Part], members: int = 1, gpus: bool = True) -> None:
        gf = self._gf
        for p in parts:
            node = p.node
            if gpus:
                ids = p.gpus
                for g in ids:
                    gf[g] = 1
                self.gpu_counts[node] += len(ids)
                self.free_gpus += len(ids)
            self.cpu_counts[node] += p.cpus * members
            self.mem_counts[node] += p.mem_mb * members


class _Masked:
    """:meth:`FreeState.masked`: copies of the GPU buffers on entry, the masks applied in place (numpy
    over the buffers: a few microseconds for thousands of GPUs), the copies written back on exit."""

    __slots__ = ("free", "node_ok", "gpu_ok", "saved")

    def __init__(self, free: FreeState, node_ok: np.ndarray, gpu_ok: np.ndarray) -> None:
        self.free, self.node_ok, self.gpu_ok = free, node_ok, gpu_ok
        self.saved: tuple[bytearray, bytearray | array, int] | None = None

    def __enter__(self) -> FreeState:
        f = self.free
        counts = f.gpu_counts
        self.saved = (f._gf[:], counts[:], f.free_gpus)
        gf = np.frombuffer(f._gf, dtype=np.uint8)
        gf &= self.gpu_ok
        if isinstance(counts, bytearray):
            c = np.frombuffer(counts, dtype=np.uint8)
        else:
            c = np.frombuffer(counts, dtype=np.int64)
        c *= self.node_ok
        f.free_gpus = int(c.sum())
        return f

    def __exit__(self, *exc: object) -> None:
        f = self.free
        assert self.saved is not None
        gf, counts, free = self.saved
        f._gf[:] = gf
        f.gpu_counts[:] = counts  # type: ignore[assignment]  # (a copy of this very buffer)
        f.free_gpus = free


class _Holding:
    """:meth:`FreeState.holding`: copies of the buffers on entry, ``held`` taken, the copies written back on exit."""

    __slots__ = ("free", "held", "saved")

    def __init__(self, free: FreeState, held: Sequence[Part]) -> None:
        self.free, self.held = free, held
        self.saved: tuple[bytearray, bytearray | array, list[int], list[int], int, Sequence[Part]] | None = None

    def __enter__(self) -> FreeState:
        f = self.free
        self.saved = (f._gf[:], f.gpu_counts[:], f.cpu_counts[:], f.mem_counts[:], f.free_gpus, f.outside)
        f.take_held(self.held)
        return f

    def __exit__(self, *exc: object) -> None:
        f = self.free
        assert self.saved is not None
        gf, counts, cpus, mem, free, f.outside = self.saved
        f._gf[:] = gf
        f.gpu_counts[:] = counts  # type: ignore[assignment]  # (a copy of this very buffer)
        f.cpu_counts[:] = cpus
        f.mem_counts[:] = mem
        f.free_gpus = free
