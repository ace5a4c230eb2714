"""Jobs' log files as the service reads them: bounded reads, a size cap, offsets that survive a cut.

A job writes its log itself (the executor hands it the file opened ``O_APPEND``); the service reads
it for ``/jobs/{id}/logs`` (tail and ``-f``), ``/jobs/{id}/progress``, progress tracking, the trace
export and profiling.  Every read here takes at most :data:`CHUNK` bytes at a time, whatever the log
holds (a job that prints a gigabyte without a newline costs the server one chunk).

**The cap** (:func:`cut`).  A log over its cap is cut in place: its first ``cap/8`` bytes (the job's
start-up output, up to a line end) stay, then a one-line note the job's owner sees::

    gpuloom: log over its cap of 268435456 bytes: 1073741824 bytes cut here

then its last ``cap/4`` bytes (from a line start), moved down; the file is truncated after them and
the job's later writes (``O_APPEND``) land at the new end.  The job keeps running.  A log is cut
back to about 3/8 of its cap, so the next cut comes after another 5/8 of it.  Moving the kept tail
in place needs no free space (on file systems that overwrite in place), so a cut works on a full
disk; a write the job makes between the cut's last size check and its truncation (a few
microseconds) is lost.

**Offsets.**  ``/logs?offset=``, ``X-Log-Offset`` and the service's progress offsets count the bytes
the job wrote (logical offsets), not positions in the file.  ``<log>.cut`` records what the last cut
left (:class:`Cut`): the head kept, the note's length and the logical offset of the first byte after
the note.  An offset taken before a cut means the same byte after it; one in the part cut away
reads on from the note.  Cuts and reads of the file take :data:`LOCK`, so a reader never sees a log
halfway through a cut (a crash halfway through one leaves the offsets of that log off).
"""

from __future__ import annotations

import codecs
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 16  # bytes read at a time for a client (``/logs`` streams)
BULK = 1 << 20  # bytes read at a time by a scan of a whole log (progress)
MIN_CAP = 1 << 16  # the smallest cap: head, note and tail must fit in it
NOTE = "gpuloom: log over its cap of {cap} bytes{why}: {cut} bytes cut here\n"
#: held while a log is cut, and while a reader maps offsets and reads (every reader is in the server's process)
LOCK = threading.Lock()
_RECORD_BYTES = 128  # the cut record is rewritten in place at this size: no new space needed on a full disk


@dataclass(frozen=True, slots=True)
class Cut:
    """Where the last cut left a log: ``head`` bytes kept as written, a ``note`` of that many bytes,
    then the rest of the file, whose first byte the job wrote at logical offset ``start``."""

    head: int
    note: int
    start: int

    def physical(self, at: int) -> int:
        """The file position of logical offset ``at`` (one in the part cut away: the note)."""
        if at <= self.head:
            return at
        if at < self.start:
            return self.head
        return self.head + self.note + (at - self.start)

    def logical(self, pos: int) -> int:
        """The logical offset of file position ``pos`` (one inside the note: the note's start)."""
        if pos <= self.head:
            return pos
        if pos < self.head + self.note:
            return self.head
        return self.start + (pos - self.head - self.note)


def _record_path(path: str | Path) -> str:
    return f"{os.fspath(path)}.cut"


def read_cut(path: str | Path) -> Cut | None:
    """The log's cut record, None if it was never cut (or the record is unreadable)."""
    try:
        fd = os.open(_record_path(path), os.O_RDONLY)
    except OSError:
        return None
    try:
        d = json.loads(os.read(fd, _RECORD_BYTES * 2))
        c = Cut(int(d["head"]), int(d["note"]), int(d["start"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)
    return c if 0 <= c.head <= c.start and c.note > 0 else None


def _write_cut(path: str | Path, c: Cut) -> None:
    text = json.dumps({"head": c.head, "note": c.note, "start": c.start}).encode()
    fd = os.open(_record_path(path), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.pwrite(fd, text.ljust(_RECORD_BYTES), 0)
    finally:
        os.close(fd)


def remove(path: str | Path) -> None:
    """Delete a log and its cut record."""
    for q in (os.fspath(path), _record_path(path)):
        try:
            os.unlink(q)
        except FileNotFoundError:
            pass


def _size(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def logical_size(path: str | Path) -> int | None:
    """How many bytes the job has written to its log (cut ones included); None without a log."""
    with LOCK:
        size = _size(path)
        if size is None:
            return None
        c = read_cut(path)
    return size if c is None else c.logical(size)


def read(path: str | Path, start: int, limit: int = CHUNK, end: int | None = None) -> tuple[bytes, int]:
    """At most ``limit`` bytes of the log from logical offset ``start`` (not past logical ``end``),
    and the logical offset after them.  Crossing a cut gives its note; a read never stops inside it."""
    with LOCK:
        c = read_cut(path)
        pos = start if c is None else c.physical(start)
        stop = None if end is None else (end if c is None else c.physical(end))
        n = limit if stop is None else min(limit, max(0, stop - pos))
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return b"", start
        try:
            data = os.pread(fd, n, pos) if n > 0 else b""
        finally:
            os.close(fd)
    if c is not None and pos < c.head < pos + len(data) < c.head + c.note:
        data = data[: c.head - pos]  # the next read takes the note whole
    after = pos + len(data) if c is None else c.logical(pos + len(data))
    return data, max(start, after)


def tail(path: str | Path, nbytes: int) -> bytes:
    """The log's last ``nbytes`` bytes as they are in the file (notes included)."""
    with LOCK:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return b""
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, min(nbytes, size), max(0, size - nbytes))
        finally:
            os.close(fd)


def span(path: str | Path, tail_bytes: int | None, offset: int | None, limit: int,
         whole_lines: bool = False) -> tuple[int, int]:
    """The logical range ``[start, end)`` a read of the log returns: its last ``tail_bytes`` (at most
    ``limit``), or ``limit`` bytes from ``offset`` (clamped to the end).  ``whole_lines``: ``end`` is
    moved back to the last line end in the range; with none, the range is empty unless it is
    ``limit`` long (a line that long comes in pieces)."""
    with LOCK:
        size = _size(path)
        if size is None:
            return 0, 0
        c = read_cut(path)
        last = size if c is None else c.logical(size)
        if offset is None:
            first = max(0, size - min(tail_bytes or limit, limit))
            start = first if c is None else c.logical(first)
        else:
            start = min(offset, last)
        # from inside the part cut away the read gives the note, then ``limit`` bytes from after it
        end = min(last, (c.start if c is not None and c.head <= start < c.start else start) + limit)
        if not whole_lines or end <= start:
            return start, end
        lo = start if c is None else c.physical(start)
        hi = end if c is None else c.physical(end)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return start, start
        try:
            pos = hi
            while pos > lo:  # backwards, a chunk at a time, to the last newline
                k = min(CHUNK, pos - lo)
                i = os.pread(fd, k, pos - k).rfind(b"\n")
                if i >= 0:
                    nl = pos - k + i + 1
                    return start, max(start, nl if c is None else c.logical(nl))
                pos -= k
        finally:
            os.close(fd)
    return (start, end) if end - start >= limit else (start, start)


def text(path: str | Path, start: int, end: int) -> Iterator[str]:
    """The log's logical range ``[start, end)`` as text (invalid UTF-8 replaced), a chunk at a time."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    at = start
    while at < end:
        data, at = read(path, at, CHUNK, end)
        if not data:
            break
        yield dec.decode(data)
    last = dec.decode(b"", final=True)
    if last:
        yield last


def cut(path: str | Path, cap: int, why: str = "") -> int:
    """Cut the log to about 3/8 of ``cap`` bytes if it is over ``cap`` (see the module notes);
    returns how many bytes of the job's output this cut removed (0: none)."""
    if cap < MIN_CAP:
        raise ValueError(f"a log cap is at least {MIN_CAP} bytes, got {cap}")
    with LOCK:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return 0
        try:
            return _cut(fd, path, cap, why)
        finally:
            os.close(fd)


def _cut(fd: int, path: str | Path, cap: int, why: str) -> int:
    size = os.fstat(fd).st_size
    if size <= cap:
        return 0
    old = read_cut(path)
    if old is not None and old.head + old.note > size:
        old = None  # the file was replaced since
    if old is not None and old.head <= cap // 8:
        head = old.head  # the head stays what the first cut kept
    else:  # the head ends at a line end, if there is one in its last 4 KiB
        head = cap // 8
        back = os.pread(fd, 4096, max(0, head - 4096))
        i = back.rfind(b"\n")
        if i >= 0:
            head = max(0, head - len(back)) + i + 1
    src = size - cap // 4
    i = os.pread(fd, 4096, src).find(b"\n")  # the kept tail starts at a line start, if one is near
    if i >= 0:
        src += i + 1
    start = src if old is None else old.logical(src)
    lead = b"" if head == 0 or os.pread(fd, 1, head - 1) == b"\n" else b"\n"
    note = lead + NOTE.format(cap=cap, why=why, cut=start - head).encode()
    os.pwrite(fd, note, head)
    dst = head + len(note)
    pos = src
    while True:  # move the tail down, then whatever the job appended meanwhile
        end = os.fstat(fd).st_size
        if pos >= end:
            break
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            os.pwrite(fd, data, dst)
            pos += len(data)
            dst += len(data)
    os.ftruncate(fd, dst)
    _write_cut(path, Cut(head, len(note), start))
    return start - head - (0 if old is None else old.start - old.head)
