"""Scheduling core and simulator speed (issue: scheduling core).

(a) one Sia-Philly 160-job workload (PAL/Blox format) on 16 nodes x 4 GPUs,
    FIFO, packed-sticky, 360 s rounds;
(b) the full Philly job list (82k jobs) on 64 x 8 GPUs, FIFO, packed-sticky,
    300 s rounds.

Each is run in a fresh subprocess so peak memory (ru_maxrss) is its own; the
time covers the simulation only (loading is reported separately).  Both run
with the per-round invariant checks on and off.

Run: ``python benchmarks/run.py core`` (data from ../shared/data or $GPULOOM_DATA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("GPULOOM_DATA", HERE.parent.parent / "shared" / "data"))

CASES = {
    "a: sia-philly 160 jobs, 16x4, 360 s": ("pal/traces/philly/workload-1.csv", "pal", "16x4", 360.0),
    "b: philly 82k jobs, 64x8, 300 s": ("sia/philly_jobs.csv", "philly", "64x8", 300.0),
}

CHILD = r"""
import json, resource, sys, time
from gpuloom.core import parse_cluster
from gpuloom.scheduler import Scheduler
from gpuloom.sim import SimConfig, Simulator
from gpuloom.sim.traces import load_trace
path, fmt, cluster, rnd, check = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5] == "1"
t0 = time.perf_counter()
specs = load_trace(path, fmt)
t1 = time.perf_counter()
sim = Simulator(parse_cluster(cluster), specs, Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"),
                config=SimConfig(round_len=rnd, check=check))
r = sim.run()
t2 = time.perf_counter()
s = r.summary()
print(json.dumps({"load_s": t1 - t0, "sim_s": t2 - t1, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "jobs": s["jobs"], "completed": s["completed"], "mean_jct": s["mean_jct_s"], "rounds": r.rounds,
                  "rounds_computed": r.rounds_computed}))
"""


def run_case(path: Path, fmt: str, cluster: str, rnd: float, check: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), fmt, cluster, str(rnd), "1" if check else "0"],
        capture_output=True, text=True, env=env, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if not DATA.is_dir():
        print(f"data not found at {DATA}; set GPULOOM_DATA")
        return
    print(f"{'case':40} {'checks':>6} {'load s':>7} {'sim s':>7} {'peak MB':>8} {'jobs':>7} {'rounds':>7} {'computed':>8} {'mean JCT s':>11}")
    for name, (rel, fmt, cluster, rnd) in CASES.items():
        for check in (False, True):
            r = run_case(DATA / rel, fmt, cluster, rnd, check)
            print(f"{name:40} {'on' if check else 'off':>6} {r['load_s']:7.2f} {r['sim_s']:7.2f} {r['peak_mb']:8.0f} "
                  f"{r['completed']:>7} {r['rounds']:>7} {r['rounds_computed']:>8} {r['mean_jct']:11.0f}", flush=True)


if __name__ == "__main__":
    main()
