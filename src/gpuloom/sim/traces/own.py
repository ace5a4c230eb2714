"""``csv`` / ``jsonl``: gpuloom's own job format (docs/traces.md), and :func:`save_trace`.

``id, arrival, gpus`` and ``duration`` or ``iterations`` + ``iter_time``;
optional ``model, user, cpus, mem_mb``; any other column/key goes to attrs (a
JSON ``attrs`` object is merged).  In JSONL, ``attrs["profile"]`` may hold a
CPU/memory profile record (:mod:`gpuloom.perf.profile_record`, what the service
stores and ``gpuloom history --as-trace`` exports): it becomes the job's
``JobSpec.profile`` and stays in attrs, so :func:`save_trace` writes it back.  In CSV, an extra cell becomes an int or a
float where it parses as one, a bool where it reads ``true``/``false`` (any
case: what :func:`save_trace` writes for a bool), else stays a string.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from ...core.parse import bool_literal
from ...perf.profile_record import is_record, profile_from_record
from ...perf.sensitivity import SensitivityError
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
from .formats import FORMATS

OWN_FIELDS = ("id", "arrival", "gpus", "duration", "iterations", "iter_time", "model", "user", "cpus", "mem_mb")


def _own_job(d: Mapping[str, Any], w: Where, attrs: dict[str, Any]) -> JobSpec:
    """One gpuloom job from string-or-typed values (CSV cells are strings)."""

    def get(k: str) -> Any:
        v = d.get(k)
        return None if v is None or (isinstance(v, str) and not v.strip()) else v

    def num(k: str, conv: Callable[..., Any], **kw: Any) -> Any:
        v = get(k)
        if v is None:
            return None
        if isinstance(v, bool):
            raise w.error(k, f"expected a number, got {v!r}")
        return conv(str(v), k, w, **kw)

    for k in ("id", "arrival", "gpus"):
        if get(k) is None:
            raise w.error(k, "missing")
    jid = str_field(str(d["id"]), "id", w)
    arrival = num("arrival", float_field)
    gpus = num("gpus", int_field)
    dur = num("duration", float_field, positive=True)
    iters = num("iterations", int_field)
    it = num("iter_time", float_field, positive=True)
    kw: dict[str, Any] = {"model": str(get("model") or ""), "user": str(get("user") or ""),
                          "cpus": num("cpus", int_field, low=0), "mem_mb": num("mem_mb", int_field, low=0), "attrs": attrs}
    if is_record(attrs.get("profile")):
        try:
            kw["profile"] = profile_from_record(f"job {jid}", attrs["profile"])
        except SensitivityError as e:
            raise w.error("profile", str(e)) from None
    if iters is not None or it is not None:
        if iters is None or it is None:
            raise w.error("iterations" if iters is None else "iter_time", "iterations and iter_time go together")
        if dur is not None and not math.isclose(dur, iters * it, rel_tol=1e-6):
            raise w.error("duration", f"{dur:g} disagrees with iterations * iter_time = {iters * it:g}")
        return JobSpec.from_iterations(jid, arrival, gpus, iters, it, **kw)
    if dur is None:
        raise w.error("duration", "missing (give duration, or iterations and iter_time)")
    return JobSpec(jid, arrival, gpus, dur, **kw)


def _cell_value(s: str) -> Any:
    """An extra CSV column's value: int, float, bool (``true``/``false``), or the string as is."""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        pass
    flag = bool_literal(s)
    return s if flag is None else flag


@FORMATS.register("csv")
def read_csv(path: str | Path) -> Trace:
    """gpuloom's CSV job format (header required; see docs/traces.md)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "csv")
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ("id", "arrival", "gpus"), w)
    extra = [(i, c) for i, c in enumerate(h.names) if c not in OWN_FIELDS]
    for row in rows:
        b.rows += 1
        check_width(row, h.width, w)
        d = dict(zip(h.names, row, strict=True))
        attrs = {c: _cell_value(row[i]) for i, c in extra if row[i].strip()}
        b.add(w, _own_job, d, w, attrs)
    return b.done()


@FORMATS.register("jsonl")
def read_jsonl(path: str | Path) -> Trace:
    """gpuloom's JSON-lines job format: one object per line (see docs/traces.md)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "jsonl")
    try:
        f = open(p, encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", p) from None
    with f:
        for n, text in enumerate(f, 1):
            w.line = n
            if not text.strip():
                continue
            b.rows += 1
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise w.error(None, f"invalid JSON: {e.msg} at column {e.colno}") from None
            if not isinstance(d, dict):
                raise w.error(None, f"expected a JSON object, got {type(d).__name__}")
            attrs = d.get("attrs", {})
            if not isinstance(attrs, dict):
                raise w.error("attrs", "expected a JSON object")
            attrs = {**{k: v for k, v in d.items() if k not in OWN_FIELDS and k != "attrs"}, **attrs}
            b.add(w, _own_job, d, w, attrs)
    return b.done()


def save_trace(jobs: Sequence[JobSpec], path: str | Path, fmt: str | None = None) -> None:
    """Write ``jobs`` in gpuloom's own format (``csv`` or ``jsonl``, by default from the extension).

    Extra ``attrs`` become columns (CSV: only scalar values) or keys; :func:`load_trace` reads it back.
    """
    p = Path(path)
    fmt = fmt or ("jsonl" if p.suffix == ".jsonl" else "csv")
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"save_trace writes 'csv' or 'jsonl', not {fmt!r}")

    def base(j: JobSpec) -> dict[str, Any]:
        d: dict[str, Any] = {"id": j.id, "arrival": j.arrival, "gpus": j.gpus}
        if j.iterations is not None and j.iter_time is not None:
            d["iterations"], d["iter_time"] = j.iterations, j.iter_time
        else:
            d["duration"] = j.duration
        for k in ("model", "user"):
            if getattr(j, k):
                d[k] = getattr(j, k)
        for k in ("cpus", "mem_mb"):
            if getattr(j, k) is not None:
                d[k] = getattr(j, k)
        return d

    if fmt == "jsonl":
        with open(p, "w", encoding="utf-8") as f:
            for j in jobs:
                d = base(j)
                if j.attrs:
                    d["attrs"] = dict(j.attrs)
                f.write(json.dumps(d, default=list) + "\n")
        return
    rows = []
    for j in jobs:
        d = base(j)
        for k, v in j.attrs.items():
            if k in OWN_FIELDS:
                raise ValueError(f"job {j.id}: attrs key {k!r} clashes with a column")
            if isinstance(v, str | int | float | bool):
                d[k] = v
        rows.append(d)
    cols: dict[str, None] = {}
    for d in rows:
        cols.update(dict.fromkeys(d))
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(cols), lineterminator="\n")
    wr.writeheader()
    wr.writerows(rows)
    p.write_text(buf.getvalue(), encoding="utf-8")
