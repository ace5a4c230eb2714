"""Gavel's continuous workloads: jobs drawn from its 26 job types, Poisson arrivals, sized on a V100.

:func:`gavel_workload` draws jobs exactly as Gavel's simulator does
(stanford-futuredata/gavel, ``scheduler/utils.py``: ``generate_job``,
``_generate_duration``, ``_generate_scale_factor``; ``scheduler.py``:
``simulate`` and ``_initialize_seeds``), with the same random streams, so a
seed gives Gavel's own trace job for job:

* **arrivals**: the first at 0, then exponential gaps of mean ``3600 /
  jobs_per_hour`` s (Python's ``random.Random(seed + 3)``);
* **each job** (``random.Random(seed + 2)``): a scale factor (GPUs) drawn as
  Philly's: 1 with probability 0.7, 2 with 0.1, 4 with 0.15, 8 with 0.05 (the
  draw is made for every job; *continuous-single* then sets it to 1,
  *continuous-multiple* keeps it); a duration ``60 * 10**U(1.5, 3)`` s with
  probability 0.8, else ``60 * 10**U(3, 4)`` s; a job type uniform over the
  26 of :data:`GAVEL_JOB_TYPES` (drawn again until it is one of the
  distributed models when it has more than one GPU);
* **size**: the duration is its run time on the reference type (a V100), so
  ``steps = duration x the V100's throughput`` for its type and scale factor.

Jobs are named ``gavel-<n>`` with Gavel's job id ``n`` (0, 1, ...), carry
``attrs["job_type"]`` (``"ResNet-50 (batch size 64)"``), ``total_steps``,
``scale_factor`` and the throughput file they were sized with
(``gpu_speeds_file``), so the throughput model's ``gpu_type`` factor reads the
same matrix (:mod:`gpuloom.perf.gputype`).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from ..core.job import JobSpec
from ..perf.gputype import JOB_TYPE_KEY, SPEEDS_FILE_KEY, load_type_speeds


def _types() -> tuple[list[str], frozenset[str]]:
    out: list[str] = []
    for b in (16, 32, 64, 128, 256):
        out.append(f"ResNet-18 (batch size {b})")
    for b in (16, 32, 64, 128):
        out.append(f"ResNet-50 (batch size {b})")
    for b in (16, 32, 64, 128, 256):
        out.append(f"Transformer (batch size {b})")
    for b in (5, 10, 20, 40, 80):
        out.append(f"LM (batch size {b})")
    for b in (512, 1024, 2048, 4096, 8192):
        out.append(f"Recommendation (batch size {b})")
    out += ["A3C", "CycleGAN"]
    distributed = frozenset(t for t in out if t.split(" (")[0] in ("ResNet-18", "ResNet-50", "Transformer", "LM"))
    return out, distributed


#: Gavel's job table (``job_table.py``), in its order: the draw indexes into it
GAVEL_JOB_TYPES, DISTRIBUTED = _types()
#: the data folder's copy of Gavel's measured throughputs, relative to the data folder
THROUGHPUTS = "gavel/throughputs/simulation_throughputs.json"


def _scale_factor(rng: random.Random) -> int:
    r = rng.uniform(0, 1)
    if 0.7 <= r <= 0.8:
        return 2
    if 0.8 <= r <= 0.95:
        return 4
    if 0.95 <= r:
        return 8
    return 1


def _duration(rng: random.Random) -> float:
    if rng.random() >= 0.8:
        return 60 * (10 ** rng.uniform(3, 4))
    return 60 * (10 ** rng.uniform(1.5, 3))


def gavel_workload(num_jobs: int, jobs_per_hour: float, seed: int = 0, multi_gpu: bool = False,
                   throughputs: str | Path = THROUGHPUTS, reference: str = "v100") -> list[JobSpec]:
    """``num_jobs`` jobs of Gavel's continuous-single (``multi_gpu=False``) or continuous-multiple workload
    (see the module notes); ``throughputs`` is Gavel's throughput file (to size the jobs in steps)."""
    if num_jobs < 1:
        raise ValueError(f"num_jobs must be >= 1, got {num_jobs}")
    if not jobs_per_hour > 0:
        raise ValueError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    matrix = load_type_speeds(throughputs, pairs=False)
    path = str(throughputs)
    jobs_rng = random.Random(seed + 2)
    gaps = random.Random(seed + 3)
    rate = jobs_per_hour / 3600.0
    arrival = 0.0
    out: list[JobSpec] = []
    for n in range(num_jobs):
        g = _scale_factor(jobs_rng)
        run_time = _duration(jobs_rng)
        if not multi_gpu:
            g = 1
        while True:
            job_type = jobs_rng.choice(GAVEL_JOB_TYPES)
            if g == 1 or job_type in DISTRIBUTED:
                break
        row = matrix.rates.get((" ".join(job_type.lower().split()), g))
        if row is None or not row.get(reference):
            raise ValueError(f"{throughputs}: no {reference} throughput for {job_type!r} on {g} GPU(s)")
        steps = run_time * row[reference]
        model = job_type.split(" (")[0]
        attrs = {JOB_TYPE_KEY: job_type, "total_steps": steps, "scale_factor": g, SPEEDS_FILE_KEY: path}
        out.append(JobSpec(f"gavel-{n}", arrival, g, run_time, model=model, attrs=attrs))
        arrival += -math.log(1.0 - gaps.random()) / rate
    return out
