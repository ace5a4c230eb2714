"""Trace loading and simulating what was loaded.

Run: ``PYTHONPATH=src python benchmarks/bench_traces.py`` (needs ../shared/data beside the
checkout, or ``$GPULOOM_DATA``).  Prints two tables:

* load time (best of 3, wall and CPU: on a shared machine the CPU time is the steadier figure) and jobs for one file of every format; the Philly list is the
  one that matters (82,247 jobs);
* wall time of a FIFO / packed-sticky simulation of a few loaded traces and of the
  built-in workload, on the cluster each trace was made for.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

from gpuloom.core import Cluster
from gpuloom.sim import simulate
from gpuloom.sim.generator import builtin_workload
from gpuloom.sim.traces import read_trace

LOADS = [
    "sia/philly_jobs.csv",
    "sia/workloads/philly/workload-1.csv",
    "pal/traces/philly/workload-1-noheader.csv",
    "pal/blox/sia-160job-trace.csv",
    "muri/sim_traces/trace2.csv",
    "gavel/msr/seed0/11cb48.trace",
    "synergy/traces/dynamic_100job.csv",
    "tiresias/60_job.csv",
    "alibaba/gpu-v2023/openb_pod_list_default.csv",
]

# (trace, nodes, GPUs per node, round length)
SIMS = [
    ("sia/workloads/philly/workload-1.csv", 16, 4, 360.0),
    ("pal/traces/philly/workload-1.csv", 16, 4, 360.0),
    ("muri/testbed_trace/cluster_trace.csv", 8, 8, 300.0),
    ("synergy/traces/dynamic_100job.csv", 4, 8, 300.0),
    ("tiresias/60_job.csv", 16, 4, 300.0),
]


def data_dir() -> Path:
    env = os.environ.get("GPULOOM_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main() -> None:
    d = data_dir()
    if not d.is_dir():
        print(f"bench_traces: no data at {d}; skipped")
        return
    print(f"{'trace':50s} {'format':9s} {'jobs':>7s} {'skipped':>8s} {'wall s':>7s} {'cpu s':>7s} {'peak MB':>8s}")
    for rel in LOADS:
        best = cpu = float("inf")
        for _ in range(3):
            t, c = time.perf_counter(), time.process_time()
            tr = read_trace(d / rel)
            best, cpu = min(best, time.perf_counter() - t), min(cpu, time.process_time() - c)
        tracemalloc.start()
        read_trace(d / rel)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        print(f"{rel:50s} {tr.format:9s} {len(tr.jobs):7d} {sum(tr.skipped.values()):8d} {best:7.3f} {cpu:7.3f} {peak:8.1f}")
    print()
    print(f"{'simulation (fifo, packed-sticky)':50s} {'cluster':>8s} {'jobs':>6s} {'wall s':>7s} {'cpu s':>7s} "
          f"{'mean JCT h':>10s}")
    runs = [(rel, n, g, r, read_trace(d / rel).jobs) for rel, n, g, r in SIMS]
    runs.append(("builtin_workload(seed=0)", 16, 4, 300.0, builtin_workload(0)))
    for name, n, g, r, jobs in runs:
        t, c = time.perf_counter(), time.process_time()
        res = simulate(Cluster.homogeneous(n, g), jobs, round_len=r)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        s = res.summary()
        print(f"{name:50s} {f'{n}x{g}':>8s} {s['completed']:6d} {wall:7.3f} {cpu:7.3f} {s['mean_jct_s'] / 3600:10.2f}")


if __name__ == "__main__":
    main()
