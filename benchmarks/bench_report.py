"""Reports and ``compare``: writing and plotting a long run, and parallel vs sequential runs.

(a) a generated 20,000-job workload on 64x8 GPUs (FIFO, packed-sticky, 300 s
    rounds; ~40,000 series points): time to write jobs.csv/series.csv/
    summary.json, to draw the three PNGs, and to write report.md;
(b) ``run_many`` of four configurations on an 8,000-job workload with 1 and
    with 2 processes (results must be identical).

Run: ``PYTHONPATH=src python benchmarks/bench_report.py``
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import simulate
from gpuloom.sim.plots import plot_compare, plot_run
from gpuloom.sim.report import write_report, write_run
from gpuloom.sim.runconfig import parse_run_config, run_many


def workload(n: int, mean_gap: float, seed: int = 1) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(mean_gap, n))
    gpus = rng.choice([1, 1, 1, 2, 4, 8], n)
    durations = rng.lognormal(7.0, 1.5, n)
    return [JobSpec(f"j{i}", float(a), int(g), float(d)) for i, (a, g, d) in
            enumerate(zip(arrivals, gpus, durations, strict=True))]


def timed(fn, *args):  # noqa: ANN001, ANN201
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main() -> None:
    load0 = os.getloadavg()[0]
    rows: list[tuple[str, str, float]] = []
    cluster = Cluster.homogeneous(64, 8)
    result, t_sim = timed(simulate, cluster, workload(20_000, 30.0))
    rows.append(("(a) simulate 20,000 jobs", f"{len(result.series):,} series points", t_sim))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        _, t = timed(write_run, result, out)
        rows.append(("(a) write_run (3 files)", f"{(out / 'jobs.csv').stat().st_size / 1e6:.1f} MB jobs.csv", t))
        plot_run(result, out / "warm")  # first call pays matplotlib's import
        _, t = timed(plot_run, result, out)
        rows.append(("(a) plot_run (3 PNGs)", "", t))
        _, t = timed(write_report, result, out, [out / "jct_cdf.png"])
        rows.append(("(a) write_report", "", t))

        specs = workload(8_000, 30.0, seed=2)
        configs = [parse_run_config(c) for c in ("order=fifo", "order=srtf", "order=las", "order=2d-las")]
        seq, t1 = timed(run_many, configs, cluster, specs, 1)
        rows.append(("(b) run_many 4 configs x 8,000 jobs", "1 process", t1))
        par, t2 = timed(run_many, configs, cluster, specs, 2)
        rows.append(("(b) run_many 4 configs x 8,000 jobs", f"2 processes, speed-up x{t1 / t2:.2f}", t2))
        inside = sum(r.wall_time for r in par.values())
        rows.append(("(b)   of which simulating (sum over runs)", "", inside))
        same = all(par[k].jobs == seq[k].jobs and par[k].series == seq[k].series for k in seq)
        _, t = timed(plot_compare, par, out / "cmp.png")
        rows.append(("(b) plot_compare", f"identical results: {same}", t))
    w = max(len(r[0]) for r in rows)
    print(f"load average before/after: {load0:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
          "(parallel speed-up needs idle cores)")
    print(f"{'step':<{w}}  {'note':<32}  {'wall s':>7}")
    for name, note, secs in rows:
        print(f"{name:<{w}}  {note:<32}  {secs:7.2f}")


if __name__ == "__main__":
    main()
