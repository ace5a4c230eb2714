"""Jobs as steps in kept allocations (``--executor slurm-steps``) on a test Slurm of each test's own
(tests/slurm_util.py's ``own_slurm``): a controller that stops and comes back, steps held to their memory.
Outside the Slurm xdist group (conftest.py), these run beside it; and why a step ended, parsed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec.slurm import REASONS
from gpuloom.runtime.exec.slurm_steps import (
    ABORTED_AT_LAUNCH,
    NO_EXIT_RECORD,
    sacct_step_reason,
    srun_aborted,
    stepd_reason,
)
from service_util import JOB_PY
from slurm_util import own_slurm_fixture, steps_executor, wait_until  # noqa: F401 (own_slurm_fixture: a fixture)
from slurm_util import step_spec as spec


@pytest.mark.slow  # 20-30 s: handed out early, not at the suite's end (tests/conftest.py)
def test_a_step_ends_while_slurmctld_is_down_and_its_allocation_goes_after(own_slurm: Any, tmp_path: Path) -> None:
    """On a test Slurm of its own, stopped after the test: Slurm keeps the allocation COMPLETING until
    slurmstepd's retried message gets through (about 45 s), and nothing waits for that."""
    slurm = own_slurm()
    steps = steps_executor(slurm, tmp_path)
    log = tmp_path / "r.log"
    info = steps.launch(spec("r", "sleep 2; echo done", log, (2,)))
    slurm.stop_daemon("slurmctld")
    try:
        # the step's own exit record reports its end without the controller
        assert wait_until(lambda: steps.poll(), 30, "r's exit while slurmctld is down") == {"r": 0}
        assert log.read_text() == "done\n"
        time.sleep(1.5)  # past linger_s: the idle allocation cannot be cancelled yet
        assert steps.poll() == {}
    finally:
        slurm.start_ctld()
    # once the controller answers, the idle allocation is cancelled (Slurm keeps it COMPLETING until the
    # step's own completion message, which slurmstepd retries, gets through) and not taken up again
    wait_until(lambda: steps.poll() == {} and slurm.job(info.pid)["JobState"] in ("COMPLETING", "CANCELLED"), 30,
               "the allocation to be cancelled", lambda: f"{slurm.job(info.pid)} {steps.allocs}")
    for _ in range(5):
        assert steps.poll() == {} and steps.allocs == {}
        time.sleep(0.3)


def test_why_a_step_ended_is_read_from_sacct_and_slurmstepds_lines() -> None:
    oom, timeout, cancel = REASONS["OUT_OF_MEMORY"], REASONS["TIMEOUT"], REASONS["CANCELLED"]
    sacct = "12|RUNNING\n12.0|COMPLETED\n12.1|OUT_OF_MEMORY\n12.2|CANCELLED by 0\n12.3|TIMEOUT\n12.4|FAILED\n"
    assert [sacct_step_reason(sacct, f"12.{i}") for i in range(6)] == [None, oom, cancel, timeout, None, None]
    out = ("epoch 3\nslurmstepd-gpn0: error: StepId=7.2 exceeded memory limit (436641792 > 104857600), being killed\n"
           "slurmstepd-gpn0: error: *** STEP 7.2 ON gpn0 CANCELLED AT 2026-11-29T08:16:07 ***\n")
    assert (stepd_reason(out, "7.2"), stepd_reason(out, "7.1"), stepd_reason(out, "7.22")) == (oom, None, None)
    cgroup = "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.3. Some of your processes may have been killed"
    assert stepd_reason(cgroup, "7.3") == oom
    line = "slurmstepd-gpn0: error: *** STEP 7.4 ON gpn0 CANCELLED AT 2026-11-29T08:18:18{} ***\n"
    causes = ("", " DUE TO TIME LIMIT", " DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS", " DUE TO PREEMPTION",
              " DUE TO JOB REQUEUE")
    assert [stepd_reason(line.format(c), "7.4") for c in causes] == [
        cancel, timeout, REASONS["NODE_FAIL"], REASONS["PREEMPTED"], None]
    assert stepd_reason("echo " + line.format(""), "7.4") is None  # only slurmstepd's own line, from its start
    # srun -v's account of a step Slurm ended while it launched it (no slurmstepd line: its output was not set up)
    srun = ("srun: launching StepId=3.3 on host gpn0, 1 tasks: 0\nsrun: Complete StepId=3.0+0 received\n"
            "srun: launch/slurm: launch_p_step_launch: StepId=3.3 aborted before step completely launched.\n"
            "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n")
    assert (srun_aborted(srun, "3.3"), srun_aborted(srun, "3.0"), srun_aborted(srun, "3.33")) == (True, False, False)


@pytest.mark.slow  # a minute at least (Slurm's least step time limit): handed out early (tests/conftest.py)
def test_a_failed_step_ends_with_slurms_reason_oom_time_limit_or_cancel(own_slurm: Any, tmp_path: Path) -> None:
    """A test Slurm of its own that holds steps to their memory (``OverMemoryKill``, read each second):
    an OOM kill, a step time limit (a minute, Slurm's least: the jobs run side by side) and an scancel
    each end their job with Slurm's reason; an exit of the job's own, or a signal it sent itself, with none."""
    slurm = own_slurm("JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherParams=OverMemoryKill",
                      "JobAcctGatherFrequency=task=1")
    e = steps_executor(slurm, tmp_path)
    big = f"{JOB_PY} -c 'import time; x = b\"x\" * (400 << 20); time.sleep(60)'"
    jobs = {"tl": ("sleep 300", (0,)), "oom": (big, (1,)), "cx": ("sleep 300", (2,)), "bad": ("exit 3", (3,)),
            "sig": ("kill -KILL $$", ()), "early": ("sleep 300", ())}
    for x, (cmd, gpus) in jobs.items():
        e.launch(spec(x, cmd, tmp_path / f"{x}.log", gpus, cpus=1, mem=100))
    # cancelled while srun may still be launching it: slurmstepd's line, or srun's word if it had none yet
    slurm.run("scancel", e.steps["early"].step)
    slurm.run("scontrol", "update", f"StepId={e.steps['tl'].step}", "TimeLimit=1")
    # cancelled once running (srun -v says its task started): a busy machine may take seconds to get there
    err = e.steps["cx"].err
    assert err is not None
    wait_until(lambda: "tasks started" in Path(err).read_text(), 60, "cx's task to start")
    slurm.run("scancel", e.steps["cx"].step)
    got: dict[str, int | None] = {}
    why: dict[str, str | None] = {}

    def ended() -> bool:
        for x, code in e.poll().items():
            got[x], why[x] = code, e.end_reason(x)  # (asked at once, as the service does)
        return len(got) == len(jobs)

    wait_until(ended, 150, "every job's end", lambda: f"{got} {slurm.scontrol('show', 'step')}")
    # (srun can say 0 for a step Slurm ended before its task ran: no exit of the job's, so unknown, never 0)
    assert (got.pop("early"), why.pop("early")) in {(c, r) for c in (137, None) for r in (
        REASONS["CANCELLED"], ABORTED_AT_LAUNCH)} | {(None, NO_EXIT_RECORD)}
    assert got == {"tl": 143, "oom": 137, "cx": 137, "bad": 3, "sig": 137}
    assert why == {"tl": REASONS["TIMEOUT"], "oom": REASONS["OUT_OF_MEMORY"], "cx": REASONS["CANCELLED"],
                   "bad": None, "sig": None}


def test_srun_ending_0_without_the_scripts_exit_record_is_no_success(tmp_path: Path, monkeypatch: Any) -> None:
    """srun says 0 for a step Slurm ended before its task ran: with no exit record of the script's, its end
    is reported (after ``ENDED_GRACE_S``, for a record written just before srun's end) unknown, not 0."""
    import subprocess

    from gpuloom.runtime.exec import slurm_steps
    from gpuloom.runtime.exec.slurm_steps import SlurmStepsExecutor, Step

    monkeypatch.setattr(slurm_steps, "ENDED_GRACE_S", 0.3)
    e = SlurmStepsExecutor("t", out_dir=str(tmp_path))
    rec = tmp_path / "j.4.exit"
    st = Step(4, "4.1", str(rec), subprocess.Popen(["true"]))
    assert st.proc is not None and st.proc.wait() == 0
    assert e._step_exit(st, "j") == (False, None)  # a record may still show
    time.sleep(0.4)
    assert e._step_exit(st, "j") == (True, None)
    assert e._step_exit(st) == (True, None)  # (a stop does not wait)
    rec.write_text("0\n")
    assert e._step_exit(st, "j") == (True, 0)
