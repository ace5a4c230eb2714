"""``muri``: Muri's simulator and testbed traces; all times in milliseconds -> seconds.

Work = ``iterations * iteration_time`` (the simulator traces' ``duration`` is
that product rounded up to a whole second, in 6 of 5,755 trace2 jobs one second
more; in the testbed trace ``duration`` is the measured run and differs by
-81 %..+30 %); the trace's value is kept in ``attrs["trace_duration"]``.
``attrs["resource_times"] = (t0, t1, t2)`` seconds per iteration: t0 CPU (data
loading and preprocessing, or the RL environment: dqn/a2c have t0 ~ 0.44-0.51 s
and t1 ~ 0.01 s), t1 GPU compute (bert/gpt2: t1 dominates), t2 network
(inter-GPU communication: it is 0 for every 1-GPU job).  Also
``iteration_time``, ``batch_size``, ``priority``, ``interval`` (s).
"""

from __future__ import annotations

from pathlib import Path

from ...core.job import JobSpec
from .fields import Builder, Header, Trace, Where, check_width, first_row, float_field, int_field, read_rows, str_field
from .formats import FORMATS

MURI_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration",
                "interval", "iteration_time", "resource_time_0", "resource_time_1", "resource_time_2", "priority")


@FORMATS.register("muri")
def read_muri(path: str | Path) -> Trace:
    """Muri trace (times in ms) -> seconds; see the module docstring for the resource columns."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "muri")
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), MURI_COLUMNS, w)
    P = h.pos
    for row in rows:
        b.rows += 1
        check_width(row, h.width, w)
        jid = str_field(row[P["job_id"]], "job_id", w)
        gpus = int_field(row[P["num_gpu"]], "num_gpu", w)
        submit = float_field(row[P["submit_time"]], "submit_time", w) / 1000.0
        iters = int_field(row[P["iterations"]], "iterations", w)
        model = str_field(row[P["model_name"]], "model_name", w)
        batch = int_field(row[P["batch_size"]], "batch_size", w)
        trace_dur = float_field(row[P["duration"]], "duration", w) / 1000.0
        interval = float_field(row[P["interval"]], "interval", w) / 1000.0
        it = float_field(row[P["iteration_time"]], "iteration_time", w, positive=True) / 1000.0
        rt = tuple(float_field(row[P[f"resource_time_{i}"]], f"resource_time_{i}", w) / 1000.0 for i in range(3))
        prio = int_field(row[P["priority"]], "priority", w, low=0)
        attrs = {"resource_times": rt, "iteration_time": it, "batch_size": batch, "priority": prio,
                 "interval": interval, "trace_duration": trace_dur}
        b.add(w, JobSpec.from_iterations, jid, submit, gpus, iters, it, model=model, attrs=attrs)
    return b.done()
