"""What a drained node costs a scheduling round of the service.

A service (in process, real ``sleep`` processes) on 2 nodes x 4 GPUs, both full, with N one-GPU jobs
waiting; a round's median time with every node in service, then with node-1 drained (``wait``: its
jobs run on, the plan hook and the pending-reason pass of :mod:`gpuloom.runtime.service.control` run
every round).

Run: ``PYTHONPATH=src python benchmarks/bench_control.py [N ...]`` (default 1000 10000).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

ROUNDS = 15


def median_round(svc: Service) -> float:
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        svc.round()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        cluster = Cluster.homogeneous(2, 4)
        svc = Service(store, cluster, local_executor(cluster, tmp / "run", True), Scheduler.from_names(),
                      ServiceConfig(tmp, round_s=1000.0, grace_s=0.0))
        try:
            for _ in range(8):
                svc.submit({"command": "sleep 600", "gpus": 1}, "alice")
            svc.round()
            store.add_jobs([{"command": "sleep 600", "gpus": 1, "name": "w"}] * n, "alice",
                           "waiting_for_initial_contact")
            svc.round()
            base = median_round(svc)
            svc.control.drain("node-1", "benchmark", "wait", "admin")
            drained = median_round(svc)
            assert all(n["state"] in ("alloc", "drng") for n in svc.nodes())
            return base, drained
        finally:
            svc.terminate_all()
            svc.actuator.close()
            store.close()


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000]
    print(f"{'waiting':>8} {'round ms':>9} {'drained ms':>11} {'ratio':>6}")
    for n in sizes:
        base, drained = bench(n)
        print(f"{n:>8} {base * 1e3:>9.2f} {drained * 1e3:>11.2f} {drained / base:>6.2f}")


if __name__ == "__main__":
    main()
