"""Gavel's heterogeneity-aware LAS: the time of one scheduling round, gpuloom beside Gavel's own code.

``python benchmarks/run.py gavel`` (or ``python benchmarks/bench_gavel.py [--sizes 108:1000 2048:10000]
[--gavel DIR --gavel-python PY] [--timeout S]``):

For each size (GPUs : active jobs) the cluster has a third of its GPUs of each of V100, P100 and K80,
one per server as in Gavel's simulator; the jobs are Gavel's continuous-single jobs (its generator,
seed 0), all active.  Timed (CPU time, the median of ``--repeat`` runs on fresh state):

* gpuloom, ``Scheduler.schedule`` with ``--size gavel`` on a fresh round (the allocation LP through
  HiGHS, the priorities, the walk and the placement of every chosen job), and the next round (no new
  LP: the job set did not change);
* Gavel (stanford-futuredata/gavel ``scheduler/``, given by ``--gavel DIR`` or ``$GAVEL_DIR``, run by
  ``--gavel-python`` or ``$GAVEL_PYTHON``, a Python with cvxpy and ECOS), on the same jobs in a
  child process: its ``Scheduler`` in simulation mode with the same cluster, the jobs added, and
  ``_schedule_jobs_on_workers()`` timed the same two ways (its first call solves
  ``MaxMinFairnessPolicyWithPerf``'s LP with ECOS, Gavel's default).  The LP's objective (the least
  normalised effective throughput) is printed for both, to show they solve the same problem.

Without Gavel's code the gpuloom side runs alone.  Data from ../shared/data or $GPULOOM_DATA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
DATA = Path(os.environ.get("GPULOOM_DATA", HERE.parent.parent / "shared" / "data"))

THROUGHPUTS = "gavel/throughputs/simulation_throughputs.json"


def cluster_spec(gpus: int) -> dict[str, int]:
    third = gpus // 3
    return {"v100": gpus - 2 * third, "p100": third, "k80": third}


def gpuloom_round(gpus: int, jobs: int, repeat: int) -> dict[str, Any]:
    import numpy as np

    from gpuloom.core.cluster import typed_cluster
    from gpuloom.core.job import Job
    from gpuloom.perf.assembly import build_model
    from gpuloom.policies.base import FreeState, View
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.gavel_workload import gavel_workload

    spec = cluster_spec(gpus)
    cl = typed_cluster(",".join(f"{t}:{n}" for t, n in spec.items()))
    specs = [s for s in gavel_workload(jobs, 4.0, 0, throughputs=DATA / THROUGHPUTS)]
    first, second, lp, objective = [], [], [], None
    for _ in range(repeat):
        js = []
        for i, s in enumerate(specs):
            j = Job(s, i)
            j.arrive(0.0)
            js.append(j)
        by_id = {j.id: j for j in js}
        model = build_model(cl, {}, specs)
        model.bind(by_id)
        sched = Scheduler.from_names("fifo", "none", "gavel", "packed-sticky")
        sched.bind(model)
        view = View(0.0, cl, js, {}, model, np.random.default_rng(0), 1, free=FreeState(cl), by_id=by_id)
        t0 = time.process_time()
        rnd = sched.schedule(view, reasons=False)
        first.append(time.process_time() - t0)
        lp.append(sched.size.last_lp_seconds)
        objective = sched.size.last_objective
        # the next round, 360 s later, with the plan carried out (held for the whole round)
        for jid, a in rnd.plan.allocations.items():
            by_id[jid].alloc = a
            by_id[jid].last_update = 0.0
        for j in js:
            j.advance(360.0)
        cur = dict(rnd.plan.allocations)
        view2 = View(360.0, cl, js, cur, model, np.random.default_rng(0), 2, free=FreeState.of(cl, cur), by_id=by_id)
        t0 = time.process_time()
        sched.schedule(view2, reasons=False)
        second.append(time.process_time() - t0)
    return {"first": statistics.median(first), "lp": statistics.median(lp), "second": statistics.median(second),
            "objective": objective, "placed": len(rnd.plan.allocations)}


_GAVEL_CHILD = r'''
import contextlib, json, logging, os, sys, time
gavel, throughputs, spec, jobs_file = sys.argv[1:5]
sys.path.insert(0, gavel)
logging.disable(logging.CRITICAL)
import scheduler, job as gjob
from policies import max_min_fairness
spec = json.loads(spec)
jobs = json.load(open(jobs_file))
out = {}
with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
    policy = max_min_fairness.MaxMinFairnessPolicyWithPerf(solver="ECOS")
    s = scheduler.Scheduler(policy, throughputs_file=throughputs, seed=0, time_per_iteration=360, simulate=True)
    for t in sorted(spec):
        for _ in range(spec[t]):
            s._register_worker_callback(t, num_gpus=1)
    for j in jobs:
        s.add_job(gjob.Job(job_id=None, job_type=j["job_type"], command="", working_directory="",
                           num_steps_arg="", total_steps=j["steps"], duration=None, scale_factor=1), timestamp=0)
    s._current_timestamp = 360.0  # (the reset needs time since the start)
    t0 = time.process_time()
    first = s._schedule_jobs_on_workers()
    out["first"] = time.process_time() - t0
    s._current_worker_assignments = first
    t0 = time.process_time()
    s._schedule_jobs_on_workers()
    out["second"] = time.process_time() - t0
    # the LP alone, and its objective: the least normalised effective throughput
    state = s._get_allocation_state()
    t0 = time.process_time()
    alloc = policy.get_allocation(state["throughputs"], state["scale_factors"], state["priority_weights"],
                                  state["cluster_spec"])
    out["lp"] = time.process_time() - t0
    import numpy as np
    tp = state["throughputs"]
    types = sorted(spec)
    caps = np.array([spec[t] for t in types], dtype=float)
    vals = []
    for jid, row in alloc.items():
        speeds = np.array([tp[jid][t] for t in types])
        prop = float(speeds @ (caps / caps.sum()))
        vals.append(float(sum(tp[jid][t] * row[t] for t in types)) / prop)
    out["objective"] = min(vals)
    out["placed"] = len(first)
print(json.dumps(out))
'''


def gavel_round(gpus: int, jobs: int, gavel: Path, python: str, timeout: float) -> dict[str, Any] | str:
    from gpuloom.sim.gavel_workload import gavel_workload

    specs = gavel_workload(jobs, 4.0, 0, throughputs=DATA / THROUGHPUTS)
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "jobs.json"
        f.write_text(json.dumps([{"job_type": s.attrs["job_type"], "steps": s.attrs["total_steps"]} for s in specs]))
        try:
            p = subprocess.run([python, "-c", _GAVEL_CHILD, str(gavel), str(gavel / "simulation_throughputs.json"),
                                json.dumps(cluster_spec(gpus)), str(f)], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"> {timeout:.0f} s (stopped)"
    if p.returncode != 0:
        return "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["108:1000", "2048:10000"], help="GPUS:JOBS")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gavel", type=Path, default=os.environ.get("GAVEL_DIR"),
                    help="Gavel's scheduler/ folder (default $GAVEL_DIR)")
    ap.add_argument("--gavel-python", default=os.environ.get("GAVEL_PYTHON"),
                    help="a Python with cvxpy and ECOS for Gavel's code (default $GAVEL_PYTHON)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to Gavel's side per size")
    args = ap.parse_args()
    if not (DATA / THROUGHPUTS).is_file():
        print(f"skipped: Gavel's throughputs not found under {DATA}")
        return
    print("one round of heterogeneity-aware LAS (CPU seconds; first: with the allocation LP, next: without)")
    print(f"{'GPUs':>5} {'jobs':>6}  {'who':<8} {'round':>9} {'LP':>9} {'next':>8} {'placed':>7}  objective")
    for size in args.sizes:
        gpus, jobs = (int(x) for x in size.split(":"))
        g = gpuloom_round(gpus, jobs, args.repeat)
        print(f"{gpus:>5} {jobs:>6}  {'gpuloom':<8} {g['first']:>9.3f} {g['lp']:>9.3f} {g['second']:>8.3f} "
              f"{g['placed']:>7}  {g['objective']:.6f}", flush=True)
        if args.gavel is None or args.gavel_python is None:
            print(f"{'':>13}  {'Gavel':<8} (not run: give --gavel DIR and --gavel-python PY)")
            continue
        r = gavel_round(gpus, jobs, Path(args.gavel), args.gavel_python, args.timeout)
        if isinstance(r, str):
            print(f"{'':>13}  {'Gavel':<8} {r}")
            continue
        print(f"{gpus:>5} {jobs:>6}  {'Gavel':<8} {r['first']:>9.3f} {r['lp']:>9.3f} {r['second']:>8.3f} "
              f"{r['placed']:>7}  {r['objective']:.6f}   (gpuloom {r['first'] / g['first']:.0f}x faster)",
              flush=True)


if __name__ == "__main__":
    main()
