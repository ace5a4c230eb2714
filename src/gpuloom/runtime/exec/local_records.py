"""The run records of a launch and the server's files beside them: the pid and exit records (blank
placeholders made at launch, written over in place by the wrapper), the job's log, and the checks that
no other account can swap a file the server keeps (see :mod:`.local`'s notes)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

#: bytes of a blank run record: room for a pid or an exit status, written over in place
RECORD_ROOM = 16


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


def make_record(path: str) -> None:
    """(Re)create the run record ``path`` as a blank placeholder owned by us (0600), never through a link."""
    try:
        os.unlink(path)  # a link is removed, not followed
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b" " * (RECORD_ROOM - 1) + b"\n")
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
