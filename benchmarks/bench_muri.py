"""Muri grouping: how long one grouping takes, a whole Muri-S run, and the comparison table.

``main()`` (what ``benchmarks/run.py`` calls) prints

* grouping time of :class:`~gpuloom.policies.muri.MuriGrouping` for 100, 400
  and 1,000 queued jobs (drawn from trace2), ordered by SRSF: on Muri's 8 x 8
  cluster (Muri's admission lets at most 3-fold the cluster into the
  matching) and, as a stress test, with every queued job admitted and every
  matched pair merged (``pack_all``) so the matching runs over the whole
  queue; cold = fresh policy (no cached weights), warm = the same call again
  (its matching rounds answered from the policy's kept rounds: what a
  simulation gets when a round's buckets did not change);
* the wall time of a whole Muri-S run on trace3 (n8g8).

``--table`` instead runs Muri traces 1-4 on n8g8 under SRTF, SRSF and 2D-LAS
without grouping and Muri-S / Muri-L (with and, as Muri's simulator does, with
its measured sharing overheads 1.33/1.5/1.37), and prints mean JCT, p99 JCT and
makespan (hours) as a markdown table; ``--procs N`` runs configurations in
parallel.  Jobs come from ``../shared/data/muri`` (``$GPULOOM_DATA``); without
the data the grouping benchmark uses synthetic profiles and the rest is skipped.

    PYTHONPATH=src python benchmarks/bench_muri.py            # grouping + trace3 run
    PYTHONPATH=src python benchmarks/bench_muri.py --table --procs 2
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.perf.assembly import build_model
from gpuloom.perf.interleave import InterleaveFactor
from gpuloom.perf.model import LocalityFactor, ThroughputModel
from gpuloom.policies.base import View, make
from gpuloom.policies.muri import VARIANTS
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
#: simulator settings of every run in the table: Muri's simulator reschedules on
#: arrivals and completions; 2D-LAS also needs periodic rounds to demote jobs
SIM = dict(round_len=300.0, reschedule_on_arrival=True, reschedule_on_completion=True, restart_overhead=10.0)

CONFIGS: dict[str, tuple[str, str, bool]] = {  # label -> (order, group, Muri's sharing overhead)
    "SRTF": ("srtf", "none", False),
    "SRSF": ("srsf", "none", False),
    "2D-LAS": ("2d-las", "none", False),
    "Muri-S": (*VARIANTS["muri-s"], False),
    "Muri-L": (*VARIANTS["muri-l"], False),
    "Muri-S (overhead)": (*VARIANTS["muri-s"], True),
    "Muri-L (overhead)": (*VARIANTS["muri-l"], True),
}


def data_dir() -> Path:
    env = os.environ.get("GPULOOM_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def load_muri(path: Path) -> list[JobSpec]:
    return load_trace(path, "muri")


def muri_cluster(path: Path) -> Cluster:
    """Muri's cluster spec: ``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node`` (GB)."""
    with open(path) as fh:
        r = next(csv.DictReader(fh))
    nodes = int(r["num_switch"]) * int(r["num_node_p_switch"])
    return Cluster.homogeneous(nodes, int(r["num_gpu_p_node"]), int(r["num_cpu_p_node"]),
                               int(float(r["mem_p_node"]) * 1000))


def model_for(cluster: Cluster, overhead: bool) -> ThroughputModel:
    """The model the CLI builds (``-P interleave_overhead=muri`` for Muri's overheads)."""
    return build_model(cluster, options={"interleave_overhead": "muri" if overhead else None})


# -- grouping time -------------------------------------------------------------------
def queue_of(n: int, rng: np.random.Generator) -> list[Job]:
    d = data_dir() / "muri/sim_traces/trace2.csv"
    if d.exists():
        specs = load_muri(d)
        pick = rng.choice(len(specs), size=n, replace=False)
        jobs = [Job(specs[i], k) for k, i in enumerate(sorted(pick.tolist()))]
    else:  # synthetic: a dominant resource per job
        jobs = []
        for i in range(n):
            rt = rng.uniform(0.0, 0.05, 3)
            rt[rng.integers(3)] += rng.uniform(0.1, 0.5)
            it = float(rt.sum())
            jobs.append(Job(JobSpec(str(i), 0.0, int(rng.choice([1, 1, 2, 4, 8])), 3600.0, iter_time=it,
                                    attrs={"resource_times": tuple(rt), "iteration_time": it}), i))
    for j in jobs:  # some progress, so SRSF has something to sort
        j.remaining = j.spec.duration * float(rng.uniform(0.1, 1.0))
    return jobs


def time_grouping(n: int, cluster: Cluster, reps: int = 5, pack_all: bool = False) -> tuple[float, float, int]:
    rng = np.random.default_rng(n)
    jobs = queue_of(n, rng)
    f = InterleaveFactor({j.id: j for j in jobs})
    view = View(0.0, cluster, jobs, {}, ThroughputModel(cluster, [LocalityFactor(), f]), rng)
    ordered = make("order", "srsf").order(jobs, view)
    cold, warm = [], []
    units: list = []
    for _ in range(reps):
        pol = make("group", "muri", {"pack_all": pack_all})
        t = time.perf_counter()
        units = pol.group(ordered, view)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        pol.group(ordered, view)
        warm.append(time.perf_counter() - t)
    return statistics.median(cold), statistics.median(warm), sum(len(u) > 1 for u in units)


def run_config(trace: str, label: str) -> dict[str, float | str]:
    order, group, ovh = CONFIGS[label]
    d = data_dir() / "muri"
    specs = load_muri(d / "sim_traces" / f"{trace}.csv")
    cl = muri_cluster(d / "sim_cluster/n8g8.csv")
    sim = Simulator(cl, specs, Scheduler.from_names(order, group), model_for(cl, ovh), SimConfig(**SIM))
    t = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t
    s = res.summary()
    return {"trace": trace, "policy": label, "jobs": s["jobs"], "completed": s["completed"],
            "mean_jct_h": s["mean_jct_s"] / 3600, "p99_jct_h": s["p99_jct_s"] / 3600,
            "makespan_h": s["makespan_s"] / 3600, "gpu_util": s["gpu_util"], "wall_s": wall}


def main() -> None:
    print("## Muri grouping time (SRSF order, k = 3 resources, median of 5)")
    print()
    print("| queued jobs | cluster | admitted to matching | groups | cold ms | warm ms |")
    print("|---:|---|---:|---:|---:|---:|")
    n8g8 = Cluster.homogeneous(8, 8, 92, 520_000)
    for n in (100, 400, 1000):
        jobs = queue_of(n, np.random.default_rng(n))
        demand = sum(j.spec.gpus for j in jobs)
        big = Cluster.homogeneous(-(-demand // 8), 8, 92, 520_000)
        for name, cl, pack in (("8x8", n8g8, False), ("all enter, pack_all", big, True)):
            adm = len(make("group", "muri")._admit(jobs, [(1.0,)] * n, cl.num_gpus, 3))  # noqa: SLF001
            cold, warm, groups = time_grouping(n, cl, pack_all=pack)
            print(f"| {n} | {name} ({cl.num_gpus} GPUs) | {adm} | {groups} | {cold * 1e3:.1f} | {warm * 1e3:.1f} |")
    print()
    if not (data_dir() / "muri/sim_traces/trace3.csv").exists():
        print("(Muri traces not found: whole-run benchmark skipped)")
        return
    r = run_config("trace3", "Muri-S")
    print(f"Muri-S on trace3 (992 jobs, n8g8): wall {r['wall_s']:.1f} s; mean JCT {r['mean_jct_h']:.1f} h, "
          f"p99 {r['p99_jct_h']:.1f} h, makespan {r['makespan_h']:.1f} h")


def table(procs: int, traces: list[str], labels: list[str]) -> None:
    tasks = [(t, lab) for t in traces for lab in labels]
    print(f"Muri traces on n8g8 (64 GPUs, 92 cores, 520 GB per node); simulator: {SIM}")
    print()
    print("| trace | policy | completed | mean JCT (h) | p99 JCT (h) | makespan (h) | GPU util | wall (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|", flush=True)
    if procs > 1:
        with ProcessPoolExecutor(procs) as ex:
            rows = ex.map(run_config, *zip(*tasks, strict=True))
            for r in rows:
                _row(r)
    else:
        for t, lab in tasks:
            _row(run_config(t, lab))


def _row(r: dict[str, float | str]) -> None:
    print(f"| {r['trace']} | {r['policy']} | {r['completed']}/{r['jobs']} | {r['mean_jct_h']:.1f} | "
          f"{r['p99_jct_h']:.1f} | {r['makespan_h']:.1f} | {r['gpu_util']:.2f} | {r['wall_s']:.0f} |", flush=True)
    if not math.isfinite(float(r["mean_jct_h"])):
        print(f"warning: {r['trace']} {r['policy']} finished no job", file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true", help="run traces 1-4 under every policy and print the table")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--traces", default="trace1,trace2,trace3,trace4")
    ap.add_argument("--policies", default=",".join(CONFIGS))
    a = ap.parse_args()
    if a.table:
        unknown = [p for p in a.policies.split(",") if p not in CONFIGS]
        if unknown:
            ap.error(f"unknown policies {unknown}; choose from {list(CONFIGS)}")
        table(a.procs, a.traces.split(","), a.policies.split(","))
    else:
        main()
