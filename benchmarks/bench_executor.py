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

from gpuloom.runtime.exec.cgroups import CgroupManager
from gpuloom.runtime.exec.executor import LaunchSpec
from gpuloom.runtime.exec.local import LocalExecutor
from gpuloom.runtime.exec.progress import ProgressTail
from gpuloom.runtime.service.profiling import RealProfiler

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


def _spin(core: int, seconds: float, out) -> None:  # type: ignore[no-untyped-def]
    os.sched_setaffinity(0, {core})
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        for _ in range(2000):
            pass
        n += 1
    out.put(n)


def two_core_gain(seconds: float = 0.5) -> float:
    """Work of two pinned busy loops on two cores / on one core now: 2.0 idle, ~1.0 when others saturate it."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    work = []
    for cores in ((CORES[0], CORES[0]), (CORES[0], CORES[1])):
        q = ctx.Queue()
        ps = [ctx.Process(target=_spin, args=(c, seconds, q)) for c in cores]
        for p in ps:
            p.start()
        work.append(sum(q.get() for _ in ps))
        for p in ps:
            p.join()
    return work[1] / work[0]


def interleaved(cmd: str, tmp: Path, cycles: int = 3, window_s: float = 2.0) -> dict[int, float]:
    """One run on 2 cores, alternately confined to 1 core and given 2 back: it/s per core count."""
    ex = LocalExecutor("local")
    job = f"bench-{uuid.uuid4().hex[:6]}"
    log = tmp / f"{job}.log"
    ex.launch(LaunchSpec(job, cmd, "local", (), CORES[:2], 0, str(log)))
    tail = ProgressTail(log)
    windows: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    try:
        while not tail.read() or tail.latest is None or tail.latest.iter < 3:
            time.sleep(0.05)
        for _ in range(cycles):
            for n in (1, 2):
                ex.repin(job, CORES[:n])
                time.sleep(0.4)
                t0 = time.time()
                time.sleep(window_s)
                windows[n].append((t0, time.time()))
    finally:
        ex.stop(job, 10.0)
    tail.read()
    out = {}
    for n, ws in windows.items():
        iters = secs = 0.0
        for a, b in ws:
            pts = [p for p in tail.points if a <= p.t <= b]
            if len(pts) >= 2:
                iters += pts[-1].iter - pts[0].iter
                secs += pts[-1].t - pts[0].t
        out[n] = iters / secs if secs else float("nan")
    return out


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
        if len(CORES) >= 2:
            print(f"\ntwo pinned busy loops, work on 2 cores / on 1 core now: {two_core_gain():.2f} "
                  "(2.00 on an idle machine; ~1 when other processes saturate it)")
        print(f"\nprofiled runs, one per allocation (RealProfiler)\n{'job':<20} {'cores':>5} {'iter/s':>8} {'speed-up':>8}")
        for name, cmd, warm, window in jobs:
            prof = RealProfiler(LocalExecutor("local"), f"bench-{uuid.uuid4().hex[:6]}", cmd, "local", (), CORES, tmp,
                                warmup_s=warm, window_s=window, startup_timeout_s=120.0, grace_s=10.0)
            base = None
            for c in range(1, len(CORES) + 1):
                thr = prof(c, 0)
                base = base or thr
                print(f"{name:<20} {c:>5} {thr:>8.2f} {thr / base:>8.2f}")
        if len(CORES) >= 2:
            print("\none run, alternately confined to 1 core and given 2 back (3 cycles of 2 s windows)")
            for name, cmd, _, _ in jobs:
                if "torch" not in name:  # sleepy fixes its step time at start: in-place re-pinning shows nothing
                    continue
                r = interleaved(cmd, tmp)
                print(f"{name:<20} 1 core {r[1]:.2f} it/s, 2 cores {r[2]:.2f} it/s, speed-up {r[2] / r[1]:.2f}")


if __name__ == "__main__":
    main()
