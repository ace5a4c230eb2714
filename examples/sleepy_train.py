#!/usr/bin/env python3
"""A tiny torch-free "training job" that follows gpuloom's job protocol, for fast tests and demos.

* prints ``GPULOOM_PROGRESS iter=<steps done> samples=<...> t=<unix time>`` once it is ready to
  train (after loading any checkpoint: the launch is over) and after every step;
* on SIGTERM finishes the current step, writes a checkpoint to
  ``$GPULOOM_CHECKPOINT_DIR/sleepy.json`` (atomically: write, then rename) and exits 143;
  exit 0 means all steps are done;
* with ``GPULOOM_RESUME=1`` continues from that checkpoint, so every step runs exactly once;
* ``--ledger FILE`` appends the number of every step it runs (tests check exactly-once with it);
* its "model" is a running sum of step numbers, printed at the end (``result=``), so a lost or
  repeated step changes the result;
* a step sleeps ``--step-s`` seconds, scaled by ``--cpu-ref R``: ``step_s * R / min(cores, R)`` where
  cores is the number of CPU cores it was given (``GPULOOM_CPUS``, else its CPU affinity) - a
  stand-in for a data loader that needs R cores;
* ``--stages CPU,GPU[,NET]`` instead makes a step three stages (seconds each), a stand-in for a
  real training step on a fake GPU:

  - the CPU stage (data loading) is scaled by ``--cpu-ref`` as above;
  - the GPU stage is quoted for ``--gpu-ref N`` GPUs (default: as many as it got) and takes
    ``GPU * N / gpus`` on ``gpus`` GPUs (a fixed global batch split over them);
  - the NET stage (gradient exchange) takes NET seconds;
  - with ``--gpu-lock-dir DIR`` the GPUs and their links are exclusive: the GPU stage holds an
    ``flock`` on ``DIR/gpu<i>.lock`` and the NET stage one on ``DIR/net<i>.lock`` for each of its
    GPUs (``CUDA_VISIBLE_DEVICES``), so jobs sharing GPUs take turns on each resource while their
    CPU stages (on their own cores) overlap - the co-location Muri interleaves.  Use one directory
    per machine (GPU indices are per machine);

* it keeps time like a GPU: sleeps run to deadlines, so a late wake-up (a busy machine) is made up
  in the next stage and the step rate is the declared one; only waiting for a GPU held by another
  job slows it down;
* ``--ballast-mb M`` allocates and touches M MiB at start (to exercise memory limits).

Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

STOP = False
HANDOFF_S = 0.003  # after releasing its GPUs, a job waits at least this long before asking again


def on_term(signum: int, frame: object) -> None:
    global STOP
    STOP = True


def save(path: Path, state: dict) -> None:
    # a temporary file of this process's own: the processes of a job spread over nodes (ranks)
    # share the checkpoint directory and may checkpoint at the same moment
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def given_cores() -> int:
    """The cores gpuloom gave the job (``GPULOOM_CPUS``: ``0-3,6``), else those it may run on."""
    spec = os.environ.get("GPULOOM_CPUS", "").strip()
    if spec:
        n = 0
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            n += int(hi) - int(lo) + 1 if hi else 1
        return n
    return len(os.sched_getaffinity(0))


def given_gpus() -> list[int]:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [int(g) for g in cvd.split(",") if g.strip()] if cvd else []


class Clock:
    """Deadline sleeping: ``run(s)`` ends ``s`` after the previous deadline, not after now."""

    def __init__(self) -> None:
        self.t = time.monotonic()

    def run(self, seconds: float) -> None:
        self.t += seconds
        d = self.t - time.monotonic()
        if d > 0:
            time.sleep(d)

    def waited(self) -> None:
        """A wait for another job (a GPU it holds) is real: the next deadline counts from now."""
        self.t = max(self.t, time.monotonic())


class Exclusive:
    """Exclusive use of one resource of the job's fake GPUs: one lock file per GPU (ids in sorted order)."""

    def __init__(self, lock_dir: str, kind: str, gpus: list[int]) -> None:
        self.fds: list[int] = []
        if lock_dir and gpus:
            Path(lock_dir).mkdir(parents=True, exist_ok=True)
            self.fds = [os.open(os.path.join(lock_dir, f"{kind}{g}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
                        for g in sorted(set(gpus))]

    def run(self, clock: Clock, seconds: float) -> None:
        """Hold the resource for ``seconds`` (waiting for it first if another job holds it)."""
        if seconds <= 0:
            return
        self.acquire(clock)
        try:
            clock.run(seconds)
        finally:
            self.release()

    def acquire(self, clock: Clock) -> None:
        waited = False
        for fd in self.fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = True
        if waited:
            clock.waited()

    def release(self) -> None:
        for fd in reversed(self.fds):
            fcntl.flock(fd, fcntl.LOCK_UN)
        if self.fds:
            time.sleep(HANDOFF_S)  # let a job waiting for these GPUs have them (flock is not FIFO)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-s", type=float, default=0.02)
    ap.add_argument("--stages", default="", help="CPU,GPU[,NET] seconds per step (instead of --step-s)")
    ap.add_argument("--cpu-ref", type=int, default=0, help="cores the step (CPU stage) time is quoted for "
                    "(0: insensitive)")
    ap.add_argument("--gpu-ref", type=int, default=0, help="GPUs the GPU stage is quoted for (0: as many as it got)")
    ap.add_argument("--gpu-lock-dir", default="", help="make the GPUs exclusive through lock files here")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ballast-mb", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: only on SIGTERM)")
    ap.add_argument("--ledger", type=str, default="")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("GPULOOM_CHECKPOINT_DIR", ""))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    try:
        stages = [float(x) for x in args.stages.split(",")] if args.stages else []
    except ValueError:
        stages = [-1.0]
    if args.steps < 0 or args.step_s < 0 or len(stages) > 3 or any(not s >= 0 for s in stages):
        print("sleepy_train: --steps, --step-s and --stages (at most CPU,GPU,NET) must be >= 0", file=sys.stderr)
        return 2

    ballast = bytearray(args.ballast_mb * 2**20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1

    ckpt = Path(args.checkpoint_dir) / "sleepy.json" if args.checkpoint_dir else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": 0, "result": 0}
    if os.environ.get("GPULOOM_RESUME") == "1":
        if ckpt is not None and ckpt.exists():
            state = json.loads(ckpt.read_text())
            print(f"resumed from {ckpt} at step {state['step']}", flush=True)
        else:
            print("GPULOOM_RESUME=1 but no checkpoint: starting from step 0", flush=True)

    cores = given_cores()
    gpus = given_gpus()
    cpu_scale = args.cpu_ref / min(cores, args.cpu_ref) if args.cpu_ref > 0 and cores > 0 else 1.0
    if stages:
        cpu_s, gpu_s, net_s = (stages + [0.0, 0.0])[:3]
        cpu_s *= cpu_scale
        if args.gpu_ref > 0 and gpus:
            gpu_s *= args.gpu_ref / len(gpus)
        step_s = cpu_s + gpu_s + net_s
    else:
        cpu_s, gpu_s, net_s = args.step_s * cpu_scale, 0.0, 0.0
        step_s = cpu_s
    gpu, net = Exclusive(args.gpu_lock_dir, "gpu", gpus), Exclusive(args.gpu_lock_dir, "net", gpus)
    print(f"sleepy_train: cores={cores} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} step_s={step_s:.4f} "
          f"stages={cpu_s:.4f},{gpu_s:.4f},{net_s:.4f}", flush=True)
    ledger = open(args.ledger, "a") if args.ledger else None

    def progress() -> None:
        s = state["step"]
        print(f"GPULOOM_PROGRESS iter={s} samples={s * args.batch_size} t={time.time():.6f}", flush=True)

    progress()  # ready: the launch is over
    clock = Clock()
    while state["step"] < args.steps:
        if STOP:
            if ckpt is not None:
                save(ckpt, state)
                print(f"checkpointed at step {state['step']}", flush=True)
            return 128 + signal.SIGTERM
        clock.run(cpu_s)
        gpu.run(clock, gpu_s)
        net.run(clock, net_s)
        state["step"] += 1
        state["result"] += state["step"]
        if ledger is not None:
            ledger.write(f"{state['step']}\n")
            ledger.flush()
        progress()
        s = state["step"]
        if ckpt is not None and args.checkpoint_every and s % args.checkpoint_every == 0:
            save(ckpt, state)
    if ckpt is not None:
        save(ckpt, state)
    print(f"done steps={state['step']} result={state['result']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
