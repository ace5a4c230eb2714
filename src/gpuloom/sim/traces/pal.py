"""``pal`` / ``blox``: Blox and PAL traces.

``job_id,num_gpus,submit_time,duration,model[,batch_size]``; the ``-noheader``
variants are ``id,model,submit,duration,gpus`` (checked: the first 160 rows of
``workload-N-noheader.csv`` match Sia's workload N, not PAL's headered
``workload-N.csv``, which holds different jobs).

Every job carries ``attrs["source_options"]``: how PAL's simulator (Blox) ran
these traces, which a run uses where it gives none of its own (as it loads a
Synergy trace's profiles; :func:`gpuloom.perf.assembly.trace_options`):

* ``variability="artifact"``: each GPU's slowest measured run, drawn per GPU
  (the heavy-tailed PM-scores of PAL's evaluation);
* ``locality_rule="any"``: a trace's ``duration`` is the job's time inside one
  node, and PAL's simulator charges the penalty to every job that spans nodes;
* ``place.backfill=False``: Blox's loops stop at the first job that does not
  fit (a strict queue).

``--variability none``, ``-P locality_rule=excess`` and ``-P backfill=true``
override them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ...core.job import JobSpec
from .fields import (
    Builder,
    Header,
    Trace,
    Where,
    chain_first,
    check_width,
    first_row,
    float_field,
    int_field,
    read_rows,
    str_field,
)
from .formats import FORMATS

#: how PAL's simulator ran its traces: model options and policy parameters (see the module notes)
PAL_SOURCE_OPTIONS = {"variability": "artifact", "locality_rule": "any", "place.backfill": False}


@FORMATS.register("pal", "blox")
def read_pal(path: str | Path) -> Trace:
    """Blox/PAL CSV: ``job_id,num_gpus,submit_time,duration,model[,batch_size]`` or the headerless
    ``id,model,submit,duration,gpus`` variant (recognised by a non-header first row)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "pal")
    rows = read_rows(p, w)
    first = first_row(rows, p)
    if "job_id" in [c.strip() for c in first]:
        h = Header(first, ("job_id", "num_gpus", "submit_time", "duration", "model"), w)
        pi, pg, ps, pd, pm = (h.pos[c] for c in ("job_id", "num_gpus", "submit_time", "duration", "model"))
        pb = h.pos.get("batch_size")
        width = h.width
        body: Iterable[list[str]] = rows
    else:  # headerless: id, model, submit, duration, gpus
        pi, pm, ps, pd, pg, pb, width = 0, 1, 2, 3, 4, None, 5
        body = chain_first(first, rows)
    for row in body:
        b.rows += 1
        check_width(row, width, w)
        jid = str_field(row[pi], "job_id", w)
        gpus = int_field(row[pg], "num_gpus", w)
        t = float_field(row[ps], "submit_time", w)
        dur = float_field(row[pd], "duration", w, positive=True)
        model = str_field(row[pm], "model", w)
        attrs: dict = {"source_options": dict(PAL_SOURCE_OPTIONS)}
        if pb is not None:
            attrs["batch_size"] = int_field(row[pb], "batch_size", w)
        b.add(w, JobSpec, jid, t, gpus, dur, model=model, attrs=attrs)
    return b.done()
