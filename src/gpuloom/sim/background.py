"""One piece of work done in a forked child process while the caller goes on: ``gpuloom simulate`` formats
its CSV files' rows and draws its plots there while it simulates and writes the summary.

:class:`Background` forks at once, while the caller is still small (before a run: fork copies page
tables, and every page both processes share is copied again on its first write); the child runs
``prepare`` (``import matplotlib``, while the caller simulates), then waits for the argument that
:meth:`~Background.submit` sends it (pickled through a pipe), runs ``fn`` on it and sends back what
``fn`` returned, which :meth:`~Background.result` gives, or raises :class:`BackgroundError` with the
child's exception and traceback.  Parts sent ahead of the argument (:meth:`~Background.send`) go to ``take``
in the child as they come: work done while the caller goes on (``gpuloom simulate`` sends the rows its run
will not change).

The child never outlives its caller: :meth:`~Background.result` waits for it, :meth:`~Background.cancel`
kills and reaps it (also on leaving a ``with`` block: an exception, an early exit), a child that reads
no argument (the caller closed the pipe, or died) exits, and on Linux the kernel kills it when the
caller dies (``PR_SET_PDEATHSIG``: a caller killed by a signal runs no clean-up).

Forking is safe only where the process runs no other thread and the platform forks cleanly: elsewhere
(not Linux, a thread running, ``fork`` refused) nothing is forked: :meth:`~Background.send` runs ``take``
and :meth:`~Background.submit` runs ``fn`` in the caller, their exceptions raised as they are.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

_A = TypeVar("_A")
_R = TypeVar("_R")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARTS_PIPE = 1 << 20  # bytes the pipe of a child sent parts holds (Linux's default most for a user)
#: the pipe ends this process holds to its children: a child forked later closes them at once, else it would
#: hold a sibling's argument pipe open, and that sibling would wait for it to end before reading its argument
_HELD: set[int] = set()


class BackgroundError(RuntimeError):
    """What the child raised (``child_traceback``: its traceback), or how it died."""

    def __init__(self, message: str, child_traceback: str = "") -> None:
        super().__init__(message)
        self.child_traceback = child_traceback


def can_fork() -> bool:
    """Whether :class:`Background` forks here: Linux, and no thread but this one."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and _threads() == 1


def _threads() -> int:
    """The Python threads running.  A thread Python did not start (a library's) that called into Python has a
    dummy entry in :func:`threading.enumerate` that stays after the thread ended: one whose thread is gone from
    ``/proc/self/task`` does not count."""
    live = threading.enumerate()
    if all(not isinstance(t, threading._DummyThread) for t in live):  # (the usual case)
        return len(live)
    try:
        tasks = set(os.listdir("/proc/self/task"))
    except OSError:
        return len(live)
    return sum(1 for t in live if not isinstance(t, threading._DummyThread) or str(t.native_id) in tasks)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this (child) process when ``parent`` dies; exit at once if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # (no prctl: the caller still waits for or kills the child)
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _close(fd: int) -> None:
    """Close ``fd``, one of the pipe ends held to a child (:data:`_HELD`)."""
    _HELD.discard(fd)
    os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Background(Generic[_A, _R]):
    """``fn(arg)`` in a child forked now, ``arg`` sent later (see the module docstring); ``what`` names the
    work in errors ("drawing the plots"); ``take``: what the child does with each part sent ahead of ``arg``;
    ``fork`` False: no child (``take`` runs in :meth:`send`, ``fn`` in :meth:`submit`)."""

    def __init__(self, what: str, fn: Callable[[_A], _R], prepare: Callable[[], object] | None = None,
                 fork: bool | None = None, take: Callable[[Any], object] | None = None) -> None:
        self.what = what
        self.fn = fn
        self.take = take
        self.pid: int | None = None
        self._to: int | None = None  # the pipe to the child (the argument)
        self._from: int | None = None  # the pipe from the child (the result)
        self._value: _R | None = None
        if not (can_fork() if fork is None else fork):
            return
        # what the caller buffered is written once, by the caller, not again by the child
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        parent = os.getpid()
        arg_r, arg_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (arg_r, arg_w, res_r, res_w):
                os.close(fd)
            return
        if pid == 0:  # the child: never returns
            self._child(prepare, arg_r, res_w, parent, (arg_w, res_r, *_HELD))
        os.close(arg_r)
        os.close(res_w)
        if take is not None:  # parts sent during a run: room for several, so that the caller seldom waits
            try:
                fcntl.fcntl(arg_w, fcntl.F_SETPIPE_SZ, _PARTS_PIPE)
            except (OSError, AttributeError):
                pass
        self.pid, self._to, self._from = pid, arg_w, res_r
        _HELD.update((arg_w, res_r))

    def _child(self, prepare: Callable[[], object] | None, arg_r: int, res_w: int, parent: int,
               held: tuple[int, ...]) -> None:
        status = 1
        try:
            for fd in held:  # (the caller's ends of this child's pipes and of its siblings')
                try:
                    os.close(fd)
                except OSError:
                    pass
            _HELD.clear()
            _die_with_parent(parent)
            try:
                if prepare is not None:
                    prepare()
                # (last, part or argument), pickled one after the other
                reader = os.fdopen(arg_r, "rb", buffering=1 << 16)
                while True:
                    try:
                        last, obj = pickle.load(reader)
                    except EOFError:  # the argument was not sent: the caller gave up
                        os._exit(0)
                    if last:
                        break
                    assert self.take is not None
                    self.take(obj)
                payload = pickle.dumps((True, self.fn(obj)))
                status = 0
            except BaseException as e:  # noqa: BLE001  (all goes back to the caller, KeyboardInterrupt too)
                tb = traceback.format_exc()
                if isinstance(e, BackgroundError):  # (a child of this child failed: its traceback first)
                    tb = e.child_traceback + tb
                payload = pickle.dumps((False, (f"{type(e).__name__}: {e}", tb)))
            _write_all(res_w, payload)
        finally:
            os._exit(status)  # no atexit handlers, no flushing of the caller's buffers, no clean-up of its objects

    def send(self, part: object) -> None:
        """Send the child a part ahead of the argument, for ``take`` (without a child: ``take(part)`` now)."""
        if self.take is None:
            raise TypeError(f"{self.what}: parts are sent only to a child given take")
        if self.pid is None:
            self.take(part)
            return
        if self._to is None:  # the child stopped reading: result() says why
            return
        try:
            _write_all(self._to, pickle.dumps((False, part), protocol=pickle.HIGHEST_PROTOCOL))
        except BrokenPipeError:
            _close(self._to)
            self._to = None

    def submit(self, arg: _A) -> None:
        """Send ``arg`` to the child (without a child: compute ``fn(arg)`` now)."""
        if self.pid is None:
            self._value = self.fn(arg)
            return
        fd, self._to = self._to, None
        if fd is None:  # (a part could not be sent)
            return
        try:
            _write_all(fd, pickle.dumps((True, arg), protocol=pickle.HIGHEST_PROTOCOL))
        except BrokenPipeError:  # the child failed before reading it: result() says why
            pass
        finally:
            _close(fd)

    def result(self) -> _R:
        """What ``fn`` returned, once the child has ended; :class:`BackgroundError` if it failed."""
        if self.pid is None:  # no child, or its result was taken
            return cast(_R, self._value)
        fd, pid = self._from, self.pid
        assert fd is not None
        try:
            data = _read_all(fd)
        except BaseException:
            self.cancel()
            raise
        _close(fd)
        self._from = None
        _, status = os.waitpid(pid, 0)
        self.pid = None
        if data:
            ok, value = pickle.loads(data)
            if ok:
                self._value = value
                return cast(_R, value)
            message, tb = value
            raise BackgroundError(f"{self.what} failed: {message}", tb)
        if os.WIFSIGNALED(status):
            raise BackgroundError(f"{self.what} failed: its process was killed by signal {os.WTERMSIG(status)}")
        raise BackgroundError(f"{self.what} failed: its process exited with status "
                              f"{os.waitstatus_to_exitcode(status)} and said nothing")

    def cancel(self) -> None:
        """Kill the child, if it still runs, and reap it."""
        for name in ("_to", "_from"):
            fd = getattr(self, name)
            if fd is not None:
                _close(fd)
                setattr(self, name, None)
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)

    def __enter__(self) -> Background[_A, _R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
