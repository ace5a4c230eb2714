"""What a run was made from (label, stages, trace, seed, parameters, version) and the plain values its files
hold: exact CSV cells, strict JSON, folder names."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import RunResult

Results = Mapping[str, "RunResult | Sequence[RunResult]"]


def _version() -> str:
    from .. import __version__

    return __version__


def runs_of(results: Results) -> dict[str, list[RunResult]]:
    """``{label: [runs]}``: one run per seed (a bare ``RunResult`` is one seed)."""
    return {k: [v] if isinstance(v, RunResult) else list(v) for k, v in results.items()}


# -- plain values -------------------------------------------------------------
def _cell(v: Any) -> str:
    """CSV cell: exact floats, empty for None/NaN."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return str(v)


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/±inf → None, tuples → lists, numpy scalars → Python, other objects → str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset | np.ndarray):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _dump_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n")


def slug(label: str) -> str:
    """A folder name for a label: ``srtf/random-sticky/seed=3`` → ``srtf_random-sticky_seed=3``."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", label).strip("_") or "run"


# -- what a run was made from ----------------------------------------------------
def describe(result: RunResult) -> dict[str, Any]:
    """The run's provenance: label, stages, version, trace/workload, seed, parameters, cluster."""
    c, m = result.config, result.meta
    return {
        "label": result.label,
        "stages": result.stages,
        "gpuloom_version": m.get("gpuloom_version", _version()),
        "trace": m.get("trace"),
        "workload": m.get("workload"),
        "seed": c.get("seed"),
        "params": dict(c.get("params") or {}),
        "cluster": m.get("cluster"),
        "command": m.get("command"),
        **({"measure_jobs": _window_text(result)} if result.window is not None else {}),
    }


def _window_text(result: RunResult) -> str:
    """``"4000:5000"``: the run's measurement window, as ``--measure-jobs`` takes it."""
    from .window import text

    return text(result.window) if result.window is not None else ""


def _subtitle(result: RunResult, *, label: bool = False) -> str:
    d = describe(result)
    bits = [d["label"]] if label else []
    if d["stages"] != d["label"]:
        bits.append(d["stages"])
    src = d["trace"] or d["workload"]
    if src:
        bits.append(Path(str(src)).name if d["trace"] else str(src))
    if not (src and not d["trace"] and f"seed {d['seed']})" in str(src)):  # a generated workload names its seed
        bits.append(f"seed {d['seed']}")
    if d["params"]:
        p = ", ".join(f"{k}={v}" for k, v in sorted(d["params"].items()))
        bits.append(p if len(p) < 60 else p[:57] + "...")
    if result.window is not None:
        bits.append(f"jobs {result.window[0]}-{result.window[1] - 1} measured")
    bits.append(f"gpuloom {d['gpuloom_version']}")
    return " · ".join(bits)

