"""``alibaba``: the openb pod list of Alibaba's cluster-trace-gpu-v2023.

Arrival = ``creation_time``; work = ``deletion_time - scheduled_time``.  Pods
that cannot be jobs are skipped and counted in ``Trace.skipped``: CPU-only pods
(``num_gpu`` 0, ``"cpu-only"``) and pods that never ran (``Pending``, no
``scheduled_time``, ``"never-scheduled"``); ``pending="error"`` makes the
latter an error instead.  ``Running`` pods were still running when the trace
ended, so their duration is a lower bound (``attrs["censored"]``).
``cpus = ceil(cpu_milli / 1000)``, ``mem_mb = memory_mib``; ``cpu_milli``,
``gpu_milli`` (per GPU: < 1000 is a GPU fraction), ``qos``, ``phase`` and
``gpu_spec`` (when given) are in attrs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from .fields import Builder, Header, Trace, Where, check_width, first_row, float_field, int_field, read_rows, str_field
from .formats import FORMATS

ALIBABA_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                   "creation_time", "deletion_time", "scheduled_time")


@FORMATS.register("alibaba")
def read_alibaba(path: str | Path, pending: str = "skip") -> Trace:
    """Alibaba cluster-trace-gpu-v2023 pod list; CPU-only and never-scheduled pods are skipped (counted)."""
    if pending not in ("skip", "error"):
        raise ValueError(f"pending must be 'skip' or 'error', got {pending!r}")
    p = Path(path)
    w = Where(p)
    b = Builder(p, "alibaba")
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ALIBABA_COLUMNS, w)
    P = h.pos
    for row in rows:
        b.rows += 1
        check_width(row, h.width, w)
        name = str_field(row[P["name"]], "name", w)
        gpus = int_field(row[P["num_gpu"]], "num_gpu", w, low=0)
        cpu_milli = int_field(row[P["cpu_milli"]], "cpu_milli", w, low=0)
        mem = int_field(row[P["memory_mib"]], "memory_mib", w, low=0)
        gpu_milli = int_field(row[P["gpu_milli"]], "gpu_milli", w, low=0)
        created = float_field(row[P["creation_time"]], "creation_time", w)
        phase = str_field(row[P["pod_phase"]], "pod_phase", w)
        if gpus == 0:
            b.skip("cpu-only")
            continue
        sched_s = row[P["scheduled_time"]].strip()
        if not sched_s:
            if pending == "error":
                raise w.error("scheduled_time", f"pod {name} ({phase}) never ran: no scheduled_time")
            b.skip("never-scheduled")
            continue
        sched = float_field(sched_s, "scheduled_time", w)
        deleted = float_field(row[P["deletion_time"]], "deletion_time", w)
        if deleted <= sched:
            raise w.error("deletion_time", f"pod {name} ends ({deleted:g}) before it runs ({sched:g})")
        if gpu_milli == 0 or gpu_milli > 1000:
            raise w.error("gpu_milli", f"expected 1..1000 per GPU for a GPU pod, got {gpu_milli}")
        attrs: dict[str, Any] = {"cpu_milli": cpu_milli, "gpu_milli": gpu_milli, "qos": row[P["qos"]].strip(),
                                 "phase": phase, "censored": phase == "Running", "queued": sched - created}
        spec_s = row[P["gpu_spec"]].strip()
        if spec_s:
            attrs["gpu_spec"] = spec_s
        b.add(w, JobSpec, name, created, gpus, deleted - sched, cpus=math.ceil(cpu_milli / 1000),
                  mem_mb=mem, attrs=attrs)
    return b.done()
