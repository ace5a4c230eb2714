"""Gavel (OSDI'20) Figure 8: heterogeneity-agnostic vs -aware LAS on the continuous-single trace.

Setting (Gavel's ``EXPERIMENTS.md``, ``run_sweep_continuous.py -s 4000 -e 5000 -c
36:36:36``): 36 V100 + 36 P100 + 36 K80 GPUs, one per server; single-GPU jobs
drawn by Gavel's generator (:mod:`gpuloom.sim.gavel_workload`, the same jobs as
Gavel's simulator for a seed) arriving at a Poisson rate; rounds of 360 s, no
preemption overhead (Gavel's simulator charges none); the mean JCT of jobs
4,000-4,999, counted once every one of them has finished (jobs keep arriving
until then).  Policies: ``gavel -P aware=false`` (Gavel's ``max_min_fairness``,
"LAS") and ``gavel`` (``max_min_fairness_perf``, "Gavel").

Published: the seed-0 mean JCTs the authors' notebook prints for Figure 8's
runs (``scheduler/notebooks/figures/evaluation/continuous_jobs.ipynb``, the
JCT-CDF cells, in hours), :data:`PUBLISHED`.  Gavel's simulator: the same
seeds and rates run here with Gavel's own code (cvxpy with ECOS, its default),
:data:`GAVEL_SIMULATOR`.  Both presets are the same.  ``limit=N`` measures jobs
0.8 N .. N instead (a quick check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.cluster import typed_cluster
from ...perf.assembly import build_model
from ...scheduler import Scheduler
from ..engine import SimConfig, Simulator
from ..gavel_workload import THROUGHPUTS, gavel_workload
from .common import Result, Row, need

CLUSTER = "v100:36,p100:36,k80:36"
RATES = (2.0, 4.0, 5.2)  #: jobs/hour: light, moderate and heavy load for the agnostic policy
WINDOW = (4000, 5000)

#: mean JCT (hours) of jobs 4,000-4,999, seed 0, by input job rate (jobs/h): Gavel's notebook output
PUBLISHED: dict[str, dict[float, float]] = {
    "agnostic": {0.4: 23.26, 0.8: 23.33, 1.2: 23.51, 1.6: 23.57, 2.0: 23.47, 2.4: 23.43, 2.8: 23.59, 3.2: 23.59,
                 3.6: 23.57, 4.0: 23.49, 4.4: 23.81, 4.8: 35.79, 5.2: 63.78, 5.6: 95.99},
    "aware": {0.4: 17.58, 0.8: 17.64, 1.2: 17.67, 1.6: 17.48, 2.0: 16.95, 2.4: 16.39, 2.8: 16.04, 3.2: 16.08,
              3.6: 16.38, 4.0: 16.82, 4.4: 17.48, 4.8: 18.97, 5.2: 22.02, 5.6: 28.96, 6.0: 41.23},
}

#: mean JCT (hours) of the same runs with Gavel's own simulator (stanford-futuredata/gavel at c4fa400,
#: Python 3.11, cvxpy + ECOS), by (policy, rate, seed); see docs/gavel.md for the command
GAVEL_SIMULATOR: dict[tuple[str, float, int], float] = {
    ("max_min_fairness", 2.0, 0): 23.69,
    ("max_min_fairness_perf", 2.0, 0): 17.02,
    ("max_min_fairness", 4.0, 0): 23.75,
    ("max_min_fairness_perf", 4.0, 0): 17.07,
    ("max_min_fairness", 5.2, 0): 66.51,
    ("max_min_fairness_perf", 5.2, 0): 22.38,
}


def _gavel_sim(aware: bool, rate: float, seeds: int) -> float | None:
    """Gavel's simulator's mean JCT (h) over seeds 0..seeds-1, where every one of them was run."""
    got = [GAVEL_SIMULATOR.get(("max_min_fairness_perf" if aware else "max_min_fairness", rate, s))
           for s in range(seeds)]
    return None if any(g is None for g in got) else sum(g for g in got if g is not None) / len(got)


def run_point(data: Path, rate: float, aware: bool, seed: int = 0, window: tuple[int, int] = WINDOW,
              **params: Any) -> dict[str, Any]:
    """One run: the mean JCT (s) of the window's jobs, with what it took."""
    path = need(data / THROUGHPUTS)
    start, end = window
    # jobs keep arriving until the window is done (the run then stops): twice the window, and at least
    # 400 hours of arrivals past it (a job of the window may take that long under heavy load)
    specs = gavel_workload(max(2 * end, end + int(rate * 400)), rate, seed, throughputs=path)
    cl = typed_cluster(CLUSTER)
    want = {f"gavel-{i}" for i in range(start, end)}
    left = set(want)

    def stop_when_measured(sim: Simulator, event: str) -> None:
        if event == "complete":
            done = [jid for jid in left if sim.by_id[jid].finish is not None]
            left.difference_update(done)
            if not left:
                sim.config.max_time = sim.now  # the rest of the run measures nothing

    p: dict[str, Any] = {"aware": aware, **params}
    if not aware:
        p.setdefault("shuffle_seed", seed + 5)  # Gavel's worker-type shuffler
    sched = Scheduler.from_names("fifo", "none", "gavel", "packed-sticky", True, p)
    sim = Simulator(cl, specs, sched, build_model(cl, {}, specs),
                    SimConfig(round_len=360.0, restart_overhead=0.0, launch_overhead=0.0, seed=seed, check=False),
                    observers=[stop_when_measured])
    res = sim.run()
    jct = [r.finish - r.arrival for r in res.jobs if r.id in want and r.finish is not None]
    last_arrival = specs[-1].arrival
    return {"mean_jct_s": sum(jct) / len(jct) if jct else float("nan"), "finished": len(jct), "measured": len(want),
            "end_s": res.end_time, "tail_ran_out": res.end_time > last_arrival, "wall_s": res.wall_time,
            **sched.size.stats()}


def run(data: Path, preset: str = "paper", seeds: int = 1, limit: int | None = None,
        window: tuple[int, int] | None = None) -> Result:
    """``window`` (``--measure-jobs A:B``) measures jobs A..B-1 instead of Gavel's; ``limit`` 0.8 N .. N-1."""
    if window is None:
        window = WINDOW if limit is None else (max(0, int(limit * 0.8)), limit)
    rows: list[Row] = []
    notes: list[str] = []
    means: dict[tuple[str, float], Row] = {}
    short = limit is not None or window != WINDOW  # the published figures are for Gavel's window
    for rate in RATES:
        for name, aware in (("agnostic", False), ("aware", True)):
            label = "LAS (agnostic)" if not aware else "Gavel LAS (aware)"
            row = Row(f"{label}, {rate:g} jobs/h", f"mean JCT, jobs {window[0]}-{window[1] - 1}", "h",
                      None if short else PUBLISHED[name].get(rate),
                      "Gavel Fig. 8 (notebook, seed 0)")
            row.other = None if short else _gavel_sim(aware, rate, seeds)
            for seed in range(seeds):
                out = run_point(data, rate, aware, seed, window)
                row.values.append(out["mean_jct_s"] / 3600.0)
                if out["tail_ran_out"]:
                    notes.append(f"{label} at {rate:g} jobs/h, seed {seed}: arrivals ended before the window did")
            rows.append(row)
            means[(name, rate)] = row
        ratio = Row(f"agnostic / aware, {rate:g} jobs/h", "mean JCT ratio", "x", None, "direction: > 1")
        pa, pw = PUBLISHED["agnostic"].get(rate), PUBLISHED["aware"].get(rate)
        if not short and pa and pw:
            ratio.published = pa / pw
        ga, gw = _gavel_sim(False, rate, seeds), _gavel_sim(True, rate, seeds)
        if not short and ga and gw:
            ratio.other = ga / gw
        ratio.values = [a / w for a, w in zip(means[("agnostic", rate)].values, means[("aware", rate)].values,
                                              strict=True)]
        rows.append(ratio)
    held = all(v > 1.0 for r in rows if r.unit == "x" for v in r.values)
    notes.insert(0, f"direction (aware LAS shorter than agnostic at every rate): {'holds' if held else 'does NOT hold'}")
    notes.append("published: the authors' seed-0 logs behind Fig. 8 (continuous_jobs.ipynb); Gavel's simulator: "
                 "run here on the same jobs (see docs/gavel.md for the gaps)")
    return Result("gavel", preset, "Gavel (OSDI'20) Fig. 8: LAS, agnostic vs aware, 36 V100 + 36 P100 + 36 K80",
                  rows, notes, seeds, other_label="Gavel's sim")
