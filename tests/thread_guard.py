"""The guard against threads a test leaves running (tests/conftest.py's ``_no_leaked_threads``).

A non-daemon thread the project names (``gpuloom-*``, such as an Actuator's stop pool, ``gpuloom-stop_N``) that
is still running once a test and its fixtures have ended was left by something the test built and never closed
(a Service, an Actuator, ...).  It outlives the test on its worker: tests/test_background.py forks only where no
other thread runs, so every later test there would be skipped.  A stopped service leaves none (its actuator's
close joins them).  Daemon threads (the loop, the GPU sampler) and library threads are not judged."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

PREFIX = "gpuloom-"


def ours(before: set[threading.Thread]) -> list[threading.Thread]:
    """The project's non-daemon threads running now that were not in ``before``."""
    return [t for t in threading.enumerate()
            if t not in before and t.name.startswith(PREFIX) and not t.daemon and t.is_alive()]


@contextlib.contextmanager
def no_leaked_threads() -> Iterator[None]:
    """Fails (``pytest.fail``) at its end when the block left one of the project's non-daemon threads running."""
    import pytest

    before = set(threading.enumerate())
    yield
    left = ours(before)
    if left:
        pytest.fail("left running: " + ", ".join(sorted(t.name for t in left))
                    + " (close what the test built: Service.shutdown(), Actuator.close(), ...)", pytrace=False)
