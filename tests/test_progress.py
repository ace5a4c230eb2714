"""The progress protocol: line parsing, rates over windows and segments, tailing a growing log."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuloom.runtime.exec.progress import Point, ProgressError, ProgressTail, parse_line, rate


def test_parse_lines() -> None:
    p = parse_line("GPULOOM_PROGRESS iter=120\n")
    assert p is not None and (p.iter, p.t, p.samples, p.fields) == (120, None, None, {})
    p = parse_line("  GPULOOM_PROGRESS iter=130 samples=4160 t=1732172400.25 loss=0.731")
    assert p is not None and (p.iter, p.t, p.samples, p.fields) == (130, 1732172400.25, 4160, {"loss": "0.731"})
    assert parse_line("epoch 3 loss 0.2") is None
    assert parse_line("GPULOOM_PROGRESSIVE iter=1") is None
    for bad, msg in [
        ("GPULOOM_PROGRESS samples=3", "no iter= field"),
        ("GPULOOM_PROGRESS", "no iter= field"),
        ("GPULOOM_PROGRESS iter=x", "invalid literal"),
        ("GPULOOM_PROGRESS iter=-4", "must be >= 0"),
        ("GPULOOM_PROGRESS iter=4 junk", "'junk' is not key=value"),
        ("GPULOOM_PROGRESS iter=4 t=nan", "t finite"),
    ]:
        with pytest.raises(ProgressError, match=msg):
            parse_line(bad)


def test_rate_window_and_segments() -> None:
    pts = [Point(0.0, 0, 0), Point(1.0, 10, 320), Point(2.0, 30, 960), Point(4.0, 70, 2240)]
    assert rate(pts) == 70 / 4
    assert rate(pts, window_s=2.0) == (70 - 30) / 2
    assert rate(pts, window_s=3.0) == (70 - 10) / 3
    assert rate(pts, attr="samples") == 2240 / 4
    assert rate(pts[:1]) is None
    assert rate([Point(1.0, 5, None), Point(1.0, 6, None)]) is None  # no time elapsed
    # the job restarted from an older checkpoint at t=5: only the new segment counts
    pts += [Point(5.0, 50, None), Point(6.0, 56, None), Point(8.0, 68, None)]
    assert rate(pts) == (68 - 50) / 3
    assert rate(pts, attr="samples") is None


def test_tail_reads_incrementally(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    now = [100.0]
    tail = ProgressTail(log, clock=lambda: now[0])
    assert tail.read() == [] and tail.latest is None  # no file yet
    with open(log, "w") as f:
        f.write("[gpuloom] launch\nGPULOOM_PROGRESS iter=1 t=10.0\nGPULOOM_PROGRESS iter=3 t=11")
    assert [(p.t, p.iter) for p in tail.read()] == [(10.0, 1)]  # last line is still partial
    with open(log, "a") as f:
        f.write(".0\nnoise\nGPULOOM_PROGRESS iter=oops\nGPULOOM_PROGRESS iter=7\n")
    now[0] = 12.0
    assert [(p.t, p.iter) for p in tail.read()] == [(11.0, 3), (12.0, 7)]  # no t= field: time of reading
    assert tail.bad_lines == 1
    assert tail.throughput() == (7 - 1) / 2
    assert tail.throughput(since=11.0) == 4.0
    log.write_text("GPULOOM_PROGRESS iter=2 t=20\n")  # truncated and rewritten
    assert [(p.t, p.iter) for p in tail.read()] == [(20.0, 2)]


def test_tail_start_at_end_skips_old_runs(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("GPULOOM_PROGRESS iter=50 t=1\nGPULOOM_PROGRESS iter=60 t=2\n")
    tail = ProgressTail(log, start_at_end=True)
    with open(log, "a") as f:
        f.write("GPULOOM_PROGRESS iter=60 t=10\nGPULOOM_PROGRESS iter=64 t=12\n")
    tail.read()
    assert tail.throughput() == 2.0


# -- real profiling through the executor ---------------------------------------------------------

SLEEPY = Path(__file__).resolve().parents[1] / "examples" / "sleepy_train.py"


def _profiler(tmp_path: Path, args: str, **kw):
    import os
    import shlex
    import sys

    from gpuloom.runtime.exec.local import LocalExecutor
    from gpuloom.runtime.service.profiling import RealProfiler

    cores = sorted(os.sched_getaffinity(0))[:2]
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(SLEEPY))} {args}"
    return RealProfiler(LocalExecutor("local"), f"p-{tmp_path.name[-12:]}", cmd, "local", (0,), cores, tmp_path,
                        warmup_s=0.2, window_s=1.0, startup_timeout_s=20.0, grace_s=2.0, **kw)


def test_real_profiler_measures_cpu_sensitivity(tmp_path: Path) -> None:
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores")
    # quoted for 2 cores: 0.05 s/step on 2 cores (20 it/s), 0.1 s/step on 1 core (10 it/s)
    prof = _profiler(tmp_path, "--steps 1000 --step-s 0.05 --cpu-ref 2")
    one, two = prof(1, 0), prof(2, 0)
    assert 7.0 < one < 10.5
    assert 14.0 < two < 21.0
    assert two > 1.5 * one
    assert [(r.cpus, r.mem_mb) for r in prof.runs] == [(1, 0), (2, 0)]
    assert all(r.exit_code == 143 for r in prof.runs)  # stopped by SIGTERM, after a scratch checkpoint
    assert not any(p.name.endswith(".ckpt") for p in tmp_path.iterdir())  # scratch removed


def test_real_profiler_out_of_memory_is_zero(tmp_path: Path) -> None:
    from gpuloom.runtime.exec.cgroups import CgroupManager

    if not CgroupManager().support.memory:
        pytest.skip("no writable memory cgroup")
    prof = _profiler(tmp_path, "--steps 1000 --step-s 0.02 --ballast-mb 150")
    assert prof(1, 64) == 0.0
    assert prof.runs[-1].exit_code == 137
    assert prof(1, 400) > 20.0


def test_silent_job_cannot_be_profiled(tmp_path: Path) -> None:
    from gpuloom.runtime.service.profiling import NoProgress, grid_profile, profile_job

    prof = _profiler(tmp_path, "--steps 3 > /dev/null")
    prof.startup_timeout_s = 5.0
    with pytest.raises(NoProgress, match="exited without printing a GPULOOM_PROGRESS line"):
        prof(1, 0)
    assert profile_job(prof, [1], [0]) is None
    g = grid_profile(lambda c, m: float(c * 10 + m), [1, 2], [100, 200])
    assert g.matrix.tolist() == [[110.0, 210.0], [120.0, 220.0]]
    assert g.best() == (2, 200, 220.0) and g.measured == 4


def test_real_profiler_drives_the_optimistic_profiler(tmp_path: Path) -> None:
    import os

    pytest.importorskip("gpuloom.perf.profiler", reason="optimistic profiler not merged yet")
    from gpuloom.runtime.exec.cgroups import CgroupManager
    from gpuloom.runtime.service.profiling import profile_job

    if len(os.sched_getaffinity(0)) < 2 or not CgroupManager().support.memory:
        pytest.skip("needs 2 cores and a writable memory cgroup")
    # CPU-bound on 2 cores; 150 MiB of ballast: 100 MiB is fatal (measured as 0), 300 and 600 are fine
    prof = _profiler(tmp_path, "--steps 1000 --step-s 0.04 --cpu-ref 2 --ballast-mb 150")
    res = profile_job(prof, [1, 2], [100, 300, 600], threshold=0.10)
    assert res is not None
    assert (res.cpus, res.mem_mb) == (2, 300)
    assert res.points[(1, 600)] < 0.7 * res.points[(2, 600)]
    assert res.points_measured < res.grid_size
