"""Logs cannot hurt the server or other users.

A job controls what it prints: reading its log costs the server a bounded amount of memory whatever
the log holds (a huge line without a newline included); a running job's log is cut to its cap in
place, the job running on; a full state disk gives submissions a 503 that says so, and no job's end
is lost or run twice.  The tests that mount a small tmpfs need root and are skipped otherwise.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.lifecycle import JobState
from gpuloom.runtime.api.ops import progress_points
from gpuloom.runtime.exec import joblogs
from gpuloom.runtime.exec.progress import ProgressTail
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store, StoreFull, is_full
from gpuloom.scheduler import Scheduler
from service_util import (
    JOB_PY,
    REPO,
    Server,
    fill,
    job,
    job_writable,
    key_events,
    kill_jobs,
    running,
    shared_copy,
    submit,
    wait_for,
)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
CHATTY = shared_copy(Path(__file__).resolve().parent / "jobs" / "chatty.py")
NOTE_RE = re.compile(rb"gpuloom: log over its cap of (\d+) bytes([^:]*): (\d+) bytes cut here\n")


def chatty_output(iters: int, lines: int) -> bytes:
    import importlib.util

    spec = importlib.util.spec_from_file_location("chatty", CHATTY)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return b"".join(mod.output(iters, lines))


# -- bounded reads -------------------------------------------------------------------------------

def huge_log(path: Path, hole: int) -> None:
    """A log with a progress line, ``hole`` NUL bytes without a newline, a progress line and one of 8 KB."""
    with open(path, "wb") as f:
        f.write(b"GPULOOM_PROGRESS iter=1 t=10\n")
        f.truncate(hole)  # sparse: no disk used
        f.seek(0, 2)
        f.write(b"\nGPULOOM_PROGRESS iter=2 t=11\nGPULOOM_PROGRESS iter=3 t=12 " + b"k=v " * 2000 + b"\n")


def test_progress_reads_are_bounded_over_a_newline_free_log(tmp_path: Path) -> None:
    log = tmp_path / "7.log"
    huge_log(log, 64 << 20)
    tracemalloc.start()
    try:
        tail = ProgressTail(log)
        new = tail.read()
        tail_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        points = progress_points(log)
        points_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tail_peak < 4 << 20 and points_peak < 4 << 20, (tail_peak, points_peak)  # a chunk of 1 MiB, a line
    # the 64 MiB line is dropped unread, as is the 8 KB progress line (longer than a progress line can be)
    assert [(p.t, p.iter) for p in new] == [(10.0, 1), (11.0, 2)]
    assert points == [{"t": 11.0, "iter": 2}]  # /progress: the last 4 MiB only


# -- cutting -------------------------------------------------------------------------------------

def lines(a: int, b: int) -> bytes:
    return b"".join(b"line %06d\n" % i for i in range(a, b))  # 12 bytes each


def test_cut_keeps_head_note_and_tail_and_offsets_survive_it(tmp_path: Path) -> None:
    log = tmp_path / "3.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as the executor gives it to the job
    try:
        os.write(fd, lines(0, 20000))  # 240,000 bytes
        follow_at = 230400  # an offset a follower holds: line 19200
        with pytest.raises(ValueError, match="at least 65536 bytes"):
            joblogs.cut(log, 1000)
        assert joblogs.cut(log, 250_000) == 0  # under its cap: untouched
        # head: the 682 whole lines in the first 8192 bytes; tail: the whole lines in the last 16384
        assert joblogs.cut(log, 1 << 16) == 223620 - 8184
        note = b"gpuloom: log over its cap of 65536 bytes: 215436 bytes cut here\n"
        assert log.read_bytes() == lines(0, 682) + note + lines(18635, 20000)
        assert joblogs.read_cut(log) == joblogs.Cut(8184, len(note), 223620)
        assert joblogs.logical_size(log) == 240000
        # an offset taken before the cut still names the same byte
        start, end = joblogs.span(log, None, follow_at, 1 << 20)
        assert (start, end) == (follow_at, 240000)
        assert "".join(joblogs.text(log, start, end)).encode() == lines(19200, 20000)
        # one in the part cut away reads on from the note
        start, end = joblogs.span(log, None, 100_008, 1 << 20)
        assert "".join(joblogs.text(log, start, end)).encode() == note + lines(18635, 20000)
        # the job writes on: after the kept tail
        os.write(fd, lines(20000, 20001))
        assert joblogs.logical_size(log) == 240012
        assert joblogs.read(log, 240000, 100) == (lines(20000, 20001), 240012)
        # a tail read that starts inside the note gives it whole
        assert "".join(joblogs.text(log, *joblogs.span(log, 16440, None, 1 << 20))).encode() == \
            note + lines(18635, 20001)
        # a second cut keeps the same head; the note counts everything cut
        os.write(fd, lines(20001, 40000))
        assert joblogs.cut(log, 1 << 16) == 463620 - 223620
        note2 = b"gpuloom: log over its cap of 65536 bytes: 455436 bytes cut here\n"
        assert log.read_bytes() == lines(0, 682) + note2 + lines(38635, 40000)
        assert joblogs.read_cut(log) == joblogs.Cut(8184, len(note2), 463620)
        # following with whole lines: a partial last line waits
        os.write(fd, b"partial")
        assert joblogs.span(log, None, 479_990, 1 << 20, whole_lines=True) == (479_990, 480_000)
    finally:
        os.close(fd)


def test_a_cut_does_not_promote_a_launching_job_on_old_lines(tmp_path: Path, cgroup_parent: str) -> None:
    """A relaunched job's log holds the progress lines of its earlier run; a cut moves them into the
    kept tail.  The job is promoted on its first line after this launch, not on those."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 2)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0, log_cap=1 << 16))
    go = job_writable(tmp_path)
    try:
        jid = str(svc.submit({"command": f"head -c 3000 /dev/zero | tr '\\0' y; echo; "
                                         f"while [ ! -e {go}/p ]; do sleep 0.02; done; echo GPULOOM_PROGRESS iter=777; "
                                         f"while [ ! -e {go}/end ]; do sleep 0.02; done", "gpus": 1}, "alice"))
        old = b"".join(b"old %06d " % i + b"z" * 88 + b"\n" for i in range(2000)) + \
            b"".join(b"GPULOOM_PROGRESS iter=%d\n" % i for i in range(100))  # the earlier run's output
        svc.log_path(jid).write_bytes(old)
        svc.round()
        lc = svc.jobs[jid].lifecycle
        assert lc is not None and lc.state is JobState.LAUNCHING
        assert svc.running[jid].log_offset == len(old)
        wait_for(lambda: (joblogs.logical_size(svc.log_path(jid)) or 0) >= len(old) + 3001, what="the job's output")
        svc._cap_logs()
        kept = svc.log_path(jid).read_bytes()
        assert b"bytes cut here\n" in kept and b"GPULOOM_PROGRESS iter=99\n" in kept  # old lines in the kept tail
        for _ in range(3):
            svc.round()
        assert lc.state is JobState.LAUNCHING
        (go / "p").touch()
        wait_for(lambda: b"iter=777\n" in svc.log_path(jid).read_bytes(), what="the new progress line")
        svc.round()
        assert lc.state is JobState.RUNNING_PROTECTED
        (go / "end").touch()
        wait_for(lambda: (svc.round(), store.get_job(int(jid)).state == "finished")[1], what="the job to finish")
        row = store.get_job(int(jid))
        assert row is not None and row.progress == 777 and row.exit_code == 0
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


# -- the server ----------------------------------------------------------------------------------

def peak_rss_growth(pid: int, fn: Callable[[], Any]) -> int:
    """How far ``fn()`` raises process ``pid``'s peak resident memory (bytes)."""
    def hwm() -> int:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak to the current size
    except OSError:
        pass
    before = hwm()
    fn()
    return hwm() - before


def test_server_memory_stays_bounded_reading_a_huge_newline_free_log(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x2", "--round", "0.2").start()
    try:
        with s.client() as c:
            jid = submit(c, command="echo GPULOOM_PROGRESS iter=1 t=10; sleep 0.3; echo GPULOOM_PROGRESS iter=3 t=11",
                         gpus=1)
            wait_for(lambda: job(c, jid)["state"] == "finished", what="the job to finish")
            for path in ("/history/trace", f"/jobs/{jid}/logs", f"/jobs/{jid}/progress"):  # warm up each path
                assert c.get(path).status_code == 200
            huge = tmp_path / "logs" / f"{jid}.log"
            huge_log(huge, 512 << 20)
            assert s.proc is not None
            got: dict[str, Any] = {}
            grew = {
                "trace": peak_rss_growth(s.proc.pid, lambda: got.update(trace=c.get("/history/trace").json())),
                "logs": peak_rss_growth(s.proc.pid, lambda: got.update(logs=c.get(f"/jobs/{jid}/logs",
                                                                                  params={"tail": 8 << 20}))),
                "progress": peak_rss_growth(s.proc.pid,
                                            lambda: got.update(progress=c.get(f"/jobs/{jid}/progress").json())),
            }
        # the old code read the whole 512 MiB log into memory (several copies) for the trace
        assert all(g < 32 << 20 for g in grew.values()), grew
        (row,) = got["trace"]
        assert row["iterations"] == 3  # the job's own stored progress; the log was read to its end
        r = got["logs"]
        assert len(r.content) == 8 << 20 and r.headers["X-Log-Offset"] == str(huge.stat().st_size)
        assert got["progress"] == [{"t": 11.0, "iter": 2}]
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_log_cap_cuts_a_chatty_job_which_runs_on_and_counts_progress(tmp_path: Path) -> None:
    logs = tmp_path / "joblogs"
    s = Server(tmp_path / "state", "--cluster", "1x2", "--round", "0.2", "--log-cap", "64Ki",
               "--log-dir", str(logs))
    (tmp_path / "state").mkdir()
    s.start()
    iters, per = 40, 40  # 40 writes of ~4 KB, 20 ms apart: ~164 KB in all, cut a few times on the way
    expected = chatty_output(iters, per)
    try:
        with s.client() as c:
            jid = submit(c, command=f"{JOB_PY} {CHATTY} {iters} {per} 0.02", gpus=1)
            done = wait_for(lambda: (j := job(c, jid))["state"] == "finished" and j, what="the job to finish")
            text = c.get(f"/jobs/{jid}/logs").content
            points = c.get(f"/jobs/{jid}/progress").json()
            events = [e["kind"] for e in c.get(f"/jobs/{jid}/events").json()]
        path = logs / f"{jid}.log"
        assert not (tmp_path / "state" / "logs" / f"{jid}.log").exists()  # --log-dir
        data = path.read_bytes()
        assert data == text and len(data) <= 64 << 10
        cut = joblogs.read_cut(path)
        assert cut is not None
        (m,) = NOTE_RE.finditer(data)
        assert m.start() == cut.head or m.start() == cut.head + 1  # after the head (a newline first if mid-line)
        # every byte kept is the job's, in place: its head, then its output from the note's offset on
        assert data[:cut.head] == expected[:cut.head]
        assert data[cut.head + cut.note:] == expected[cut.start:]
        assert int(m.group(1)) == 65536 and int(m.group(3)) == cut.start - cut.head
        assert data.startswith(b"chatty start\n") and data.endswith(b"chatty done\n")
        # the job ran to its end and its progress counted: promoted on its lines, last point kept
        assert done["exit_code"] == 0 and done["attempts"] == 1 and done["progress"] == iters
        assert "running_protected" in events
        assert points[-1] == {"t": None, "iter": iters}
    finally:
        s.stop()
        kill_jobs(tmp_path / "state")


@needs_root
def test_store_full_is_classified(tmpfs) -> None:  # noqa: ANN001
    d = tmpfs("db", "4m")
    store = Store(f"sqlite:///{d / 'db.sqlite'}")
    try:
        (jid,) = store.add_jobs([{"command": "true", "gpus": 1}], "alice", "standby")
        filler = fill(d)
        with pytest.raises(StoreFull, match=r"^the state disk is full: the database \(.*/db/db\.sqlite\) cannot "
                                            r"record changes \(database or disk is full\); free space on its "
                                            r"file system$"):
            store.update_job(jid, {"reason": "r" * 5000}, "ev", {})
        with pytest.raises(StoreFull):
            store.add_jobs([{"command": "x" * 5000, "gpus": 1}] * 3, "alice", "standby")
        filler.unlink()
        assert store.update_job(jid, {"reason": "ok"}, "ev", {})
        row = store.get_job(jid)
        assert row is not None and row.reason == "ok"
    finally:
        store.close()


def test_postgres_disk_full_is_classified() -> None:
    errors = pytest.importorskip("psycopg.errors")
    from sqlalchemy.exc import OperationalError

    e = OperationalError("INSERT ...", {}, errors.DiskFull("could not extend file: No space left on device"))
    assert is_full(e)
    assert not is_full(OperationalError("INSERT ...", {}, errors.LockNotAvailable("lock")))


@needs_root
def test_full_state_disk_refuses_submissions_with_503_and_loses_no_end(tmp_path: Path, tmpfs) -> None:  # noqa: ANN001
    """The issue's scenario: the state disk fills up while a job runs and another finishes."""
    state = tmpfs("state", "48m")
    go = job_writable(tmp_path)
    args = ("--cluster", "1x4", "--round", "0.2")
    s = Server(state, *args).start()
    try:
        with s.client() as c:
            a = submit(c, command=f"echo started; while [ ! -e {go}/a ]; do sleep 0.05; done", gpus=1)
            b = submit(c, command=f"echo started; while [ ! -e {go}/b ]; do sleep 0.05; done; echo b done", gpus=1)
            for jid in (a, b):
                wait_for(lambda jid=jid: "started" in c.get(f"/jobs/{jid}/logs").text, what=f"job {jid} to start")
            filler = fill(state)
            r = c.post("/jobs", json={"command": "true", "gpus": 1})
            assert r.status_code == 503 and r.headers["Retry-After"] == "60"
            assert re.fullmatch(r"the state disk is full: .*/state has 0\.0 MiB free of 48\.0 MiB, less than the "
                                r"2\.4 MiB the server keeps for its records; submissions are refused until space "
                                r"is freed", r.json()["detail"]), r.json()
            assert c.post("/tokens", json={"user": "carol"}).status_code == 503  # any write: the store refuses it
            pid = job(c, a)["procs"][0]["pid"]
            (go / "a").touch()  # job a finishes while nothing can be recorded
            wait_for(lambda: not running(pid), what="job a's process to end")
            time.sleep(0.5)  # rounds that reap it and cannot record it
            assert job(c, a)["state"] == "launching"  # (the store is the truth: it could not be told yet)
            filler.unlink()
            done = wait_for(lambda: (j := job(c, a))["state"] == "finished" and j, what="a's end to be recorded")
            assert done["exit_code"] == 0 and done["attempts"] == 1
            assert c.post("/jobs", json={"command": "true", "gpus": 1}).status_code == 201
            assert job(c, b)["state"] == "launching"  # the other job ran on, untouched
            (go / "b").touch()
            wait_for(lambda: job(c, b)["state"] == "finished", what="b to finish")
        s.stop()
        s = Server(state, *args).start()
        time.sleep(1.0)  # rounds after the restart: nothing to recover, nothing to rerun
        with s.client() as c:
            for jid in (a, b):
                j = job(c, jid)
                assert (j["state"], j["attempts"], j["exit_code"]) == ("finished", 1, 0)
                assert key_events(c.get(f"/jobs/{jid}/events").json()) == ["submit", "launch", "finished"]
                assert c.get(f"/jobs/{jid}/logs").text.count("started") == 1  # launched once, exactly
    finally:
        s.stop()
        kill_jobs(state)


@needs_root
def test_a_full_log_disk_cuts_logs_harder_and_leaves_the_state_disk_alone(tmp_path: Path, tmpfs) -> None:  # noqa: ANN001
    logs = tmpfs("joblogs", "64m")  # nearly full below 3.2 MiB free
    filler = logs / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (56 << 20))  # someone else's: the service cannot cut it
    s = Server(tmp_path, "--cluster", "1x2", "--round", "0.2", "--log-cap", "0", "--log-dir", str(logs)).start()
    iters, per = 30, 5000  # 30 writes of 500 KB, 0.1 s apart, with no cap of its own: 15 MB into 8 MiB free
    expected = chatty_output(iters, per)
    try:
        with s.client() as c:
            jid = submit(c, command=f"{JOB_PY} {CHATTY} {iters} {per} 0.1", gpus=1)
            wait_for(lambda: b"(its disk is nearly full)" in joblogs.tail(logs / f"{jid}.log", 8 << 20), timeout=60,
                     what="a cut under pressure")
            assert c.post("/jobs", json={"command": "true", "gpus": 1}).status_code == 201  # the database is elsewhere
            done = wait_for(lambda: (j := job(c, jid))["state"] == "finished" and j, timeout=60, what="the job to end")
        path = logs / f"{jid}.log"
        data = path.read_bytes()
        cut = joblogs.read_cut(path)
        assert cut is not None
        (m,) = NOTE_RE.finditer(data)
        assert m.group(1) == b"4194304" and m.group(2) == b" (its disk is nearly full)"
        assert data[:cut.head] == expected[:cut.head] and data[cut.head + cut.note:] == expected[cut.start:]
        assert done["exit_code"] == 0 and done["progress"] == iters  # no write of the job failed
        assert filler.stat().st_size == 56 << 20
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_log_cap_option_is_checked(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--state-dir", str(tmp_path), "--log-cap", "1k"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO / "src"),
                                                                  COLUMNS="200"))
    assert out.returncode == 2 and "--log-cap: 0 (no cap) or at least 65536 bytes (64Ki), got '1k'" in out.stderr
