"""What users write for sizes, times and GPUs, read into the units jobs are kept in.

``parse_mem`` (MB of 10^6 bytes: ``8G`` = 8000, ``8Gi`` = 8590), ``parse_time_limit``
(seconds, Slurm's rule: a bare number is minutes), ``parse_duration`` (other
durations: a bare number is seconds), ``parse_wall_time`` (a moment: ISO, Unix seconds, ``now+1h``, ``2h``),
``parse_gres`` (``v100:2``).  Each raises ``ValueError`` naming the field it was given.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

MAX_DURATION = 10 * 365 * 86400.0  # time limits beyond ten years are typos

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


def parse_time_limit(value: Any, where: str = "time_limit") -> float:
    """Seconds from a job's time limit by Slurm's rule, the same from every entry point: a bare number is
    minutes (``60``, ``1.5``, ``"60"``); else ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]`` or ``90s/10m/2h/1d``.
    Raises ``ValueError`` naming ``where``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            v = float(value) * 60.0
        except OverflowError:
            v = math.inf
        return _checked_seconds(v, value, where)
    return parse_duration(value, where)


def parse_duration(value: Any, where: str = "time_limit") -> float:
    """Seconds from a number of seconds or a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``)
    or ``90s/10m/2h/1d``.  Job time limits use :func:`parse_time_limit` (a bare number is minutes there)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a time like 1:30:00 or 2h, not a boolean")
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
            raise ValueError(f"{where}: expected minutes or a time like 30:00, 1:30:00, 2-00:00:00, 90s or 2h, "
                             f"got {str(value)[:40]!r}") from None
    return _checked_seconds(v, value, where)


_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$", re.IGNORECASE)
_NOW = re.compile(r"^now\s*(?:([+-])\s*(.+))?$", re.IGNORECASE)
_SPAN_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_wall_time(value: Any, now: float, where: str = "time", direction: int = 1) -> float:
    """Wall seconds (Unix time) from what users write for a moment: Unix seconds (``1732172400``), an ISO
    date/time (``2026-01-31``, ``2026-01-31T09:30``, ``...Z``; UTC unless it says), ``now``, ``now+D`` /
    ``now-D`` / ``+D`` (``D`` as :func:`parse_duration` reads it, or weeks: ``1w``), or a bare duration with a
    unit (``90m``, ``2h``, ``7d``), which is that long after ``now`` when ``direction`` is 1 (a start) and
    before it when -1 (an age: ``--since 2h``).  Raises ``ValueError`` naming ``where`` and the value."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be 1 or -1, got {direction!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        v = float(value)
    elif isinstance(value, str):
        s = value.strip()
        m = _NOW.match(s)
        rel = (m.group(1), m.group(2)) if m else ("+", s[1:]) if s.startswith("+") else None
        if rel is not None:
            return now if rel[1] is None else now + (1 if rel[0] == "+" else -1) * _span(rel[1], value, where)
        if _AGE.match(s):
            return now + direction * _span(s, value, where)
        try:
            v = float(s)
        except ValueError:
            try:
                d = datetime.fromisoformat(s)
            except ValueError:
                raise _bad_time(value, where) from None
            return (d if d.tzinfo is not None else d.replace(tzinfo=UTC)).timestamp()
    else:
        raise _bad_time(value, where)
    if not math.isfinite(v):
        raise ValueError(f"{where}: must be a finite time, got {str(value)[:40]!r}")
    return v


def _span(text: str, value: Any, where: str) -> float:
    """Seconds of a relative time's duration (``2h``, ``1w``, ``1:30:00``)."""
    m = _AGE.match(text.strip())
    if m:
        return float(m.group(1)) * _SPAN_UNIT[m.group(2).lower()]
    try:
        return parse_duration(text, where)
    except ValueError:
        raise _bad_time(value, where) from None


def _bad_time(value: Any, where: str) -> ValueError:
    return ValueError(f"{where}: expected an ISO date/time (2026-01-31T09:30), Unix seconds, now, now+DURATION "
                      f"(now+1h) or a duration like 2h or 7d, got {str(value)[:40]!r}")


def _checked_seconds(v: float, value: Any, where: str) -> float:
    """``v`` (seconds read from ``value``) if finite, > 0 and at most :data:`MAX_DURATION`."""
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be a finite time > 0, got {str(value)[:40]!r}")
    if v > MAX_DURATION:
        raise ValueError(f"{where}: at most {MAX_DURATION / 86400:.0f} days, got {str(value)[:40]!r}")
    return v
