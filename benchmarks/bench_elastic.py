"""F-scheduling (elastic sizing under slowdown fairness) against static GPU slots.

1. The thesis scenario: one 6-GPU machine, ResNet-50 / InceptionV3 / ResNet-50 /
   InceptionV3 training jobs of 2,000 steps arriving at 0, 100, 200, 300 s;
   elastic sizing with v_bound 0.5 (slowdown as f(R)/f(U), and as f(U)/f(R))
   against static slots of 1, 2, 3 and 6 GPUs.  Lifecycle: launch 10 s,
   checkpoint 5 s, stop 2 s; protection 3x the launch time; hysteresis 1 step/s.
   Prints total completion time (makespan) per configuration and writes the
   per-job phase breakdown and the GPU-utilisation CDF as PNGs.
2. Scale: 400 generated jobs of the built-in models on 8 nodes x 8 GPUs,
   elastic vs static n=2, with the invariant checks on every round; wall time.

Run: python benchmarks/bench_elastic.py [out-folder]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.perf.scaling import builtin_curve
from gpuloom.sim.elastic import (
    compare_elastic_static,
    comparison_rows,
    plot_phase_breakdown,
    plot_utilisation_cdf,
    thesis_specs,
)
from gpuloom.sim.engine import LifecycleTimes

MODELS = ("resnet50", "inception3", "resnet101", "vgg16", "googlenet", "inception4")


def _table(rows: list[dict[str, object]]) -> None:
    cols = list(rows[0])
    print("  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print("  ".join(_cell(v) for v in r.values()))


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:>16.3f}" if abs(v) < 10 else f"{v:>16.1f}"
    return f"{v!s:>16}"


def scale_specs(n: int, seed: int = 0) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(30.0, n))
    out = []
    for i in range(n):
        m = MODELS[int(rng.integers(len(MODELS)))]
        f1 = builtin_curve(m)(1)  # type: ignore[union-attr]
        steps = int(rng.integers(500, 5000))
        out.append(JobSpec.from_iterations(f"s{i}", float(t[i]), 1, steps, 1.0 / f1, model=m))
    return out


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("gpuloom-out/elastic")
    out.mkdir(parents=True, exist_ok=True)
    lt = LifecycleTimes(launch=10.0, checkpoint=5.0, stop=2.0)
    res = compare_elastic_static(
        thesis_specs(),
        Cluster.homogeneous(1, 6),
        slots=(1, 2, 3, 6),
        elastic={
            "F v<=0.5 f(R)/f(U)": {"v_bound": 0.5},
            "F v<=0.5 f(U)/f(R)": {"v_bound": 0.5, "slowdown": "factor"},
        },
        lifecycle=lt,
    )
    print("thesis scenario: 1 machine x 6 GPUs, 4 jobs x 2000 steps (ResNet-50, InceptionV3 alternating)")
    _table(comparison_rows(res))
    print("per job (queued / launching+reallocating / running, s):")
    for name, run in res.items():
        r = run.result
        cells = ", ".join(
            f"{j.id} {j.phases['queued']:.0f}/{j.phases['launching']:.0f}/{j.phases['running']:.0f}"
            for j in r.jobs if j.phases
        )
        print(f"  {name:>20}: {cells}")
    p1 = plot_phase_breakdown(res, out / "elastic_breakdown.png")
    p2 = plot_utilisation_cdf(res, out / "elastic_util_cdf.png")
    print(f"charts: {p1}, {p2}")

    specs = scale_specs(400)
    cl = Cluster.homogeneous(8, 8)
    t0 = time.perf_counter()
    big = compare_elastic_static(specs, cl, slots=(2,), lifecycle=lt, round_len=60.0)
    wall = time.perf_counter() - t0
    print(f"\nscale: 400 jobs on 8x8 GPUs, invariant checks every round ({wall:.1f} s wall for both runs)")
    rows = comparison_rows(big)
    for r, run in zip(rows, big.values(), strict=True):
        r["wall_s"] = run.result.wall_time
        r["rounds"] = run.result.rounds_computed
    _table(rows)


if __name__ == "__main__":
    main()
