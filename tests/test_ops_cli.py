"""Slurm-grade commands against a real server: a job array of 10 with a dependency chain that
finishes in order; submit from flags; queue, show, history, logs -f; --version and completion."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from service_util import Server, kill_jobs, wait_for

NCPU = len(os.sched_getaffinity(0))
runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.output


def test_version_and_completion() -> None:
    code, out = cli("--version")
    assert code == 0 and out.strip() == "gpuloom 0.1.0"
    # the shell is found among the command's parents (as when a user types it), so run it from bash
    import shlex
    import subprocess
    import sys

    r = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m gpuloom --show-completion; exit $?"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "_GPULOOM_COMPLETE" in r.stdout, r.stderr
    assert "complete -o default -F _gpuloom_completion gpuloom" in r.stdout


@pytest.mark.serial  # waits for states a few rounds of 0.2 s long
def test_array_of_ten_with_a_dependency_chain_finishes_in_order(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x4", "--cpus-per-node", str(NCPU), "--round", "0.2").start()
    sd = ("--state-dir", str(tmp_path))
    try:
        # ten tasks, one at a time (%1), then a job after all of them, then one after that
        code, out = cli("submit", "--array", "0-9%1", "--name", "arr", "--gpus", "1", "--mem", "1G", "--time", "10:00",
                        *sd, "--", "sh", "-c", "sleep 0.2; echo task $GPULOOM_ARRAY_TASK_ID of $GPULOOM_ARRAY_JOB_ID")
        assert code == 0 and out.strip() == "Submitted job array 1 (0-9%1)", out
        code, out = cli("submit", "--wrap", "echo merge", "--dependency", "afterok:1", "--gpus", "2", "--json", *sd)
        assert code == 0 and json.loads(out)["id"] == 11 and json.loads(out)["dependency"] == "afterok:1"
        code, out = cli("submit", "--name", "report", "--dependency", "afterok:11", *sd, "--", "echo", "done")
        assert code == 0 and out.strip() == "Submitted job 12"
        code, out = cli("queue", *sd)
        # (the array's waiting tasks are one line: 1_[2-9] while task 1 runs)
        assert code == 0 and "(Dependency)" in out and "(JobArrayTaskLimit)" in out and re.search(r" 1_(\[\d-9\]|9) ", out)
        def pending() -> list[dict]:
            code, out = cli("queue", "--state", "PD", "--json", *sd)
            assert code == 0, out
            return json.loads(out)

        assert {j["id"] for j in pending()} >= {11, 12} and all(j["st"] == "PD" for j in pending())
        # (a job's pending reason is the next round's: until then it is None)
        wait_for(lambda: {j["pending_reason"] for j in pending() if j["id"] in (11, 12)} == {"Dependency"},
                 what="both dependent jobs held for their dependency")

        def done() -> list[dict] | None:
            recs = json.loads(cli("history", "--json", *sd)[1])
            return recs if len(recs) == 12 and all(r["st"] in ("CD", "F", "CA") for r in recs) else None

        recs = wait_for(done, timeout=120, what="the array and its chain to finish")
        assert [r["st"] for r in recs] == ["CD"] * 12
        assert [r["array"] for r in recs[:10]] == [f"1_{i}" for i in range(10)]
        # in order: each task starts after the one before ended, the chain after the whole array
        for a, b in zip(recs, recs[1:], strict=False):
            assert a["end"] <= b["start"], (a, b)
        assert all(r["gpu_hours"] > 0 and r["exit_code"] == 0 and r["nodes"] == ["node-0"] for r in recs)
        assert recs[10]["gpus"] == 2 and recs[10]["gpu_hours"] == 2 * recs[10]["held_s"] / 3600
        code, out = cli("logs", "10", *sd)
        assert out == "task 9 of 1\n"
        code, out = cli("logs", "12", *sd)
        assert out == "done\n"
        code, out = cli("history", "--user", "admin", "--state", "CD", "--since", "1h", *sd)
        assert code == 0 and "1_9" in out and "GPU-HOURS" in out and "FINISHED" in out
        code, out = cli("history", "--since", "2099-01-01", "--json", *sd)
        assert json.loads(out) == []
        code, out = cli("history", "--since", "soon", *sd)
        assert code == 2 and "--since" in out
        code, out = cli("show", "11", *sd)
        assert code == 0 and "JobId=11 JobName=wrap" in out and "JobState=FINISHED (CD)" in out
        assert "Dependency=afterok:1" in out and "Allocations:" in out and "Events:" in out and "launch" in out
        code, out = cli("show", "12", "--json", *sd)
        shown = json.loads(out)
        assert shown["command"] == "echo done" and shown["accounting"]["allocations"][0]["closed_by"] == "finished"
        assert [e["kind"] for e in shown["events"]][0] == "submit"
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_submit_from_flags_and_follow_logs(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2").start()
    sd = ("--state-dir", str(tmp_path))
    try:
        code, out = cli("submit", "--gpus", "2", "--cpus", "1", "--mem", "2G", "--time", "1:00:00", "-e", "WHO=me",
                        "--json", *sd, "--", "sh", "-c", "for i in 1 2 3 4 5; do echo line $i $WHO; sleep 0.3; done")
        job = json.loads(out)
        assert code == 0 and (job["gpus"], job["cpus"], job["name"], job["time_limit"]) == (2, 1, "sh", 3600.0)
        assert job["command"] == "sh -c 'for i in 1 2 3 4 5; do echo line $i $WHO; sleep 0.3; done'"
        # running, or already done where `gpuloom queue` took longer than the job's 1.5 s (a loaded machine)
        wait_for(lambda: [j["st"] for j in json.loads(cli("queue", "--all", "--json", *sd)[1])] in (["R"], ["CD"]),
                 what="the job to run")
        code, out = cli("logs", "1", "-f", "--interval", "0.1", *sd)  # returns once the job ended
        assert code == 0 and out == "".join(f"line {i} me\n" for i in range(1, 6))
        code, out = cli("queue", "--all", "--long", *sd)
        assert code == 0 and " CD " in out and "FINISHED" in out and "1:00:00" in out
        # nothing to run; a command and --wrap both
        code, out = cli("submit", "--gpus", "1", *sd)
        assert code == 2 and "nothing to run" in out
        code, out = cli("submit", "--wrap", "true", *sd, "--", "echo", "x")
        assert code == 2 and "not both" in out
        # following from before the job printed anything: everything, once
        code, out = cli("submit", "--json", *sd, "--", "sh", "-c", "echo first; sleep 1.5; echo second")
        jid = json.loads(out)["id"]
        seen: list[str] = []
        t = threading.Thread(target=lambda: seen.append(cli("logs", str(jid), "-f", "--interval", "0.1", *sd)[1]))
        t.start()
        t.join(timeout=60)
        assert seen == ["first\nsecond\n"]
    finally:
        s.stop()
        kill_jobs(tmp_path)
