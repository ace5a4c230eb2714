"""The service at scale: rounds and ``gpuloom queue`` with 100 / 1,000 / 10,000 pending jobs.

A real ``gpuloom serve`` (SQLite in its state directory, or a throw-away PostgreSQL server started from
its binaries) with a declared 64x8 cluster and 512 one-GPU ``sleep`` jobs running, so every job
submitted next pends.  At each pending level (topped up with job arrays of 1,000 tasks):

* **quiet round**: the mean round (``gpuloom_round_duration_seconds``, sum over count from ``/metrics``)
  over ``--quiet`` seconds in which nothing changes (``--round 0.25``), and the server's CPU meanwhile
  (rounds and the 0.1 s ticks between them), which other processes' load does not inflate;
* **quiet** also gives the mean time from one round to the next (``--round 0.25`` plus the round's own);
* **stream**: one client, then ``CLIENTS`` clients, submit single jobs for ``--stream`` seconds each
  (the admin's token: no rate limit): submissions per second,
  the rounds meanwhile (their count and mean from ``/metrics``), the longest time without a round and
  how long a submission waited for the round that picked it up (both from the store's events, see
  :func:`stream`): rounds must keep coming however fast submissions do;
* **queue** / **queue --json**: the wall time of the command (a new process, output into a file), the
  CPU it and the server spent, and its lines / jobs as a check.

The servers and commands run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` unset), as an
installed package does.

``python benchmarks/bench_scale.py [--baseline OTHER_CHECKOUT] [--db sqlite,postgres] [--sizes 100,1000,10000]``:
with ``--baseline`` (e.g. ``git worktree add /tmp/base HEAD`` before a change) each database is run with
that checkout's server and command, then with this one's, and the table shows both.  ``benchmarks/run.py
scale`` runs this checkout on SQLite only.  Running as root needs the ``postgres`` account for PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
RUNNING = 512
CLIENTS = 8
ROUND_S = 0.25
ARRAY = 1000  # tasks per array submitted to reach a pending level


# -- PostgreSQL ------------------------------------------------------------------------------------
def _pg_bin() -> str | None:
    found = [shutil.which("initdb") or "", *sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)]
    return next((str(Path(p).parent) for p in found if p and os.access(Path(p).parent / "pg_ctl", os.X_OK)), None)


def _as_pg(cmd: str) -> list[str]:
    if os.geteuid() != 0:
        return ["/bin/sh", "-c", cmd]
    pwd.getpwnam("postgres")  # KeyError: no account to run the server as
    return ["su", "postgres", "-s", "/bin/sh", "-c", cmd]


@contextlib.contextmanager
def postgres() -> Iterator[Path]:
    """A PostgreSQL server on a Unix socket in a new directory (yielded), removed afterwards."""
    pg = _pg_bin()
    if pg is None:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    d = Path(tempfile.mkdtemp(prefix="gpuloom-bench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(d, "postgres")
        os.chmod(d, 0o755)
    data = d / "data"
    try:
        subprocess.run(_as_pg(f"{pg}/initdb -D {data} -A trust -U gpuloom"), check=True, capture_output=True)
        subprocess.run(_as_pg(f"{pg}/pg_ctl -D {data} -w -o \"-k {d} -c listen_addresses=''\" -l {d}/log start"),
                       check=True, capture_output=True)
        yield d
    finally:
        subprocess.run(_as_pg(f"{pg}/pg_ctl -D {data} -m fast stop"), capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def pg_database(sock: Path, name: str) -> str:
    import psycopg

    with psycopg.connect(f"host={sock} user=gpuloom dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://gpuloom@/{name}?host={sock}"


# -- the server ------------------------------------------------------------------------------------
class Server:
    def __init__(self, state_dir: Path, src: Path, db: str | None) -> None:
        from gpuloom.cli.testbed import wait_for_serve

        self.state_dir, self.src = state_dir, src
        self.db = db or f"sqlite:///{state_dir / 'gpuloom.db'}"
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env["PYTHONPATH"] = str(src)
        args = ["--cluster", "64x8", "--cpus-per-node", "64", "--mem-gb-per-node", "512", "--round", str(ROUND_S),
                "--launch-timeout", "1", "--log-level", "warning", "--max-array-size", str(ARRAY + 1)]
        self.out = open(state_dir / "serve.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir",
                                      str(state_dir), *args, *(["--db", db] if db else [])],
                                     env=self.env, stdout=self.out, stderr=subprocess.STDOUT)
        up = wait_for_serve(state_dir, self.proc, 120, poll_s=0.1)
        if up is None:
            raise RuntimeError("server did not start")
        self.url, self.token = up
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=300)
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        """CPU seconds the server has used."""
        t = self.ps.cpu_times()
        return t.user + t.system

    def submit_array(self, n: int, name: str) -> None:
        r = self.http.post("/jobs", json={"name": name, "command": "sleep 3600", "gpus": 1, "array": f"0-{n - 1}"})
        r.raise_for_status()

    def count(self, state: str) -> int:
        r = self.http.get("/jobs", params={"state": state, "limit": 10_000})
        return len(r.json()) if r.headers.get("X-Next-After") is None else 10_000

    def rounds(self) -> tuple[float, int, dict[float, int]]:
        """The round histogram from /metrics: (sum, count, {bucket's upper bound: count})."""
        text = self.http.get("/metrics").text
        total = float(re.search(r"^gpuloom_round_duration_seconds_sum (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
        n = int(float(re.search(r"^gpuloom_round_duration_seconds_count (\S+)", text, re.M).group(1)))  # type: ignore[union-attr]
        buckets = {float(le): int(float(v)) for le, v in re.findall(
            r'^gpuloom_round_duration_seconds_bucket\{le="([^"+]+)"\} (\S+)', text, re.M)}
        return total, n, buckets

    def close(self) -> None:
        from gpuloom.runtime.state.store import Store

        self.http.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.out.close()
        store = Store(self.db)
        for row in store.list_jobs():
            for p in row.procs or []:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(p["pid"]), signal.SIGKILL)
        sid = store.get_meta("service_id")
        store.close()
        time.sleep(0.5)
        if sid:
            shutil.rmtree(f"/var/tmp/gpuloom-{sid}", ignore_errors=True)  # its default job directory
            for base in Path("/sys/fs/cgroup").iterdir():
                parent = base / f"gpuloom-{sid}"
                if parent.is_dir():  # the service's (now empty) job cgroups
                    for child in [c for c in parent.iterdir() if c.is_dir()] + [parent]:
                        with contextlib.suppress(OSError):
                            child.rmdir()


def _wait(what: str, cond: object, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _slowest(before: dict[float, int], after: dict[float, int]) -> float:
    """The upper bound of the highest histogram bucket that gained a round (inf: above the last)."""
    last = 0.0
    prev = 0
    for le in sorted(after):
        n = after[le] - before.get(le, 0)
        if n > prev:
            last = le
        prev = n
    return last


def quiet(s: Server, seconds: float) -> tuple[float, float, float]:
    """(mean round, server CPU per second, mean time from one round to the next) over ``seconds`` in
    which nothing changes."""
    s0, n0, _ = s.rounds()
    c0, t0 = s.cpu(), time.monotonic()
    time.sleep(seconds)
    c1, t1 = s.cpu(), time.monotonic()
    s1, n1, _ = s.rounds()
    return (s1 - s0) / max(1, n1 - n0), (c1 - c0) / (t1 - t0), (t1 - t0) / max(1, n1 - n0)


def stream(s: Server, seconds: float, clients: int = CLIENTS) -> dict:
    """Submissions from ``clients`` clients (the admin's token: no rate limit) for ``seconds``; the rounds
    meanwhile, as the store recorded them: each round that picks up new jobs moves them to
    ``waiting_for_initial_resource`` in one batch, one event time for them all, so those times are the
    rounds' (read after the stream: the watching does not compete with what it watches).  ``gap``: the
    longest time without such a round from the first submission to the last (the clients connected
    before: their start is no gap); ``contact``: each job's submission to that round (p50, p99)."""
    from gpuloom.runtime.state.store import Store

    stop = threading.Event()
    ready = threading.Barrier(clients + 1)
    acked = [0] * clients

    def client(k: int) -> None:
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token}"}, timeout=300) as h:
            h.get("/health")  # (connected)
            ready.wait()
            while not stop.is_set():
                if h.post("/jobs", json={"name": "s", "command": "sleep 3600", "gpus": 1}).status_code == 201:
                    acked[k] += 1

    s0, n0, b0 = s.rounds()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.time()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    t1 = time.time()
    s1, n1, b1 = s.rounds()
    time.sleep(2 * ROUND_S + 1)  # the last submissions' round
    store = Store(s.db)
    try:
        events = [e for e in store.events() if e["time"] >= t0 and e["kind"] in ("submit", "waiting_for_initial_resource")]
    finally:
        store.close()
    submitted = {e["job_id"]: e["time"] for e in events if e["kind"] == "submit"}
    contact = {e["job_id"]: e["time"] for e in events if e["kind"] != "submit" and e["job_id"] in submitted}
    first, last = min(submitted.values()), max(submitted.values())
    marks = [first, *sorted({t for t in contact.values() if first <= t <= last}), last]
    lat = sorted(contact[j] - submitted[j] for j in contact)
    return {"per_s": sum(acked) / (t1 - t0), "rounds": n1 - n0, "mean": (s1 - s0) / max(1, n1 - n0),
            "gap": max(b - a for a, b in zip(marks, marks[1:], strict=False)), "slowest": _slowest(b0, b1),
            "p50": lat[len(lat) // 2] if lat else float("nan"), "p99": lat[int(len(lat) * 0.99)] if lat else float("nan")}


def queue_cli(s: Server, *flags: str) -> tuple[float, float, float, int]:
    """``gpuloom queue FLAGS`` into a file: wall seconds, its CPU, the server's CPU meanwhile, and its
    lines (jobs with --json)."""
    with tempfile.TemporaryFile("w+") as out:
        r0, c0 = resource.getrusage(resource.RUSAGE_CHILDREN), s.cpu()
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpuloom", "queue", "--state-dir", str(s.state_dir), *flags],
                       env=s.env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=600)
        wall = time.perf_counter() - t
        r1, c1 = resource.getrusage(resource.RUSAGE_CHILDREN), s.cpu()
        out.seek(0)
        text = out.read()
    mine = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return wall, mine, c1 - c0, len(json.loads(text)) if "--json" in flags else text.count("\n")


def run_side(side: str, src: Path, db_kind: str, sizes: list[int], quiet_s: float, stream_s: float,
             pg: Path | None) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpuloom-bench-scale-") as d:
        db = pg_database(pg, f"scale_{side}_{int(time.time() * 1000) % 10**9}") if pg is not None else None
        s = Server(Path(d), src, db)
        try:
            for k in range(RUNNING // 64):  # (short launch rounds: short launch times, short protection)
                s.submit_array(64, "run")
                _wait("a launch", lambda k=k: s.count("waiting_for_initial_resource") == 0
                      and s.count("waiting_for_initial_contact") == 0)
            _wait("the running jobs", lambda: s.count("running") == RUNNING)
            submitted = 0
            for size in sizes:
                pending = s.count("waiting_for_initial_resource")
                while pending < size:
                    n = min(ARRAY, size - pending)
                    s.submit_array(n, "p")
                    pending += n
                    submitted += n
                _wait("the jobs to pend", lambda size=pending: s.count("waiting_for_initial_resource") >= size)
                time.sleep(2 * ROUND_S + 1)
                row = {"side": side, "db": db_kind, "pending": pending}
                row["quiet"], row["quiet_cpu"], row["every"] = quiet(s, quiet_s)
                row["queue"], row["queue_cpu"], row["queue_srv"], row["lines"] = queue_cli(s)
                row["json"], row["json_cpu"], row["json_srv"], row["jobs"] = queue_cli(s, "--json")
                row["gap1"], row["per_s1"] = (lambda r: (r["gap"], r["per_s"]))(stream(s, stream_s, 1))
                row.update(stream(s, stream_s))
                rows.append(row)
                print(_line(row), flush=True)
        finally:
            s.close()
    return rows


HEAD = (f"{'side':<6} {'db':<8} {'pending':>7} {'quiet ms':>8} {'cpu %':>5} {'every s':>7} {'1: subm/s':>9} "
        f"{'gap s':>5} {'subm/s':>6} {'rounds':>6} {'mean ms':>7} {'slowest':>7} {'gap s':>5} {'contact ms':>11} "
        f"{'queue s (cpu+srv)':>18} {'--json s (cpu+srv)':>19} {'jobs':>6}")


def _line(r: dict) -> str:
    slow = "inf" if r["slowest"] == float("inf") else f"<={r['slowest'] * 1e3:g}"
    q = f"{r['queue']:.2f} ({r['queue_cpu']:.2f}+{r['queue_srv']:.2f})"
    j = f"{r['json']:.2f} ({r['json_cpu']:.2f}+{r['json_srv']:.2f})"
    return (f"{r['side']:<6} {r['db']:<8} {r['pending']:>7} {r['quiet'] * 1e3:>8.1f} {r['quiet_cpu'] * 100:>5.0f} "
            f"{r['every']:>7.3f} {r['per_s1']:>9.0f} {r['gap1']:>5.2f} "
            f"{r['per_s']:>6.0f} {r['rounds']:>6} {r['mean'] * 1e3:>7.1f} {slow:>7} {r['gap']:>5.2f} "
            f"{r['p50'] * 1e3:>5.0f}/{r['p99'] * 1e3:<5.0f} {q:>18} {j:>19} {r['jobs']:>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="another checkout: its server and command first, then this one's")
    ap.add_argument("--db", default="sqlite", help="comma-separated: sqlite, postgres")
    ap.add_argument("--sizes", default="100,1000,10000", help="pending levels, rising")
    ap.add_argument("--quiet", type=float, default=5.0, help="seconds of quiet rounds measured per level")
    ap.add_argument("--stream", type=float, default=4.0, help="seconds of submissions per level")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    kinds = [k.strip() for k in a.db.split(",")]
    for k in kinds:
        if k not in ("sqlite", "postgres"):
            ap.error(f"--db: sqlite or postgres, got {k!r}")
    sides = ([("before", a.baseline / "src")] if a.baseline else []) + [("after" if a.baseline else "this", REPO / "src")]
    print(f"gpuloom serve, 64x8 declared, {RUNNING} running, --round {ROUND_S}; {CLIENTS} submitting clients; "
          f"{psutil.cpu_count()} cores")
    print("quiet: mean round with nothing changing, cpu %: the server's CPU meanwhile, every s: from one round "
          "to the next; 1: one client submitting as fast as it can: subm/s, gap (the longest time without a round); "
          f"then {CLIENTS} clients: subm/s, rounds, mean, slowest (its histogram bucket), gap, contact (submission to "
          "the round that picked it up, p50/p99); queue/json: wall seconds of `gpuloom queue [--json]` "
          f"into a file (its CPU + the server's); load {os.getloadavg()[0]:.1f}")
    print(HEAD, flush=True)
    rows: list[dict] = []
    for kind in kinds:
        with postgres() if kind == "postgres" else contextlib.nullcontext() as pg:
            for side, src in sides:
                rows += run_side(side, src, kind, sizes, a.quiet, a.stream, pg)
    print(f"\nload {os.getloadavg()[0]:.1f}\n" + HEAD)
    for r in rows:
        print(_line(r))


if __name__ == "__main__":
    main()
