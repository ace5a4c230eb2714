"""What the operator's view costs: transition log lines on submissions, a /metrics scrape, a
history query, a round's gate over a held array.

``python benchmarks/run.py ops`` (in process, SQLite in a temporary directory, no job launched):

* submissions with and without the telemetry listener (log lines at INFO to a null handler),
  as a ratio measured in the same run;
* one ``/metrics`` scrape (text generated) with N queued jobs mirrored;
* ``history()`` over N finished jobs with one allocation record each;
* ``Gate.ready()`` with an array of N tasks held by ``%1``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.history import history
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

N = 2000


def _service(d: Path) -> Service:
    store = Store(f"sqlite:///{d / 'db.sqlite'}", synchronous="NORMAL")
    cl = Cluster.homogeneous(4, 8)
    return Service(store, cl, local_executor(cl, d / "run", True, "gpuloom-bench-ops"), Scheduler.from_names(),
                   ServiceConfig(d,
                   round_s=1000.0))


def _submit(svc: Service, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        svc.submit({"name": f"j{i}", "command": "true", "gpus": 1}, "alice")
    return time.perf_counter() - t0


def main() -> None:
    logging.getLogger("gpuloom.jobs").addHandler(logging.NullHandler())
    logging.getLogger("gpuloom.jobs").setLevel(logging.INFO)
    logging.getLogger("gpuloom.jobs").propagate = False
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "a").mkdir()
        (d / "b").mkdir()
        svc = _service(d / "a")
        plain = _service(d / "b")
        plain.telemetry.close()  # no listener
        _submit(svc, 50)
        _submit(plain, 50)  # warm both
        with_l = _submit(svc, N)
        without = _submit(plain, N)
        print(f"submit x{N}: {with_l * 1e3 / N:.2f} ms each with transition logging, "
              f"{without * 1e3 / N:.2f} ms without: ratio {with_l / without:.2f}")
        with svc.lock:
            svc.observe()  # mirror the queued jobs (observe only: nothing is launched)
        t0 = time.perf_counter()
        for _ in range(10):
            text = svc.telemetry.metrics_text()
        print(f"/metrics with {len(svc.driver.jobs)} active jobs: {(time.perf_counter() - t0) * 100:.1f} ms per scrape "
              f"({len(text)} bytes)")
        store = svc.store
        now = time.time()
        for jid in range(1, N + 1):
            store.update_job(jid, {"alloc": {"parts": [{"node": "node-0", "gpus": [0], "local_gpus": [0], "cpus": 1,
                                                        "mem_mb": 1000}], "group": []}}, "launch", durable=False)
            store.update_job(jid, {"alloc": None, "state": "finished", "end_time": now}, "finished", durable=False)
        t0 = time.perf_counter()
        recs = history(store, now)
        print(f"history() of {len(recs)} jobs: {(time.perf_counter() - t0) * 1e3:.0f} ms")
        svc.terminate_all()
        svc.shutdown()
        plain.shutdown()
        (d / "c").mkdir()
        g = _service(d / "c")
        first = g.submit({"name": "arr", "command": "true", "gpus": 1, "array": f"0-{N - 1}%1"}, "alice")
        g.gate.add(g.store.get_job(first))
        for r in g.store.list_jobs(after_id=first):
            g.gate.add(r)
        g.gate.ready()  # releases task 0
        t0 = time.perf_counter()
        for _ in range(5):
            g.gate.ready()
        print(f"gate over an array of {N} held by %1: {(time.perf_counter() - t0) * 200:.1f} ms per round")
        g.shutdown()


if __name__ == "__main__":
    main()
