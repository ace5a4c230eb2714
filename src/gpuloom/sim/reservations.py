"""A reservation calendar for the simulator (``gpuloom simulate --reservations cal.csv``).

CSV with a header: ``name,start,duration,users,nodes,gpus``.  ``start`` and ``duration`` are seconds
of simulated time; ``users`` the trace's users whose jobs may use the reservation, and ``nodes`` node
names, each list separated by ``;`` (or by commas inside a quoted field); give ``nodes`` or ``gpus`` (a
count), not both.  A bad row is refused naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from ..core.cluster import Cluster
from ..core.reservations import Reservation, ReservationError, check_overlaps

COLUMNS = ("name", "start", "duration", "users", "nodes", "gpus")
_SPLIT = re.compile(r"[;,\s]+")


def _items(text: str) -> tuple[str, ...]:
    return tuple(x for x in _SPLIT.split(text.strip()) if x)


def _number(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ReservationError(f"{where}: expected seconds (a number), got {text[:40]!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ReservationError(f"{where}: expected seconds >= 0, got {text[:40]!r}")
    return v


def load_calendar(path: Path, cluster: Cluster) -> list[Reservation]:
    """The reservations of a calendar file, checked against ``cluster`` and each other."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ReservationError(f"{path}: cannot read it: {e.strerror or e}") from None
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    if header is None or [h.strip() for h in header] != list(COLUMNS):
        raise ReservationError(f"{path}:1: the header must be {','.join(COLUMNS)}, got {','.join(header or [])!r}")
    out: list[Reservation] = []
    for line, row in enumerate(rows, start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(COLUMNS):
            raise ReservationError(f"{path}:{line}: expected {len(COLUMNS)} fields ({','.join(COLUMNS)}), "
                                   f"got {len(row)}")
        f = dict(zip(COLUMNS, (x.strip() for x in row), strict=True))
        start = _number(f["start"], f"{path}:{line}: start")
        duration = _number(f["duration"], f"{path}:{line}: duration")
        gpus = 0
        if f["gpus"]:
            try:
                gpus = int(f["gpus"])
            except ValueError:
                raise ReservationError(f"{path}:{line}: gpus: expected a whole number, got {f['gpus'][:40]!r}") from None
        try:
            r = Reservation(f["name"], start, start + duration, frozenset(_items(f["users"])), _items(f["nodes"]), gpus)
            r.check(cluster)
        except ReservationError as e:
            raise ReservationError(f"{path}:{line}: {e}") from None
        out.append(r)
    try:
        check_overlaps(out)
    except ReservationError as e:
        raise ReservationError(f"{path}: {e}") from None
    return out
