"""Job specs in the service: parsing the API's fields, and a stored spec as a :class:`JobSpec`.

``parse_mem`` and ``parse_duration`` read what users write (``8G``, ``1:30:00``);
:func:`job_spec` turns a stored row into the :class:`~gpuloom.core.job.JobSpec`
the scheduler sees: the job's work estimate (``duration``) is ``iterations x
iteration_time`` when the spec gives both (what the simulator calls a job's
work), else its time limit, else ``default_duration``; the fields in
:data:`SPEC_ATTRS` reach the policies as ``JobSpec.attrs`` (priority, Muri stage
times, elastic curves); an inline ``profile`` record becomes ``JobSpec.profile``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..core.job import JobSpec
from ..perf.profile_record import is_record, profile_from_record
from .store import JobRow

DEFAULT_DURATION = 3600.0  # work estimate (s) for jobs without a time limit
#: job-spec fields passed to policies as ``JobSpec.attrs`` (priority, Muri stage times, elastic curves)
SPEC_ATTRS = ("priority", "batch_size", "throughput", "min_gpus", "resource_times", "iteration_time")


def job_spec(row: JobRow, epoch: float, default_duration: float = DEFAULT_DURATION, profile: Any = None) -> JobSpec:
    """The scheduler's view of a stored job; arrival in service time (seconds since ``epoch``)."""
    s: Mapping[str, Any] = row.spec
    attrs = {k: s[k] for k in SPEC_ATTRS if s.get(k) is not None}
    if profile is None and is_record(s.get("profile")):
        profile = profile_from_record(profile_key(s), s["profile"])
    kw: dict[str, Any] = {"model": str(s.get("model") or ""), "user": row.user, "cpus": s.get("cpus"),
                          "mem_mb": s.get("mem_mb"), "profile": profile, "attrs": attrs}
    arrival = max(0.0, row.submit_time - epoch)
    iters, it = s.get("iterations"), s.get("iteration_time")
    if iters and it:
        return JobSpec.from_iterations(str(row.id), arrival, int(s["gpus"]), int(iters), float(it), **kw)
    return JobSpec(str(row.id), arrival, int(s["gpus"]), float(s.get("time_limit") or default_duration), **kw)


def profile_key(spec: Mapping[str, Any]) -> str:
    """The key a job's profile goes by: ``<model or name>/<gpus>gpu`` (the service's ``profiles`` table)."""
    return f"{spec.get('model') or spec.get('name') or 'job'}/{int(spec['gpus'])}gpu"


def parse_mem(value: Any, where: str = "mem") -> int:
    """``"8G"``/``"512M"``/``"1.5T"``/``2048`` (MB) → MB.  Raises ``ValueError`` naming ``where``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a size like 8G or a number of MB, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{where}: must be >= 0 MB, got {value}")
        return int(value)
    s = str(value).strip().upper().removesuffix("B")
    mult = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    try:
        if s and s[-1] in mult:
            v = float(s[:-1]) * mult[s[-1]]
        else:
            v = float(s)
    except ValueError:
        raise ValueError(f"{where}: expected a size like 8G, 512M or a number of MB, got {value!r}") from None
    if v < 0 or not math.isfinite(v):
        raise ValueError(f"{where}: must be >= 0, got {value!r}")
    return int(v)


def parse_duration(value: Any, where: str = "time_limit") -> float:
    """Seconds from a number or a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) or ``90s/10m/2h/1d``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected seconds or a time like 1:30:00, got {value!r}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        s = str(value).strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            if s and s[-1].lower() in units and s[:-1].replace(".", "", 1).isdigit():
                v = float(s[:-1]) * units[s[-1].lower()]
            else:
                days = 0
                if "-" in s:
                    d, s = s.split("-", 1)
                    days = int(d)
                    fields = [int(x) for x in s.split(":")]
                    while len(fields) < 3:
                        fields.append(0)
                    h, m, sec = fields
                else:
                    fields = [int(x) for x in s.split(":")]
                    if len(fields) == 1:
                        h, m, sec = 0, fields[0], 0  # Slurm: a bare number is minutes
                    elif len(fields) == 2:
                        h, m, sec = 0, fields[0], fields[1]
                    elif len(fields) == 3:
                        h, m, sec = fields
                    else:
                        raise ValueError
                v = float(days * 86400 + h * 3600 + m * 60 + sec)
        except ValueError:
            raise ValueError(f"{where}: expected seconds or a time like 30:00, 1:30:00, 2-00:00:00 or 2h, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be > 0, got {value!r}")
    return v
