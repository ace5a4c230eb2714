#!/usr/bin/env python3
"""A tiny torch-free "training job" that follows gpuloom's job protocol, for fast tests and demos.

* prints ``GPULOOM_PROGRESS iter=<steps done> samples=<...> t=<unix time>`` after every step;
* on SIGTERM finishes the current step, writes a checkpoint to
  ``$GPULOOM_CHECKPOINT_DIR/sleepy.json`` (atomically: write, then rename) and exits 143;
  exit 0 means all steps are done;
* with ``GPULOOM_RESUME=1`` continues from that checkpoint, so every step runs exactly once;
* ``--ledger FILE`` appends the number of every step it runs (tests check exactly-once with it);
* its "model" is a running sum of step numbers, printed at the end (``result=``), so a lost or
  repeated step changes the result;
* a step sleeps ``--step-s`` seconds, scaled by ``--cpu-ref R``: ``step_s * R / min(cores, R)`` where
  cores is the number of CPU cores it may run on - a stand-in for a data loader that needs R cores;
* ``--ballast-mb M`` allocates and touches M MiB at start (to exercise memory limits).

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

STOP = False


def on_term(signum: int, frame: object) -> None:
    global STOP
    STOP = True


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-s", type=float, default=0.02)
    ap.add_argument("--cpu-ref", type=int, default=0, help="cores the step time is quoted for (0: insensitive)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ballast-mb", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: only on SIGTERM)")
    ap.add_argument("--ledger", type=str, default="")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("GPULOOM_CHECKPOINT_DIR", ""))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    if args.steps < 0 or args.step_s < 0:
        print("sleepy_train: --steps and --step-s must be >= 0", file=sys.stderr)
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

    cores = len(os.sched_getaffinity(0))
    step_s = args.step_s * args.cpu_ref / min(cores, args.cpu_ref) if args.cpu_ref > 0 else args.step_s
    print(f"sleepy_train: cores={cores} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} step_s={step_s:.4f}",
          flush=True)
    ledger = open(args.ledger, "a") if args.ledger else None
    while state["step"] < args.steps:
        if STOP:
            if ckpt is not None:
                save(ckpt, state)
                print(f"checkpointed at step {state['step']}", flush=True)
            return 128 + signal.SIGTERM
        time.sleep(step_s)
        state["step"] += 1
        state["result"] += state["step"]
        if ledger is not None:
            ledger.write(f"{state['step']}\n")
            ledger.flush()
        s = state["step"]
        print(f"GPULOOM_PROGRESS iter={s} samples={s * args.batch_size} t={time.time():.6f}", flush=True)
        if ckpt is not None and args.checkpoint_every and s % args.checkpoint_every == 0:
            save(ckpt, state)
    if ckpt is not None:
        save(ckpt, state)
    print(f"done steps={state['step']} result={state['result']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
