"""Profiles in the service: which jobs are profiled, how a profile is stored and read back.

The service (:mod:`.service`) profiles a job before its first real launch when
profiling is on and the job asks for it (:func:`wants_profile`): it has a
``model``, or ``profile: true`` in its spec (``profile: false`` opts out).  A
profile is keyed by :func:`profile_key` - the model (the job's name when it has
none) and its GPU count, ``"resnet50/2gpu"`` - so every later job of the same
model and size skips profiling and reuses it.

Stored records (the ``profiles`` table, JSON):

* ``{"status": "ok", ...}``: the optimistic profiler's outcome - the demand
  (``gpus``, ``cpus``, ``mem_mb``), every measured point (``[cores, MB, it/s]``),
  ``points_measured`` and ``grid_size``, and the estimated throughput matrix
  over the CPU and memory points (job totals) it searched;
* ``{"status": "unprofilable", "reason": ...}``: the job printed no progress
  lines (or ran at no allocation); it runs with GPU-proportional resources and
  jobs of that model are not profiled again.

:func:`profile_from_record` turns an ``ok`` record into a
:class:`~gpuloom.perf.sensitivity.SensitivityProfile` (per-GPU axes, as the
catalogue stores them) that the service sets as the job's ``JobSpec.profile``:
:class:`~gpuloom.perf.sensitivity.SensitivityFactor` prefers it to any
catalogue entry, and the Synergy sizers (``greedy``/``tune``/``opt``) read it
through the factor, exactly as they read a catalogue profile in the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..perf.profiler import ProfileResult
from ..perf.sensitivity import SensitivityError, SensitivityProfile

OK = "ok"
UNPROFILABLE = "unprofilable"


def wants_profile(spec: Mapping[str, Any]) -> bool:
    """Whether a job spec asks to be profiled: a ``model``, or ``profile: true``; ``profile: false`` opts out."""
    flag = spec.get("profile")
    if flag is False:
        return False
    return flag is True or bool(spec.get("model"))


def profile_key(spec: Mapping[str, Any]) -> str:
    """The store key of a job's profile: ``<model or name>/<gpus>gpu``."""
    return f"{spec.get('model') or spec.get('name') or 'job'}/{int(spec['gpus'])}gpu"


def record_from_result(res: ProfileResult, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON record of a successful profile (see the module notes)."""
    assert res.profile is not None
    g = res.gpus
    return {
        "status": OK,
        "gpus": g,
        "cpus": res.cpus,
        "mem_mb": res.mem_mb,
        "best_tput": res.best_tput,
        "demand_tput": res.demand_tput,
        "threshold": res.threshold,
        "cpu_points": list(res.cpu_points),
        "mem_points": list(res.mem_points),
        "points": [[c, m, v] for (c, m), v in sorted(res.points.items())],
        "points_measured": res.points_measured,
        "grid_size": res.grid_size,
        "matrix": np.asarray(res.profile.raw, dtype=float).tolist(),
        **dict(extra or {}),
    }


def unprofilable_record(gpus: int, reason: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"status": UNPROFILABLE, "gpus": int(gpus), "reason": reason, **dict(extra or {})}


def profile_from_record(key: str, rec: Mapping[str, Any]) -> SensitivityProfile | None:
    """The throughput profile of a stored record; ``None`` for an unprofilable one.

    Raises :class:`~gpuloom.perf.sensitivity.SensitivityError` naming the key if
    an ``ok`` record is malformed.
    """
    if rec.get("status") != OK:
        return None
    try:
        g = int(rec["gpus"])
        return SensitivityProfile(
            model=key,
            gpus=g,
            cpu_axis=tuple(float(c) / g for c in rec["cpu_points"]),
            mem_axis=tuple(float(m) / g for m in rec["mem_points"]),
            raw=np.asarray(rec["matrix"], dtype=float),
            best_cpus=float(rec["cpus"]) / g,
            best_mem_mb=float(rec["mem_mb"]) / g,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SensitivityError(f"stored profile {key!r}: {e!r}") from None
