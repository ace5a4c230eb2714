"""Chaos: SIGKILL the server at random points of a workload, many times; no step is lost or repeated.

A two-GPU cluster under SRTF with preemption runs checkpointing stepper jobs (each finished step
appended to a ledger, exactly once if nothing is lost or repeated) that arrive while the server
is killed and restarted at random moments: during submissions, launches (before or after their
record), preemptions (while jobs checkpoint), completions and recovery itself.  At the end every
job has finished and every ledger lists each of its steps exactly once.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from service_util import Server, job, kill_jobs, ledger, stepper_cmd, submit, wait_for

NCPU = len(os.sched_getaffinity(0))
KILLS = 20


@pytest.mark.slow
def test_sigkill_at_random_points_every_ledger_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(20)
    args = ("--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2", "--grace", "10",
            "--order", "srtf")
    steps: dict[int, int] = {}
    s = Server(tmp_path, *args).start()
    kills = 0
    try:
        while kills < KILLS:
            with s.client() as c:
                for _ in range(rng.choice([0, 1, 1, 2])):
                    n = rng.randint(8, 30)
                    # shorter jobs preempt longer ones (SRTF): time limits set the work estimate, generously
                    jid = submit(c, name=f"s{n}", command=stepper_cmd(n, 0.1), gpus=rng.choice([1, 1, 2]),
                                 time_limit=f"{10 * n}s")
                    steps[jid] = n
            time.sleep(rng.uniform(0.05, 1.5))
            s.kill()
            kills += 1
            s = Server(tmp_path, *args).start()
        with s.client() as c:
            rows = {jid: wait_for(lambda jid=jid: (j := job(c, jid))["state"] in ("finished", "failed") and j,
                                  timeout=180, what=f"job {jid} to end") for jid in steps}
        ledgers = {jid: ledger(r["checkpoint_dir"]) for jid, r in rows.items()}
    finally:
        s.stop()
        kill_jobs(tmp_path)
    assert kills >= 20 and len(steps) >= 15
    assert {jid: r["state"] for jid, r in rows.items()} == {jid: "finished" for jid in steps}
    lost_or_repeated = {jid: ledgers[jid] for jid, n in steps.items() if ledgers[jid] != list(range(n))}
    assert lost_or_repeated == {}
    print(f"\nchaos: {kills} SIGKILLs of the server, {len(steps)} jobs, {sum(steps.values())} steps, "
          f"{sum(r['preemptions'] for r in rows.values())} preemptions, "
          f"{sum(r['attempts'] for r in rows.values())} launches; 0 steps lost or repeated")
