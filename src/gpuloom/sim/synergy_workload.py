"""Synergy's workloads: model families, class splits, Poisson load in jobs/hour.

:func:`synergy_workload` draws jobs the way Synergy's simulator
(msr-fiddle/synergy, ``jobs/workload.py``, ``jobs/model_zoo.py``,
``helpers/utils.py``) does:

* **families and models**: image (alexnet, res18, res50, mobilenet,
  shufflenet), language (gnmt, transformer, lstm), speech (m5, deepspeech);
  a job's family is drawn with the split's weights (e.g. ``(20, 70, 10)``,
  ``(33, 33, 33)``, ``(50, 0, 50)``), its model uniformly within the family
  (Synergy balances the split deterministically; drawing keeps jobs
  independent of each other, same proportions in expectation);
* **arrivals**: Poisson, exponential gaps with mean ``3600 / jobs_per_hour`` s;
* **durations and GPU counts**, two sources:

  - ``"philly"`` (Synergy's evaluation): (duration, GPUs) pairs drawn from
    the Microsoft Philly job list (``sia/philly_jobs.csv``: ``duration``,
    ``num_gpus``), jobs of at most ``max_gpus`` GPUs (one server; Synergy's
    multi-GPU trace) and at least ``min_duration`` seconds;
  - ``"synthetic"`` (Synergy's synthetic mode, no data needed): GPUs 1 / 2 /
    4 / 8 with probability 0.70 / 0.10 / 0.15 / 0.05 (``get_job_gpu_demand``)
    and Gavel-like durations ``60 * 10**U(1.5, 3)`` s with probability 0.8,
    else ``60 * 10**U(3, 4)`` s (``get_gavel_like_iter``; mean ≈ 16.8 h, so at
    9 jobs/h this overloads 128 GPUs about 2.2x).

Durations are reference seconds: run time at the GPU-proportional share (the
sensitivity factor speeds sensitive jobs up from there).

Synergy's own trace files (``synergy/traces/*.csv``) are read by
:func:`gpuloom.sim.traces.load_trace` (format ``synergy``).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..core.job import JobSpec
from ..perf.sensitivity import FAMILIES

#: Synergy's synthetic GPU demand distribution.
SYNERGY_GPU_MIX: dict[int, float] = {1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}
SPLITS: dict[str, tuple[float, float, float]] = {
    "20-70-10": (20, 70, 10),
    "33-33-33": (33, 33, 33),
    "50-0-50": (50, 0, 50),
}


class WorkloadError(ValueError):
    """Bad workload parameter or input file; the message says which."""


def load_philly_jobs(path: str | Path, max_gpus: int = 8, min_duration: float = 60.0) -> list[tuple[float, int]]:
    """(duration s, GPUs) of every Philly job with ``1 <= GPUs <= max_gpus`` and duration >= ``min_duration``."""
    path = Path(path)
    try:
        f = path.open(newline="")
    except OSError as e:
        raise WorkloadError(f"{path}: {e.strerror or e}") from None
    out: list[tuple[float, int]] = []
    with f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        for c in ("duration", "num_gpus"):
            if c not in cols:
                raise WorkloadError(f"{path}: missing column {c!r}")
        for line, row in enumerate(reader, start=2):
            try:
                d = float(row["duration"])
                g = int(float(row["num_gpus"]))
            except (TypeError, ValueError):
                raise WorkloadError(f"{path}:{line}: bad duration or num_gpus {row!r}") from None
            if not math.isfinite(d):
                raise WorkloadError(f"{path}:{line}: duration {d} is not finite")
            if 1 <= g <= max_gpus and d >= min_duration:
                out.append((d, g))
    if not out:
        raise WorkloadError(f"{path}: no job with 1..{max_gpus} GPUs and duration >= {min_duration} s")
    return out


def _split(split: Sequence[float]) -> np.ndarray:
    w = np.asarray(list(split), dtype=float)
    if w.shape != (3,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise WorkloadError(f"split must be three non-negative weights (image, language, speech), got {tuple(split)}")
    return w / w.sum()


def synergy_workload(
    num_jobs: int,
    jobs_per_hour: float = 9.0,
    split: Sequence[float] = (20, 70, 10),
    seed: int = 0,
    *,
    durations: str = "synthetic",
    philly: Sequence[tuple[float, int]] | str | Path | None = None,
    max_gpus: int = 8,
    min_duration: float = 60.0,
    start: float = 0.0,
) -> list[JobSpec]:
    """``num_jobs`` Synergy-style jobs (see the module notes); deterministic for a seed."""
    if num_jobs < 0:
        raise WorkloadError(f"num_jobs must be >= 0, got {num_jobs}")
    if not (math.isfinite(jobs_per_hour) and jobs_per_hour > 0):
        raise WorkloadError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    if durations not in ("synthetic", "philly"):
        raise WorkloadError(f"durations must be 'synthetic' or 'philly', got {durations!r}")
    w = _split(split)
    rng = np.random.default_rng(seed)
    fams = list(FAMILIES)
    pool: list[tuple[float, int]] | None = None
    if durations == "philly":
        if philly is None:
            raise WorkloadError("durations='philly' needs philly= (a path to philly_jobs.csv or (duration, gpus) pairs)")
        pool = load_philly_jobs(philly, max_gpus, min_duration) if isinstance(philly, str | Path) else list(philly)
        if not pool:
            raise WorkloadError("philly job pool is empty")
    gpu_vals = np.array([g for g in SYNERGY_GPU_MIX if g <= max_gpus])
    gpu_p = np.array([SYNERGY_GPU_MIX[g] for g in gpu_vals])
    if gpu_vals.size == 0:
        raise WorkloadError(f"max_gpus {max_gpus} excludes every GPU count of the mix")
    gpu_p = gpu_p / gpu_p.sum()
    specs: list[JobSpec] = []
    t = float(start)
    gap = 3600.0 / jobs_per_hour
    for i in range(num_jobs):
        if i:
            t += float(rng.exponential(gap))
        fam = fams[int(rng.choice(3, p=w))]
        names = FAMILIES[fam]
        model = names[int(rng.integers(len(names)))]
        if pool is not None:
            d, g = pool[int(rng.integers(len(pool)))]
        else:
            g = int(rng.choice(gpu_vals, p=gpu_p))
            lo, hi = (3.0, 4.0) if rng.random() >= 0.8 else (1.5, 3.0)
            d = 60.0 * 10 ** float(rng.uniform(lo, hi))
        specs.append(
            JobSpec(f"j{i}", round(t, 3), int(g), max(float(d), min_duration), model=model, attrs={"family": fam})
        )
    return specs


#: Synergy's model zoo in its order (``jobs/model_zoo.py``: ``create_default_models``), by family
RUNNER_MODELS: dict[str, tuple[str, ...]] = {
    "image": ("alexnet", "res18", "res50", "mobilenet", "shufflenet"),
    "language": ("gnmt", "transformer", "lstm"),
    "speech": ("m5", "deepspeech"),
}
RUNNER_SEED = 42  #: ``runner.py --seed`` default


def _gavel_like(rng: random.Random) -> float:
    """``helpers/utils.py: get_gavel_like_iter``: seconds at the proportional share, two draws."""
    lo, hi = (3.0, 4.0) if rng.random() >= 0.8 else (1.5, 3.0)
    return 60 * (10 ** rng.uniform(lo, hi))


def runner_workload(
    num_jobs: int,
    iter_times: Mapping[str, float],
    jobs_per_hour: float = 9.0,
    split: Sequence[float] = (20, 70, 10),
    seed: int = RUNNER_SEED,
) -> list[JobSpec]:
    """The single-GPU jobs Synergy's runner generates in its default run (the artifact README's command).

    In that run (``--cluster_job_log``, exponential arrivals, no ``--multigpu``) every job of the Philly list
    gets a Gavel-like duration drawn from Python's ``random`` (``parse_philly_trace_full.py``): the Philly log
    only decides how many jobs pass its filter, never a duration.  The runner seeds ``random`` with ``seed``
    before the list is drawn and again before each run, so this rebuilds it without the log: the durations,
    then from a fresh stream per job a Poisson gap (whole seconds), a ``randint(0, 9)`` that the runner draws
    and ignores, and the model by Synergy's ``OVERALL`` assignment (the family furthest below its share of the
    jobs so far, its models in turn).  Iterations are ``int(duration / iter_time)`` as the runner sets them;
    ``iter_times`` gives each model's (the ``iter_time`` of its 1-GPU profile).
    """
    if num_jobs < 0:
        raise WorkloadError(f"num_jobs must be >= 0, got {num_jobs}")
    if not (math.isfinite(jobs_per_hour) and jobs_per_hour > 0):
        raise WorkloadError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    _split(split)
    pct = [float(x) for x in split]
    missing = [m for ms in RUNNER_MODELS.values() for m in ms if not iter_times.get(m, 0) > 0]
    if missing:
        raise WorkloadError(f"iter_times has no positive iteration time for {', '.join(missing)}")
    rng = random.Random(seed)
    durations = [_gavel_like(rng) for _ in range(num_jobs)]
    rng = random.Random(seed)
    fams = list(RUNNER_MODELS)
    total = dict.fromkeys(fams, 0)
    turn = dict.fromkeys(fams, 0)
    specs: list[JobSpec] = []
    t = 0
    for i, d in enumerate(durations):
        t += math.ceil(-math.log(1.0 - rng.random()) / jobs_per_hour * 3600)
        rng.randint(0, 9)
        n = sum(total.values())
        # each family's priority as the runner computes it (all 0 before the first job); ties: the first family
        prio = [pct[k] / 100 - total[f] / n for k, f in enumerate(fams)] if n else [0.0] * 3
        fam = fams[max(range(3), key=lambda k: (prio[k], -k))]
        model = RUNNER_MODELS[fam][turn[fam] % len(RUNNER_MODELS[fam])]
        turn[fam] += 1
        total[fam] += 1
        it = float(iter_times[model])
        specs.append(JobSpec.from_iterations(f"j{i}", float(t), 1, max(1, int(d / it)), it, model=model,
                                             attrs={"family": fam}))
    return specs
