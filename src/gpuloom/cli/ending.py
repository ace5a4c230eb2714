"""How the ``gpuloom`` program ends after a command that built a large heap.

A simulation leaves hundreds of thousands of objects (jobs, records, the simulator's state); freeing them
one by one when the command returns, then again as the interpreter shuts down, costs time and does nothing
the operating system does not do at once when the process ends.  A command that is done with them hands
them to :func:`keep_until_exit`; :func:`entry` (the ``gpuloom`` program) then ends the process without
freeing them: the output streams flushed, the ``atexit`` handlers run, then ``os._exit``.  A command run in
process (:func:`~gpuloom.cli.main`, a test's runner) is not ended: what it kept is held until the next
command keeps its own.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

#: what the last command kept (:func:`keep_until_exit`)
_KEPT: list[Any] = []


def keep_until_exit(*objs: Any) -> None:
    """Hold ``objs`` until the process ends (replacing what an earlier command held), and have :func:`entry`
    end it without freeing them."""
    _KEPT[:] = objs


def ends_without_teardown() -> bool:
    """Whether the last command kept objects for the process's end (:func:`keep_until_exit`)."""
    return bool(_KEPT)


def exit_without_teardown(code: int) -> None:
    """End the process with ``code``: the output streams flushed and the ``atexit`` handlers run, as a normal
    exit does, but no object freed.  Returns (the caller then exits normally) where that is not safe: another
    thread still runs (a normal exit waits for it), or a stream cannot be flushed (a normal exit reports it)."""
    if threading.active_count() != 1:
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except (AttributeError, OSError, ValueError):
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):  # (what the handlers printed)
            stream.flush()
    except (AttributeError, OSError, ValueError):
        code = code or 120  # (what Python exits with when it cannot flush its output)
    os._exit(code)
