"""Statistics over the seeds of each configuration: the mean and its 95 % confidence interval, and why a
configuration shows ± 0."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .runinfo import Results, runs_of


def confidence(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """``(mean, half-width, n)`` of the finite values: mean ± t(1−α/2, n−1) · s/√n (NaN width if n < 2)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(x[0]), math.nan, 1
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return float(x.mean()), half, n


def aggregate(results: Results) -> dict[str, dict[str, dict[str, float]]]:
    """``{label: {metric: {"mean", "ci95", "low", "high", "n"}}}`` over each configuration's seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, runs in runs_of(results).items():
        sums = [r.summary() for r in runs]
        row = {}
        for key in sums[0]:
            vals = [s.get(key) for s in sums]
            if not all(isinstance(v, int | float) for v in vals if v is not None):
                continue
            m, h, n = confidence([float(v) for v in vals if v is not None])
            row[key] = {"mean": m, "ci95": h, "low": m - h, "high": m + h, "n": n}
        out[label] = row
    return out


RANDOM_PLACES = ("random-sticky", "random-non-sticky")


def seed_notes(results: Results) -> list[str]:
    """Why a configuration run with several seeds shows ± 0: its seeds gave identical runs (every job's record
    equal).  Random placement still drew with each seed; it is said apart, since a reader expects it to vary."""
    same = [lb for lb, rs in runs_of(results).items() if len(rs) > 1 and all(r.jobs == rs[0].jobs for r in rs[1:])]
    if not same:
        return []
    rand = [lb for lb in same if runs_of(results)[lb][0].config.get("place") in RANDOM_PLACES]
    fixed = [lb for lb in same if lb not in rand]
    notes = []
    if fixed:
        notes.append(f"{', '.join(fixed)}: every seed gave the same run (nothing in {'it' if len(fixed) == 1 else 'them'} "
                     "depends on the seed: a trace's jobs, no random stage), hence ± 0")
    if rand:
        notes.append(f"{', '.join(rand)}: every seed gave the same run although each drew other GPUs at random: no job "
                     "ran faster or slower for the GPUs it drew (a job pays the same locality penalty however many "
                     "nodes beyond the fewest it spans, and no PM-scores tell GPUs apart), hence ± 0; the seed "
                     "matters with --variability generate (GPUs of unequal speed), or with smaller jobs on "
                     "larger nodes")
    return notes

