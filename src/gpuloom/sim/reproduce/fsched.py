"""F-scheduling (the thesis' scenario): elastic sizing against static partitions of one 6-GPU machine.

Four jobs of 2,000 global steps (90 samples split over the job's GPUs):
ResNet-50, InceptionV3, ResNet-50, InceptionV3 at 0, 100, 200, 300 s.
Published: the thesis ranks F-scheduling (v_bound 0.5) ahead of every static
partition (n = 1, 2, 3, 6 GPUs per slot), with n = 6 the worst; its figures are
not in our data, so only the direction is compared (``published`` empty).
Throughput: strong-scaling curves derived from Tiresias' measured weak-scaling
curves (:func:`~gpuloom.perf.scaling.strong_scaling_curve`, batch 32 per GPU
assumed).  Lifecycle times 10/5/2 s (launch/checkpoint/stop) are assumptions
(the thesis gives none).  Deterministic.  Presets: ``paper`` - rounds on
events only (the thesis); ``artifact`` - also every 10 s (gpuloom's former
setting).
"""

from __future__ import annotations

import math
from pathlib import Path

from ...core.cluster import Cluster
from ..elastic import compare_elastic_static, thesis_specs
from ..engine import LifecycleTimes
from .common import Result, Row


def run(data: Path, preset: str = "paper", seeds: int = 1, limit: int | None = None) -> Result:
    specs = thesis_specs()
    runs = compare_elastic_static(specs, Cluster.homogeneous(1, 6), slots=(1, 2, 3, 6),
                                  elastic={"F-scheduling": {"v_bound": 0.5}},
                                  lifecycle=LifecycleTimes(10.0, 5.0, 2.0),
                                  round_len=math.inf if preset == "paper" else 10.0)
    rows = []
    src = "thesis: F-scheduling best, static n=6 worst (direction)"
    for name, r in runs.items():
        s = r.result.summary()
        rows.append(Row(name, "total completion", "s", None, src, [r.result.end_time]))
        rows.append(Row(name, "mean JCT", "s", None, src, [s["mean_jct_s"]]))
    jct = {r.setting: r.mean for r in rows if r.metric == "mean JCT"}
    ms = {r.setting: r.mean for r in rows if r.metric == "total completion"}
    ok = all(jct["F-scheduling"] < v for k, v in jct.items() if k != "F-scheduling") and \
        max(jct, key=jct.__getitem__) == "static n=6" and max(ms, key=ms.__getitem__) == "static n=6"
    notes = [f"thesis direction reproduced: {'yes' if ok else 'NO'} (F-scheduling lowest mean JCT and total "
             "completion; static n=6 highest)"]
    return Result("fsched", preset, "F-scheduling thesis scenario: 1 x 6 GPUs", rows, notes, 1)
