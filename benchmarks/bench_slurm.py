"""Stock Slurm against gpuloom, and gpuloom over Slurm, on one workload, in one run.

A real one-node Slurm (``tests/slurm_util.py``: 4 GPUs as typed gres, 8 declared cores, 8000 MB,
``sched/backfill``) and one seeded workload: ``JOBS`` jobs of 1, 2 or 4 GPUs running
``examples/sleepy_train.py`` for 3-12 s (steps of 0.1 s; it checkpoints on SIGTERM and resumes),
arriving about every ``GAP_S`` seconds. Each job asks for 2 cores and 2000 MB per GPU everywhere.
The workload goes, one configuration after the other, through:

* ``slurm``: stock Slurm, ``sbatch --gres=gpu:N`` at each arrival (FIFO + backfill);
* ``slurm+time``: the same with time limits (``--time``: 1.5 x the run time, in whole minutes);
* ``gpuloom``: ``gpuloom serve`` with its own executor on the declared 4-GPU node, ``fifo`` then
  ``srtf``, with the same time limits as ``slurm+time`` (whole minutes) and the run time as its work
  estimate (``iterations`` x ``iteration_time``);
* ``gpuloom/slurm``: ``gpuloom serve --slurm all``, ``fifo`` then ``srtf``;
* ``gpuloom/srun``: the same with ``--executor slurm-srun`` (each job an allocation with one step);
* ``gpuloom/steps``: the same with ``--executor slurm-steps`` (each job a step in an allocation of its
  account's that the service keeps open).

Every job is the service's default job account's (one user), in every configuration.

Each run of a job appends ``start``/``end`` records (wall clock, its ``CUDA_VISIBLE_DEVICES``) to
a file, so every configuration is measured by the same clock in the job itself: JCT = last end -
submit; makespan = last end - first submit; **hand-off** = a run's start minus the moment the last
of its GPUs came free (the end of the previous run there), for runs that were waiting for them.

Run: ``python benchmarks/run.py slurm`` (root, with ``slurm-wlm`` and ``munge``; about 13 minutes), or
``python benchmarks/bench_slurm.py NAME...`` for some configurations (``"gpuloom/slurm fifo"``).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

JOBS = 12
GAP_S = 1.5
SEED = 7
STEP_S = 0.1


def workload() -> list[dict[str, Any]]:
    rng = np.random.default_rng(SEED)
    t = 0.0
    out = []
    for i in range(JOBS):
        t += float(rng.exponential(GAP_S)) if i else 0.0
        out.append({"i": i, "at": t, "gpus": int(rng.choice([1, 1, 2, 2, 4])),
                    "steps": int(rng.integers(30, 121))})
    return out


def command(job: dict[str, Any], base: Path, py: str, tag: str) -> str:
    rec = base / f"{tag}-{job['i']}.rec"
    ckpt = base / f"{tag}-ckpt-{job['i']}"
    sleepy = base / "sleepy_train.py"
    return (f"trap '' TERM; echo \"start $(date +%s.%N) $CUDA_VISIBLE_DEVICES\" >> {rec}; "
            f"{py} {sleepy} --steps {job['steps']} --step-s {STEP_S} --checkpoint-every 1 --checkpoint-dir {ckpt}; "
            f"rc=$?; echo \"end $(date +%s.%N) $CUDA_VISIBLE_DEVICES $rc\" >> {rec}; exit $rc")


def time_limit_s(job: dict[str, Any]) -> float:
    return job["steps"] * STEP_S * 1.5


def time_limit_min(job: dict[str, Any]) -> int:
    """Slurm's ``--time``: whole minutes (gpuloom gets the same limit)."""
    return max(1, math.ceil(time_limit_s(job) / 60))


def submit_all(jobs: list[dict[str, Any]], submit: Any) -> dict[int, float]:
    """Submit each job at its arrival time (from now); their wall submit times."""
    t0 = time.time()
    when: dict[int, float] = {}
    for j in jobs:
        time.sleep(max(0.0, t0 + j["at"] - time.time()))
        when[j["i"]] = time.time()
        submit(j)
    return when


def measure(jobs: list[dict[str, Any]], base: Path, tag: str, submitted: dict[int, float]) -> dict[str, float]:
    runs = []  # (job, start, end, gpus)
    jct = []
    failed = 0
    for j in jobs:
        lines = (base / f"{tag}-{j['i']}.rec").read_text().split("\n")
        start = None
        last_ok = None
        for ln in lines:
            w = ln.split()
            if not w:
                continue
            if w[0] == "start":
                start = (float(w[1]), w[2] if len(w) > 2 else "")
            elif w[0] == "end" and start is not None:
                gpus = tuple(int(g) for g in start[1].split(",") if g)
                runs.append((j["i"], start[0], float(w[1]), gpus))
                if w[-1] == "0":
                    last_ok = float(w[1])
                start = None
        if last_ok is None:  # failed (a time limit): left out of the JCTs, counted
            failed += 1
            continue
        jct.append(last_ok - submitted[j["i"]])
    hand = []
    for j, start, _, gpus in runs:  # from the moment its last GPU came free, if it was waiting for one
        freed = [e for (_, s2, e, g2) in runs if set(g2) & set(gpus) and e <= start + 1e-3 and s2 < start]
        if freed and max(freed) > submitted[j]:
            hand.append(start - max(freed))
    ends = [r[2] for r in runs]
    arr = np.array(jct)
    return {"mean": float(arr.mean()), "median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)),
            "makespan": max(ends) - min(submitted.values()), "handoff_med": float(np.median(hand)) if hand else math.nan,
            "handoff_max": float(max(hand)) if hand else math.nan, "handoffs": len(hand), "failed": failed}


def run_stock(slurm: Any, jobs: list[dict[str, Any]], base: Path, py: str, tag: str, limits: bool) -> dict[str, float]:
    ids = []

    def submit(j: dict[str, Any]) -> None:
        argv = ["sbatch", "--parsable", f"--gres=gpu:{j['gpus']}", f"--cpus-per-task={2 * j['gpus']}",
                f"--mem={2000 * j['gpus']}", f"--output={base}/{tag}-{j['i']}.out", f"--chdir={base}"]
        if limits:
            argv.append(f"--time={time_limit_min(j)}")
        ids.append(slurm.run(*argv, "--wrap", command(j, base, py, tag)).stdout.strip())

    submitted = submit_all(jobs, submit)
    wait(lambda: not slurm.run("squeue", "-h", "-o", "%i").stdout.strip(), f"{tag} to drain")
    return measure(jobs, base, tag, submitted)


def run_gpuloom(jobs: list[dict[str, Any]], base: Path, py: str, tag: str, args: list[str]) -> dict[str, float]:
    from service_util import Server

    state = base.parent / f"state-{tag}"  # the service's own directories: not under the records' (0777)
    state.mkdir(mode=0o700)
    s = Server(state, "--round", "0.2", "--job-dir", str(base.parent / f"jobs-{tag}"), *args).start(timeout=60)
    try:
        with s.client() as c:
            ids = []

            def submit(j: dict[str, Any]) -> None:
                r = c.post("/jobs", json={"name": f"b{j['i']}", "command": command(j, base, py, tag), "gpus": j["gpus"],
                                          "time_limit": time_limit_min(j), "cpus": 2 * j["gpus"],
                                          "iterations": j["steps"], "iteration_time": STEP_S,
                                          "mem": f"{2000 * j['gpus']}M"})
                r.raise_for_status()
                ids.append(r.json()["id"])

            submitted = submit_all(jobs, submit)
            wait(lambda: all(c.get(f"/jobs/{i}").json()["state"] in ("finished", "failed", "cancelled") for i in ids),
                 f"{tag} to finish")
    finally:
        s.stop()
    return measure(jobs, base, tag, submitted)


def wait(fn: Any, what: str, timeout: float = 900.0) -> None:
    end = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> None:
    from slurm_util import SlurmCluster, missing

    why = missing()
    if why is not None:
        print(f"skipped: {why}")
        return
    jobs = workload()
    top = Path(tempfile.mkdtemp(prefix="gpuloom-bench-slurm-", dir="/var/tmp"))
    top.chmod(0o711)
    base = top / "records"
    base.mkdir()
    base.chmod(0o777)  # job accounts write their records here
    shutil.copy(REPO / "examples" / "sleepy_train.py", base / "sleepy_train.py")
    (base / "sleepy_train.py").chmod(0o644)
    py = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable  # one job accounts can run
    slurm = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpuloom-slurm-")))
    os.environ["SLURM_CONF"] = str(slurm.conf)
    rows = []
    try:
        slurm.start()
        print(f"{JOBS} jobs, {sum(j['gpus'] * j['steps'] * STEP_S for j in jobs):.0f} GPU-seconds of work, "
              f"last arrival at {jobs[-1]['at']:.1f} s, on 4 GPUs", flush=True)
        configs: list[tuple[str, Any]] = [
            ("slurm", lambda t: run_stock(slurm, jobs, base, py, t, False)),
            ("slurm+time", lambda t: run_stock(slurm, jobs, base, py, t, True)),
            ("gpuloom fifo", lambda t: run_gpuloom(jobs, base, py, t, ["--gpus", "4", "--cpus-per-node", "8",
                                                                          "--mem-gb-per-node", "8"])),
            ("gpuloom srtf", lambda t: run_gpuloom(jobs, base, py, t, ["--gpus", "4", "--cpus-per-node", "8",
                                                                          "--mem-gb-per-node", "8", "--order", "srtf"])),
            ("gpuloom/slurm fifo", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all"])),
            ("gpuloom/slurm srtf", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all", "--order", "srtf"])),
            ("gpuloom/srun fifo", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all", "--executor", "slurm-srun"])),
            ("gpuloom/srun srtf", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all", "--executor", "slurm-srun",
                                                                              "--order", "srtf"])),
            ("gpuloom/steps fifo", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all", "--executor",
                                                                               "slurm-steps"])),
            ("gpuloom/steps srtf", lambda t: run_gpuloom(jobs, base, py, t, ["--slurm", "all", "--executor",
                                                                               "slurm-steps", "--order", "srtf"])),
        ]
        only = sys.argv[1:]  # configuration names to run (default: all)
        for k, (name, fn) in enumerate(configs):
            if only and name not in only:
                continue
            m = fn(f"c{k}")
            rows.append((name, m))
            print(f"  {name:20s} mean JCT {m['mean']:6.1f} s  median {m['median']:6.1f}  p95 {m['p95']:6.1f}  "
                  f"makespan {m['makespan']:6.1f} s  hand-off median {m['handoff_med']:.2f} s max "
                  f"{m['handoff_max']:.2f} s ({m['handoffs']})" + (f"  {m['failed']} FAILED" if m["failed"] else ""),
                  flush=True)
    finally:
        slurm.stop()
        if os.environ.get("GPULOOM_BENCH_KEEP"):  # records, service state and logs, to look into a failure
            print(f"kept {top}")
        else:
            subprocess.run(["rm", "-rf", str(top)], check=False)
    by = dict(rows)
    if "slurm" not in by:
        return
    base_jct = by["slurm"]["mean"]
    for own, over in (("gpuloom fifo", "gpuloom/slurm fifo"), ("gpuloom srtf", "gpuloom/slurm srtf"),
                      ("gpuloom fifo", "gpuloom/srun fifo"), ("gpuloom srtf", "gpuloom/srun srtf"),
                      ("gpuloom fifo", "gpuloom/steps fifo"), ("gpuloom srtf", "gpuloom/steps srtf")):
        if own not in by or over not in by:
            continue
        gain, kept = base_jct - by[own]["mean"], base_jct - by[over]["mean"]
        print(f"{over}: keeps {kept:.1f} s of {own}'s {gain:.1f} s mean-JCT gain over stock Slurm"
              + (f" ({100 * kept / gain:.0f} %)" if gain > 0 else ""))


if __name__ == "__main__":
    main()
