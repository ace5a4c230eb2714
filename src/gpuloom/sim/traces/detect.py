"""Format detection and :func:`read_trace` / :func:`load_trace` over the formats of :data:`~.formats.FORMATS`.

``"auto"`` picks a reader from the extension and the first line: ``.jsonl`` or
a first line starting with ``{`` -> ``jsonl``; ``.trace`` or 6/9 tabs ->
``gavel``; otherwise the CSV header's columns decide; a headerless 5-column
file is ``pal`` when its name contains ``noheader``, ``synergy`` when a
profile file lies beside it or one folder up, and otherwise an error asking
for the format.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from ...core.registry import RegistryError
from .fields import Trace, TraceError
from .formats import FORMATS
from .synergy import find_profiles

_HEADERS: list[tuple[str, frozenset[str]]] = [
    ("philly", frozenset({"timestamp", "duration", "num_gpus", "cluster"})),
    ("sia", frozenset({"name", "time", "application", "num_replicas"})),
    ("muri", frozenset({"resource_time_0", "iteration_time", "num_gpu"})),
    ("alibaba", frozenset({"cpu_milli", "gpu_milli", "pod_phase", "creation_time"})),
    ("tiresias", frozenset({"job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration"})),
    ("pal", frozenset({"job_id", "num_gpus", "submit_time", "duration", "model"})),
    ("csv", frozenset({"id", "arrival", "gpus"})),
]


def _first_line(p: Path) -> str:
    try:
        with open(p, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.rstrip("\r\n")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", p) from None
    raise TraceError("empty file", p)


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its extension and first line; :class:`TraceError` when unclear."""
    p = Path(path)
    first = _first_line(p)
    if p.suffix == ".jsonl" or first.lstrip().startswith("{"):
        return "jsonl"
    if p.suffix == ".trace" or first.count("\t") in (6, 9):
        return "gavel"
    cells = {c.strip() for c in next(csv.reader([first]))}
    for name, need in _HEADERS:
        if need <= cells:
            return name
    row = next(csv.reader([first]))
    if len(row) == 5 and not _is_number(row[1]) and all(_is_number(c) for c in row[2:]):
        if "noheader" in p.name:
            return "pal"
        if find_profiles(p) is not None:
            return "synergy"
        raise TraceError("headerless 5-column file is either 'pal' (id,model,submit,duration,gpus) or "
                         "'synergy' (id,model,arrival,iterations,gpus): give the format", p)
    raise TraceError(f"cannot tell the trace format from the first line {first[:80]!r}; "
                     f"give one of: {', '.join(sorted(FORMATS))}", p)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def read_trace(path: str | Path, fmt: str = "auto", **opts: Any) -> Trace:
    """Read ``path`` as ``fmt`` (a :data:`FORMATS` name, ``module:function`` or ``"auto"``); ``opts``
    go to the reader."""
    p = Path(path)
    if not p.is_file():
        raise TraceError("no such file", p)
    name = detect_format(p) if fmt == "auto" else fmt
    try:
        reader = FORMATS.lookup(name)
    except RegistryError as e:
        raise TraceError(f"{e}".replace("(choose from: ", "(choose from: auto, "), p) from None
    try:
        out = reader(p, **opts)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise TraceError(f"format {name!r} does not take option(s) {', '.join(opts)}", p) from None
        raise
    trace = out if isinstance(out, Trace) else _listed(out, name, p)
    trace.format = name
    return trace


def _listed(jobs: object, name: str, p: Path) -> Trace:
    """A reader's list of jobs as a :class:`Trace`, sorted by arrival (stable)."""
    if not isinstance(jobs, list) or not all(isinstance(j, JobSpec) for j in jobs):
        raise TraceError(f"format {name!r}: the reader returned {type(jobs).__name__}, not a Trace or a list of "
                         "JobSpec", p)
    if not jobs:
        raise TraceError(f"format {name!r}: no jobs", p)
    seen: set[str] = set()
    for j in jobs:
        if j.id in seen:
            raise TraceError(f"format {name!r}: job id {j.id!r} twice", p)
        seen.add(j.id)
    return Trace(sorted(jobs, key=lambda j: j.arrival), name, str(p), len(jobs))


def load_trace(path: str | Path, fmt: str = "auto", **opts: Any) -> list[JobSpec]:
    """The jobs of one trace file, sorted by arrival.  See :func:`read_trace` and the module docstring."""
    return read_trace(path, fmt, **opts).jobs
