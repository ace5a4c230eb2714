"""The service's half of a validation: a real ``gpuloom serve`` running a workload of real processes.

:class:`Testbed` starts ``gpuloom serve`` (a subprocess on loopback, its own
state directory, a declared fake-GPU cluster, the local executor, profiling
off: the jobs bring their profiles) under one policy stack, submits each
:class:`~gpuloom.sim.validate.TestbedJob` over HTTP at its arrival time (the
job is ``examples/sleepy_train.py``: a real process that sleeps its stages,
holding lock files for its GPUs), waits until every job has ended, and
reads back what happened: the accounting (``GET /history?allocations=true``)
and the history as a trace (``GET /history/trace``, :mod:`gpuloom.runtime.state.export`).
Whatever happens, it cancels what is still running and stops the server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from ..core.cluster import Cluster
from ..driver import Stack
from ..sim.validate import Outcome, TestbedJob, gpu_util

FINAL = ("finished", "failed", "cancelled")


def others_may_run(path: str) -> bool:
    """Whether an unprivileged account can execute ``path`` (every directory above it enterable)."""
    p = Path(os.path.realpath(path))
    try:
        return all(os.stat(q).st_mode & 0o001 for q in [p, *p.parents])
    except OSError:
        return False


def job_python() -> str:
    """A Python the service's job accounts can run: this one, else the system's (this one may live in root's
    home; a server started as root runs jobs as an unprivileged account)."""
    if os.geteuid() != 0 or others_may_run(sys.executable):
        return sys.executable
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def default_script() -> Path | None:
    """``examples/sleepy_train.py`` of the checkout this package runs from, if there is one."""
    p = Path(__file__).resolve().parents[3] / "examples" / "sleepy_train.py"
    return p if p.exists() else None


def cluster_args(cluster: Cluster) -> list[str]:
    """``serve`` options declaring ``cluster`` (identical nodes: NODESxGPUS, cores and memory per node)."""
    n = cluster.nodes[0]
    if any((m.gpus, m.cpus, m.mem_mb) != (n.gpus, n.cpus, n.mem_mb) for m in cluster.nodes):
        raise ValueError("the testbed declares identical nodes only")
    return ["--cluster", f"{cluster.num_nodes}x{n.gpus}", "--cpus-per-node", str(n.cpus),
            "--mem-gb-per-node", repr(n.mem_mb / 1000.0)]


def wait_for_serve(state_dir: Path, proc: subprocess.Popen, timeout: float, verify: Any = True,
                   poll_s: float = 0.1) -> tuple[str, str] | None:
    """Wait until the ``gpuloom serve`` process ``proc`` with ``state_dir`` answers ``/health``:
    its URL and admin token (from ``server.json`` and ``admin.token``), or None after ``timeout``
    seconds.  RuntimeError with the end of ``serve.out`` if the process exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            out = state_dir / "serve.out"
            raise RuntimeError(f"gpuloom serve exited: {out.read_text()[-2000:] if out.exists() else ''}")
        f = state_dir / "server.json"
        if f.exists():
            url = json.loads(f.read_text())["url"]
            token = (state_dir / "admin.token").read_text().strip()
            try:
                if httpx.get(url + "/health", timeout=5, verify=verify).status_code == 200:
                    return url, token
            except httpx.HTTPError:
                pass
        time.sleep(poll_s)
    return None


def _wall(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).timestamp()


@dataclass(slots=True)
class TestbedRun:
    """What the service did with a workload."""

    __test__ = False  # not a pytest class, despite its name
    trace: list[dict[str, Any]]  # GET /history/trace rows
    history: list[dict[str, Any]]  # GET /history?allocations=true records
    outcomes: dict[str, Outcome]  # by workload job id; seconds after the first submission
    ids: dict[str, int]  # workload job id -> service job id
    util: float  # GPU utilisation over [first submission, last end]
    states: dict[str, str] = field(default_factory=dict)  # workload job id -> final state
    wall_s: float = 0.0


class Testbed:
    """One ``gpuloom serve`` for one stack (see the module notes)."""

    __test__ = False  # not a pytest class, despite its name
    def __init__(self, workdir: Path, cluster: Cluster, stack: Stack, round_s: float = 2.0,
                 grace_s: float = 10.0, script: Path | None = None, python: str | None = None,
                 serve_args: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir).resolve()  # the server runs there: a relative --state-dir would nest
        self.state_dir = self.workdir / "state"
        self.share: Path | None = None  # the job script and the GPU locks, where every account reaches them
        self.cluster = cluster
        self.stack = stack
        self.round_s = round_s
        self.grace_s = grace_s
        script = script or default_script()
        if script is None:
            raise FileNotFoundError("no job script: give the path of examples/sleepy_train.py (--job-script)")
        self.script = Path(script).resolve()
        self.python = python or job_python()
        self.serve_args = list(serve_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""

    # -- the server ------------------------------------------------------------------------------
    def command(self) -> list[str]:
        st = self.stack
        self.share_files()
        assert self.share is not None
        # the jobs' checkpoint directories in the testbed's own folder, not a shared default like /var/tmp
        cmd = [sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir", str(self.state_dir),
               "--job-dir", str(self.share / "jobs"),
               *cluster_args(self.cluster), "--round", repr(self.round_s), "--grace", repr(self.grace_s),
               "--no-profile", "--log-level", "warning", "--order", st.order, "--group", st.group, "--size", st.size,
               "--place", st.place, "--reserve-depth", str(st.reserve_depth)]  # (the service's default is 8)
        if not st.preemptive:
            cmd.append("--non-preemptive")
        for k, v in {**st.model_options, **st.params}.items():
            cmd += ["-P", f"{k}={v}"]
        return cmd + self.serve_args

    def share_files(self) -> tuple[str, str]:
        """(the job script, the GPU lock directory), somewhere the jobs' OS accounts can read and write."""
        if self.share is None:  # outside /tmp: jobs of other accounts get their own /tmp
            from ..runtime.service.security import JOB_DIR_BASE, JOB_DIR_BASE_ENV

            base = os.environ.get(JOB_DIR_BASE_ENV) or JOB_DIR_BASE
            self.share = Path(tempfile.mkdtemp(prefix="gpuloom-testbed-", dir=base))
            os.chmod(self.share, 0o755)
            shutil.copy(self.script, self.share / self.script.name)
            os.chmod(self.share / self.script.name, 0o644)
            (self.share / "gpu-locks").mkdir()
            os.chmod(self.share / "gpu-locks", 0o1777)  # like /tmp: any job account makes its lock files
        return str(self.share / self.script.name), str(self.share / "gpu-locks")

    def start(self, timeout: float = 60.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "server.json").unlink(missing_ok=True)
        src = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
        out = open(self.state_dir / "serve.out", "ab")
        self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                     cwd=self.workdir)
        out.close()
        up = wait_for_serve(self.state_dir, self.proc, timeout)
        if up is not None:
            self.url, self.token = up
            return
        log = (self.state_dir / "serve.out").read_text()[-2000:]
        raise RuntimeError(f"gpuloom serve did not come up in {timeout:.0f} s (its state in {self.state_dir})"
                           + (f": {log}" if log.strip() else ""))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def stop(self) -> None:
        """Cancel what still runs, then stop the server (SIGINT; SIGKILL if it does not go)."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.url:
            try:
                with self.client() as c:
                    live = [j["id"] for j in c.get("/jobs").json() if j["state"] not in FINAL]
                    for jid in live:
                        c.delete(f"/jobs/{jid}")
                    end = time.monotonic() + self.grace_s + 10
                    while live and time.monotonic() < end:
                        live = [j["id"] for j in c.get("/jobs").json() if j["state"] not in FINAL]
                        time.sleep(0.2)
            except httpx.HTTPError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.share is not None:
            shutil.rmtree(self.share, ignore_errors=True)
            self.share = None

    # -- a run -----------------------------------------------------------------------------------
    def run(self, jobs: Sequence[TestbedJob], timeout: float = 1800.0) -> TestbedRun:
        """Start the server, submit ``jobs`` at their arrivals, wait for all to end, read back, stop."""
        t_start = time.monotonic()
        try:
            self.start()  # a server that did not come up in time may still be starting: stopped below too
            return self._run(jobs, timeout, t_start)
        finally:
            self.stop()

    def _run(self, jobs: Sequence[TestbedJob], timeout: float, t_start: float) -> TestbedRun:
        order = sorted(jobs, key=lambda j: (j.arrival, j.id))
        ids: dict[str, int] = {}
        errors: list[str] = []
        script, locks = self.share_files()
        bodies = {j.id: j.submit_body(self.cluster, self.python, script, locks) for j in order}

        def submitter() -> None:
            t0 = time.monotonic()
            with self.client() as c:
                for j in order:
                    d = t0 + j.arrival - time.monotonic()
                    if d > 0:
                        time.sleep(d)
                    r = c.post("/jobs", json=bodies[j.id])
                    if r.status_code != 201:
                        errors.append(f"job {j.id}: {r.status_code} {r.text}")
                        return
                    ids[j.id] = int(r.json()["id"])

        th = threading.Thread(target=submitter, name="testbed-submit", daemon=True)
        th.start()
        end = time.monotonic() + timeout
        with self.client() as c:
            while True:
                if errors:
                    raise RuntimeError("; ".join(errors))
                if not th.is_alive() and len(ids) == len(order):
                    states = {j["id"]: j["state"] for j in c.get("/jobs").json()}
                    if all(states.get(sid) in FINAL for sid in ids.values()):
                        break
                if time.monotonic() > end:
                    raise TimeoutError(f"the workload did not finish within {timeout:.0f} s")
                time.sleep(0.5)
            trace = c.get("/history/trace").json()
            hist = c.get("/history", params={"allocations": True}).json()
        by_sid = {r["id"]: r for r in hist}
        back = {sid: jid for jid, sid in ids.items()}
        bad = [f"{jid} ({by_sid[sid]['state']}: {by_sid[sid].get('reason')})" for jid, sid in ids.items()
               if by_sid.get(sid, {}).get("state") != "finished"]
        if bad:  # a comparison over the jobs that happened to finish would mean nothing
            raise RuntimeError(f"{len(bad)} of {len(ids)} jobs did not finish: {'; '.join(bad[:5])} "
                               f"(the server's log: {self.state_dir / 'serve.out'})")
        t0 = min(_wall(by_sid[s]["submit"]) or 0.0 for s in ids.values())
        outcomes, spans, t1 = {}, [], t0
        for sid, rec in by_sid.items():
            if sid not in back:
                continue
            sub, fin = _wall(rec["submit"]), _wall(rec["end"])
            if rec["state"] == "finished" and sub is not None and fin is not None:
                outcomes[back[sid]] = Outcome(sub - t0, fin - t0)
                t1 = max(t1, fin)
            for a in rec.get("allocations") or []:
                a0, a1 = _wall(a["start"]), _wall(a["end"])
                if a0 is not None and a1 is not None:
                    spans.append((a0, a1, a["gpu_ids"]))
        return TestbedRun(trace, hist, outcomes, ids, gpu_util(spans, self.cluster.num_gpus, t0, t1),
                          {back[s]: r["state"] for s, r in by_sid.items() if s in back},
                          time.monotonic() - t_start)
