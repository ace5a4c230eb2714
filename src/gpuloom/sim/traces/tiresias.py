"""``tiresias``: Tiresias' trace (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``).

Work = ``duration`` (seconds); ``iter_time = duration / iterations``;
``attrs["interval"]`` when the column is there.
"""

from __future__ import annotations

from pathlib import Path

from ...core.job import JobSpec
from .fields import Builder, Header, Trace, Where, check_width, first_row, float_field, int_field, read_rows, str_field
from .formats import FORMATS


@FORMATS.register("tiresias")
def read_tiresias(path: str | Path) -> Trace:
    """Tiresias CSV ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` (seconds)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "tiresias")
    rows = read_rows(p, w)
    cols = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration")
    h = Header(first_row(rows, p), cols, w)
    pi, pg, ps, pit, pm, pd = (h.pos[c] for c in cols)
    pv = h.pos.get("interval")
    for row in rows:
        b.rows += 1
        check_width(row, h.width, w)
        jid = str_field(row[pi], "job_id", w)
        gpus = int_field(row[pg], "num_gpu", w)
        t = float_field(row[ps], "submit_time", w)
        iters = int_field(row[pit], "iterations", w)
        model = str_field(row[pm], "model_name", w)
        dur = float_field(row[pd], "duration", w, positive=True)
        attrs = {} if pv is None else {"interval": float_field(row[pv], "interval", w)}
        b.add(w, JobSpec, jid, t, gpus, dur, model=model, iterations=iters,
                  iter_time=dur / iters, attrs=attrs)
    return b.done()
