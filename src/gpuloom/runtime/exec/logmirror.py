"""A service-side copy of logs written on other machines, and how far it got.

When the service does not share a log directory with the nodes
(:mod:`.ray_executor` with ``logs="agent"``), it appends what is new in each
node-local log to its own copy and keeps, beside the copy, ``<log>.mirror``:
``{"<node>:<remote path>": bytes copied}``, rewritten atomically after every
append, so a restarted service goes on where its predecessor stopped.
An append the copy's disk refuses (full) is undone with its record (:func:`copy_new`): the next
copy goes on from the same byte, so a full disk delays the copy, never repeats or loses a line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _mirror_file(local: str) -> Path:
    return Path(local + ".mirror")


def mirror_offset(local: str, node: str, remote: str) -> int:
    try:
        return int(json.loads(_mirror_file(local).read_text()).get(f"{node}:{remote}", 0))
    except (OSError, ValueError):
        return 0


def set_mirror_offset(local: str, node: str, remote: str, offset: int) -> None:
    f = _mirror_file(local)
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError):
        d = {}
    d[f"{node}:{remote}"] = offset
    tmp = f.with_suffix(".mirror.tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, f)


def append_to(path: str, data: bytes) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def copy_new(local: str, node: str, remote: str, off: int, data: bytes) -> bool:
    """Append ``data`` (``remote``'s bytes from ``off``) to ``local`` and record how far its copy got; False
    and ``local`` as it was where its disk refuses either (full): the next copy starts at ``off`` again."""
    try:
        size: int | None = os.path.getsize(local)
    except OSError:
        size = None
    try:
        append_to(local, data)
        set_mirror_offset(local, node, remote, off + len(data))
    except OSError:
        try:  # (a part of data may have been written)
            if size is None:
                os.unlink(local)
            else:
                os.truncate(local, size)
        except OSError:
            pass
        return False
    return True
