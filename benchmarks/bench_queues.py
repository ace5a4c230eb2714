"""Queues shared by teams: round time at scale, and Philly's virtual clusters as queues.

``python benchmarks/run.py queues`` (or ``python benchmarks/bench_queues.py [round|philly] ...``):

* ``round`` (the default part): the time of one scheduling round on 1,024 GPUs
  (128 nodes x 8) with 2,000 active jobs in 50 queues (5 orgs x 10 teams,
  guarantees summing to the cluster, an org limit of 1.5x its guarantee),
  FIFO within queues, packed-sticky placement.  90% of the jobs arrive in
  the first minute, the rest over the next half hour, and all run for hours,
  so every round sees about 2,000 jobs, ~1,000 GPUs busy and the rest
  waiting; a round every 60 s for 30 simulated minutes.  Each queue stage is timed against ``none`` in the
  same run (median and p95 CPU time of ``Scheduler.schedule``; the round check, which
  the simulator runs in tests, timed separately); SRTF within queues beside
  SRTF without them.
* ``philly``: the 82k-job Philly list (``sia/philly_jobs.csv``, its 15
  virtual clusters as queues) on 64 x 8 GPUs, 300 s rounds, packed-sticky,
  under: no queues (global FIFO); strict quotas (no borrowing); quotas with
  borrowing and reclaim; DRF fair share (weights = quota shares, no
  guarantees).  Two quota splits: in proportion to each VC's GPU demand, and
  from Venus' VC configuration (``helios/venus_vc_config_from_Lucid.csv``,
  matched by rank of demand).  Reports per-VC mean JCT and queueing delay,
  overall utilisation, and the guarantee deficit (GPU-hours a VC was owed
  and did not get).  Runs in parallel processes (``--processes``, default 2);
  about 5 CPU-minutes per run.  ``--out DIR`` writes the tables as CSV and
  markdown.
* ``skip``: Philly's first 20,000 jobs (``--limit``) on 64 x 8 GPUs, quotas by demand, FIFO,
  packed-sticky, 300 s rounds, checks on, under no queue stage and quota, drf and fairshare, each with
  and without round skipping: rounds computed, CPU seconds and the SHA-256 of ``jobs.csv``, which
  must be the same both ways.

Data from ../shared/data or $GPULOOM_DATA.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
DATA = Path(os.environ.get("GPULOOM_DATA", HERE.parent.parent / "shared" / "data"))

from gpuloom.core.cluster import Cluster  # noqa: E402
from gpuloom.core.job import JobSpec  # noqa: E402
from gpuloom.core.queues import Queue, QueueTree, Quota  # noqa: E402


# -- round time ----------------------------------------------------------------------------------
def scale_tree(gpus: int = 1024, orgs: int = 5, teams: int = 10) -> QueueTree:
    """``orgs`` x ``teams`` leaves; guarantees split the cluster unevenly (1..teams), orgs limited to 1.5x."""
    qs = []
    per_org = gpus // orgs
    weights = list(range(1, teams + 1))
    for o in range(orgs):
        share = [per_org * w // sum(weights) for w in weights]
        qs.append(Queue(f"org{o}", None, Quota(gpus=per_org), Quota(gpus=per_org * 1.5), 1.0))
        qs += [Queue(f"org{o}-t{t}", f"org{o}", Quota(gpus=share[t]), Quota(), float(weights[t])) for t in range(teams)]
    return QueueTree(qs)


def scale_jobs(n: int = 2000, queues: int = 50, seed: int = 0) -> list[JobSpec]:
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 1, 1, 2, 4, 8, 8, 16], size=n)
    names = [f"org{k // 10}-t{k % 10}" for k in range(queues)]
    # 90% arrive in the first minute, the rest over the next half hour: every round has news
    arrive = np.where(np.arange(n) < 0.9 * n, rng.uniform(0, 60, n), rng.uniform(60, 1800, n))
    return [JobSpec(f"j{i}", float(arrive[i]), int(sizes[i]), float(rng.uniform(4, 12) * 3600),
                    attrs={"queue": names[int(rng.integers(queues))]}) for i in range(n)]


def time_rounds(queue: str, check: bool, order: str = "fifo") -> dict[str, float]:
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator

    cl = Cluster.homogeneous(128, 8)
    params = {} if queue == "none" else {"queues": scale_tree(cl.num_gpus)}
    sched = Scheduler.from_names(order, queue=queue, params=params)
    times: list[float] = []
    checks: list[float] = []
    plain, plain_check = sched.schedule, sched.check

    clock = time.process_time  # CPU time: the machine may be shared; wall time would measure the neighbours

    def timed(view, reasons=True):  # noqa: ANN001, ANN202
        t = clock()
        out = plain(view, reasons)
        times.append(clock() - t)
        return out

    def timed_check(rnd, view):  # noqa: ANN001, ANN202
        t = clock()
        plain_check(rnd, view)
        checks.append(clock() - t)

    def timed_changes(rnd, view, *args):  # noqa: ANN001, ANN002, ANN202
        t = clock()
        plain_changes(rnd, view, *args)
        checks.append(clock() - t)

    # the driver checks most rounds incrementally (check_changes), the whole plan now and then (check)
    plain_changes = sched.check_changes
    sched.schedule = timed  # type: ignore[method-assign]
    sched.check = timed_check  # type: ignore[method-assign]
    sched.check_changes = timed_changes  # type: ignore[method-assign]
    sim = Simulator(cl, scale_jobs(), sched, config=SimConfig(round_len=60.0, max_time=1800.0, check=check))
    sim.run()
    steady = times[2:]  # once the first minute's arrivals are in
    return {"median_ms": 1e3 * statistics.median(steady),
            "p95_ms": 1e3 * sorted(steady)[int(0.95 * (len(steady) - 1))],
            "check_ms": 1e3 * statistics.median(checks[2:]) if checks else float("nan"),
            "rounds": len(times), "active": len(sim.active), "running": len(sim.current)}


def bench_round() -> None:
    print("one round: 1,024 GPUs (128x8), 2,000 active jobs, 50 queues (5 orgs x 10 teams), fifo/packed-sticky")
    print(f"{'queue stage':12} {'CPU ms':>10} {'p95 ms':>8} {'x none':>7} {'check ms':>9} {'rounds':>7} "
          f"{'active':>7} {'running':>8}")
    base = None
    for q, order in (("none", "fifo"), ("quota", "fifo"), ("drf", "fifo"), ("fairshare", "fifo"), ("none", "srtf"),
                     ("drf", "srtf")):
        r = time_rounds(q, True, order)
        base = base or r["median_ms"]
        name = q if order == "fifo" else f"{q} ({order})"
        print(f"{name:12} {r['median_ms']:10.1f} {r['p95_ms']:8.1f} {r['median_ms'] / base:7.2f} {r['check_ms']:9.1f} "
              f"{r['rounds']:7d} {r['active']:7d} {r['running']:8d}", flush=True)


# -- Philly ----------------------------------------------------------------------------------------
CONFIGS = {
    "no queues (FIFO)": ("none", {}),
    "strict quotas": ("quota", {"borrow": False}),
    "borrow + reclaim": ("quota", {}),
    "DRF fair share": ("drf", {"guarantees": False}),
}


def _philly_specs() -> list[JobSpec]:
    from gpuloom.sim.traces import load_trace

    return load_trace(DATA / "sia" / "philly_jobs.csv", "philly")


def philly_trees(specs: list[JobSpec], gpus: int) -> dict[str, QueueTree]:
    from gpuloom.sim.quotas import config_quotas, demand_quotas, read_vc_config

    venus, _ = config_quotas(specs, gpus, read_vc_config(DATA / "helios" / "venus_vc_config_from_Lucid.csv"))
    return {"demand": demand_quotas(specs, gpus), "venus": venus}


def philly_window(specs: list[JobSpec], days: tuple[float, float] | None) -> list[JobSpec]:
    """The jobs arriving in ``days`` (from, to; days since the trace's start), their arrivals shifted to
    start at 0; all of them without ``days``."""
    if days is None:
        return specs
    lo, hi = days[0] * 86400.0, days[1] * 86400.0
    return [replace(s, arrival=s.arrival - lo) for s in specs if lo <= s.arrival < hi]


def _run_philly(task: tuple[str, str, tuple[float, float] | None]) -> dict[str, Any]:
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator
    from gpuloom.sim.queue_report import QueueRecorder, queue_rows

    split, label, days = task
    every = _philly_specs()
    cl = Cluster.homogeneous(64, 8)
    tree = philly_trees(every, cl.num_gpus)[split]  # quotas from the whole list's demand, as from history
    specs = philly_window(every, days)
    queue, params = CONFIGS[label]
    sched = Scheduler.from_names(queue=queue, params={**params, "queues": tree} if queue != "none" else {})
    rec = QueueRecorder(tree)
    t = time.perf_counter()
    sim = Simulator(cl, specs, sched, config=SimConfig(round_len=300.0, check=False), observers=[rec])
    result = sim.run()
    result.extra["queues"] = rec.finish(sim)
    s = result.summary()
    return {"split": split, "config": label, "wall_s": time.perf_counter() - t, "summary": s,
            "queues": queue_rows(result)}


def bench_philly(processes: int, out: Path | None, splits: list[str], days: tuple[float, float] | None = None) -> None:
    tasks = [(sp, label, days) for sp in splits for label in CONFIGS]
    which = "82,247 jobs" if days is None else f"the jobs arriving on days {days[0]:g}-{days[1]:g}"
    print(f"Philly: {which}, 15 VCs, 64x8 GPUs, 300 s rounds; {len(tasks)} runs in {processes} processes",
          flush=True)
    results = []
    with ProcessPoolExecutor(processes) as pool:
        for r in pool.map(_run_philly, tasks):  # in task order, each as soon as it (and those before) end
            s = r["summary"]
            print(f"  {r['split']:6} {r['config']:18} util {s['gpu_util']:.1%}  mean JCT {s['mean_jct_s'] / 3600:.1f} h  "
                  f"queueing {s['mean_queueing_delay_s'] / 3600:.1f} h  done {s['completed']:,}  "
                  f"({r['wall_s']:.0f} s)", flush=True)
            results.append(r)
    for sp in splits:
        rows = [r for r in results if r["split"] == sp]
        text = philly_tables(sp, rows)
        print(text, flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"philly_{sp}.md").write_text(text)
            write_csv(out / f"philly_{sp}.csv", rows)


def philly_tables(split: str, rows: list[dict[str, Any]]) -> str:
    labels = [r["config"] for r in rows]
    lines = [f"\n### Quotas by {split}\n", "| | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]

    def row(name: str, vals: list[str]) -> None:
        lines.append(f"| {name} | " + " | ".join(vals) + " |")

    row("GPU utilisation", [f"{r['summary']['gpu_util']:.1%}" for r in rows])
    row("mean JCT (h)", [f"{r['summary']['mean_jct_s'] / 3600:.1f}" for r in rows])
    row("mean queueing delay (h)", [f"{r['summary']['mean_queueing_delay_s'] / 3600:.1f}" for r in rows])
    row("completed", [f"{r['summary']['completed']:,}" for r in rows])
    row("guarantee deficit (GPU-h)", [f"{sum(q['deficit_gpu_h'] for q in r['queues']):,.0f}" for r in rows])
    row("preemptions", [f"{r['summary']['preemptions']:,}" for r in rows])
    row("wall time (s)", [f"{r['wall_s']:.0f}" for r in rows])
    lines += ["", "Per VC: mean JCT / mean queueing delay (h); guarantee in GPUs, jobs", "",
              "| VC | guarantee | jobs | " + " | ".join(labels) + " |", "|---|---:|---:|" + "---:|" * len(labels)]
    per = [{q["queue"]: q for q in r["queues"]} for r in rows]
    names = sorted(per[0], key=lambda n: (-per[0][n]["guarantee"], n))
    for n in names:
        cells = []
        for p in per:
            q = p.get(n)
            if q is None or q["completed"] == 0:
                cells.append("–" if q is None or q["jobs"] == 0 else f"– ({q['jobs'] - q['completed']} never ran)")
                continue
            unfinished = q["jobs"] - q["completed"]
            cells.append(f"{q['mean_jct'] / 3600:.1f} / {q['mean_queueing_delay'] / 3600:.1f}"
                         + (f" ({unfinished} never ran)" if unfinished else ""))
        first = per[0][n]
        lines.append(f"| {n} | {first['guarantee']:g} | {first['jobs']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "queue", "guarantee", "jobs", "completed", "mean_jct", "mean_queueing_delay",
                    "mean_share", "deficit_gpu_h", "gpu_util"])
        for r in rows:
            for q in r["queues"]:
                w.writerow([r["config"], q["queue"], q["guarantee"], q["jobs"], q["completed"], q["mean_jct"],
                            q["mean_queueing_delay"], q["mean_share"], q["deficit_gpu_h"], r["summary"]["gpu_util"]])


def bench_skip(limit: int) -> None:
    """Each queue stage on Philly's first ``limit`` jobs with and without round skipping: jobs.csv's SHA-256."""
    import hashlib
    import tempfile

    from gpuloom.core import parse_cluster
    from gpuloom.sim.engine import SimConfig
    from gpuloom.sim.quotas import demand_quotas
    from gpuloom.sim.report import write_jobs_csv
    from gpuloom.sim.runconfig import RunConfig, run_config

    specs = sorted(_philly_specs(), key=lambda s: s.arrival)[:limit]
    cl = parse_cluster("64x8")
    tree = demand_quotas(specs, cl.num_gpus)
    print(f"Philly's first {len(specs):,} jobs, 64x8, quotas by demand, fifo/packed-sticky, checks on")
    print(f"{'queue stage':12} {'rounds computed':>17} {'cpu s':>7} {'every round':>12} {'cpu s':>7}  jobs.csv SHA-256")
    for stage in ("none", "quota", "drf", "fairshare"):
        out = []
        for skip in (True, False):
            params = {"queue.queues": tree} if stage != "none" else {}
            rc = RunConfig("", "fifo", "none", "proportional", "packed-sticky", True, params,
                           sim=SimConfig(round_len=300.0, restart_overhead=10.0, skip_rounds=skip), queue=stage)
            t = time.process_time()
            res = run_config(rc, cl, specs, queues=tree)
            cpu = time.process_time() - t
            with tempfile.TemporaryDirectory() as d:
                digest = hashlib.sha256(write_jobs_csv(res, Path(d) / "jobs.csv").read_bytes()).hexdigest()
            out.append((res.rounds_computed, res.rounds, cpu, digest))
        (c1, n1, t1, h1), (c2, _, t2, h2) = out
        same = h1[:16] + " both" if h1 == h2 else f"DIFFERENT: {h1[:16]} / {h2[:16]}"
        print(f"{stage:12} {f'{c1:,}/{n1:,}':>17} {t1:7.1f} {c2:12,} {t2:7.1f}  {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # (checked below, not with choices: Python 3.11's argparse checks an empty '*' positional, or
    # its list default, against the choices as one value, and refuses it)
    ap.add_argument("part", nargs="*", metavar="{round,philly,skip}", help="what to run (default: round)")
    ap.add_argument("--processes", "-j", type=int, default=2)
    ap.add_argument("--split", action="append", choices=["demand", "venus"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--days", help="only the jobs arriving in this window, FROM:TO in days (e.g. 63:70)")
    ap.add_argument("--limit", type=int, default=20_000, help="skip: the first N Philly jobs by arrival")
    args = ap.parse_args()
    args.part = args.part or ["round"]
    for p in args.part:
        if p not in ("round", "philly", "skip"):
            ap.error(f"argument part: invalid choice: {p!r} (choose from 'round', 'philly', 'skip')")
    if "round" in args.part:
        bench_round()
    if "philly" in args.part:
        if not DATA.is_dir():
            print(f"data not found at {DATA}; set GPULOOM_DATA")
            return
        days = None
        if args.days:
            try:
                lo, hi = (float(x) for x in args.days.split(":"))
            except ValueError:
                ap.error(f"--days: FROM:TO in days, got {args.days!r}")
            if not 0 <= lo < hi:
                ap.error(f"--days: FROM must be >= 0 and below TO, got {args.days!r}")
            days = (lo, hi)
        bench_philly(args.processes, args.out, args.split or ["demand", "venus"], days)
    if "skip" in args.part:
        if args.limit < 1:
            ap.error(f"--limit: at least 1 job, got {args.limit}")
        if not DATA.is_dir():
            print(f"data not found at {DATA}; set GPULOOM_DATA")
            return
        bench_skip(args.limit)


if __name__ == "__main__":
    main()
