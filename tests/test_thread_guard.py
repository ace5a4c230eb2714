"""The guard against threads left running by a test (tests/thread_guard.py, autouse in tests/conftest.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from thread_guard import no_leaked_threads, ours


def test_a_pool_left_open_fails_and_one_shut_down_passes() -> None:
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpuloom-stop")
    try:
        with pytest.raises(pytest.fail.Exception, match=r"^left running: gpuloom-stop_0 \(close"):
            with no_leaked_threads():
                pool.submit(lambda: None).result()  # (one task: one worker thread, idle but alive)
    finally:
        pool.shutdown(wait=True)
    with no_leaked_threads():
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpuloom-stop")
        pool.submit(lambda: None).result()
        pool.shutdown(wait=True)


def test_only_new_non_daemon_threads_of_the_project_count() -> None:
    stop = threading.Event()
    made = [threading.Thread(target=stop.wait, name=name, daemon=daemon)
            for name, daemon in (("gpuloom-loop", False), ("gpuloom-sampler", True), ("other-lib", False))]
    running_before = threading.Thread(target=stop.wait, name="gpuloom-older")
    running_before.start()
    try:
        before = set(threading.enumerate())
        for t in made:
            t.start()
        assert [t.name for t in ours(before)] == ["gpuloom-loop"]
    finally:
        stop.set()
        for t in [*made, running_before]:
            t.join()
    assert ours(before) == []  # (ended threads no longer count)
