"""A tiny checkpointing job for the service tests.

``stepper.py STEPS DT``: does STEPS steps of DT seconds.  Each finished step is
appended to ``$GPULOOM_CHECKPOINT_DIR/ledger`` and the checkpoint (next step)
(``STEPPER_DT_<GPU TYPE>`` in its environment sets DT on that type of GPU: ``STEPPER_DT_K80=0.2``)
is replaced atomically; on SIGTERM it finishes the current step, checkpoints
and exits 143 (exit 0 means all steps are done); with ``GPULOOM_RESUME=1`` it restarts from the checkpoint.
``STEPPER_HOLD=PATH`` in its environment: after its last step it waits for PATH to exist before it ends
(so a test decides when the job ends; SIGTERM still stops it, exit 143).  So the
ledger lists every step exactly once if no work is lost or repeated.  The
first line of output is a JSON record of what the process was given.
"""

import json
import os
import signal
import sys
import time

steps, dt = int(sys.argv[1]), float(sys.argv[2])
# a step time per GPU type (STEPPER_DT_V100=0.05): the job runs faster on some types than on others
dt = float(os.environ.get("STEPPER_DT_" + os.environ.get("GPULOOM_GPU_TYPE", "").upper(), dt))
ckdir = os.environ["GPULOOM_CHECKPOINT_DIR"]
ck = os.path.join(ckdir, "step.json")
ledger = os.path.join(ckdir, "ledger")
stop = False


def on_term(_sig, _frame):  # noqa: ANN001, ANN201
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
start = 0
if os.environ.get("GPULOOM_RESUME") == "1" and os.path.exists(ck):
    with open(ck) as f:
        start = json.load(f)["next"]


def cgroup_mem_limit() -> tuple[str | None, int | None]:
    """(memory cgroup path, its limit in bytes) of this process, v1 or v2, if readable."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        for base, fname, match in (
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory" in ctrl.split(",")),
            ("/sys/fs/cgroup", "memory.max", ctrl == ""),
        ):
            if match:
                try:
                    v = open(os.path.join(base + path, fname)).read().strip()
                except OSError:
                    continue
                return path, (int(v) if v != "max" and int(v) < 1 << 60 else None)
    return None, None


mem_cgroup, mem_limit = cgroup_mem_limit()


print(json.dumps({
    "event": "start",
    "job": os.environ.get("GPULOOM_JOB_ID"),
    "resume": os.environ.get("GPULOOM_RESUME"),
    "start": start,
    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "affinity": sorted(os.sched_getaffinity(0)),
    "mem_env": os.environ.get("GPULOOM_MEM_MB"),
    "mem_cgroup": mem_cgroup,
    "mem_limit": mem_limit,
    "pid": os.getpid(),
}), flush=True)
for i in range(start, steps):
    time.sleep(dt)
    with open(ledger, "a") as f:
        f.write(f"{i}\n")
    tmp = f"{ck}.{os.getpid()}.tmp"  # (its own: the ranks of a job over several nodes share the file)
    with open(tmp, "w") as f:
        json.dump({"next": i + 1}, f)
    os.replace(tmp, ck)
    print(f"GPULOOM_PROGRESS iter={i + 1}", flush=True)
    if stop:
        print(f"checkpointed at step {i + 1}", flush=True)
        sys.exit(143)  # 128 + SIGTERM: stopped, not done
hold = os.environ.get("STEPPER_HOLD")
while hold and not os.path.exists(hold):
    if stop:
        print(f"checkpointed at step {steps}", flush=True)
        sys.exit(143)
    time.sleep(0.05)
print("done", flush=True)
