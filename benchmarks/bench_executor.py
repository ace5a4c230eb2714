"""Local executor costs and what CPU allocation does to the example training job.

* launch: wall time of ``LocalExecutor.launch`` (cgroup setup, fork, exec of the wrapper) and from
  the call to the job's first progress line, with cgroups and with affinity only;
* stop: ``stop`` of a job that checkpoints on SIGTERM;
* the PyTorch example (when torch is installed) and ``sleepy_train.py --cpu-ref 2``, profiled through
  the executor at 1..N cores: iterations per second.

Run: ``PYTHONPATH=src python benchmarks/bench_executor.py``
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from gpuloom.runtime.cgroups import CgroupManager
from gpuloom.runtime.executor import LaunchSpec
from gpuloom.runtime.local import LocalExecutor
from gpuloom.runtime.profiling import RealProfiler
from gpuloom.runtime.progress import ProgressTail

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PY = shlex.quote(sys.executable)
CORES = tuple(sorted(os.sched_getaffinity(0)))


def _launch_stats(ex: LocalExecutor, tmp: Path, n: int) -> tuple[list[float], list[float], list[float]]:
    launch, first, stop = [], [], []
    cmd = f"{PY} {shlex.quote(str(EXAMPLES / 'sleepy_train.py'))} --steps 100000 --step-s 0.005"
    for i in range(n):
        job = f"bench-{uuid.uuid4().hex[:6]}-{i}"
        log = tmp / f"{job}.log"
        t0 = time.perf_counter()
        ex.launch(LaunchSpec(job, cmd, ex.node, (0,), CORES[:1], 256, str(log),
                             {"GPULOOM_CHECKPOINT_DIR": str(tmp / job)}))
        t1 = time.perf_counter()
        tail = ProgressTail(log)
        while not tail.read():
            time.sleep(0.002)
        t2 = time.perf_counter()
        ex.stop(job, 5.0)
        t3 = time.perf_counter()
        launch.append(t1 - t0)
        first.append(t2 - t0)
        stop.append(t3 - t2)
    return launch, first, stop


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = []
        for label, cg in (("cgroups", None), ("affinity only", CgroupManager(enabled=False))):
            ex = LocalExecutor("local", cgroups=cg)
            mode = ex.cgroup_mode
            launch, first, stop = _launch_stats(ex, tmp, 10)
            rows.append((f"{label} ({mode})", launch, first, stop))
        print(f"{'executor':<22} {'launch() ms':>12} {'to 1st progress ms':>19} {'stop ms':>9}   (median of 10)")
        for label, launch, first, stop in rows:
            print(f"{label:<22} {statistics.median(launch) * 1e3:>12.1f} {statistics.median(first) * 1e3:>19.1f} "
                  f"{statistics.median(stop) * 1e3:>9.1f}")

        jobs = [("sleepy --cpu-ref 2", f"{PY} {shlex.quote(str(EXAMPLES / 'sleepy_train.py'))} "
                 "--steps 100000 --step-s 0.02 --cpu-ref 2", 0.3, 1.5)]
        try:
            import torch  # noqa: F401

            jobs.append(("train.py (torch)", f"{PY} {shlex.quote(str(EXAMPLES / 'train.py'))} --steps 100000", 1.0, 4.0))
        except ImportError:
            print("\ntorch not installed: skipping examples/train.py (pip install '.[torch]')")
        print(f"\n{'job':<20} {'cores':>5} {'iter/s':>8} {'speed-up':>8}")
        for name, cmd, warm, window in jobs:
            prof = RealProfiler(LocalExecutor("local"), f"bench-{uuid.uuid4().hex[:6]}", cmd, "local", (), CORES, tmp,
                                warmup_s=warm, window_s=window, startup_timeout_s=120.0, grace_s=10.0)
            base = None
            for c in range(1, len(CORES) + 1):
                thr = prof(c, 0)
                base = base or thr
                print(f"{name:<20} {c:>5} {thr:>8.2f} {thr / base:>8.2f}")


if __name__ == "__main__":
    main()
