"""Synergy's optimistic profiling: find a job's best-case CPU and memory with few measurements.

:func:`optimistic_profile` takes a *measurement function* ``measure(cpus,
mem_mb) -> throughput`` – in the simulator a lookup in a catalogue profile, in
the runtime a short real run of the job – and the CPU and memory points it may
try (job totals).  The search (Synergy §4.1):

1. **CPU, memory at maximum.**  Measure at (max CPU, max memory): the best
   case ``T_best``.  Binary search over the CPU points for the smallest one
   whose throughput is within ``threshold`` of ``T_best``: at each probe,
   if the gain of the upper point over the probe, ``T_best / T(probe) - 1``,
   is below the threshold the upper point is not worth its cores and the
   search continues into the lower half; otherwise into the upper half.
   Throughput is assumed non-decreasing in cores (more data-loader workers
   never slow a job down), which makes the search exact.
2. **Memory.**  With a cache model (:class:`~gpuloom.perf.sensitivity.DataPipelineModel`:
   MinIO-style hit rate ``mem / dataset``) memory is computed, not measured:
   the smallest memory point at which the fetch stage keeps up with the CPU
   stage's measured rate.  Without one, the same binary search runs over
   memory at the chosen CPU (a fallback for jobs whose dataset is unknown).

The result carries the demand, every measured point, how many were measured
(vs. the full grid, ``len(cpu) * len(mem)``) and a
:class:`~gpuloom.perf.sensitivity.SensitivityProfile` estimated from them so
the throughput model can use it right away: ``T(c, m) = min(Tcpu(c),
Tmem(m))`` – the pipeline's slowest stage – where ``Tcpu`` is the CPU curve
(the best measured point with at most ``c`` cores, a lower bound since more
memory never hurts) and ``Tmem`` the memory curve (cache model or measured)
at the chosen CPU, read from the nearest measured point at or below (linear
from 0 below the first measured CPU point).  Measured points keep their
measured values.  Pass ``reference`` (the GPU-proportional point) to measure
it as well – one more point – so speeds relative to it are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .sensitivity import DEFAULT_THRESHOLD, DataPipelineModel, SensitivityError, SensitivityProfile


class ProfileError(SensitivityError):
    """Bad profiler input or a measurement that cannot be used."""


@dataclass(slots=True)
class ProfileResult:
    """Outcome of :func:`optimistic_profile` (CPU and memory are job totals)."""

    cpus: int
    mem_mb: int
    best_tput: float
    demand_tput: float
    points: dict[tuple[int, int], float]
    cpu_points: tuple[int, ...]
    mem_points: tuple[int, ...]
    gpus: int = 1
    threshold: float = DEFAULT_THRESHOLD
    profile: SensitivityProfile | None = field(default=None, repr=False)

    @property
    def points_measured(self) -> int:
        return len(self.points)

    @property
    def grid_size(self) -> int:
        return len(self.cpu_points) * len(self.mem_points)

    @property
    def demand(self) -> tuple[int, int, int]:
        """The demand vector (GPUs, cores, MB)."""
        return self.gpus, self.cpus, self.mem_mb


def _binary_search(points: Sequence[int], value: Callable[[int], float], target: float) -> int:
    """Index of the smallest point with ``value >= target`` (points[-1] qualifies by construction)."""
    lo, hi = 0, len(points) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if value(points[mid]) >= target:
            hi = mid  # the upper point gains less than the threshold: go lower
        else:
            lo = mid + 1  # the upper point is worth it: go higher
    return hi


def optimistic_profile(
    measure: Callable[[int, int], float],
    cpu_points: Sequence[int],
    mem_points: Sequence[int],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    gpus: int = 1,
    cache: DataPipelineModel | None = None,
    reference: tuple[int, int] | None = None,
    model: str = "",
) -> ProfileResult:
    """Find the best-case (cores, MB) of a job with Synergy's optimistic search (see the module notes)."""
    cps = sorted(set(int(c) for c in cpu_points))
    mps = sorted(set(int(m) for m in mem_points))
    if not cps or not mps:
        raise ProfileError("optimistic_profile: cpu_points and mem_points must not be empty")
    if cps[0] <= 0 or mps[0] < 0:
        raise ProfileError("optimistic_profile: CPU points must be > 0 and memory points >= 0")
    if not (isinstance(threshold, int | float) and 0 <= threshold < 10):
        raise ProfileError(f"optimistic_profile: threshold must be in [0, 10), got {threshold!r}")
    if gpus < 1:
        raise ProfileError(f"optimistic_profile: gpus must be >= 1, got {gpus}")
    points: dict[tuple[int, int], float] = {}

    def at(c: int, m: int) -> float:
        key = (c, m)
        if key not in points:
            v = float(measure(c, m))
            if not math.isfinite(v) or v < 0:
                raise ProfileError(f"measurement at {c} cores, {m} MB returned {v!r}")
            points[key] = v
        return points[key]

    mmax = mps[-1]
    best = at(cps[-1], mmax)
    if best <= 0:
        raise ProfileError(f"throughput at the maximum ({cps[-1]} cores, {mmax} MB) is 0: nothing to profile")
    target = best / (1.0 + threshold) * (1 - 1e-12)
    ci = _binary_search(cps, lambda c: at(c, mmax), target)
    cpu = cps[ci]
    cpu_rate = at(cpu, mmax)
    if cache is not None:
        mem = cache.memory_for(cpu_rate / (1.0 + threshold), mps)
        if mem is None:
            mem = mmax
        mem_curve = {m: min(cpu_rate, cache.io_rate(m)) for m in mps}
    else:
        mi = _binary_search(mps, lambda m: at(cpu, m), target)
        mem = mps[mi]
        mem_curve = {}
    if reference is not None:
        at(int(reference[0]), int(reference[1]))
    demand_tput = points.get((cpu, mem))
    if demand_tput is None:
        demand_tput = mem_curve[mem]

    # estimated matrix: min(CPU curve at max memory, memory curve at the chosen CPU)
    # (any measured point is a lower bound of the CPU curve at max memory)
    cpu_meas = sorted((c, v) for (c, m), v in points.items())

    def tcpu(c: int) -> float:
        below = [v for cc, v in cpu_meas if cc <= c]
        if below:
            return max(below)
        c0 = cpu_meas[0][0]
        v0 = max(v for cc, v in cpu_meas if cc == c0)
        return v0 * c / c0

    mem_meas = sorted((m, v) for (c, m), v in points.items() if c == cpu)

    def tmem(m: int) -> float:
        if mem_curve:
            return mem_curve[m]
        below = [v for mm, v in mem_meas if mm <= m]
        return max(below) if below else mem_meas[0][1]

    mat = np.empty((len(cps), len(mps)))
    for i, c in enumerate(cps):
        for j, m in enumerate(mps):
            v = points.get((c, m))
            mat[i, j] = v if v is not None else min(tcpu(c), tmem(m))
    if (mat <= 0).all():
        raise ProfileError("all estimated throughputs are 0")
    profile = SensitivityProfile(
        model=model or "profiled",
        gpus=gpus,
        cpu_axis=tuple(c / gpus for c in cps),
        mem_axis=tuple(m / gpus for m in mps),
        raw=np.maximum(mat, 0.0),
        best_cpus=cpu / gpus,
        best_mem_mb=mem / gpus,
    )
    return ProfileResult(
        cpus=cpu,
        mem_mb=mem,
        best_tput=best,
        demand_tput=float(demand_tput),
        points=points,
        cpu_points=tuple(cps),
        mem_points=tuple(mps),
        gpus=gpus,
        threshold=float(threshold),
        profile=profile,
    )
