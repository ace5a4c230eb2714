"""Sizing policies: how much of each resource a unit gets.

``proportional``: the job's GPU demand, CPU and memory in proportion to its
GPUs on whichever node it lands (the baseline every other sizer must not fall
below).  A job spec's explicit ``cpus``/``mem_mb`` are honoured.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.job import Job
from .base import Request, SizePolicy, View, register


@register("size", "proportional", "gpu-proportional")
class Proportional(SizePolicy):
    fixed_gpus = True  # never changes a job's GPU count

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        out = []
        for unit in units:
            j = unit[0]
            out.append(Request(tuple(unit), max(m.spec.gpus for m in unit), j.spec.cpus, j.spec.mem_mb))
        return out
