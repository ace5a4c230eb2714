"""Sizing policies: how much of each resource a unit gets.

``proportional``: the job's GPU demand, CPU and memory in proportion to its
GPUs on whichever node it lands (the baseline every other sizer must not fall
below).  A job spec's explicit ``cpus``/``mem_mb`` are honoured.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.job import Job
from .base import Request, SizePolicy, View, register

#: group requests kept (cleared when full: a run's groups come and go)
_GROUPS_KEPT = 100_000


@register("size", "proportional", "gpu-proportional")
class Proportional(SizePolicy):
    fixed_gpus = True  # never changes a job's GPU count
    static_requests = True  # a lone job asks for its spec's GPUs, cores and memory

    def request(self, job: Job, view: View) -> Request:
        """A lone job's request (built once: it never changes)."""
        req = job.extra.get("proportional_request")
        if req is None:
            sp = job.spec
            req = job.extra["proportional_request"] = Request((job,), sp.gpus, sp.cpus, sp.mem_mb)
        return req

    def __init__(self) -> None:
        self._groups: dict[tuple[Job, ...], Request] = {}

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        out = []
        groups = self._groups
        for unit in units:
            if len(unit) == 1:
                # a lone job's request never changes: build it once (hot path)
                j = unit[0]
                req = j.extra.get("proportional_request")
                if req is None:
                    req = j.extra["proportional_request"] = Request((j,), j.spec.gpus, j.spec.cpus, j.spec.mem_mb)
                out.append(req)
            else:
                # a group's request is a function of its jobs (in order) alone: built once while the
                # group lasts, so its key is computed once too (groups last many rounds)
                unit = tuple(unit)
                req = groups.get(unit)
                if req is None:
                    if len(groups) >= _GROUPS_KEPT:
                        groups.clear()
                    j = unit[0]
                    req = groups[unit] = Request(unit, max(m.spec.gpus for m in unit), j.spec.cpus, j.spec.mem_mb)
                out.append(req)
        return out
