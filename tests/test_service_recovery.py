"""Durability: SIGKILL the server with jobs running and queued, start it again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpuloom.runtime.exec.local import read_exit_record
from service_util import (
    STEPPER,
    Server,
    job,
    key_events,
    kill_jobs,
    ledger,
    running,
    start_records,
    stepper_cmd,
    submit,
    wait_for,
)

NCPU = len(os.sched_getaffinity(0))


def test_sigkill_recovery_adopts_live_jobs_and_resumes_dead_ones(tmp_path: Path) -> None:
    args = ("--cluster", "1x8", "--cpus-per-node", str(NCPU), "--round", "0.2", "--grace", "10")
    # the jobs end when the test says so, not after a time a loaded machine may outlast: a, b and the
    # resumed b once `up` exists (a must still run when the server comes back), f and e once `down`
    # exists (they must end while it is down); the files are where the jobs' accounts can see them
    up, down = (STEPPER.parent / f"{tmp_path.name}-{w}" for w in ("up", "down"))
    s = Server(tmp_path, *args).start()
    try:
        with s.client() as c:
            a = submit(c, **{"name": "a", "command": f"STEPPER_HOLD={up} {stepper_cmd(100, 0.1)}", "gpus": 2})
            b = submit(c, **{"name": "b", "command": f"STEPPER_HOLD={up} {stepper_cmd(50, 0.05)}", "gpus": 2})
            f = submit(c, **{"name": "f", "command": f"STEPPER_HOLD={down} {stepper_cmd(20, 0.1)}", "gpus": 2})
            e = submit(c, **{"name": "e", "command": f"while [ ! -e {down} ]; do sleep 0.05; done; exit 3",
                             "gpus": 2})
            q1 = submit(c, **{"name": "q1", "command": stepper_cmd(4, 0.05), "gpus": 6})
            q2 = submit(c, **{"name": "q2", "command": stepper_cmd(4, 0.05), "gpus": 2})
            for jid in (a, b, f):
                wait_for(lambda jid=jid: "iter=3" in c.get(f"/jobs/{jid}/logs").text, what=f"job {jid} progress")
                # (a job's first progress line promotes it at the next round, which a loaded machine may delay)
                wait_for(lambda jid=jid: job(c, jid)["state"] in ("running_protected", "running"),
                         what=f"job {jid} promoted")
            before = {jid: job(c, jid) for jid in (a, b, f, q1, q2)}
            log_a = c.get(f"/jobs/{a}/logs").text
            log_b = c.get(f"/jobs/{b}/logs").text
            log_f = c.get(f"/jobs/{f}/logs").text
        assert all(before[j]["state"] in ("running_protected", "running") for j in (a, b, f))
        assert [before[j]["state"] for j in (q1, q2)] == ["waiting_for_initial_resource"] * 2
        pid_a, pid_b, pid_f = (start_records(x)[0]["pid"] for x in (log_a, log_b, log_f))

        s.kill()  # SIGKILL: no shutdown code runs
        assert running(pid_a) and running(pid_b)  # job processes outlive the server
        # while the server is down, job b's process is lost without an exit record: its wrapper is
        # killed, and the job itself stopped (it checkpoints on SIGTERM)
        os.kill(os.getpgid(pid_b), signal.SIGKILL)
        os.kill(pid_b, signal.SIGTERM)
        wait_for(lambda: not running(pid_b), what="job b to exit")
        # job f finishes, and job e fails (exit 3): their wrappers write their exit records
        down.touch()
        wait_for(lambda: not running(pid_f), what="job f to finish")
        wait_for(lambda: sorted(rc for p in tmp_path.rglob("*.exit") if (rc := read_exit_record(str(p))) is not None)
                 == [0, 3], what="the exit records of f and e")

        s = Server(tmp_path, *args).start()
        with s.client() as c:
            # every accepted job is still there
            assert [j["id"] for j in c.get("/jobs").json()] == [a, b, f, e, q1, q2]
            wait_for(lambda: "adopt" in key_events(c.get(f"/jobs/{a}/events").json()), what="job a to be adopted")
            up.touch()
            failed = wait_for(lambda: (j := job(c, e))["state"] == "failed" and j, what="job e to fail")
            ev_e = key_events(c.get(f"/jobs/{e}/events").json())
            done = {
                jid: wait_for(lambda jid=jid: (j := job(c, jid))["state"] == "finished" and j, timeout=60,
                              what=f"job {jid} to finish")
                for jid in (a, b, f, q1, q2)
            }
            ev_f = key_events(c.get(f"/jobs/{f}/events").json())
            ev_a = key_events(c.get(f"/jobs/{a}/events").json())
            ev_b = key_events(c.get(f"/jobs/{b}/events").json())
            log_a = c.get(f"/jobs/{a}/logs").text
            log_b = c.get(f"/jobs/{b}/logs").text
        # a was adopted, not restarted: one launch, one process, its own exit code read back
        assert ev_a == ["submit", "launch", "adopt", "finished"]
        assert done[a]["attempts"] == 1 and done[a]["resume_count"] == 0 and done[a]["exit_code"] == 0
        assert [r["pid"] for r in start_records(log_a)] == [pid_a]
        # b's process was gone: requeued and resumed from its checkpoint
        assert ev_b[:3] == ["submit", "launch", "requeue"] and ev_b[-1] == "finished"
        assert done[b]["attempts"] == 2 and done[b]["resume_count"] == 1
        recs = start_records(log_b)
        assert [r["resume"] for r in recs] == [None, "1"] and recs[1]["start"] >= 3
        # f finished while the server was down: its exit record says so, it is not rerun
        assert ev_f == ["submit", "launch", "finished"] and done[f]["attempts"] == 1
        assert done[f]["reason"] == "finished while the service was down"
        assert done[f]["held_time"] >= 1.9  # it ran 20 x 0.1 s, up to its exit record
        # e failed while the server was down: its exit record is final, it is not run again
        assert ev_e == ["submit", "launch", "failed"] and failed["attempts"] == 1 and failed["exit_code"] == 3
        assert failed["reason"] == f"process {e} ended with code 3 while the service was down"
        assert ledger(done[f]["checkpoint_dir"]) == list(range(20))
        # no work lost or repeated, queued jobs ran
        assert ledger(done[a]["checkpoint_dir"]) == list(range(100))
        assert ledger(done[b]["checkpoint_dir"]) == list(range(50))
        assert ledger(done[q1]["checkpoint_dir"]) == list(range(4))
        assert ledger(done[q2]["checkpoint_dir"]) == list(range(4))
    finally:
        s.stop()
        kill_jobs(tmp_path)
