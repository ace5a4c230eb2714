"""CPU/memory profiles as plain JSON records, the form the service stores and traces carry.

A *profile record* is a mapping (JSON)::

    {"status": "ok", "gpus": 2, "cpus": 6, "mem_mb": 64000,
     "cpu_points": [2, 4, 6, 8], "mem_points": [32000, 64000],
     "matrix": [[r00, r01], [r10, r11], [r20, r21], [r30, r31]]}

``cpu_points`` and ``mem_points`` are job totals (cores, MB) on ``gpus``
GPUs; ``matrix[i][j]`` is the throughput (iterations/s; 0 = not measured) at
``cpu_points[i]`` cores and ``mem_points[j]`` MB; ``cpus``/``mem_mb`` the
demand (the point a sizer would pick; optional here).  ``status`` other than
``"ok"`` means no profile (the service's ``unprofilable`` records).  The
service writes these records for what it profiles (:mod:`gpuloom.runtime.service.profiles`),
a job may carry one inline (``profile:`` in its spec), and gpuloom's JSONL trace
format carries one per job (``attrs["profile"]``), so a profile measured by the
service reaches the simulator unchanged.

:func:`profile_from_record` turns a record into the
:class:`~gpuloom.perf.sensitivity.SensitivityProfile` the throughput model
reads (per-GPU axes, as the catalogue stores them); :func:`measured_record`
builds a record from throughput measured at a few allocations (the service's
history of a job that was never profiled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .sensitivity import SensitivityError, SensitivityProfile

OK = "ok"


def is_record(value: Any) -> bool:
    """Whether ``value`` looks like a profile record (a mapping with a ``matrix`` or a ``status``)."""
    return isinstance(value, Mapping) and ("matrix" in value or "status" in value)


def profile_from_record(key: str, rec: Mapping[str, Any]) -> SensitivityProfile | None:
    """The throughput profile of a record; ``None`` for a record whose status is not ``ok``.

    Raises :class:`~gpuloom.perf.sensitivity.SensitivityError` naming ``key`` for a malformed record.
    """
    if rec.get("status", OK) != OK:
        return None
    try:
        g = int(rec["gpus"])
        if g < 1:
            raise ValueError(f"gpus must be >= 1, got {g}")
        cpus, mem = rec.get("cpus"), rec.get("mem_mb")
        return SensitivityProfile(
            model=key,
            gpus=g,
            cpu_axis=tuple(float(c) / g for c in rec["cpu_points"]),
            mem_axis=tuple(float(m) / g for m in rec["mem_points"]),
            raw=np.asarray(rec["matrix"], dtype=float),
            best_cpus=None if cpus is None else float(cpus) / g,
            best_mem_mb=None if mem is None else float(mem) / g,
        )
    except SensitivityError as e:
        raise SensitivityError(f"profile {key!r}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise SensitivityError(f"profile {key!r}: {e!r}") from None


def record_from_points(gpus: int, points: Iterable[tuple[float, float, float]],
                       demand: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """A record from measured ``(cores, MB, it/s)`` points on ``gpus`` GPUs (None without a positive one).

    The grid is the distinct core counts by the distinct memory sizes; a cell
    nothing was measured at is 0 (the model then reads the best measured value
    at or below it).  Two measurements of one point are averaged.
    """
    acc: dict[tuple[int, int], list[float]] = {}
    for c, m, v in points:
        if c > 0 and v > 0:
            acc.setdefault((int(round(c)), max(0, int(round(m)))), []).append(float(v))
    if not acc:
        return None
    cps = sorted({c for c, _ in acc})
    mps = sorted({m for _, m in acc})
    mat = [[round(sum(acc[(c, m)]) / len(acc[(c, m)]), 6) if (c, m) in acc else 0.0 for m in mps] for c in cps]
    rec: dict[str, Any] = {"status": OK, "gpus": int(gpus), "cpu_points": cps, "mem_points": mps, "matrix": mat,
                           "source": "measured"}
    if demand is not None:
        rec["cpus"], rec["mem_mb"] = int(demand[0]), int(demand[1])
    return rec


def record_from_function(gpus: int, cpu_points: Iterable[int], mem_points: Iterable[int],
                         tput: Any, source: str = "") -> dict[str, Any]:
    """A record from a throughput function ``tput(cores, MB) -> it/s`` over a grid (synthetic workloads)."""
    cps = sorted({int(c) for c in cpu_points})
    mps = sorted({int(m) for m in mem_points})
    rec: dict[str, Any] = {"status": OK, "gpus": int(gpus), "cpu_points": cps, "mem_points": mps,
                           "matrix": [[round(float(tput(c, m)), 6) for m in mps] for c in cps]}
    if source:
        rec["source"] = source
    return rec
