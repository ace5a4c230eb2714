"""The backfill guarantee (policies/backfill.py): what its plan hook adds to a round with a long queue.

Run: ``python benchmarks/run.py backfill``, or ``python benchmarks/bench_backfill.py [--waiting 1000 5000]``.

Each case simulates a 1x4 cluster, non-preemptive FIFO, 10 s rounds, for 400 s: four 1-GPU jobs running
(ending at 100..400 s), a 4-GPU job behind them and W 1-GPU jobs of 1,000 s waiting behind it (every
round holds them back: they would run past the 4-GPU job's reservation).  Measured: seconds per computed
round without the hook and with a reserve depth of 8 (the service's default), and the extra per round
(target: at most 50 ms at 5,000 waiting jobs).  ``--quota``: the same jobs on 1x8, all in one queue limited
to 4 GPUs (the limit, not the GPUs, holds the 4-GPU job: its reservation is of the queue's room).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

TARGET_MS = 50.0


def per_round(waiting: int, depth: int, quota: bool = False) -> float:
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.core.job import JobSpec
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator

    specs = [JobSpec(f"a{i}", 0.0, 1, 100.0 * (i + 1)) for i in range(4)] + [JobSpec("big", 1.0, 4, 100.0)]
    specs += [JobSpec(f"s{k}", 2.0, 1, 1000.0) for k in range(waiting)]
    if quota:
        specs = [JobSpec(s.id, s.arrival, s.gpus, s.duration, attrs={"queue": "team"}) for s in specs]
        sched = Scheduler.from_names(preemptive=False, queue="quota",
                                     params={"queues": {"queue": [{"name": "team", "limit": 4}]}})
    else:
        sched = Scheduler.from_names(preemptive=False)
    if depth:
        sched.reserve(depth)
    sim = Simulator(parse_cluster("1x8" if quota else "1x4"), specs, sched, None,
                    SimConfig(round_len=10.0, max_time=400.0, check=False, skip_rounds=False))
    t0 = time.perf_counter()
    sim.run()
    return (time.perf_counter() - t0) / max(1, sim.rounds_computed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waiting", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--quota", action="store_true", help="all jobs in one queue limited to 4 GPUs, on 1x8")
    args = ap.parse_args()
    print(f"{'waiting':>8} {'without ms':>11} {'depth 8 ms':>11} {'extra ms':>9}  met (<= {TARGET_MS:g} ms at 5,000)")
    for w in args.waiting:
        base, hooked = per_round(w, 0, args.quota) * 1e3, per_round(w, 8, args.quota) * 1e3
        met = "" if w != 5000 else ("yes" if hooked - base <= TARGET_MS else "NO")
        print(f"{w:>8} {base:>11.2f} {hooked:>11.2f} {hooked - base:>9.2f}  {met}")


if __name__ == "__main__":
    main()
