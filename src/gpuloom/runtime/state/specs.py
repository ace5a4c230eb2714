"""Job specs in the service: parsing the API's fields, and a stored spec as a :class:`JobSpec`.

``parse_mem`` and ``parse_duration`` read what users write (``8G``, ``8Gi``, ``1:30:00``).
Memory units are exact: ``K``/``M``/``G``/``T`` are powers of 1000, ``Ki``/``Mi``/``Gi``/``Ti``
powers of 1024, and the service counts memory in MB of 10^6 bytes for jobs, nodes
(``--mem-gb-per-node 64`` = 64 000 MB) and cgroup limits alike;
:func:`job_spec` turns a stored row into the :class:`~gpuloom.core.job.JobSpec`
the scheduler sees: the job's work estimate (``duration``) is ``iterations x
iteration_time`` when the spec gives both (what the simulator calls a job's
work), else its time limit, else ``default_duration``; the fields in
:data:`SPEC_ATTRS` reach the policies as ``JobSpec.attrs`` (priority, Muri stage
times, elastic curves, the queue); an inline ``profile`` record becomes ``JobSpec.profile``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

from ...core.job import JobSpec
from ...perf.profile_record import is_record, profile_from_record
from .store import JobRow

DEFAULT_DURATION = 3600.0
MAX_DURATION = 10 * 365 * 86400.0  # time limits beyond ten years are typos  # work estimate (s) for jobs without a time limit
#: job-spec fields passed to policies as ``JobSpec.attrs`` (priority, Muri stage times, elastic curves,
#: the GPU type asked for)
SPEC_ATTRS = ("priority", "batch_size", "throughput", "min_gpus", "resource_times", "iteration_time", "queue",
              "gpu_type", "reservation")

#: a GPU type a job may ask for: a product name (``v100``, ``A100``, ``rtx3090``), alternatives joined by ``|``
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\- ]{0,62}(\|[A-Za-z0-9][A-Za-z0-9_.\- ]{0,62}){0,7}$")
_GRES = re.compile(r"^(?:gpu:)?(?:([A-Za-z][A-Za-z0-9_.\-]{0,62}):)?([0-9]{1,6})$")


def parse_gres(value: Any, where: str = "gpus") -> tuple[str | None, int]:
    """``(GPU type or None, count)`` from Slurm's forms: ``2``, ``v100:2`` (``--gpus``), ``gpu:v100:2``
    (``--gres``).  Raises ``ValueError`` naming ``where``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a GPU count or TYPE:COUNT (e.g. v100:2), got {value!r}")
    if isinstance(value, int):
        return None, value
    m = _GRES.match(str(value).strip())
    if m is None:
        raise ValueError(f"{where}: expected a GPU count or TYPE:COUNT (e.g. 2, v100:2, gpu:v100:2), "
                         f"got {str(value)[:40]!r}")
    return m.group(1), int(m.group(2))


def job_spec(row: JobRow, epoch: float, default_duration: float = DEFAULT_DURATION, profile: Any = None,
             arrival: float | None = None) -> JobSpec:
    """The scheduler's view of a stored job; ``arrival`` in service time (default: seconds from ``epoch``
    to its submission)."""
    s: Mapping[str, Any] = row.spec
    attrs = {k: s[k] for k in SPEC_ATTRS if s.get(k) is not None}
    if profile is None and is_record(s.get("profile")):
        profile = profile_from_record(profile_key(s), s["profile"])
    kw: dict[str, Any] = {"model": str(s.get("model") or ""), "user": row.user, "cpus": s.get("cpus"),
                          "mem_mb": s.get("mem_mb"), "profile": profile, "attrs": attrs}
    if arrival is None:
        arrival = max(0.0, row.submit_time - epoch)
    iters, it = s.get("iterations"), s.get("iteration_time")
    if iters and it:
        return JobSpec.from_iterations(str(row.id), arrival, int(s["gpus"]), int(iters), float(it), **kw)
    return JobSpec(str(row.id), arrival, int(s["gpus"]), float(s.get("time_limit") or default_duration), **kw)


def profile_key(spec: Mapping[str, Any]) -> str:
    """The key a job's profile goes by: ``<model or name>/<gpus>gpu`` (the service's ``profiles`` table)."""
    return f"{spec.get('model') or spec.get('name') or 'job'}/{int(spec['gpus'])}gpu"


#: memory units: decimal (SI) and binary (IEC), in bytes; the service's MB is 10^6 bytes, for jobs and nodes alike
MEM_UNITS = {"": 10**6, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
BYTES_PER_MB = 10**6
_MEM_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]I?)?B?\s*$", re.IGNORECASE)


def parse_mem_bytes(value: Any, where: str = "mem") -> int:
    """Bytes from ``"8G"`` (10^9), ``"8Gi"`` (2^30), ``"512M"``, ``"1.5T"``, ``"64KiB"`` or a number of MB
    (10^6 bytes), exactly (decimal arithmetic, rounded up to a whole byte).  Booleans are refused."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a size like 8G or a number of MB, got {value!r}")
    if isinstance(value, int):
        d = Decimal(value)
        unit = ""
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: must be a finite size, got {value}")
        d = Decimal(repr(value))
        unit = ""
    else:
        m = _MEM_RE.match(str(value))
        if m is None:
            raise ValueError(f"{where}: expected a size like 8G, 8Gi, 512M or a number of MB, got {str(value)[:40]!r}")
        d = Decimal(m.group(1))
        unit = (m.group(2) or "").upper()
    if d < 0:
        raise ValueError(f"{where}: must be >= 0, got {value!r}")
    exact = d * MEM_UNITS[unit]
    if exact > 10**21:  # a zettabyte: nothing real
        raise ValueError(f"{where}: {str(value)[:40]!r} is too large")
    return int(exact.to_integral_value(rounding=ROUND_CEILING))


def parse_mem(value: Any, where: str = "mem") -> int:
    """MB (10^6 bytes, rounded up) from what :func:`parse_mem_bytes` reads: ``"8G"`` -> 8000,
    ``"8Gi"`` -> 8590, ``2048`` -> 2048.  Raises ``ValueError`` naming ``where``."""
    b = parse_mem_bytes(value, where)
    return -(-b // BYTES_PER_MB)


def parse_duration(value: Any, where: str = "time_limit") -> float:
    """Seconds from a number or a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) or ``90s/10m/2h/1d``."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected seconds or a time like 1:30:00, not a boolean")
    if isinstance(value, int | float):
        try:
            v = float(value)
        except OverflowError:
            v = math.inf
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
        except (ValueError, OverflowError):
            raise ValueError(f"{where}: expected seconds or a time like 30:00, 1:30:00, 2-00:00:00 or 2h, "
                             f"got {str(value)[:40]!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be a finite number of seconds > 0, got {str(value)[:40]!r}")
    if v > MAX_DURATION:
        raise ValueError(f"{where}: at most {MAX_DURATION / 86400:.0f} days, got {str(value)[:40]!r}")
    return v
