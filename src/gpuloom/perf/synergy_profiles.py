"""Synergy's ``model_sensitivity_profiles.csv``, parsed in one place.

Every reader of the file goes through :func:`read_profile_rows`: the
sensitivity catalogue (:func:`gpuloom.perf.sensitivity.load_catalogue`), the
built-in scaling curves (:func:`gpuloom.perf.scaling.synergy_curves`) and the
Synergy trace reader (``gpuloom.sim.traces``, which looks up iteration times).
Each gets the same rows and, for a malformed file, the same error:
:class:`ProfileFileError`, naming the file, the 1-based line and the column
(``profiles.csv:3: field 'iter_time': expected a number > 0, got '0'``).

The file
--------
One row per ``model_gpus`` (``alexnet_1``, ``res18_4``; ``shufflenet_12`` is a
12-GPU job).  Columns used (a header cell's ``(...)`` suffix is ignored, so
``tput_rows(cpu_idx x mem_idx)`` is ``tput_rows``):

``model_file`` (required)  ``MODEL_GPUS``;
``cpus``, ``mem`` (required, non-empty)  the best-case demand: cores and GB;
``iter_time`` (required column; an empty cell is "not measured")  seconds per
    iteration, > 0;
``speedup`` (optional; may be empty)  best throughput over GPU-proportional;
``tput_rows`` (optional; may be empty)  the CPU x memory throughput matrix,
    rows separated by ``|``, cells by ``,``; every row as long as the first;
``speed`` (optional; may be empty)  the storage bandwidth the job reads, MB/s
    per GPU (:mod:`gpuloom.perf.storage`).

Other columns (``batch``, ...) are ignored.  Cells may be arithmetic
(``62.5*2``, ``int(62.5/3)``), evaluated by :func:`gpuloom.core.parse.safe_arith`.
Blank lines are skipped; a name given twice is an error.  What the matrix axes
mean is the sensitivity module's business (:mod:`gpuloom.perf.sensitivity`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.parse import FieldError, safe_arith

__all__ = ["ProfileFileError", "ProfileRow", "SensitivityError", "read_profile_rows"]

REQUIRED = ("model_file", "cpus", "mem", "iter_time")
OPTIONAL = ("speedup", "tput_rows", "speed")


class SensitivityError(ValueError):
    """A profile file or profile that cannot be used; the message says where."""


class ProfileFileError(FieldError, SensitivityError):
    """A malformed profile file: ``file:line: field 'x': reason`` (a :class:`SensitivityError`)."""


Matrix = tuple[tuple[float, ...], ...]


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One row of the profile file, values evaluated; ``None`` where the cell is empty."""

    name: str  # "res50_2", as in the file
    model: str  # "res50", as in the file (compare with gpuloom.core.parse.normalise_model)
    gpus: int
    line: int
    cpus: float
    mem_gb: float
    iter_time: float | None
    speedup: float | None
    tput: Matrix | None
    storage_mbps: float | None = None  # the `speed` column: storage MB/s per GPU


def _rows(p: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        f = open(p, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise ProfileFileError(f"cannot open: {e.strerror or e}", p) from None
    with f:
        reader = csv.reader(f)
        try:
            for row in reader:
                if row and "".join(row).strip():
                    yield reader.line_num, row
        except csv.Error as e:
            raise ProfileFileError(f"malformed CSV: {e}", p, reader.line_num) from None
        except UnicodeDecodeError:
            raise ProfileFileError("not a UTF-8 text file", p) from None


def _matrix(text: str, p: Path, line: int) -> Matrix:
    """``"a,b | c,d"`` -> ``((a, b), (c, d))``; ragged rows and bad cells are errors."""
    rows = []
    for ri, row in enumerate(text.split("|")):
        try:
            rows.append(tuple(safe_arith(c) for c in row.split(",")))
        except ValueError as e:
            raise ProfileFileError(f"tput row {ri}: {e}", p, line, "tput_rows") from None
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise ProfileFileError(f"tput rows have different lengths {sorted(widths)}", p, line, "tput_rows")
    return tuple(rows)


def read_profile_rows(path: str | Path) -> list[ProfileRow]:
    """The rows of a Synergy profile file in file order (see the module notes)."""
    p = Path(path)
    rows = _rows(p)
    first = next(rows, None)
    if first is None:
        raise ProfileFileError("empty file", p)
    hline, header = first
    cols = [h.strip().split("(")[0].strip() for h in header]
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise ProfileFileError(f"missing column(s) {', '.join(missing)}; the header has {', '.join(cols)}", p, hline)
    idx = {c: cols.index(c) for c in (*REQUIRED, *OPTIONAL) if c in cols}
    out: list[ProfileRow] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        if len(row) != len(cols):
            raise ProfileFileError(f"{len(row)} fields, the header has {len(cols)}", p, line)

        def num(col: str, line: int = line, row: list[str] = row) -> float | None:
            """The cell's value; ``None`` for an absent column or an empty cell."""
            cell = row[idx[col]].strip() if col in idx else ""
            if not cell:
                return None
            try:
                return safe_arith(cell)
            except ValueError as e:
                raise ProfileFileError(str(e), p, line, col) from None

        name = row[idx["model_file"]].strip()
        model, _, g = name.rpartition("_")
        if not model or not g.isdigit() or int(g) < 1:
            raise ProfileFileError(f"{name!r} is not MODEL_GPUS (e.g. res50_2)", p, line, "model_file")
        if name in seen:
            raise ProfileFileError(f"{name!r} given twice (first on line {seen[name]})", p, line, "model_file")
        seen[name] = line
        cpus, mem = num("cpus"), num("mem")
        if cpus is None or mem is None:
            raise ProfileFileError("must not be empty", p, line, "cpus" if cpus is None else "mem")
        iter_time = num("iter_time")
        if iter_time is not None and not iter_time > 0:
            raise ProfileFileError(f"expected a number > 0, got {row[idx['iter_time']]!r}", p, line, "iter_time")
        tput = None
        if "tput_rows" in idx and row[idx["tput_rows"]].strip():
            tput = _matrix(row[idx["tput_rows"]], p, line)
        out.append(ProfileRow(name, model, int(g), line, cpus, mem, iter_time, num("speedup"), tput, num("speed")))
    if not out:
        raise ProfileFileError("no profiles", p)
    return out
