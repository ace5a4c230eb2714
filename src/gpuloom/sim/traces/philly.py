"""``philly``: Sia's processed Microsoft Philly job list (``sia/philly_jobs.csv``).

Columns ``timestamp,duration,num_gpus,gpu_time,cluster``.  The wall-clock
``timestamp`` (the file is not sorted) becomes seconds since the earliest
submission (``Trace.meta["origin"]``); ids are ``philly-<k>`` with ``k`` the
0-based data row in file order; ``attrs["cluster"]`` is the virtual cluster,
and ``attrs["queue"]`` too: each virtual cluster is a queue under the queue
stage (:mod:`gpuloom.policies.queues`).
``gpu_time`` is always ``duration * num_gpus`` in the file and is not kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime
from operator import itemgetter
from pathlib import Path

from ...core.job import JobSpec
from .fields import Builder, Header, Trace, TraceError, Where, check_width, first_row, float_field, int_field, read_rows
from .formats import FORMATS


@FORMATS.register("philly")
def read_philly(path: str | Path) -> Trace:
    """Sia's processed Philly job list (``timestamp,duration,num_gpus,gpu_time,cluster``)."""
    return philly_trace(path, philly_columns(path))


#: what :func:`philly_columns` reads of a file, in file order: each job's arrival (seconds since ``origin``),
#: duration, GPUs and virtual cluster, and ``origin`` (the earliest submission, ``None`` with no rows);
#: plain lists and a string, cheap to send to another process
Read = tuple[list[float], list[float], list[int], list[str], str | None]


def philly_columns(path: str | Path) -> Read:
    """The columns of a Philly list (:data:`Read`), every field checked: a malformed file raises the
    :class:`TraceError` :func:`read_philly` raises.  (:func:`philly_trace` makes the jobs of them.)"""
    p = Path(path)
    w = Where(p)
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ("timestamp", "duration", "num_gpus", "cluster"), w)
    # the biggest trace: each column converted at once; a file the bulk conversion cannot take is read
    # again row by row, which names the first bad line and field
    try:
        columns = _bulk(list(rows), h)
    except TraceError:  # (malformed further on: row by row, an earlier bad field is named first)
        columns = None
    stamps, durs, gpus, clusters = columns or _checked(read_rows(p, w), h, w)
    if not stamps:
        return [], durs, gpus, clusters, None
    origin = min(stamps)
    return [(t - origin).total_seconds() for t in stamps], durs, gpus, clusters, origin.isoformat(sep=" ")


def philly_trace(path: str | Path, read: Read) -> Trace:
    """The :class:`Trace` of a Philly list from its columns (:func:`philly_columns`)."""
    arrivals, durs, gpus, clusters, origin = read
    b = Builder(Path(path), "philly")
    b.rows = len(arrivals)
    if origin is None:
        return b.done()
    # ids are unique by construction and every field was checked; one attrs mapping per virtual cluster, shared
    # by its jobs (a job's attrs are read, never written)
    attrs = {c: {"cluster": c, "queue": c} for c in set(clusters)}
    b.jobs = JobSpec.from_columns([f"philly-{k}" for k in range(len(arrivals))], arrivals, gpus, durs,
                                  list(map(attrs.__getitem__, clusters)))
    return b.done(origin=origin)


Columns = tuple[list[datetime], list[float], list[int], list[str]]


def _bulk(data: list[list[str]], h: Header) -> Columns | None:
    """The columns of ``data``, each converted in one pass; None if a row is not as every valid row is."""
    if any(len(row) != h.width for row in data):
        return None
    it, id_, ig, ic = h.pos["timestamp"], h.pos["duration"], h.pos["num_gpus"], h.pos["cluster"]
    try:
        stamps = list(map(datetime.fromisoformat, map(itemgetter(it), data)))
        durs = list(map(float, map(itemgetter(id_), data)))
        gpus = list(map(int, map(itemgetter(ig), data)))
    except ValueError:
        return None
    inf = math.inf
    if not all(0 < d < inf for d in durs) or min(gpus, default=1) < 1:
        return None
    return stamps, durs, gpus, list(map(itemgetter(ic), data))


def _checked(rows: Iterator[list[str]], h: Header, w: Where) -> Columns:
    """The columns, row by row, every cell checked: a malformed row raises a TraceError naming its line."""
    next(rows)  # the header
    it, id_, ig, ic = h.pos["timestamp"], h.pos["duration"], h.pos["num_gpus"], h.pos["cluster"]
    stamps: list[datetime] = []
    durs: list[float] = []
    gpus: list[int] = []
    clusters: list[str] = []
    fromiso = datetime.fromisoformat
    width = h.width
    inf = math.inf
    for row in rows:
        if len(row) != width:
            check_width(row, width, w)
        try:
            ts, dur, g = fromiso(row[it]), float(row[id_]), int(row[ig])
            if not 0 < dur < inf or g < 1:
                raise ValueError
        except ValueError:
            try:
                ts = fromiso(row[it])
            except ValueError:
                raise w.error("timestamp", f"expected a date-time like 2017-10-09 07:01:55, got {row[it]!r}") from None
            dur = float_field(row[id_], "duration", w, positive=True)
            g = int_field(row[ig], "num_gpus", w)
        stamps.append(ts)
        durs.append(dur)
        gpus.append(g)
        clusters.append(row[ic])
    return stamps, durs, gpus, clusters
