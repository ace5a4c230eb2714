"""Synergy benchmark: profiler cost, FIFO/SRTF x proportional/greedy/tune/opt, round times at 512 GPUs.

Run: ``python benchmarks/bench_synergy.py [--jobs N] [--durations synthetic|philly]``

1. The optimistic profiler on every catalogue profile: saturating CPU and
   memory found, points measured vs the full grid.
2. 16 servers x 8 GPUs (24 cores, 500 GB), 9 jobs/hour, split (20, 70, 10),
   1,000 jobs, 300 s rounds, packed-sticky placement: mean / p99 JCT, GPU /
   CPU / memory utilisation, wall time, for FIFO and SRTF x the four sizers.
   Durations: Synergy's synthetic mode by default (Gavel-like, mean 16.8 h:
   the cluster is overloaded and resources contended); ``--durations
   philly`` draws (duration, GPUs) from the Philly job list instead
   (lighter: about 0.7 of the cluster's GPUs demanded on average).
3. One TUNE round and one OPT round on 64 servers (512 GPUs) with 1,000
   queued jobs: cold (demand vectors computed) and warm (cached, as in a
   running scheduler).  OPT's LP window is every job whose GPUs fit, at most
   512 jobs here; HiGHS time limit 10 s per LP.

Needs the Synergy profiles (``../shared/data/synergy``); prints a note and
stops without them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.optimize  # noqa: F401  (imported up front so round times exclude it)

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job
from gpuloom.perf.assembly import build_model
from gpuloom.perf.profiler import optimistic_profile
from gpuloom.perf.sensitivity import Catalogue, load_catalogue
from gpuloom.policies.base import View
from gpuloom.policies.synergy import check_tune_invariants, plan_throughput
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.synergy_workload import synergy_workload

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    env = os.environ.get("GPULOOM_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def profiler_table(cat: Catalogue) -> None:
    print("Optimistic profiling (threshold 10 %, one 24-core 500 GB server per 8 GPUs)")
    print(f"{'model':<12}{'GPUs':>5}{'cpus':>6}{'mem GB':>8}{'speedup':>9}{'points':>8}{'grid':>6}")
    tot_m = tot_g = 0
    for p in sorted(cat, key=lambda p: (p.model, p.gpus)):
        g = p.gpus
        cap_c, cap_m = 24 * math.ceil(g / 8), 500_000 * math.ceil(g / 8)
        cps = [int(round(c * g)) for c in p.cpu_axis if c * g <= cap_c]
        mps = [int(round(m * g)) for m in p.mem_axis if m * g <= cap_m]
        ref = (3 * g, 62_500 * g)
        r = optimistic_profile(lambda c, m, p=p, g=g: p.throughput_at(c, m, g), cps, mps, 0.10, gpus=g, reference=ref)
        base = r.points[ref]
        tot_m += r.points_measured
        tot_g += r.grid_size
        print(
            f"{p.model:<12}{g:>5}{r.cpus:>6}{r.mem_mb / 1000:>8.1f}{r.demand_tput / base:>9.2f}"
            f"{r.points_measured:>8}{r.grid_size:>6}"
        )
    print(f"{'all':<12}{'':>5}{'':>6}{'':>8}{'':>9}{tot_m:>8}{tot_g:>6}   ({tot_m / tot_g:.0%} of the grid, incl. the proportional point)")
    print()


def sim_table(prof: Path, jobs: int, durations: str) -> None:
    philly = data_dir() / "sia" / "philly_jobs.csv"
    specs = synergy_workload(jobs, 9.0, (20, 70, 10), seed=1, durations=durations, philly=philly)
    cl = Cluster.homogeneous(16, 8, 24, 500_000)
    print(f"16 servers x 8 GPUs (24 cores, 500 GB), 9 jobs/h, split (20,70,10), {jobs} jobs, {durations} durations")
    head = f"{'order':<6}{'size':<14}{'mean JCT h':>11}{'p99 JCT h':>11}{'GPU':>7}{'CPU':>7}{'mem':>7}{'wall s':>8}"
    print(head)
    for order in ("fifo", "srtf"):
        for size in ("proportional", "greedy", "tune", "opt"):
            model = build_model(cl, options={"profiles": prof})  # as `gpuloom simulate -P profiles=...`
            sched = Scheduler.from_names(order, "none", size, "packed-sticky")
            t0 = time.perf_counter()
            res = Simulator(cl, specs, sched, model, SimConfig(round_len=300)).run()
            wall = time.perf_counter() - t0
            s = res.summary()
            note = ""
            if size == "opt":
                note = (f"  (LP rounds {sched.size.lp_rounds}, reused {sched.size.reused_rounds}; "
                        f"fastest points fit, no allocation LP: {sched.size.unbound_lps})")
            if s["unfinished"]:
                note += f"  {s['unfinished']} unfinished"
            print(
                f"{order:<6}{size:<14}{s['mean_jct_s'] / 3600:>11.2f}{s['p99_jct_s'] / 3600:>11.2f}"
                f"{s['gpu_util']:>7.1%}{s['cpu_util']:>7.1%}{s['mem_util']:>7.1%}{wall:>8.1f}{note}"
            )
            sys.stdout.flush()
    print()


def round_times(prof: Path) -> None:
    cl = Cluster.homogeneous(64, 8, 24, 500_000)
    specs = synergy_workload(1000, 1e6, (20, 70, 10), seed=5)  # all queued within seconds
    print(f"One round on 64 servers x 8 GPUs (512 GPUs), {len(specs)} queued jobs "
          f"({sum(s.gpus for s in specs)} GPUs demanded), FIFO, packed-sticky")
    print(f"{'size':<14}{'cold ms':>9}{'warm ms':>9}{'placed':>8}{'GPUs':>6}{'sum speed':>11}")
    for size in ("proportional", "greedy", "tune", "opt"):
        model = build_model(cl, options={"profiles": prof})
        jobs = [Job(s, i) for i, s in enumerate(specs)]
        for j in jobs:
            j.arrive(j.arrival)
        view = View(specs[-1].arrival, cl, jobs, {}, model, np.random.default_rng(0))
        sched = Scheduler.from_names("fifo", "none", size, "packed-sticky")
        t0 = time.perf_counter()
        plan = sched.schedule(view).plan
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = sched.schedule(view).plan
        warm = time.perf_counter() - t0
        if size == "tune":
            check_tune_invariants(plan, view, sched.size.last_order, sched.place)
        used = sum(a.num_gpus for a in plan.allocations.values())
        extra = ""
        if size == "opt":
            extra = f"  LP objective {sched.size.last_objective:.1f}" if sched.size.last_objective else ""
            if sched.size.last_fallback:
                extra += f"  fell back: {sched.size.last_fallback}"
        print(
            f"{size:<14}{cold * 1e3:>9.1f}{warm * 1e3:>9.1f}{len(plan):>8}{used:>6}"
            f"{plan_throughput(plan, view):>11.1f}{extra}"
        )
    print()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--durations", choices=("synthetic", "philly"), default="synthetic")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args(argv if argv is not None else [])
    prof = data_dir() / "synergy" / "model_sensitivity_profiles.csv"
    if not prof.exists():
        print(f"bench_synergy: Synergy profiles not found at {prof}; skipped")
        return
    cat = load_catalogue(prof)
    profiler_table(cat)
    round_times(prof)
    if not args.skip_sim:
        sim_table(prof, args.jobs, args.durations)


if __name__ == "__main__":
    main(sys.argv[1:])
