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

:func:`profile_from_record` (:mod:`gpuloom.perf.profile_record`, where traces read the
same records) turns an ``ok`` record into a
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

from ...perf.profile_record import profile_from_record
from ...perf.profiler import ProfileResult
from ..state.specs import profile_key

OK = "ok"
UNPROFILABLE = "unprofilable"


__all__ = ["OK", "UNPROFILABLE", "profile_from_record", "profile_key", "record_from_result", "unprofilable_record",
           "wants_profile"]


def wants_profile(spec: Mapping[str, Any]) -> bool:
    """Whether a job spec asks to be profiled: a ``model``, or ``profile: true``; ``profile: false`` opts out,
    and so does a job that brings its own profile (an inline record, :mod:`gpuloom.perf.profile_record`)."""
    flag = spec.get("profile")
    if flag is False or isinstance(flag, Mapping):
        return False
    return flag is True or bool(spec.get("model"))




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
