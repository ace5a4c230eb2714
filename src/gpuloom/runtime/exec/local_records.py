"""The run records of a launch and the server's files beside them: the pid and exit records (blank
placeholders made at launch, written over in place by the wrapper), the job's log, and the checks that
no other account can swap a file the server keeps (see :mod:`.local`'s notes).

A record made for a launch with a number (the job's attempt) carries it after the room for the
wrapper's number (``@N`` at its end, which the wrapper's in-place write does not reach), so a record
found after a restart is told from one an earlier launch of the same job left.  The server marks the
exit record of a launch it stops (``!``, in place, before its SIGTERM): the exit status then written is
that of a stop, not of an end of the job's own (:meth:`.local.NodeAgent.launched`)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

#: bytes of a blank run record: room for a pid or an exit status, written over in place, then the launch's mark
RECORD_ROOM = 32
#: bytes at a record's start the wrapper may write (a pid of 7 digits and its newline; an exit status is shorter)
_WRITTEN_ROOM = 12


def exit_path_for(log_path: str) -> str:
    return log_path + ".exit"


def _read_record(path: str) -> int | None:
    """The number in a run record; None for a blank placeholder, a missing or unreadable file."""
    try:
        fields = Path(path).read_text().split()
        return int(fields[0]) if fields else None
    except (OSError, ValueError):
        return None


def read_exit_record(path: str) -> int | None:
    """The exit code a wrapper wrote to ``path``, or None if absent, unreadable or not written yet."""
    return _read_record(path) if path else None


def launch_mark(launch: int) -> str:
    """What the records of launch number ``launch`` carry (none for 0: a launch without a number)."""
    return f"@{launch}" if launch > 0 else ""


def record_mark(path: str) -> str | None:
    """The launch mark a run record carries (``""``: none), None if it is missing or unreadable."""
    fields = record_fields(path)
    if fields is None:
        return None
    return fields[-1] if fields and fields[-1].startswith("@") else ""


#: the mark of a stopped launch's exit record, and where it goes (after the wrapper's room)
STOPPED = b"!"


def record_fields(path: str) -> list[str] | None:
    """A run record's fields (the wrapper's number first, if written), None if missing or unreadable."""
    try:
        return Path(path).read_text().split()
    except (OSError, ValueError):
        return None


def mark_stopped(path: str) -> None:
    """Mark the exit record ``path`` as a stopped launch's, in place (no new block: a full disk takes it),
    never through a link; a missing or unwritable record is left as it is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size >= RECORD_ROOM:
            os.pwrite(fd, STOPPED, _WRITTEN_ROOM)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_record(path: str, mark: str = "") -> None:
    """(Re)create the run record ``path`` as a blank placeholder owned by us (0600), never through a link,
    carrying the launch's ``mark`` at its end (after the room the wrapper writes)."""
    if len(mark) > RECORD_ROOM - 3 - _WRITTEN_ROOM:  # (room for the stop mark and a space before it)
        raise ValueError(f"launch mark {mark[:40]!r} is too long for a run record")
    try:
        os.unlink(path)  # a link is removed, not followed
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (" " * (RECORD_ROOM - 1 - len(mark)) + mark + "\n").encode())
    finally:
        os.close(fd)


def open_log(path: Path) -> int:
    """Our log file ``path`` opened for appending (created 0600): never through a link, never a FIFO or
    device, never a file of another account."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise OSError(f"{path} is not a regular file of the server's account with one name")
    os.set_blocking(fd, True)
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def exposed(directory: Path) -> str | None:
    """Why another account could swap a file the server keeps in ``directory`` (a link for root to write
    through), or None: it and every directory above it are root's or ours and writable by no one else
    (a sticky one, such as /tmp, protects the entries of others)."""
    real = Path(os.path.realpath(directory))
    for q in (real, *real.parents):
        st = os.stat(q)
        if st.st_uid not in (0, os.geteuid()):
            return f"{q} belongs to another account"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{q} is writable by other accounts"
    return None


def remove_tree(path: str) -> None:
    """Remove a job's directory without following the links it planted (``shutil.rmtree`` works by descriptor)."""
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
