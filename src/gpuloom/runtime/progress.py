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
and any partial last line, and starting over if the file is truncated).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "GPULOOM_PROGRESS"


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


class ProgressTail:
    """Follows one log file and collects its progress points."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time, start_at_end: bool = False) -> None:
        self.path = Path(path)
        self.clock = clock
        self.points: list[Point] = []
        self.bad_lines = 0
        self._offset = 0
        self._partial = b""
        if start_at_end and self.path.exists():
            self._offset = self.path.stat().st_size

    def read(self) -> list[Point]:
        """New points since the last call (none if the file does not exist yet)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:  # truncated or replaced: start over
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        now = self.clock()
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        new: list[Point] = []
        for raw in chunks:
            if MARKER.encode() not in raw:
                continue
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
        self.points.extend(new)
        return new

    @property
    def latest(self) -> Point | None:
        return self.points[-1] if self.points else None

    def throughput(self, window_s: float | None = None, since: float | None = None) -> float | None:
        """Iterations per second (see :func:`rate`), optionally only from points at or after ``since``."""
        pts = self.points if since is None else [p for p in self.points if p.t >= since]
        return rate(pts, window_s)

    def samples_per_s(self, window_s: float | None = None) -> float | None:
        return rate(self.points, window_s, "samples")
