"""Service benchmark: submission throughput and submit-to-launch latency on loopback.

Starts a real ``gpuloom serve`` (uvicorn, SQLite WAL store with synchronous=FULL,
process executor) in a subprocess on 127.0.0.1 and drives it with concurrent
httpx clients.

* **submit**: N submissions from C concurrent clients while the cluster's only
  GPU is busy (pure API + store path: validate, commit, acknowledge); reports
  acknowledgements per second and request latency, and checks the store count
  equals the acknowledged count.
* **launch**: J one-GPU jobs (``sleep``) submitted by C clients to a cluster
  with room for all of them; submit-to-launch latency is ``first_start -
  submit_time`` from the store (includes the round, the plan, core selection
  and the process launch, each committed before the next step), once for
  jobs arriving one at a time (the latency of one job) and once for a burst
  (queueing behind other launches).

Run: ``PYTHONPATH=src python benchmarks/bench_service.py``; with ``--baseline OTHER_CHECKOUT``, only the
submission benchmark from 32 clients, 6 pairs of runs of that checkout's server and this one's, each
version first in every other pair, in one run (medians and their ratios, and the median of each pair's
ratio).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]


class _Server:
    def __init__(self, state_dir: Path, *args: str, src: Path = REPO / "src") -> None:
        env = dict(os.environ, PYTHONPATH=str(src))
        self.state_dir = state_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir", str(state_dir),
             "--log-level", "warning", *args],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        from gpuloom.cli.testbed import wait_for_serve

        up = wait_for_serve(state_dir, self.proc, 60, poll_s=0.05)
        if up is None:
            raise RuntimeError("server did not start")
        self.url, self.token = up

    def close(self) -> None:
        from gpuloom.runtime.state.store import Store

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        store = Store(f"sqlite:///{self.state_dir / 'gpuloom.db'}")
        for row in store.list_jobs():
            for p in row.procs or []:
                try:
                    os.killpg(int(p["pid"]), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        sid = store.get_meta("service_id")
        store.close()
        time.sleep(0.2)
        if sid:
            import shutil

            shutil.rmtree(f"/var/tmp/gpuloom-{sid}", ignore_errors=True)  # its default job directory
        for base in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")):
            parent = base / f"gpuloom-{sid}"
            if sid and parent.is_dir():  # the service's (now empty) job cgroups
                for child in [c for c in parent.iterdir() if c.is_dir()] + [parent]:
                    try:
                        child.rmdir()
                    except OSError:
                        pass


def _drive(url: str, token: str, n: int, clients: int, body: dict, gap: float = 0.0) -> tuple[float, list[float], list[int]]:
    lat: list[float] = []
    ids: list[int] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
            for _ in range(k, n, clients):
                t = time.perf_counter()
                r = h.post("/jobs", json=body)
                dt = time.perf_counter() - t
                if r.status_code == 201:
                    with lock:
                        lat.append(dt)
                        ids.append(r.json()["id"])
                if gap:
                    time.sleep(gap)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat, ids


def bench_submit(n: int, clients: int, src: Path = REPO / "src") -> dict:
    from gpuloom.runtime.state.store import Store

    with tempfile.TemporaryDirectory() as d:
        sd = Path(d)
        s = _Server(sd, "--cluster", "1x1", "--cpus-per-node", "1", "--round", "1", src=src)
        try:
            with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token}"}) as c:
                c.post("/jobs", json={"name": "blocker", "command": "sleep 600", "gpus": 1})
            wall, lat, ids = _drive(s.url, s.token, n, clients, {"name": "b", "command": "true", "gpus": 1})
        finally:
            s.close()
        store = Store(f"sqlite:///{sd / 'gpuloom.db'}")
        stored = store.count_jobs() - 1
        store.close()
    a = np.array(lat) * 1000
    return {"test": "submit", "jobs": n, "clients": clients, "acked": len(ids), "stored": stored,
            "per_s": len(ids) / wall, "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


def bench_launch(n: int, clients: int, round_s: float, gap: float = 0.0) -> dict:
    from gpuloom.runtime.state.store import Store

    nodes = -(-n // 8)
    with tempfile.TemporaryDirectory() as d:
        sd = Path(d)
        s = _Server(sd, "--cluster", f"{nodes}x8", "--cpus-per-node", "8", "--mem-gb-per-node", "8",
                    "--round", str(round_s))
        try:
            wall, _, ids = _drive(s.url, s.token, n, clients, {"name": "l", "command": "sleep 30", "gpus": 1}, gap)
            end = time.monotonic() + 120
            store = Store(f"sqlite:///{sd / 'gpuloom.db'}")
            while time.monotonic() < end and store.count_jobs(["RUNNING"]) < n:
                time.sleep(0.1)
            rows = store.list_jobs()
            store.close()
        finally:
            s.close()
    lat = np.array([r.first_start - r.submit_time for r in rows if r.first_start is not None]) * 1000
    span = max(r.first_start for r in rows if r.first_start) - min(r.submit_time for r in rows)
    return {"test": "launch", "jobs": n, "clients": clients, "round_s": round_s, "gap": gap, "launched": len(lat),
            "per_s": len(lat) / span, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max())}


def compare_submit(baseline: Path, n: int = 1000, clients: int = 32, repeats: int = 6) -> None:
    """Submission throughput and p99 latency from ``clients`` clients: this checkout against another
    (``baseline``, e.g. a worktree of an earlier commit), alternating, in one run; medians and ratios."""
    runs: dict[str, list[dict]] = {"baseline": [], "this": []}
    pair = (("baseline", baseline / "src"), ("this", REPO / "src"))
    for k in range(repeats):
        # each version goes first in every other pair: a run that follows another (its disk writes still
        # being flushed, its processes being reaped) is not always the same version's
        for name, src in pair if k % 2 == 0 else pair[::-1]:
            runs[name].append(bench_submit(n, clients, src))
    print(f"submit: {n} jobs from {clients} clients, {repeats} alternating pairs (each version first in turn); "
          f"{psutil.cpu_count()} cores, SQLite WAL synchronous=FULL")
    med = {}
    for name, rs in runs.items():
        per_s = float(np.median([r["per_s"] for r in rs]))
        p99 = float(np.median([r["p99_ms"] for r in rs]))
        med[name] = (per_s, p99)
        print(f"  {name:<8} per_s={per_s:8.1f}  p99_ms={p99:8.1f}  (runs: "
              + ", ".join(f"{r['per_s']:.0f}/s p99 {r['p99_ms']:.0f} ms, {r['stored']} stored" for r in rs) + ")")
    print(f"  ratio of medians this/baseline: throughput x{med['this'][0] / med['baseline'][0]:.2f}, "
          f"p99 x{med['this'][1] / med['baseline'][1]:.2f}")
    # each pair ran back to back: its ratio is less sensitive to a machine whose load drifts
    tp = [t["per_s"] / b["per_s"] for b, t in zip(runs["baseline"], runs["this"], strict=True)]
    lat = [t["p99_ms"] / b["p99_ms"] for b, t in zip(runs["baseline"], runs["this"], strict=True)]
    print(f"  median of paired ratios: throughput x{float(np.median(tp)):.2f}, p99 x{float(np.median(lat)):.2f}")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, help="another checkout: compare submissions from 32 clients")
    a = ap.parse_args()
    if a.baseline is not None:
        compare_submit(a.baseline)
        return
    print(f"gpuloom service on loopback; {psutil.cpu_count()} cores, SQLite WAL synchronous=FULL")
    rows = [
        bench_submit(1000, 16),
        bench_submit(300, 1),
        bench_launch(30, 1, 5.0, gap=0.2),
        bench_launch(200, 8, 5.0),
    ]
    print(f"{'test':<7} {'jobs':>5} {'clients':>7} {'ok':>5} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  note")
    for r in rows:
        ok = r.get("acked", r.get("launched"))
        if r["test"] == "submit":
            note = f"stored={r['stored']}; latency=request round trip"
        else:
            note = f"round={r['round_s']}s; latency=submit->launch" + (
                f"; one every {r['gap']}s" if r["gap"] else "; burst")
        print(f"{r['test']:<7} {r['jobs']:>5} {r['clients']:>7} {ok:>5} {r['per_s']:>8.1f} {r['p50_ms']:>8.1f} "
              f"{r['p99_ms']:>8.1f} {r['max_ms']:>8.1f}  {note}")


if __name__ == "__main__":
    main()
