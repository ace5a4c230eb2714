"""The field toolkit every trace reader is built from.

A reader walks a file with :func:`read_rows` (the csv module splits; blank
lines are skipped; a :class:`Where` follows the 1-based line), finds its
columns with :class:`Header`, converts each cell with :func:`int_field`,
:func:`float_field` or :func:`str_field`, and hands the values to a
:class:`Builder`, which makes the :class:`JobSpec`, rejects duplicate ids and
returns the :class:`Trace`.  Every problem becomes a :class:`TraceError` that
names the file, the line and the field::

    trace.csv:17: field 'num_gpus': expected a positive integer, got 'x'
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.job import JobError, JobSpec
from ...core.parse import FieldError

__all__ = [
    "Builder",
    "Header",
    "Trace",
    "TraceError",
    "Where",
    "chain_first",
    "check_width",
    "first_row",
    "float_field",
    "int_field",
    "read_rows",
    "str_field",
]


class TraceError(FieldError):
    """A trace that cannot be read; the message names file, line and field.

    ``TraceError(message, path=None, line=None, field=None)``; ``str(e)`` is
    ``"<file name>:<line>: field '<field>': <message>"`` with the missing parts
    left out.  ``e.path``, ``e.line``, ``e.field`` and ``e.reason`` (the bare
    message) are kept.  A ``ValueError``.
    """


@dataclass(slots=True)
class Trace:
    """What one file held: the jobs (sorted by arrival) plus how it was read."""

    jobs: list[JobSpec]
    format: str
    path: str
    rows: int  # data rows read (blank lines and headers excluded)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped
    meta: dict[str, Any] = field(default_factory=dict)


class Where:
    """Where a reader is in a file (``path`` and the current 1-based ``line``); builds the errors."""

    __slots__ = ("path", "line")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.line = 0

    def error(self, field: str | None, message: str) -> TraceError:
        """A :class:`TraceError` at the current line (none before the first row) about ``field``."""
        return TraceError(message, self.path, self.line or None, field)


def int_field(s: str, name: str, w: Where, *, low: int = 1) -> int:
    """Cell ``s`` of field ``name`` as an integer ``>= low`` (``"4"`` and ``"4.0"`` are 4).

    Raises ``<file>:<line>: field '<name>': expected a positive integer, got 'x'``
    (``an integer >= <low>`` when ``low`` is not 1).
    """
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    try:
        v = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise w.error(name, f"expected {what}, got {s!r}") from None
        if not f.is_integer():
            raise w.error(name, f"expected {what}, got {s!r}") from None
        v = int(f)
    if v < low:
        raise w.error(name, f"expected {what}, got {s!r}")
    return v


def float_field(s: str, name: str, w: Where, *, positive: bool = False) -> float:
    """Cell ``s`` of field ``name`` as a finite number ``>= 0`` (``> 0`` when ``positive``).

    Raises ``... field '<name>': expected a number >= 0, got '-1'`` (or ``> 0``);
    ``nan`` and ``inf`` are rejected.
    """
    what = "a number > 0" if positive else "a number >= 0"
    try:
        v = float(s)
    except ValueError:
        raise w.error(name, f"expected {what}, got {s!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise w.error(name, f"expected {what}, got {s!r}")
    return v


def str_field(s: str, name: str, w: Where) -> str:
    """Cell ``s`` of field ``name``, stripped; ``... field '<name>': must not be empty`` if blank."""
    s = s.strip()
    if not s:
        raise w.error(name, "must not be empty")
    return s


def read_rows(path: Path, w: Where, delimiter: str = ",") -> Iterator[list[str]]:
    """The non-blank rows of a delimited UTF-8 file (a BOM is dropped); ``w.line`` follows the reader.

    A file that cannot be opened (``cannot open: ...``), malformed quoting
    (``malformed CSV: ...``) or bytes that are not UTF-8 raise :class:`TraceError`.
    """
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", path) from None
    with f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            for row in reader:
                w.line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                yield row
        except csv.Error as e:
            w.line = reader.line_num
            raise w.error(None, f"malformed CSV: {e}") from None
        except UnicodeDecodeError:
            raise w.error(None, "not a UTF-8 text file") from None


class Header:
    """Column positions from a header row: ``names`` (stripped), ``pos`` (name -> index), ``width``.

    Raises ``<file>:<line>: header lacks column(s) a, b; has x, y`` when a
    ``required`` column is missing.
    """

    def __init__(self, row: Sequence[str], required: Iterable[str], w: Where) -> None:
        self.names = [c.strip() for c in row]
        self.pos = {c: i for i, c in enumerate(self.names)}
        missing = [c for c in required if c not in self.pos]
        if missing:
            raise w.error(None, f"header lacks column(s) {', '.join(missing)}; has {', '.join(self.names)}")
        self.width = len(self.names)


def first_row(rows: Iterator[list[str]], path: Path) -> list[str]:
    """The first non-blank row (a header, usually); ``<file>: empty file`` if there is none."""
    row = next(rows, None)
    if row is None:
        raise TraceError("empty file", path)
    return row


def chain_first(first: list[str], rest: Iterator[list[str]]) -> Iterator[list[str]]:
    """``first`` then ``rest``: puts back a first row that turned out to be data."""
    yield first
    yield from rest


def check_width(row: Sequence[str], width: int, w: Where) -> None:
    """``<file>:<line>: expected <width> fields, got <n>`` unless ``row`` has ``width`` cells."""
    if len(row) != width:
        raise w.error(None, f"expected {width} fields, got {len(row)}")


class Builder:
    """Collects one file's jobs; checks duplicate ids; turns :class:`JobSpec`'s own checks into TraceErrors.

    ``rows`` counts data rows (a reader increments it), :meth:`skip` counts rows
    left out by reason, :meth:`done` returns the :class:`Trace` (jobs sorted by
    arrival, ties in file order) or raises ``empty trace`` when no job was made.
    """

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        self.jobs: list[JobSpec] = []
        self.lines: dict[str, int] = {}
        self.rows = 0
        self.skipped: dict[str, int] = {}

    def add(self, w: Where, make: Callable[..., JobSpec], *args: Any, **kw: Any) -> None:
        """``make(*args, **kw)`` (``JobSpec`` or one of its constructors) as the job of line ``w.line``.

        A :class:`~gpuloom.core.job.JobError` becomes a TraceError at that line; an
        id seen before is ``field 'id': duplicate job id 'x' (first on line N)``.
        """
        try:
            spec = make(*args, **kw)
        except JobError as e:
            raise w.error(None, str(e)) from None
        first = self.lines.setdefault(spec.id, w.line)
        if first != w.line:
            raise w.error("id", f"duplicate job id {spec.id!r} (first on line {first})")
        self.jobs.append(spec)

    def skip(self, reason: str) -> None:
        """Count one row left out for ``reason`` (reported in ``Trace.skipped``)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def done(self, **meta: Any) -> Trace:
        """The :class:`Trace`, with ``meta``; an error if there are no jobs (saying what was skipped)."""
        if not self.jobs:
            why = f" ({', '.join(f'{n} {r}' for r, n in self.skipped.items())} skipped)" if self.skipped else ""
            what = "no data rows" if self.rows == 0 else "no jobs"
            raise TraceError(f"empty trace: {what}{why}", self.path)
        jobs = sorted(self.jobs, key=lambda j: j.arrival)
        return Trace(jobs, self.fmt, str(self.path), self.rows, dict(self.skipped), dict(meta))
