"""``synergy``: Synergy's traces, ``id, model, arrival, iterations, GPUs`` (no header).

Iteration times come from Synergy's ``model_sensitivity_profiles.csv``: the
``iter_time`` of row ``<model>_<gpus>``, else of the model's row with the
nearest lower GPU count.  The file is looked for beside the trace or one folder
up, or given as ``profiles=``; ``iter_times={model: s}`` overrides.  Model
names are compared through :func:`gpuloom.core.parse.normalise_model`
(``res50`` in a trace finds ``resnet50_1``).  The profile row (best-case CPUs
and memory, best speedup, the CPU x memory throughput matrix) goes to
``attrs["sensitivity"]``.

The profile file is parsed by :func:`gpuloom.perf.synergy_profiles.read_profile_rows`,
the project's one parser of it (cells such as ``62.5*2`` or ``int(62.5/3)`` are
evaluated by :func:`gpuloom.core.parse.safe_arith`, never ``eval``).  A malformed
profile file read for a trace is a :class:`TraceError` with the parser's file,
line, field and message.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from ...core.parse import normalise_model
from ...core.parse import safe_arith as safe_arith  # re-exported: the one arithmetic evaluator
from ...perf.synergy_profiles import ProfileFileError, ProfileRow, read_profile_rows
from .fields import Builder, Trace, TraceError, Where, check_width, float_field, int_field, read_rows, str_field
from .formats import FORMATS

PROFILES_FILE = "model_sensitivity_profiles.csv"


def _record(r: ProfileRow) -> dict[str, Any]:
    rec: dict[str, Any] = {"cpus": r.cpus, "mem_gb": r.mem_gb}
    for k in ("iter_time", "speedup", "tput"):
        if getattr(r, k) is not None:
            rec[k] = getattr(r, k)
    return rec


def read_synergy_profiles(path: str | Path) -> dict[str, dict[str, Any]]:
    """``model_sensitivity_profiles.csv`` -> ``{"res50_2": {"iter_time", "cpus", "mem_gb", "speedup", "tput"}}``.

    Keys are the ``model_file`` names as written; a value's ``iter_time``,
    ``speedup`` and ``tput`` are left out where the file has none.  A thin view
    of :func:`gpuloom.perf.synergy_profiles.read_profile_rows`: a malformed file
    raises its :class:`~gpuloom.perf.synergy_profiles.ProfileFileError`.
    """
    return {r.name: _record(r) for r in read_profile_rows(path)}


def find_profiles(trace: Path) -> Path | None:
    """The ``model_sensitivity_profiles.csv`` beside ``trace`` or one folder up, if any."""
    for d in (trace.parent, trace.parent.parent):
        q = d / PROFILES_FILE
        if q.is_file():
            return q
    return None


def _profile_index(path: Path | None) -> dict[tuple[str, int], ProfileRow]:
    """(normalised model, GPUs) -> row, for rows with an iteration time."""
    if path is None:
        return {}
    try:
        rows = read_profile_rows(path)
    except ProfileFileError as e:
        raise TraceError(e.reason, e.path, e.line, e.field) from e
    return {(normalise_model(r.model), r.gpus): r for r in rows if r.iter_time is not None}


@FORMATS.register("synergy")
def read_synergy(path: str | Path, profiles: str | Path | None = None,
                 iter_times: Mapping[str, float] | None = None) -> Trace:
    """Synergy trace ``id, model, arrival, iterations, GPUs`` (no header)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "synergy")
    prof_path = Path(profiles) if profiles is not None else find_profiles(p)
    prof = _profile_index(prof_path)
    overrides = {normalise_model(m): float(v) for m, v in (iter_times or {}).items()}
    for row in read_rows(p, w):
        b.rows += 1
        check_width(row, 5, w)
        jid = str_field(row[0], "id", w)
        model = str_field(row[1], "model", w)
        arrival = float_field(row[2], "arrival", w)
        iters = int_field(row[3], "iterations", w)
        gpus = int_field(row[4], "gpus", w)
        norm = normalise_model(model)
        rec = None
        if norm in overrides:
            it = overrides[norm]
        else:
            rec = next((prof[(norm, g)] for g in range(gpus, 0, -1) if (norm, g) in prof), None)
            if rec is None:
                where = f"in {prof_path.name}" if prof_path else f"(no {PROFILES_FILE} found)"
                raise w.error("model", f"no iteration time for {model!r} with {gpus} GPU(s) {where}; "
                                       "pass profiles= or iter_times=")
            assert rec.iter_time is not None  # _profile_index keeps only rows with one
            it = rec.iter_time
        attrs: dict[str, Any] = {} if rec is None else {
            "sensitivity": {k: v for k, v in _record(rec).items() if k != "iter_time"},
            # where the profiles came from: the model loads them for the sizers (greedy/tune/opt)
            "profiles_file": str(prof_path)}
        b.add(w, JobSpec.from_iterations, jid, arrival, gpus, iters, it, model=model, attrs=attrs)
    return b.done(profiles=None if prof_path is None else prof_path.name)
