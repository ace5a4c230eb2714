"""PAL placement: round cost at scale, and PAL's Sia-Philly evaluation.

Run: ``PYTHONPATH=src python benchmarks/bench_pal.py [round|eval|sweep|sources|ablation|seeds|all]``
(``main()`` runs everything; the evaluation parts need ``../shared/data`` or
``$GPULOOM_DATA``).

1. **Round cost.**  One scheduling round (FIFO order, proportional sizing,
   the place policy) at 256, 1,024 and 10,240 GPUs (nodes of 4 GPUs), with a
   full queue: jobs drawn from the Sia-Philly size mix (1-48 GPUs) and models
   until they ask for twice the cluster.  ``cold`` is the first round
   (includes binning the PM-scores and building the per-class arrays),
   ``warm`` the best of three later rounds from an empty cluster, ``steady`` (best of three)
   a round in which the previous plan's jobs are running (non-sticky
   policies re-place all of them).  Scores: generated from PAL's measured
   data when present, else drawn from N(1, 0.03) (same cost either way).
2. **Evaluation** (PAL, SC'24, Sec. V.B): the eight Sia-Philly 160-job
   workloads on 16 nodes x 4 GPUs, FIFO, 360 s rounds, locality penalty 1.7,
   restart overhead 10 s; PM-scores for the 64 GPUs generated from the
   measured Longhorn distributions (``generate_for_cluster``, seed 0).
   Average JCT per workload and policy; improvement of PM-First and PAL over
   Packed-Sticky, per workload ``1 - JCT/JCT_packed_sticky`` and the geometric
   mean over workloads ``1 - geomean(JCT/JCT_packed_sticky)``.
   The evaluation (and the sweep) runs twice: with our semantics (each
   GPU's median run, whole measured nodes; the paper's classes; trace
   durations in seconds; backfill; 10 s restart cost) and with PAL's
   artifact's simulation semantics (``SEMANTICS["artifact"]``: each GPU's
   slowest run, GPUs drawn independently; the artifact's classes; duration x
   per-model iteration time; strict queue; no restart cost).
3. **Locality sweep**: the penalty from 1.0 to 3.0 on workload 6 (the
   workload of the artifact's sweep, ``run_sia_sim_losweep.sh``).
4. **Score sources**: the geomean improvement for other seeds of the
   generator and for PAL's measured 32-GPU table repeated over 64 GPUs.
5. **Ablation** (``ablation``, not part of ``all``): starting from our
   setup, the artifact's simulation semantics switched on one at a time -
   its scores, its model classes (:data:`ARTIFACT_MODEL_CLASSES`), its work
   (the trace's ``duration`` read as a number of iterations of a per-model
   iteration time, :data:`ARTIFACT_ITER_TIME`), its strict queue (no
   backfill) and no restart cost - with the geomean improvement of PM-First
   and PAL over Packed-Sticky after each step.  See ``docs/pal.md``.
6. **Seeds** (``seeds``, not part of ``all``): ``gpuloom reproduce pal``'s
   setting (paper preset, strict queue) for PM-score draws 0-9, each with
   the number of class-A GPUs it drew above 1.5 and PM-First's geomean
   improvement; then draw 0 with its class-A scores clipped at 1.3.

The PAL traces (``job_id,num_gpus,submit_time,duration,model``) are read
with :func:`gpuloom.sim.traces.read_pal`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.variability import (
    ARTIFACT_MODEL_CLASSES,
    PMScores,
    add_variability,
    generate_for_cluster,
    load_variability_csv,
)
from gpuloom.policies.base import View
from gpuloom.scheduler import Scheduler
from gpuloom.sim import simulate
from gpuloom.sim.traces import read_pal

POLICIES = ["packed-sticky", "packed-non-sticky", "random-sticky", "random-non-sticky", "pm-first", "pal"]
SIZES = [1, 4, 6, 8, 12, 16, 24, 32, 48]
SIZE_P = np.array([44800, 5100, 17100, 14900, 16500, 11300, 700, 900, 700], dtype=float)  # Sia-Philly mix
MODELS = ["vgg19", "resnet50", "DCGAN", "BERT", "GPT2", "PointNet"]
#: Seconds per iteration PAL's artifact assigns each Sia-Philly model; it reads a trace's
#: ``duration`` as a number of iterations, so a job's work there is ``duration * ARTIFACT_ITER_TIME``.
ARTIFACT_ITER_TIME = {"vgg19": 0.3006, "resnet50": 0.1754, "DCGAN": 0.0469, "BERT": 0.179, "GPT2": 3.5714,
                      "PointNet": 0.28125}


def data_dir() -> Path | None:
    env = os.environ.get("GPULOOM_DATA")
    p = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return p if p.is_dir() else None


def read_pal_trace(path: Path) -> list[JobSpec]:
    return read_pal(path).jobs


def _scores(cluster: Cluster, seed: int = 0) -> PMScores:
    d = data_dir()
    if d is not None:
        return generate_for_cluster(cluster, d / "pal" / "variability", seed)
    rng = np.random.default_rng(seed)
    return PMScores(np.clip(rng.normal(1.0, 0.03, (cluster.num_gpus, 4)), 0.8, None), "synthetic")


# ---------------------------------------------------------------------------
def bench_round() -> None:
    print("One placement round, full queue (demand = 2x the cluster), nodes of 4 GPUs")
    print(f"{'GPUs':>6} {'queue':>6} {'placed':>7} {'policy':<14} {'cold ms':>9} {'warm ms':>9} {'steady ms':>10}")
    for g in (256, 1024, 10240):
        cl = Cluster.homogeneous(g // 4, 4)
        scores = _scores(cl)
        rng = np.random.default_rng(1)
        jobs: list[Job] = []
        demand = 0
        while demand < 2 * g:
            k = int(rng.choice(SIZES, p=SIZE_P / SIZE_P.sum()))
            spec = JobSpec(f"j{len(jobs)}", float(len(jobs)), k, 3600.0, model=str(rng.choice(MODELS)))
            j = Job(spec, len(jobs))
            j.arrive(j.arrival)
            jobs.append(j)
            demand += k
        for pol in ("packed-sticky", "pm-first", "pal"):
            model = add_variability(ThroughputModel.default(cl, 1.7), scores)
            sched = Scheduler.from_names("fifo", "none", "proportional", pol)

            def view(current: dict) -> View:
                return View(0.0, cl, jobs, current, model, np.random.default_rng(0))  # noqa: B023

            for j in jobs:
                j.alloc = None
            t0 = time.perf_counter()
            plan = sched.schedule(view({})).plan
            cold = time.perf_counter() - t0
            warm = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                sched.schedule(view({}))
                warm = min(warm, time.perf_counter() - t0)
            for j in jobs:
                j.alloc = plan.allocations.get(j.id)
            steady = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                plan2 = sched.schedule(view(dict(plan.allocations))).plan
                steady = min(steady, time.perf_counter() - t0)
            assert len(plan2) >= 1
            for j in jobs:
                j.alloc = None
            print(f"{g:>6} {len(jobs):>6} {len(plan):>7} {pol:<14} {cold * 1e3:>9.1f} {warm * 1e3:>9.1f} "
                  f"{steady * 1e3:>10.1f}")


# ---------------------------------------------------------------------------
def _run(specs: list[JobSpec], cluster: Cluster, scores: PMScores, place: str, penalty: float,
         model_classes: dict[str, str] | None = None, backfill: bool = True, restart: float = 10.0) -> float:
    model = add_variability(ThroughputModel.default(cluster, penalty), scores, model_classes=model_classes)
    res = simulate(cluster, specs, order="fifo", place=place, model=model, round_len=360.0, seed=0,
                   params={"backfill": backfill}, restart_overhead=restart)
    s = res.summary()
    if s["unfinished"]:
        raise RuntimeError(f"{place}: {s['unfinished']} jobs unfinished")
    return float(s["mean_jct_s"])


def _geo_impr(ratios: list[float]) -> float:
    return 1.0 - math.exp(sum(math.log(r) for r in ratios) / len(ratios))


#: evaluation semantics: ours, and PAL's artifact's (scores, classes, work, strict queue, no restart cost)
SEMANTICS: dict[str, dict] = {
    "ours": {"scores": "median/node", "classes": False, "work": False, "backfill": True, "restart": 10.0},
    "artifact": {"scores": "max/gpu", "classes": True, "work": True, "backfill": False, "restart": 0.0},
}


def _setup(semantics: str, cl: Cluster, d: Path, seed: int) -> tuple[PMScores, dict[str, str] | None, dict]:
    sem = SEMANTICS[semantics]
    per_gpu, draw = sem["scores"].split("/")
    scores = generate_for_cluster(cl, d / "pal" / "variability", seed, per_gpu=per_gpu, draw=draw)
    mc = ARTIFACT_MODEL_CLASSES if sem["classes"] else None
    return scores, mc, {"backfill": sem["backfill"], "restart": sem["restart"]}


def _specs(d: Path, w: int, semantics: str) -> list[JobSpec]:
    specs = read_pal_trace(d / "pal" / "traces" / "philly" / f"workload-{w}.csv")
    return artifact_work(specs) if SEMANTICS[semantics]["work"] else specs


def bench_eval(workloads: range = range(1, 9), seed: int = 0, semantics: str = "ours") -> None:
    d = data_dir()
    if d is None:
        print("evaluation skipped: no ../shared/data")
        return
    cl = Cluster.homogeneous(16, 4)
    scores, mc, kw = _setup(semantics, cl, d, seed)
    print(f"\nSia-Philly workloads, 16x4 GPUs, FIFO, 360 s rounds, locality 1.7, {semantics} semantics "
          f"{SEMANTICS[semantics]} (seed {seed}; class A max score {scores.scores[:, 0].max():.3f})")
    print("average JCT in hours")
    print(f"{'workload':>8} " + " ".join(f"{p:>17}" for p in POLICIES) + f" {'PM-First impr':>13} {'PAL impr':>9}")
    rat: dict[str, list[float]] = {"pm-first": [], "pal": []}
    t0 = time.perf_counter()
    for w in workloads:
        specs = _specs(d, w, semantics)
        jct = {p: _run(specs, cl, scores, p, 1.7, mc, **kw) for p in POLICIES}
        for p in rat:
            rat[p].append(jct[p] / jct["packed-sticky"])
        print(f"{w:>8} " + " ".join(f"{jct[p] / 3600:>17.2f}" for p in POLICIES)
              + f" {1 - jct['pm-first'] / jct['packed-sticky']:>13.1%} {1 - jct['pal'] / jct['packed-sticky']:>9.1%}")
    print(f"geomean improvement over packed-sticky: PM-First {_geo_impr(rat['pm-first']):.1%}, "
          f"PAL {_geo_impr(rat['pal']):.1%}   ({time.perf_counter() - t0:.1f} s)")


def bench_sweep(workload: int = 6, seed: int = 0, semantics: str = "ours") -> None:
    d = data_dir()
    if d is None:
        print("sweep skipped: no ../shared/data")
        return
    cl = Cluster.homogeneous(16, 4)
    scores, mc, kw = _setup(semantics, cl, d, seed)
    specs = _specs(d, workload, semantics)
    print(f"\nLocality penalty sweep, workload {workload}, {semantics} semantics (average JCT in hours)")
    print(f"{'penalty':>7} " + " ".join(f"{p:>17}" for p in POLICIES) + f" {'PM-First impr':>13} {'PAL impr':>9}")
    for pen in (1.0, 1.5, 2.0, 2.5, 3.0):
        jct = {p: _run(specs, cl, scores, p, pen, mc, **kw) for p in POLICIES}
        print(f"{pen:>7.1f} " + " ".join(f"{jct[p] / 3600:>17.2f}" for p in POLICIES)
              + f" {1 - jct['pm-first'] / jct['packed-sticky']:>13.1%} {1 - jct['pal'] / jct['packed-sticky']:>9.1%}")


def bench_sources(seeds: range = range(4)) -> None:
    """Geomean improvement over packed-sticky for other score draws, PAL's measured table, both semantics."""
    d = data_dir()
    if d is None:
        print("sources skipped: no ../shared/data")
        return
    cl = Cluster.homogeneous(16, 4)
    table = load_variability_csv(d / "pal" / "variability" / "32gpu-variability.csv")
    measured = PMScores(np.vstack([table.scores, table.scores]), "32gpu x2")
    print("\nPM-score source vs geomean improvement over packed-sticky (8 workloads, penalty 1.7)")
    print(f"{'semantics':<9} {'source':<26} {'class A max':>11} {'PM-First':>9} {'PAL':>7}")
    for sem in SEMANTICS:
        sources = {f"generated, seed {s}": _setup(sem, cl, d, s)[0] for s in seeds}
        sources["measured 32-GPU table x2"] = measured
        _, mc, kw = _setup(sem, cl, d, 0)
        specs = {w: _specs(d, w, sem) for w in range(1, 9)}
        for name, sc in sources.items():
            rat: dict[str, list[float]] = {"pm-first": [], "pal": []}
            for w in range(1, 9):
                base = _run(specs[w], cl, sc, "packed-sticky", 1.7, mc, **kw)
                for p in rat:
                    rat[p].append(_run(specs[w], cl, sc, p, 1.7, mc, **kw) / base)
            print(f"{sem:<9} {name:<26} {sc.scores[:, 0].max():>11.3f} {_geo_impr(rat['pm-first']):>9.1%} "
                  f"{_geo_impr(rat['pal']):>7.1%}")


def artifact_work(specs: list[JobSpec]) -> list[JobSpec]:
    """The artifact's work: ``duration`` read as iterations of the model's iteration time."""
    out = []
    for s in specs:
        if s.model not in ARTIFACT_ITER_TIME:
            raise ValueError(f"job {s.id}: no artifact iteration time for model {s.model!r}")
        out.append(replace(s, duration=s.duration * ARTIFACT_ITER_TIME[s.model]))
    return out


#: ablation steps: (label, scores, artifact classes, artifact work, backfill, restart overhead)
ABLATION = [
    ("ours", "median/node", False, False, True, 10.0),
    ("+ artifact scores (max/gpu)", "max/gpu", False, False, True, 10.0),
    ("+ artifact classes", "max/gpu", True, False, True, 10.0),
    ("+ artifact work (dur x iter time)", "max/gpu", True, True, True, 10.0),
    ("+ strict queue (no backfill)", "max/gpu", True, True, False, 10.0),
    ("+ no restart cost = artifact", "max/gpu", True, True, False, 0.0),
    ("artifact, but our scores", "median/node", True, True, False, 0.0),
    ("ours, scores max/node", "max/node", False, False, True, 10.0),
    ("ours, scores median/gpu", "median/gpu", False, False, True, 10.0),
]


def bench_ablation(seed: int = 0) -> None:
    d = data_dir()
    if d is None:
        print("ablation skipped: no ../shared/data")
        return
    cl = Cluster.homogeneous(16, 4)
    base = {w: read_pal_trace(d / "pal" / "traces" / "philly" / f"workload-{w}.csv") for w in range(1, 9)}
    print(f"\nAblation: PAL artifact's simulation semantics one by one (8 workloads, penalty 1.7, seed {seed})")
    print(f"{'setup':<36} {'PM-First':>9} {'PAL':>7}   mean JCT h (packed-sticky / PM-First / PAL), workload 1")
    for label, kind, classes, work, backfill, restart in ABLATION:
        per_gpu, draw = kind.split("/")
        scores = generate_for_cluster(cl, d / "pal" / "variability", seed, per_gpu=per_gpu, draw=draw)
        mc = ARTIFACT_MODEL_CLASSES if classes else None
        rat: dict[str, list[float]] = {"pm-first": [], "pal": []}
        w1 = ""
        for w in range(1, 9):
            specs = artifact_work(base[w]) if work else base[w]
            j = {p: _run(specs, cl, scores, p, 1.7, mc, backfill, restart) for p in ("packed-sticky", "pm-first", "pal")}
            for p in rat:
                rat[p].append(j[p] / j["packed-sticky"])
            if w == 1:
                w1 = " / ".join(f"{j[p] / 3600:.2f}" for p in ("packed-sticky", "pm-first", "pal"))
        print(f"{label:<36} {_geo_impr(rat['pm-first']):>9.1%} {_geo_impr(rat['pal']):>7.1%}   {w1}")


def bench_seeds(seeds: range = range(10), clip: float = 1.3) -> None:
    """What each PM-score draw gives ``gpuloom reproduce pal`` (paper preset, strict queue): the class-A GPUs
    drawn above 1.5 (the slow-run tail) against PM-First's geomean improvement; then seed 0 with its class-A
    scores clipped at ``clip`` (the tail removed, everything else equal)."""
    from gpuloom.sim.reproduce import pal as rp

    d = data_dir()
    if d is None:
        print("seeds skipped: no ../shared/data")
        return
    cl = Cluster.homogeneous(16, 4)
    traces = rp.workloads(d)
    print("\nPM-score draw vs PM-First's gain (reproduce pal, paper preset, strict queue, 8 workloads)")
    print(f"{'draw':<22} {'class A > 1.5':>13} {'class A max':>11} {'PM-First':>9}   per workload")

    def one(name: str, scores: PMScores) -> None:
        jct = rp.mean_jcts(traces, scores, policies=("packed-sticky", "pm-first"))
        ratios = [a / b for a, b in zip(jct["pm-first"], jct["packed-sticky"], strict=True)]
        a = scores.scores[:, 0]
        print(f"{name:<22} {int((a > 1.5).sum()):>13} {a.max():>11.2f} {_geo_impr(ratios):>9.1%}   "
              + " ".join(f"{1 - r:.0%}" for r in ratios), flush=True)

    for seed in seeds:
        one(f"seed {seed}", generate_for_cluster(cl, d / "pal" / "variability", seed, per_gpu="max", draw="gpu"))
    s0 = generate_for_cluster(cl, d / "pal" / "variability", 0, per_gpu="max", draw="gpu").scores.copy()
    s0[:, 0] = np.minimum(s0[:, 0], clip)
    one(f"seed 0, A clipped {clip:g}", PMScores(s0, f"seed 0, class A clipped at {clip}"))


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 and __name__ == "__main__" else "all"
    if what in ("round", "all"):
        bench_round()
    if what in ("eval", "all"):
        bench_eval()
        bench_eval(semantics="artifact")
    if what in ("sweep", "all"):
        bench_sweep()
        bench_sweep(semantics="artifact")
    if what == "sources":  # not part of "all": keeps main() near two minutes
        bench_sources()
    if what == "ablation":
        bench_ablation()
    if what == "seeds":  # not part of "all" either: 11 draws x 8 workloads
        bench_seeds()


if __name__ == "__main__":
    main()
