"""Helpers for the service tests: a real ``gpuloom serve`` in a subprocess on loopback."""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from gpuloom.cli.testbed import wait_for_serve
from gpuloom.runtime.service.security import JOB_DIR_BASE, JOB_DIR_BASE_ENV

REPO = Path(__file__).resolve().parents[1]


def _others_may_run(path: str) -> bool:
    """Whether an unprivileged account can execute ``path`` (every directory above enterable)."""
    p = Path(os.path.realpath(path))
    return all(os.stat(q).st_mode & 0o001 for q in [p, *p.parents])


#: a Python the service's job accounts can run: ours, else the system's (ours may live in root's home)
JOB_PY = sys.executable if os.geteuid() != 0 or _others_may_run(sys.executable) else (
    shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable)
# readable by job accounts wherever the checkout is; outside /tmp, which jobs of other accounts get their own of
_SHARED = Path(tempfile.mkdtemp(prefix="gpuloom-test-jobs-", dir=os.environ.get(JOB_DIR_BASE_ENV) or JOB_DIR_BASE))
os.chmod(_SHARED, 0o755)
atexit.register(shutil.rmtree, _SHARED, True)


def shared_copy(path: Path) -> Path:
    """A copy of a job script that every account can read."""
    dst = _SHARED / path.name
    if not dst.exists():
        shutil.copy(path, dst)
        os.chmod(dst, 0o644)
    return dst


STEPPER = shared_copy(Path(__file__).resolve().parent / "jobs" / "stepper.py")


def stepper_cmd(steps: int, dt: float) -> str:
    return f"{JOB_PY} {STEPPER} {steps} {dt}"


class Server:
    """``gpuloom serve`` on 127.0.0.1 with a free port and its own state dir."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        self.state_dir = state_dir
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""
        self.verify: Any = True  # a CA file for a server with its own TLS certificate
        self.socket: str | None = None  # its Unix socket, from server.json
        self.popen_kw: dict[str, Any] = {}  # more for subprocess.Popen (say, a preexec_fn setting limits)

    def start(self, timeout: float = 120.0) -> Server:
        """Start it and wait until it answers ``/health`` (RuntimeError at once if it exits first).  On a loaded
        machine its start (it imports the whole service) takes many seconds of wall time: the deadline is for a
        server that hangs, not for a slow one (docs/performance.md)."""
        (self.state_dir / "server.json").unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        self.out = open(self.state_dir / "serve.out", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir", str(self.state_dir),
             "--log-level", "warning", *self.args],
            env=env, stdout=self.out, stderr=subprocess.STDOUT, cwd=REPO, **self.popen_kw,
        )
        up = wait_for_serve(self.state_dir, self.proc, timeout, self.verify, poll_s=0.05)
        if up is None:
            self.kill()  # (no test stops a server whose start failed: it would outlive the test)
            raise RuntimeError(f"server did not come up in {timeout:.0f} s")
        self.url, self.token = up
        self.socket = json.loads((self.state_dir / "server.json").read_text()).get("socket")
        return self

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token or self.token}"}, timeout=30,
                            verify=self.verify)

    def kill(self) -> None:
        """SIGKILL the server (job processes live in their own sessions and survive)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def remove_cgroups(parent: str) -> None:
    """Remove the (empty) job cgroups under ``parent`` and the parent itself, v1 or v2."""
    for base in (*(Path("/sys/fs/cgroup") / c for c in ("memory", "cpuset", "pids", "devices")),
                 Path("/sys/fs/cgroup")):
        p = base / parent
        if not p.is_dir():
            continue
        for child in p.iterdir():
            if child.is_dir():
                try:
                    child.rmdir()
                except OSError:
                    pass
        try:
            p.rmdir()
        except OSError:
            pass


def kill_jobs(state_dir: Path) -> None:
    """Kill every job process the store still records and remove the service's cgroups (test cleanup)."""
    from gpuloom.runtime.state.store import Store

    db = state_dir / "gpuloom.db"
    if not db.exists():
        return
    store = Store(f"sqlite:///{db}")
    sid = store.get_meta("service_id")
    for row in store.list_jobs():
        for p in row.procs or []:
            try:
                proc = psutil.Process(int(p["pid"]))
                if abs(proc.create_time() - float(p["start_time"])) < 1.0:
                    os.killpg(proc.pid, signal.SIGKILL)
            except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                pass
    store.close()
    if sid:
        time.sleep(0.1)
        remove_cgroups(f"gpuloom-{sid}")
        base = os.environ.get(JOB_DIR_BASE_ENV) or JOB_DIR_BASE
        shutil.rmtree(f"{base}/gpuloom-{sid}", ignore_errors=True)  # the service's default job directory


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie; False if it ends while being asked."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(fn: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something true (-> that), or fail after ``timeout`` s.  The pause between
    polls grows from 0.05 s to 0.25 s: most polls are a request to a server, which costs CPU on both sides, and
    a wait of seconds at a fixed 0.05 s took that CPU from the other workers' tests (docs/performance.md)."""
    end = time.monotonic() + timeout
    pause = 0.05
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(pause)
        pause = min(pause * 1.25, 0.25)
    raise AssertionError(f"timed out waiting for {what}")


def job(c: httpx.Client, jid: int) -> dict[str, Any]:
    r = c.get(f"/jobs/{jid}")
    r.raise_for_status()
    return r.json()


def start_records(log: str) -> list[dict[str, Any]]:
    """The JSON start records a stepper job printed (one per launch)."""
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("event") == "start":
                out.append(d)
    return out


def ledger(checkpoint_dir: str) -> list[int]:
    p = Path(checkpoint_dir) / "ledger"
    return [int(x) for x in p.read_text().split()] if p.exists() else []


KEY_EVENTS = ("submit", "launch", "adopt", "requeue", "preempt", "finished", "failed", "cancelled")


def key_events(events: list[dict[str, Any]]) -> list[str]:
    """Event kinds without the lifecycle's intermediate states."""
    return [e["kind"] for e in events if e["kind"] in KEY_EVENTS]


def submit(c: httpx.Client, **spec: Any) -> int:
    """POST a job; fails with the server's answer unless it was accepted."""
    r = c.post("/jobs", json=spec)
    assert r.status_code == 201, f"{r.status_code}: {r.text}"
    return int(r.json()["id"])


def own_cgroup_parent() -> Iterator[str]:
    """A cgroup parent of its own for an in-process test's jobs, removed afterwards (for fixtures)."""
    name = f"gpuloom-test-{uuid.uuid4().hex[:8]}"
    yield name
    remove_cgroups(name)


def job_writable(tmp_path: Path) -> Path:
    """A directory for a test's job output that the service's job accounts may write (named after the
    test's own temporary directory)."""
    d = _SHARED / tmp_path.name
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o777)
    return d


def fill(d: Path) -> Path:
    """Fill ``d``'s file system to the last byte with a file of its own."""
    f = d / "filler"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    assert os.statvfs(d).f_bavail == 0
    return f


class FullLogDisk:
    """While ``full``, the disk of the logs the service copies jobs' output into is full: each append
    (:func:`gpuloom.runtime.exec.logmirror.append_to`'s) is half written, then refused with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gpuloom.runtime.exec import logmirror

        self.full = True
        monkeypatch.setattr(logmirror, "open", self._open, raising=False)  # (its own open only)

    def _open(self, path: str, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = open(path, mode, *args, **kw)
        return _HalfWritten(f) if self.full and "a" in mode else f


class _HalfWritten:
    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> _HalfWritten:
        return self

    def __exit__(self, *_: object) -> None:
        self.f.close()

    def write(self, data: bytes) -> None:
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


# -- the dashboard in a real headless browser (playwright driving the system's Chromium) -----------------
CHROMIUM = os.environ.get("GPULOOM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MAX_PNG = 200_000  # bytes a screenshot for the docs may take


def login(page: Any, url: str, token: str) -> None:
    """Open ``url`` (the dashboard) and log in with ``token``."""
    page.goto(url)
    page.wait_for_selector("#login-form", state="visible")
    page.fill("#token", token)
    page.click("#login-form button")


def shot(page: Any, path: Path) -> None:
    """A screenshot of what ``page`` shows, small enough for the docs."""
    page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size < MAX_PNG, f"{path} is {path.stat().st_size} bytes"


class Crash(BaseException):
    """The server dies (no except clause of the service catches it)."""


def crashed_launch(svc: Any, command: str, node: str) -> int:
    """Submit a job to ``svc`` (whose executor raises :class:`Crash` once its first launch is made) and run a
    round: the server does not live to confirm that launch, only its intent (on ``node``) is stored."""
    jid = svc.submit({"name": "a", "command": command, "gpus": 1}, "alice")
    with pytest.raises(Crash):
        svc.round()
    row = svc.store.get_job(jid)
    assert row is not None and row.procs == [{"job_id": str(jid), "node": node, "pending": True}]
    assert row.state == "waiting_for_initial_resource" and row.attempts == 1
    return int(jid)
