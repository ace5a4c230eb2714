"""Optimistic profiling: the paper's search against exhaustive search, point counts, cache model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.profiler import ProfileError, optimistic_profile
from gpuloom.perf.sensitivity import (
    CPU_AXIS,
    MEM_AXIS_5,
    Catalogue,
    DataPipelineModel,
    SensitivityFactor,
    SensitivityProfile,
    load_catalogue,
)

ALEXNET_1 = np.array(
    [
        [0.1, 0.3, 0.3, 0.3, 0.3],
        [0.1, 0.66, 0.66, 0.66, 0.66],
        [0.1, 1, 1, 1, 1],
        [0.1, 1.25, 1.25, 1.25, 1.25],
        [0.1, 1.53, 1.53, 1.53, 1.53],
        [0.1, 1.75, 1.75, 1.75, 1.75],
        [0.1, 2, 2, 2, 2],
        [0.1, 2, 2.94, 2.94, 2.94],
        [0.1, 2, 2.94, 2.94, 2.94],
    ]
)
CPUS = [1, 2, 3, 4, 5, 6, 9, 12, 24]
MEMS = [20_830, 62_500, 125_000, 187_500, 250_000]


def test_alexnet_search_by_hand() -> None:
    p = SensitivityProfile("alexnet", 1, CPU_AXIS, MEM_AXIS_5, ALEXNET_1)
    calls: list[tuple[int, int]] = []

    def measure(c: int, m: int) -> float:
        calls.append((c, m))
        return p.throughput_at(c, m, 1)

    r = optimistic_profile(measure, CPUS, MEMS, 0.10, model="alexnet", reference=(3, 62_500))
    # T(24, 250 GB) = 2.94, target 2.94 / 1.1 = 2.673: probes 5 cores (1.53, go up),
    # 9 (2.0, up), 12 (2.94, down) -> 12; memory at 12 cores: 125 GB (2.94, down), 62.5 GB (2.0, up)
    # then the GPU-proportional reference (3 cores, 62.5 GB)
    assert calls == [
        (24, 250_000), (5, 250_000), (9, 250_000), (12, 250_000), (12, 125_000), (12, 62_500), (3, 62_500)
    ]
    assert (r.cpus, r.mem_mb) == (12, 125_000) and r.demand == (1, 12, 125_000)
    assert r.points_measured == 7 and r.grid_size == 45
    assert r.best_tput == 2.94 and r.demand_tput == 2.94
    # the estimated profile serves the throughput model: 2.94 at the demand, 1.0 at proportional
    f = SensitivityFactor(Catalogue())
    job = Job(JobSpec("j", 0, 1, 10, model="x", profile=r.profile))
    assert f(job, Allocation("j", (Part(0, (0,), 12, 125_000),))) == pytest.approx(2.94)
    # measured points keep their values; unmeasured ones are min(CPU curve, memory curve)
    assert r.profile.throughput_at(9, 250_000, 1) == 2.0
    assert r.profile.throughput_at(12, 62_500, 1) == 2.0
    assert r.profile.throughput_at(6, 125_000, 1) == 1.53  # nearest measured CPU below 6 is 5 cores
    assert r.profile.throughput_at(4, 62_500, 1) == 1.0  # only the reference is known below 5 cores
    assert r.profile.throughput_at(2, 62_500, 1) == pytest.approx(2 / 3)  # linear below it


def test_threshold_changes_the_answer() -> None:
    p = SensitivityProfile("alexnet", 1, CPU_AXIS, MEM_AXIS_5, ALEXNET_1)
    r = optimistic_profile(lambda c, m: p.throughput_at(c, m, 1), CPUS, MEMS, threshold=0.5)
    assert (r.cpus, r.mem_mb) == (9, 62_500)  # 2.0 * 1.5 >= 2.94
    r0 = optimistic_profile(lambda c, m: p.throughput_at(c, m, 1), CPUS, MEMS, threshold=0.0)
    assert (r0.cpus, r0.mem_mb) == (12, 125_000)


def exhaustive_cpu(p: SensitivityProfile, g: int, cps: list[int], mps: list[int], thr: float) -> int:
    best = p.throughput_at(cps[-1], mps[-1], g)
    return next(c for c in cps if p.throughput_at(c, mps[-1], g) * (1 + thr) >= best * (1 - 1e-12))


def test_profiler_finds_saturating_cpu_for_every_catalogue_model(data_dir: Path) -> None:
    cat = load_catalogue(data_dir / "synergy/model_sensitivity_profiles.csv")
    total_measured = total_grid = 0
    for p in cat:
        g = p.gpus
        # the points one 24-core, 500 GB server can give (a 12-GPU job spans two)
        cpu_cap, mem_cap = 24 * math.ceil(g / 8), 500_000 * math.ceil(g / 8)
        cps = [int(round(c * g)) for c in p.cpu_axis if c * g <= cpu_cap]
        mps = [int(round(m * g)) for m in p.mem_axis if m * g <= mem_cap]
        r = optimistic_profile(lambda c, m, p=p, g=g: p.throughput_at(c, m, g), cps, mps, 0.10, gpus=g, model=p.model)
        want = exhaustive_cpu(p, g, cps, mps, 0.10)
        assert r.cpus == want, (p.model, g)
        assert r.demand_tput * 1.10 >= r.best_tput - 1e-12
        # the memory is the smallest that keeps the throughput at the chosen CPU within the threshold
        smaller = [m for m in mps if m < r.mem_mb]
        assert all(p.throughput_at(r.cpus, m, g) * 1.10 < r.best_tput for m in smaller)
        assert r.points_measured <= 1 + math.ceil(math.log2(len(cps))) + math.ceil(math.log2(len(mps))) + 1
        assert r.points_measured < r.grid_size
        total_measured += r.points_measured
        total_grid += r.grid_size
    assert total_measured < total_grid / 3


def test_memory_from_the_cache_model() -> None:
    pipe = DataPipelineModel(gpu_rate=400, cpu_rate=50, dataset_mb=200_000, sample_mb=0.2, storage_mb_s=20)
    calls: list[tuple[int, int]] = []

    def measure(c: int, m: int) -> float:
        calls.append((c, m))
        return pipe.throughput_at(c, m, 1)

    mems = [25_000, 50_000, 100_000, 150_000, 200_000]
    r = optimistic_profile(measure, list(range(1, 13)), mems, 0.10, cache=pipe)
    # CPU: 8 cores feed the GPU (400/s); memory: io_rate >= 400 / 1.1 needs miss <= 0.275 -> 150 GB
    assert r.cpus == 8 and r.mem_mb == 150_000
    # memory was computed, not measured: binary search probes 12, 6, 9, 8, 7 cores at 200 GB
    assert calls == [(c, 200_000) for c in (12, 6, 9, 8, 7)]
    assert r.points_measured == 5 and r.grid_size == 60
    assert r.demand_tput == pytest.approx(400.0)
    assert r.profile.throughput_at(8, 100_000, 1) == pytest.approx(20 / (0.5 * 0.2))


def test_profiler_rejects_bad_input() -> None:
    with pytest.raises(ProfileError, match="must not be empty"):
        optimistic_profile(lambda c, m: 1.0, [], [1])
    with pytest.raises(ProfileError, match="threshold"):
        optimistic_profile(lambda c, m: 1.0, [1], [1], threshold=-0.1)
    with pytest.raises(ProfileError, match="returned nan"):
        optimistic_profile(lambda c, m: float("nan"), [1, 2], [1])
    with pytest.raises(ProfileError, match="is 0"):
        optimistic_profile(lambda c, m: 0.0, [1, 2], [1])
    with pytest.raises(ProfileError, match="CPU points must be > 0"):
        optimistic_profile(lambda c, m: 1.0, [0, 2], [1])
