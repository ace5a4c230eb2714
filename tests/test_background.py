"""Work in a forked child (gpuloom.sim.background): what it returns or raises comes back to the caller, and the
child never outlives it, whether it finishes, fails, is cancelled or its caller dies."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpuloom.sim.background import Background, BackgroundError, can_fork


@pytest.fixture(autouse=True)
def _forks() -> None:
    """Checked as each test starts, not once at collection: a thread an earlier test on this worker left running
    means no fork, and ``fn`` then runs in the worker itself (the killed-by-a-signal test would kill it: the
    whole run waited for ever on its lost tests)."""
    if not can_fork():
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        pytest.skip(f"forks only on Linux with no other thread running (running here: {names})")


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for a parent that is not this process counts as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_the_child_computes_from_what_it_is_sent_and_what_it_prepared() -> None:
    before = children()
    state = {"n": 1}
    bg: Background[int, tuple[int, int, int]] = Background(
        "adding", lambda x: (os.getpid(), x + state["n"], os.getppid()), prepare=lambda: state.update(n=100))
    assert bg.pid is not None and bg.pid in children()
    bg.submit(5)
    pid, value, parent = bg.result()
    assert pid != os.getpid() and value == 105 and parent == os.getpid()
    assert state == {"n": 1}  # the child's memory was its own
    assert bg.result() == (pid, 105, os.getpid())  # taken once, kept
    assert children() == before  # waited for


def test_a_failing_child_raises_its_message_and_traceback() -> None:
    def fail(_: object) -> None:
        raise ValueError("no room for the legend")

    before = children()
    bg: Background[None, None] = Background("drawing the plots", fail)
    bg.submit(None)
    with pytest.raises(BackgroundError, match=r"^drawing the plots failed: ValueError: no room for the legend$") as e:
        bg.result()
    assert "in fail\n" in e.value.child_traceback and e.value.child_traceback.rstrip().endswith(
        "ValueError: no room for the legend")
    assert bg.pid is None and children() == before  # reaped


def test_a_child_whose_own_child_failed_raises_with_both_tracebacks() -> None:
    def fail(_: object) -> None:
        raise ValueError("no room for the axis")

    def draw(_: object) -> None:
        inner: Background[None, None] = Background("drawing the JCT CDF", fail)
        inner.submit(None)
        inner.result()

    before = children()
    bg: Background[None, None] = Background("drawing the plots", draw)
    bg.submit(None)
    with pytest.raises(BackgroundError, match=r"^drawing the plots failed: BackgroundError: drawing the JCT CDF "
                                              r"failed: ValueError: no room for the axis$") as e:
        bg.result()
    tb = e.value.child_traceback
    assert tb.index("in fail\n") < tb.index("ValueError: no room for the axis") < tb.index("in draw\n")
    assert children() == before


def test_a_child_that_fails_while_preparing_says_so_without_being_sent_anything() -> None:
    def broken() -> None:
        raise ImportError("No module named 'matplotlib'")

    bg: Background[bytes, int] = Background("drawing the plots", len, prepare=broken)
    bg.submit(b"x" * (1 << 20))  # more than a pipe holds: the child never reads it, the caller is not stuck
    with pytest.raises(BackgroundError, match="drawing the plots failed: ImportError: No module named 'matplotlib'"):
        bg.result()


def test_a_child_killed_by_a_signal_and_a_child_that_exits_silently() -> None:
    bg: Background[None, None] = Background("drawing", lambda _: os.kill(os.getpid(), signal.SIGKILL))
    bg.submit(None)
    with pytest.raises(BackgroundError, match="^drawing failed: its process was killed by signal 9$"):
        bg.result()
    bg = Background("drawing", lambda _: os._exit(3))
    bg.submit(None)
    with pytest.raises(BackgroundError, match="^drawing failed: its process exited with status 3 and said nothing$"):
        bg.result()


def test_cancel_and_a_with_block_end_a_busy_child() -> None:
    before = children()
    bg: Background[float, None] = Background("sleeping", time.sleep)
    bg.submit(60.0)
    pid = bg.pid
    assert pid is not None
    t = time.monotonic()
    bg.cancel()
    assert time.monotonic() - t < 10 and not psutil.pid_exists(pid) and children() == before
    with pytest.raises(KeyError), Background("sleeping", time.sleep) as bg2:
        bg2.submit(60.0)
        raise KeyError("the caller failed")
    assert bg2.pid is None and children() == before


def test_a_child_reads_its_argument_while_a_child_forked_after_it_still_runs() -> None:
    # a child forked later must not hold the first one's argument pipe open: the first would wait for it to end
    def pipes(pid: int) -> set[str]:
        return {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}

    first: Background[int, int] = Background("adding", lambda x: x + 1)
    later: Background[float, None] = Background("sleeping", time.sleep)
    try:
        assert first._to is not None and first._from is not None and later.pid is not None
        held = {os.readlink(f"/proc/self/fd/{fd}") for fd in (first._to, first._from)}
        later.submit(120.0)
        first.submit(1)
        assert first.result() == 2
        assert psutil.Process(later.pid).status() != psutil.STATUS_ZOMBIE  # (it still sleeps)
        deadline = time.monotonic() + 30  # (the later child closes them as it starts: on a loaded machine, later)
        while held & pipes(later.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not held & pipes(later.pid)  # (it closed the first child's pipes as it started)
    finally:
        later.cancel()


def test_a_child_sent_nothing_exits_when_its_caller_closes_the_pipe() -> None:
    # a caller that gives up (dies, or drops the child) closes its end: the child, waiting to be sent its
    # argument, ends by itself
    script = textwrap.dedent("""
        import os, sys
        from gpuloom.sim.background import Background
        bg = Background("waiting", len)
        print(bg.pid, flush=True)
        os._exit(0)  # no clean-up: only the kernel closes the pipe
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert gone(int(out.stdout))


def test_a_child_sent_parts_but_not_its_argument_exits_without_running_fn(tmp_path: Path) -> None:
    # a caller that dies mid-run leaves its child the parts so far: the child ends without running fn (no file
    # written from half the rows)
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from gpuloom.sim.background import Background
        out = Path({str(tmp_path)!r})
        bg = Background("writing", lambda _: (out / "written").touch(),
                        take=lambda part: (out / f"part {{part}}").touch())
        bg.send(1)
        bg.send(2)
        deadline = time.monotonic() + 30
        while not (out / "part 2").exists() and time.monotonic() < deadline:  # (taken before the caller dies)
            time.sleep(0.01)
        print(bg.pid, flush=True)
        os._exit(0)  # no clean-up: only the kernel closes the pipe
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert gone(int(out.stdout))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part 1", "part 2"]


def test_a_busy_child_dies_with_its_caller() -> None:
    # a caller killed by a signal runs no clean-up; the kernel kills its child (PR_SET_PDEATHSIG)
    script = textwrap.dedent("""
        import sys, time
        from gpuloom.sim.background import Background
        bg = Background("sleeping", time.sleep)
        bg.submit(120.0)
        print(bg.pid, flush=True)
        time.sleep(120)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        pid = int(caller.stdout.readline())
        assert psutil.Process(pid).ppid() == caller.pid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        caller.send_signal(signal.SIGKILL)
        caller.wait(30)
        assert gone(pid)
    finally:
        caller.kill()
        caller.wait(30)


def test_parts_sent_ahead_go_to_take_in_the_child_as_they_come() -> None:
    got: list[object] = []
    bg: Background[str, tuple[int, list[object]]] = Background(
        "collecting", lambda last: (os.getpid(), [*got, last]), take=got.append)
    for part in ([1, 2], "x" * (3 << 20), None):  # (one part more than the pipe holds)
        bg.send(part)
    bg.submit("end")
    pid, seen = bg.result()
    assert pid != os.getpid() and seen == [[1, 2], "x" * (3 << 20), None, "end"]
    assert got == []  # (taken in the child's memory)
    with pytest.raises(TypeError, match="^adding: parts are sent only to a child given take$"):
        Background("adding", lambda x: x, fork=False).send(1)  # (a forked child would wait for ever)


def test_a_child_whose_take_fails_raises_it_and_the_caller_sends_on_unblocked() -> None:
    def take(part: bytes) -> None:
        raise ValueError(f"bad part of {len(part)} bytes")

    before = children()
    bg: Background[None, None] = Background("collecting", lambda _: None, take=take)
    for _ in range(8):  # 16 MB: far more than the pipe holds, most after the child stopped reading
        bg.send(b"x" * (2 << 20))
    bg.submit(None)
    with pytest.raises(BackgroundError, match=r"^collecting failed: ValueError: bad part of 2097152 bytes$"):
        bg.result()
    assert children() == before


def test_no_fork_runs_in_the_caller_and_raises_as_it_is() -> None:
    bg: Background[int, int] = Background("adding", lambda x: x + os.getpid(), fork=False)
    assert bg.pid is None
    bg.submit(1)
    assert bg.result() == 1 + os.getpid()

    def fail(_: object) -> None:
        raise ValueError("as it is")

    with pytest.raises(ValueError, match="^as it is$"):
        Background("failing", fail, fork=False).submit(None)
    got: list[int] = []
    bg = Background("collecting", lambda x: [*got, x], fork=False, take=got.append)
    bg.send(1)
    assert got == [1]  # (taken at once)
    bg.submit(2)
    assert bg.result() == [1, 2]


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
        bg: Background[int, int] = Background("adding", lambda x: x + os.getpid())
        assert bg.pid is None
        bg.submit(1)
        assert bg.result() == 1 + os.getpid()
    finally:
        stop.set()
        t.join()
    assert can_fork()


def test_a_library_thread_forks_nothing_while_it_runs_and_nothing_stops_forking_once_it_ended() -> None:
    # a thread Python did not start (a library's: started here through _thread) that calls into threading gets
    # a dummy entry, which Python 3.11 keeps in threading.enumerate() after the thread ended
    called, go = threading.Event(), threading.Event()
    tid: list[int] = []

    def foreign() -> None:
        tid.append(threading.current_thread().native_id or 0)
        called.set()
        go.wait(10)

    _thread.start_new_thread(foreign, ())
    assert called.wait(10)
    assert not can_fork()  # it runs
    go.set()
    end = time.monotonic() + 10
    while str(tid[0]) in os.listdir("/proc/self/task") and time.monotonic() < end:
        time.sleep(0.01)
    assert any(t.native_id == tid[0] for t in threading.enumerate())  # (its entry stays)
    assert can_fork()
    bg: Background[int, int] = Background("adding", lambda x: x + os.getpid())
    pid = bg.pid
    assert pid is not None  # (forked)
    bg.submit(1)
    assert bg.result() == 1 + pid
