"""Can a job ever run on a cluster?  A pure check, made once when a workload is loaded.

A job that no placement can ever hold would otherwise wait forever: the
simulator would keep scheduling rounds for it and the service would keep it
queued.  :func:`never_fits` answers "can this spec ever fit this (empty)
cluster?" with the reason when it cannot, using the same arithmetic as
placement, so a job it accepts is one that placement can hold on an idle
cluster, and a job it refuses is one placement can never hold.

The rules, for a job asking for ``g`` GPUs, ``c`` CPU cores and ``m`` MB
(``cpus`` / ``mem_mb`` of :class:`~gpuloom.core.job.JobSpec`; ``None`` means
the GPU-proportional share of whichever node the job lands on, which every
node with GPUs can give):

1. **GPU type.** ``attrs["gpu_type"]`` (a name, a list of acceptable names, or
   names joined by ``|``) restricts the job to nodes whose ``gpu_type`` is one of
   them, compared through :func:`~gpuloom.core.parse.normalise_gpu_type`
   (``V100`` matches a node of ``Tesla V100-SXM2-16GB``); without it every node is
   eligible.  Placement applies the same rule (:func:`spec_types`).  No eligible node: the job never fits.
2. **Totals.** ``g`` must not exceed the eligible nodes' GPUs, nor ``c`` their
   cores, nor ``m`` their memory.
3. **Per node.** A job's cores and memory are spread over its nodes in
   proportion to the GPUs it holds there, and a node holding ``k`` of its GPUs
   must give it ``ceil(c * k / g)`` cores and ``ceil(m * k / g)`` MB (as
   :func:`gpuloom.policies.base.need_on` charges it).  So node ``i`` (``G_i``
   GPUs, ``C_i`` cores, ``M_i`` MB) can hold at most
   ``k_i = min(G_i, floor(C_i * g / c), floor(M_i * g / m))`` of the job's
   GPUs, and the job fits only if ``sum(k_i) >= g``.  A 1-GPU job asking for
   100 cores therefore never fits nodes of 24 cores, however many there are.

Fractional GPU requests, co-runners (Muri groups) and elastic sizing all use
at most what rule 3 allows, so they do not make an impossible job possible.
Clusters usually have a handful of node shapes, so the check groups nodes by
shape and costs O(shapes) per job; :class:`FitChecker` also caches by request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from operator import attrgetter

from .cluster import Cluster
from .job import JobSpec, may_hold
from .parse import normalise_gpu_type

#: ``JobSpec.attrs`` key naming the GPU type(s) a job can run on.
GPU_TYPE_KEY = "gpu_type"


def _types(value: object) -> tuple[str, ...] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split("|") if t.strip()) or None
    if isinstance(value, Iterable):
        return tuple(str(t) for t in value) or None
    return (str(value),)


def spec_types(spec: JobSpec) -> tuple[str, ...] | None:
    """The GPU types ``spec`` may run on, normalised (:func:`~gpuloom.core.parse.normalise_gpu_type`),
    or ``None`` when it does not ask for one."""
    attrs = spec.attrs
    if not attrs:
        return None
    value = attrs.get(GPU_TYPE_KEY)
    if value is None:
        return None
    return _normalised(value) if isinstance(value, str) else _normalised_seq(_types(value))


@lru_cache(maxsize=1024)
def _normalised(value: str) -> tuple[str, ...] | None:
    return _normalised_seq(_types(value))


def _normalised_seq(types: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if types is None:
        return None
    out = tuple(dict.fromkeys(normalise_gpu_type(t) for t in types))
    return out or None


class FitChecker:
    """:func:`never_fits` for many jobs on one cluster: node shapes grouped once, answers cached."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        shapes = Counter((n.gpus, n.cpus, n.mem_mb, n.gpu_type) for n in cluster.nodes if n.gpus > 0)
        #: (gpus, cpus, mem_mb, gpu_type, count) per distinct node shape
        self.shapes = [(*s, k) for s, k in shapes.items()]
        self._cache: dict[tuple, str | None] = {}

    def never_fits(self, spec: JobSpec) -> str | None:
        types = _types((spec.attrs or {}).get(GPU_TYPE_KEY))
        key = (spec.gpus, spec.cpus, spec.mem_mb, types)
        if key not in self._cache:
            self._cache[key] = self._why(spec.gpus, spec.cpus, spec.mem_mb, types)
        return self._cache[key]

    def _why(self, g: int, c: int | None, m: int | None, types: tuple[str, ...] | None) -> str | None:
        shapes = self.shapes
        if types is not None:
            want = {normalise_gpu_type(t) for t in types}
            shapes = [s for s in shapes if normalise_gpu_type(s[3]) in want]
            if not shapes:
                have = sorted({s[3] for s in self.shapes})
                return f"needs GPU type {' or '.join(types)}, the cluster has {', '.join(have) or 'no GPUs'}"
        where = "" if types is None else f" of type {' or '.join(types)}"
        total_g = sum(s[0] * s[4] for s in shapes)
        if g > total_g:
            return f"needs {g} GPUs, the cluster has {total_g}{where}"
        if c is not None and c > (total_c := sum(s[1] * s[4] for s in shapes)):
            return f"needs {c} CPU cores, the cluster has {total_c}{where and ' on nodes' + where}"
        if m is not None and m > (total_m := sum(s[2] * s[4] for s in shapes)):
            return f"needs {m} MB of memory, the cluster has {total_m}{where and ' on nodes' + where}"
        if c is None and m is None:
            return None

        def room(use_cpu: bool, use_mem: bool) -> int:
            n = 0
            for gi, ci, mi, _, count in shapes:
                k = gi
                if use_cpu and c:
                    k = min(k, ci * g // c)
                if use_mem and m:
                    k = min(k, mi * g // m)
                n += k * count
            return n

        if room(True, True) >= g:
            return None
        per = "" if g == 1 else f" with {g} GPUs"
        if room(True, False) < g:
            assert c is not None  # room() is limited only by the cores asked for
            most = max(s[1] for s in shapes)
            return (f"needs {c} CPU cores{per}" + (f" ({c / g:g} per GPU)" if g > 1 else "")
                    + f": no placement{where} gives it that (the largest node has {most} cores)")
        if room(False, True) < g:
            assert m is not None
            most = max(s[2] for s in shapes)
            return (f"needs {m} MB of memory{per}" + (f" ({m / g:g} per GPU)" if g > 1 else "")
                    + f": no placement{where} gives it that (the largest node has {most} MB)")
        return f"needs {c} CPU cores and {m} MB of memory{per}: no placement{where} gives it both"


def never_fits(spec: JobSpec, cluster: Cluster) -> str | None:
    """Why ``spec`` can never run on ``cluster`` (a phrase starting with "needs"), or ``None``."""
    return FitChecker(cluster).never_fits(spec)


def impossible_jobs(specs: Sequence[JobSpec], cluster: Cluster) -> dict[str, str]:
    """``{job id: reason}`` for every spec that can never run on ``cluster``, in input order."""
    check = FitChecker(cluster)
    if not may_hold(specs, GPU_TYPE_KEY):  # none asks a GPU type: one answer a shape, asked of its first spec
        shape_of = attrgetter("gpus", "cpus", "mem_mb")
        first = dict(zip(map(shape_of, reversed(specs)), reversed(specs), strict=True))
        bad = {sh: why for sh, s in first.items() if (why := check.never_fits(s)) is not None}
        return {s.id: bad[sh] for s, sh in zip(specs, map(shape_of, specs), strict=True) if sh in bad} if bad else {}
    out = {}
    untyped: dict[tuple[int, int | None, int | None], str | None] = {}  # (no GPU type asked: one answer a shape)
    for s in specs:
        attrs = s.attrs
        if attrs and attrs.get(GPU_TYPE_KEY) is not None:
            why = check.never_fits(s)
        else:
            shape = (s.gpus, s.cpus, s.mem_mb)
            if shape in untyped:
                why = untyped[shape]
            else:
                why = untyped[shape] = check.never_fits(s)
        if why is not None:
            out[s.id] = why
    return out


def impossible_message(impossible: Mapping[str, str], option: str = "drop_impossible") -> str:
    """One line for ``{job id: reason}``: the first job and its reason, how many more, and the way out."""
    (first, why), more = next(iter(impossible.items())), len(impossible) - 1
    tail = f"; {more} more job{'s' if more > 1 else ''} can never run either" if more else ""
    return f"job {first}: {why}{tail} (use {option} to count such jobs as unfinished)"
