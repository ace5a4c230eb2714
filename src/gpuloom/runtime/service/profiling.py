"""Real profiling: run a new job briefly at chosen CPU and memory allocations and measure it.

:class:`RealProfiler` is a ``measure(cpus, mem_mb) -> float`` callable, the shape
the optimistic profiler (``gpuloom.perf.profiler.optimistic_profile(measure,
cpu_points, mem_points, threshold=0.10)``) drives.  One call:

1. launches the job's command through the :class:`~gpuloom.runtime.exec.executor.Executor`
   as a separate run ``<job>.profile-c<cpus>-m<mem>`` on the first ``cpus`` of the
   cores set aside for profiling, limited to ``mem_mb``, with its own log, a
   scratch ``GPULOOM_CHECKPOINT_DIR`` (so the job's real checkpoints are never
   touched) and ``GPULOOM_PROFILING=1``;
2. tails the log (:mod:`gpuloom.runtime.exec.progress`): waits for the first progress
   line (startup - imports, data loading - is not measured), lets ``warmup_s`` of
   job time pass, then collects ``window_s`` more;
3. stops the run (SIGTERM, grace, SIGKILL) and returns iterations per second over
   the points after the warm-up.

Job time is the lines' ``t=`` (the job's wall clock; the reader's where a line
has none).  A step of that clock (NTP, ``date -s``) shows as a line dated before
the one above it, or after it by more than the run has lasted (on the monotonic
clock): the lines from the last step on are a segment of their own, and the
warm-up, the window and the rate are taken in it alone (:func:`_last_segment`).

Outcomes other than a rate:

* the run is OOM-killed (exit 137 under a memory limit) before it makes progress:
  ``0.0`` - this allocation cannot run the job, which is a measurement;
* no progress line within ``startup_timeout_s``, or the run exits otherwise without
  progress: :class:`NoProgress`.  :func:`profile_job` turns that into ``None`` and
  the caller gives the job GPU-proportional resources, unprofiled.

Profile runs have their own ids: a service that sees one in ``Executor.poll()``
ignores it (the profiler collects its exit through ``stop``).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from gpuloom.runtime.exec.executor import Executor, ExecutorError, LaunchSpec
from gpuloom.runtime.exec.progress import Point, ProgressTail, rate

log = logging.getLogger(__name__)

Measure = Callable[[int, int], float]
STEP_SLACK_S = 1.0  # consecutive lines more than the run's age plus this apart: the job's clock stepped


class NoProgress(RuntimeError):
    """The job printed no usable progress lines: it cannot be profiled."""


@dataclass(frozen=True, slots=True)
class ProfileRun:
    cpus: int
    mem_mb: int
    throughput: float  # iterations per second
    points: int  # progress lines used
    exit_code: int | None
    wall_s: float


class RealProfiler:
    """Measures a job's throughput at (cpus, mem_mb) by running it; see the module docstring."""

    def __init__(
        self,
        executor: Executor,
        job_id: str,
        command: str,
        node: str,
        gpus: Sequence[int],
        cores: Sequence[int],
        log_dir: str | Path,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        warmup_s: float = 2.0,
        window_s: float = 5.0,
        startup_timeout_s: float = 120.0,
        grace_s: float = 5.0,
        poll_s: float = 0.05,
        user: str | None = None,
        scratch_dir: str | Path | None = None,
        make_scratch: Callable[[Path], object] | None = None,
    ) -> None:
        """``user``: the OS account the runs run as; ``scratch_dir``: where their throw-away checkpoint
        directories go (default ``log_dir``), each made by ``make_scratch`` (default ``mkdir``)."""
        if not cores:
            raise ValueError(f"profiling {job_id}: no CPU cores to profile on")
        if window_s <= 0 or warmup_s < 0:
            raise ValueError(f"profiling {job_id}: window_s must be > 0 and warmup_s >= 0")
        self.executor = executor
        self.job_id = job_id
        self.command = command
        self.node = node
        self.gpus = tuple(gpus)
        self.cores = tuple(cores)
        self.log_dir = Path(log_dir)
        self.env = dict(env or {})
        self.workdir = workdir
        self.user = user
        self.scratch_dir = Path(scratch_dir) if scratch_dir is not None else self.log_dir
        self.make_scratch = make_scratch or (lambda p: p.mkdir(parents=True, exist_ok=True))
        self.warmup_s = warmup_s
        self.window_s = window_s
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.runs: list[ProfileRun] = []

    def run_id(self, cpus: int, mem_mb: int) -> str:
        return f"{self.job_id}.profile-c{cpus}-m{mem_mb}"

    def __call__(self, cpus: int, mem_mb: int) -> float:
        return self.measure(cpus, mem_mb)

    def measure(self, cpus: int, mem_mb: int) -> float:
        if not 1 <= cpus <= len(self.cores):
            raise ValueError(f"profiling {self.job_id}: {cpus} cores asked, {len(self.cores)} set aside")
        if mem_mb < 0:
            raise ValueError(f"profiling {self.job_id}: negative memory {mem_mb}")
        rid = self.run_id(cpus, mem_mb)
        log_path = self.log_dir / f"{rid}.log"
        scratch = self.scratch_dir / f"{rid}.ckpt"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        self.make_scratch(scratch)
        env = {**self.env, "GPULOOM_PROFILING": "1", "GPULOOM_RESUME": "0", "GPULOOM_CHECKPOINT_DIR": str(scratch)}
        spec = LaunchSpec(rid, self.command, self.node, self.gpus, self.cores[:cpus], mem_mb, str(log_path), env,
                          self.workdir, self.user)
        t_launch = time.monotonic()
        self.executor.launch(spec)
        tail = ProgressTail(log_path)
        code: int | None = None
        try:
            while True:
                tail.read()
                pts = tail.points
                if pts:
                    first = pts[_last_segment(pts, time.monotonic() - t_launch + STEP_SLACK_S)].t
                    if pts[-1].t >= first + self.warmup_s + self.window_s:
                        break
                if not self.executor.alive(rid):
                    tail.read()
                    break
                if not pts and time.monotonic() - t_launch > self.startup_timeout_s:
                    break
                time.sleep(self.poll_s)
        finally:
            code = self._stop(rid)
            shutil.rmtree(scratch, ignore_errors=True)
        wall = time.monotonic() - t_launch
        pts = tail.points[_last_segment(tail.points, wall + STEP_SLACK_S):]
        if len(pts) < 2:
            if code == 137 and mem_mb > 0 and not pts:
                log.info("profiling %s: killed at %d MB (out of memory): throughput 0", rid, mem_mb)
                self.runs.append(ProfileRun(cpus, mem_mb, 0.0, 0, code, wall))
                return 0.0
            if pts:
                why = "printed only one GPULOOM_PROGRESS line"
            elif code is not None and time.monotonic() - t_launch < self.startup_timeout_s:
                why = "exited without printing a GPULOOM_PROGRESS line"
            else:
                why = f"printed no GPULOOM_PROGRESS line within {self.startup_timeout_s:g}s"
            raise NoProgress(f"job {self.job_id} at {cpus} cores / {mem_mb} MB {why} (exit code {code}; log {log_path})")
        start = pts[0].t + self.warmup_s
        use = [p for p in pts if p.t >= start]
        if len(use) < 2:  # the run ended during the warm-up: take what there is
            use = pts
        thr = rate(use) or 0.0
        self.runs.append(ProfileRun(cpus, mem_mb, thr, len(use), code, wall))
        return thr

    def _stop(self, rid: str) -> int | None:
        try:
            return self.executor.stop(rid, self.grace_s)
        except ExecutorError:  # someone else's poll() collected it
            return None


def _last_segment(points: Sequence[Point], max_gap: float) -> int:
    """Where the points after the last step of the job's clock begin: a line dated before the one
    above it, or more than ``max_gap`` seconds after it (0: no step)."""
    for i in range(len(points) - 1, 0, -1):
        d = points[i].t - points[i - 1].t
        if d < 0 or d > max_gap:
            return i
    return 0


@dataclass(slots=True)
class GridProfile:
    """Throughput (iterations/s) on a CPU x memory grid; NaN where not measured."""

    cpu_points: tuple[int, ...]
    mem_points: tuple[int, ...]
    matrix: np.ndarray = field(repr=False)

    @property
    def measured(self) -> int:
        return int(np.isfinite(self.matrix).sum())

    def best(self) -> tuple[int, int, float]:
        m = np.where(np.isfinite(self.matrix), self.matrix, -np.inf)
        i, j = np.unravel_index(int(np.argmax(m)), m.shape)
        return self.cpu_points[i], self.mem_points[j], float(self.matrix[i, j])


def grid_profile(measure: Measure, cpu_points: Sequence[int], mem_points: Sequence[int]) -> GridProfile:
    """Measure every (cpus, mem) point: the exhaustive baseline the optimistic profiler prunes."""
    cps, mps = tuple(cpu_points), tuple(mem_points)
    mat = np.full((len(cps), len(mps)), math.nan)
    for i, c in enumerate(cps):
        for j, m in enumerate(mps):
            mat[i, j] = measure(c, m)
    return GridProfile(cps, mps, mat)


def profile_job(measure: Measure, cpu_points: Sequence[int], mem_points: Sequence[int], threshold: float = 0.10,
                **kw: Any) -> Any:
    """Profile with the optimistic profiler (``gpuloom.perf.profiler``) when it is available, else the full grid.

    ``kw`` (e.g. ``gpus=``, ``model=``) goes to the optimistic profiler.  Returns its
    ``ProfileResult`` (or a :class:`GridProfile`), or ``None`` for a job that cannot be
    profiled - it reports no progress, or runs at no allocation - and then runs with
    GPU-proportional resources.
    """
    opt: ModuleType | None
    try:
        from gpuloom.perf import profiler as opt
    except ImportError:
        opt = None
    unusable: tuple[type[Exception], ...] = (NoProgress,)
    if opt is not None:
        unusable += (opt.ProfileError,)
    try:
        if opt is not None:
            return opt.optimistic_profile(measure, list(cpu_points), list(mem_points), threshold=threshold, **kw)
        return grid_profile(measure, cpu_points, mem_points)
    except unusable as e:
        log.warning("%s: running it unprofiled, with GPU-proportional resources", e)
        return None
