"""``synergy``: Synergy's traces, ``id, model, arrival, iterations, GPUs`` (no header).

Iteration times come from Synergy's ``model_sensitivity_profiles.csv``: the
``iter_time`` of row ``<model>_<gpus>``, else of the model's row with the
nearest lower GPU count.  The file is looked for beside the trace or one folder
up, or given as ``profiles=``; ``iter_times={model: s}`` overrides.  The
profile row (GPU-proportional CPUs and memory, best speedup, the CPU x memory
throughput matrix) goes to ``attrs["sensitivity"]``.  Cells such as ``62.5*2``
or ``int(62.5/3)`` are evaluated by a tiny ``ast`` arithmetic evaluator, never
``eval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from .fields import (
    Builder,
    Header,
    Trace,
    TraceError,
    Where,
    check_width,
    first_row,
    float_field,
    int_field,
    read_rows,
    str_field,
)


def safe_arith(text: str) -> float:
    """Evaluate ``62.5*2``, ``int(62.5/3)``: one safe evaluator for the project, without ``eval``
    (see :func:`gpuloom.perf.sensitivity.safe_number`)."""
    from ...perf.sensitivity import safe_number

    return safe_number(text)


def read_synergy_profiles(path: str | Path) -> dict[str, dict[str, Any]]:
    """``model_sensitivity_profiles.csv`` -> ``{"res50_2": {"iter_time", "cpus", "mem_gb", "speedup", "tput"}}``."""
    p = Path(path)
    w = Where(p)
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ("model_file", "cpus", "mem", "iter_time"), w)
    pt = next((i for i, c in enumerate(h.names) if c.startswith("tput_rows")), None)
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        check_width(row, h.width, w)
        name = str_field(row[h.pos["model_file"]], "model_file", w)
        rec: dict[str, Any] = {}
        for col, key in (("iter_time", "iter_time"), ("cpus", "cpus"), ("mem", "mem_gb"), ("speedup", "speedup")):
            if col not in h.pos:
                continue
            cell = row[h.pos[col]]
            try:
                rec[key] = safe_arith(cell)
            except ValueError as e:
                raise w.error(col, str(e)) from None
        if not rec["iter_time"] > 0:
            raise w.error("iter_time", f"expected a number > 0, got {row[h.pos['iter_time']]!r}")
        if pt is not None and row[pt].strip():
            try:
                rec["tput"] = tuple(tuple(safe_arith(c) for c in r.split(",")) for r in row[pt].split("|"))
            except ValueError as e:
                raise w.error(h.names[pt], str(e)) from None
        out[name] = rec
    if not out:
        raise TraceError("empty profile file", p)
    return out


def find_profiles(trace: Path) -> Path | None:
    """The ``model_sensitivity_profiles.csv`` beside ``trace`` or one folder up, if any."""
    for d in (trace.parent, trace.parent.parent):
        q = d / "model_sensitivity_profiles.csv"
        if q.is_file():
            return q
    return None


def read_synergy(path: str | Path, profiles: str | Path | None = None,
                 iter_times: Mapping[str, float] | None = None) -> Trace:
    """Synergy trace ``id, model, arrival, iterations, GPUs`` (no header)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "synergy")
    prof_path = Path(profiles) if profiles is not None else find_profiles(p)
    prof = read_synergy_profiles(prof_path) if prof_path is not None else {}
    overrides = dict(iter_times or {})
    for row in read_rows(p, w):
        b.rows += 1
        check_width(row, 5, w)
        jid = str_field(row[0], "id", w)
        model = str_field(row[1], "model", w)
        arrival = float_field(row[2], "arrival", w)
        iters = int_field(row[3], "iterations", w)
        gpus = int_field(row[4], "gpus", w)
        rec = None
        if model in overrides:
            it = float(overrides[model])
        else:
            cands = [g for g in range(gpus, 0, -1) if f"{model}_{g}" in prof]
            if not cands:
                where = f"in {prof_path.name}" if prof_path else "(no model_sensitivity_profiles.csv found)"
                raise w.error("model", f"no iteration time for {model!r} with {gpus} GPU(s) {where}; "
                                       "pass profiles= or iter_times=")
            rec = prof[f"{model}_{cands[0]}"]
            it = rec["iter_time"]
        attrs: dict[str, Any] = {} if rec is None else {
            "sensitivity": {k: rec[k] for k in ("cpus", "mem_gb", "speedup", "tput") if k in rec}}
        b.add(w, JobSpec.from_iterations, jid, arrival, gpus, iters, it, model=model, attrs=attrs)
    return b.done(profiles=None if prof_path is None else prof_path.name)
