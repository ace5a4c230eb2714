"""The files a Slurm job writes that the service reads (its output, its exit record, srun's messages):
opened so that a job cannot have the service read another file in their place."""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("gpuloom.service")


#: the most bytes of a job's output one read copies into its log (an output with more left is read again)
READ_MOST = 16 << 20


def read_output(path: str, offset: int, most: int = READ_MOST, warned: set[str] | None = None) -> bytes | None:
    """Up to ``most`` bytes from ``offset`` of a job's output file, which its account owns and could replace:
    only a regular file with one name, owned by the owner of its directory, is read (never through a link,
    so a job cannot have the service copy another file into its log); None otherwise.  ``warned``: paths
    already logged as refused (each is logged once, not at every poll)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.stat(os.path.dirname(path)).st_uid:
            if warned is None or path not in warned:
                log.warning("%s: not a plain file of its directory's owner: not copied", path)
                if warned is not None:
                    warned.add(path)
            return None
        return os.pread(fd, most, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def _unlink(path: str | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return ""
