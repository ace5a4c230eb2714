"""The progress protocol: how a job tells gpuloom how fast it runs.

A job prints, on stdout or stderr (both go to its log), lines of the form::

    GPULOOM_PROGRESS iter=120
    GPULOOM_PROGRESS iter=130 samples=4160 t=1732172400.25 loss=0.731

* the line starts with ``GPULOOM_PROGRESS`` followed by space-separated
  ``key=value`` fields; anything else in the log is ignored;
* ``iter`` (required, integer >= 0) counts the job's training iterations
  *since its very first start*: after a checkpoint/resume it continues from the
  restored value, so ``iter`` is also how much work is done;
* ``samples`` (optional, integer) counts samples the same way;
* ``t`` (optional, Unix seconds, float) is when the line was printed.  Without
  it the reader uses the time it read the line, which is only as good as the
  job's output buffering and the reader's polling allow - print ``t`` (and
  flush) to get exact rates;
* any other field (``loss=``, ``epoch=``...) is kept as text.

Throughput is iterations per second over a window: with the points
``(t_i, iter_i)`` seen in the last ``window_s`` seconds, ``(iter_last -
iter_first) / (t_last - t_first)``.  A drop of ``iter`` (the job restarted from
an older checkpoint) starts a new segment; rates never span segments.

:class:`ProgressTail` follows a log file incrementally (remembering its offset
and any partial last line, and starting over if the file is truncated) and keeps at most
``max_points`` points (halving them when over); :func:`scan` reads the points of a part of a log
once.  Both read a chunk at a time (:mod:`.joblogs`: offsets survive a cut of the log); a partial
line longer than :data:`MAX_LINE` is dropped, never buffered (a progress line is short).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import joblogs

log = logging.getLogger(__name__)

MARKER = "GPULOOM_PROGRESS"
_MARK = MARKER.encode()
MAX_LINE = 4096  # longer lines are not progress lines: dropped unread
MAX_POINTS = 100_000  # points a tail keeps (halved when over)


class ProgressError(ValueError):
    """A malformed progress line; the message quotes it."""


@dataclass(frozen=True, slots=True)
class Progress:
    iter: int
    t: float | None = None  # when the job printed it (field ``t``), if it said
    samples: int | None = None
    fields: dict[str, str] = field(default_factory=dict)


def parse_line(line: str) -> Progress | None:
    """The progress point in ``line``; None if it is not a progress line.

    Raises :class:`ProgressError` for a progress line with a missing or bad ``iter``/``samples``/``t``.
    """
    s = line.strip()
    if not s.startswith(MARKER):
        return None
    rest = s[len(MARKER):]
    if rest and not rest[0].isspace():
        return None  # e.g. GPULOOM_PROGRESSIVE
    kv: dict[str, str] = {}
    for tok in rest.split():
        k, eq, v = tok.partition("=")
        if not eq or not k:
            raise ProgressError(f"{line.strip()!r}: field {tok!r} is not key=value")
        kv[k] = v
    if "iter" not in kv:
        raise ProgressError(f"{line.strip()!r}: no iter= field")
    try:
        it = int(kv.pop("iter"))
        samples = int(kv.pop("samples")) if "samples" in kv else None
        t = float(kv.pop("t")) if "t" in kv else None
    except ValueError as e:
        raise ProgressError(f"{line.strip()!r}: {e}") from None
    if it < 0 or (samples is not None and samples < 0) or (t is not None and not math.isfinite(t)):
        raise ProgressError(f"{line.strip()!r}: iter and samples must be >= 0, t finite")
    return Progress(it, t, samples, kv)


@dataclass(frozen=True, slots=True)
class Point:
    t: float
    iter: int
    samples: int | None


def rate(points: list[Point], window_s: float | None = None, attr: str = "iter") -> float | None:
    """Units per second over the last ``window_s`` seconds of the latest segment; None with < 2 usable points."""
    if len(points) < 2:
        return None
    seg_start = 0
    for i in range(1, len(points)):
        if points[i].iter < points[i - 1].iter:
            seg_start = i
    seg = points[seg_start:]
    if window_s is not None:
        t_end = seg[-1].t
        seg = [p for p in seg if p.t >= t_end - window_s]
    if attr == "samples":
        seg = [p for p in seg if p.samples is not None]
    if len(seg) < 2:
        return None
    dt = seg[-1].t - seg[0].t
    if dt <= 0:
        return None
    first, last = getattr(seg[0], attr), getattr(seg[-1], attr)
    return (last - first) / dt


class _Lines:
    """Splits a log, fed a chunk at a time, into its complete lines that hold the progress marker.

    The partial line carried between chunks is at most :data:`MAX_LINE` bytes: a longer one is
    dropped up to its end."""

    __slots__ = ("partial", "skipping")

    def __init__(self) -> None:
        self.partial = b""
        self.skipping = False  # inside a line too long to keep

    def feed(self, data: bytes) -> list[bytes]:
        buf = self.partial + data if self.partial else data
        self.partial = b""
        begin = 0
        if self.skipping:
            i = buf.find(b"\n")
            if i < 0:
                return []
            begin, self.skipping = i + 1, False
        last = buf.rfind(b"\n", begin)
        out: list[bytes] = []
        if last >= 0:
            at = buf.find(_MARK, begin, last)
            while at >= 0:
                first = max(begin, buf.rfind(b"\n", begin, at) + 1)
                end = buf.find(b"\n", at, last + 1)
                if end - first <= MAX_LINE:
                    out.append(buf[first:end])
                at = buf.find(_MARK, end + 1, last)
            begin = last + 1
        if len(buf) - begin > MAX_LINE:
            self.skipping = True
        else:
            self.partial = buf[begin:]
        return out


def _thin(points: list[Point], most: int) -> list[Point]:
    """Every other point (and the last) once there are more than ``most``."""
    if len(points) <= most:
        return points
    kept = points[::2]
    if kept[-1] is not points[-1]:
        kept.append(points[-1])
    return kept


def scan(path: str | Path, start: int = 0) -> Iterator[Progress]:
    """The progress points of the log from logical offset ``start`` to its current end, in order
    (a chunk at a time; malformed lines skipped).  Not thinned: the caller keeps what it needs."""
    end = joblogs.logical_size(path)
    if end is None:
        return
    lines = _Lines()
    at = start
    while at < end:
        data, at = joblogs.read(path, at, joblogs.BULK, end)
        if not data:
            break
        for raw in lines.feed(data):
            try:
                p = parse_line(raw.decode("utf-8", "replace"))
            except ProgressError:
                continue
            if p is not None:
                yield p


class ProgressTail:
    """Follows one log file and collects its progress points."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time, start_at_end: bool = False,
                 max_points: int = MAX_POINTS) -> None:
        self.path = Path(path)
        self.clock = clock
        self.max_points = max_points
        self.points: list[Point] = []
        self.bad_lines = 0
        self._offset = 0  # logical (see :mod:`.joblogs`)
        self._lines = _Lines()
        if start_at_end:
            self._offset = joblogs.logical_size(self.path) or 0

    def read(self) -> list[Point]:
        """New points since the last call (none if the file does not exist yet), read a chunk at a time."""
        end = joblogs.logical_size(self.path)
        if end is None:
            return []
        if end < self._offset:  # truncated or replaced: start over
            self._offset, self._lines = 0, _Lines()
        new: list[Point] = []
        while self._offset < end:
            data, self._offset = joblogs.read(self.path, self._offset, joblogs.BULK, end)
            if not data:
                break
            now = self.clock()
            for raw in self._lines.feed(data):
                line = raw.decode("utf-8", "replace")
                try:
                    p = parse_line(line)
                except ProgressError as e:
                    self.bad_lines += 1
                    if self.bad_lines == 1:
                        log.warning("%s: ignoring malformed progress line: %s", self.path, e)
                    continue
                if p is not None:
                    new.append(Point(p.t if p.t is not None else now, p.iter, p.samples))
            new = _thin(new, self.max_points)
        self.points.extend(new)
        self.points = _thin(self.points, self.max_points)
        return new

    @property
    def latest(self) -> Point | None:
        return self.points[-1] if self.points else None

    def throughput(self, window_s: float | None = None, since: float | None = None) -> float | None:
        """Iterations per second (see :func:`rate`), optionally only from points at or after ``since``."""
        pts = self.points if since is None else [p for p in self.points if p.t >= since]
        return rate(pts, window_s)
