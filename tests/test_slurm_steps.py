"""Jobs as steps in allocations the service keeps (``--executor slurm-steps``), against the test Slurm
(tests/slurm_util.py): placement, reuse by the account's next job, other accounts kept out,
preemption and resume with every step run once, adoption after a restart, through the service too.
Tests that need a test Slurm of their own are in test_slurm_steps_own.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec.executor import NodeUnavailable
from gpuloom.runtime.exec.identity import lookup
from gpuloom.runtime.exec.slurm import LIVE, parse_records
from gpuloom.runtime.exec.slurm_steps import SlurmStepsExecutor
from service_util import JOB_PY, FullLogDisk, job, job_writable, ledger, start_records, stepper_cmd, submit, wait_for
from slurm_util import (  # noqa: F401 (*_fixture: fixtures)
    SlurmCluster,
    fresh_steps_prefix,
    preempt_short_over_long,
    serve_slurm_fixture,
    slurm_fixture,
    slurm_ids,
    slurm_jobs_cancelled_fixture,
    steps_executor,
    wait_until,
)
from slurm_util import step_spec as spec

REPO = Path(__file__).resolve().parents[1]
SLEEPY = REPO / "examples" / "sleepy_train.py"
CMD = 'echo "cvd=$CUDA_VISIBLE_DEVICES cpus=$GPULOOM_CPUS mem=$GPULOOM_MEM_MB id=$(id -un) step=$SLURM_STEP_ID"'


def live_jobs(slurm: SlurmCluster) -> list[dict[str, str]]:
    return [r for r in parse_records(slurm.scontrol("show", "job")) if r.get("JobState") in LIVE]


@pytest.fixture
def steps(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmStepsExecutor]:
    """A steps executor on the session's test Slurm, once earlier tests' jobs have ended."""
    e = steps_executor(slurm, tmp_path)
    wait_until(lambda: not live_jobs(slurm), 30, "earlier tests' jobs to end")
    yield e
    slurm.cancel_all()
    slurm.run("scancel", "--user=gpuloom", check=False)
    wait_until(lambda: not live_jobs(slurm), 30, "the jobs to end")


def test_a_step_runs_in_an_allocation_of_its_account_and_the_next_job_reuses_it(
        steps: SlurmStepsExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    a = steps.launch(spec("a", CMD + "; sleep 1", tmp_path / "a.log", (1, 3)))
    rec = slurm.job(a.pid)
    assert (rec["JobName"], rec["BatchFlag"], rec["UserId"], rec["GroupId"]) == (
        f"{steps.prefix}.alloc", "0", f"gpuloom({lookup('gpuloom').uid})", f"gpuloom({lookup('gpuloom').gid})")
    assert slurm.scontrol("show", "job", "-d", str(a.pid)).count("GRES=gpu:g1:1(IDX:1),gpu:g3:1(IDX:3)") == 1
    step = parse_records(slurm.scontrol("show", "step", f"{a.pid}.0"))[0]
    assert (step["Name"], step["UserId"]) == (f"{steps.prefix}:a", str(lookup("gpuloom").uid))
    assert wait_until(lambda: steps.poll(), 120, "a's exit") == {"a": 0}
    assert (tmp_path / "a.log").read_text() == "cvd=1,3 cpus=2 mem=300 id=gpuloom step=0\n"
    # the account's next job on the same GPUs is a step in the same allocation
    b = steps.launch(spec("b", CMD + "; exit 3", tmp_path / "b.log", (1, 3), cpus=1, mem=200))
    assert b.pid == a.pid
    assert wait_until(lambda: steps.poll(), 30, "b's exit") == {"b": 3}
    assert (tmp_path / "b.log").read_text() == "cvd=1,3 cpus=1 mem=200 id=gpuloom step=1\n"
    # two jobs of the account at once, each on some of its GPUs: two steps side by side in it
    c = steps.launch(spec("c", CMD + "; sleep 1", tmp_path / "c.log", (3,), cpus=1, mem=150))
    d = steps.launch(spec("d", CMD, tmp_path / "d.log", (1,), cpus=1, mem=100))
    assert c.pid == d.pid == a.pid
    got: dict[str, int | None] = {}
    wait_until(lambda: got.update(steps.poll()) or len(got) == 2, 30, "c's and d's exits")
    assert got == {"c": 0, "d": 0}
    assert [(tmp_path / f"{x}.log").read_text() for x in "cd"] == [
        "cvd=3 cpus=1 mem=150 id=gpuloom step=2\n", "cvd=1 cpus=1 mem=100 id=gpuloom step=3\n"]
    # idle for linger_s: cancelled
    wait_until(lambda: steps.poll() == {} and not steps.allocs, 10, "the idle allocation to be cancelled")
    wait_until(lambda: slurm.job(a.pid)["JobState"] == "CANCELLED", 10, "Slurm's end of the allocation")
    out = Path(str(steps.out_dir))  # its scripts, exit records and srun's messages are gone with the jobs
    wait_until(lambda: steps.poll() == {} and not steps._ending, 10, "the sruns to be reaped")
    assert sorted(os.listdir(out / "gpuloom")) == [] and [n for n in os.listdir(out) if n != "gpuloom"] == []


def test_a_step_that_writes_its_exit_and_runs_on_is_cancelled(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job that reports its own end early cannot keep its GPUs: its step is cancelled after the
    grace period, though its allocation lingers (long here)."""
    e = SlurmStepsExecutor(fresh_steps_prefix(), env=slurm.env, out_dir=str(job_writable(tmp_path) / "out"), linger_s=120.0)
    e.read_nodes()
    try:
        d = f"{e.out_dir}/gpuloom"
        info = e.launch(spec("lie", f'echo 0 > {d}/lie.$SLURM_JOB_ID.exit; sleep 60', tmp_path / "l.log", (0,)))
        assert wait_until(lambda: e.poll(), 30, "the reported exit") == {"lie": 0}
        step = f"{info.pid}.0"
        assert step in e.read_steps()
        # meanwhile the account's next job on that GPU, in that allocation, waits a little, then is refused
        t = time.monotonic()
        with pytest.raises(NodeUnavailable, match=f"no step in Slurm allocation {info.pid}: not launched within 5 s"):
            e.launch(spec("next", "true", tmp_path / "n.log", (0,)))
        assert 5.0 < time.monotonic() - t < 10.0
        wait_until(lambda: e.poll() == {} and step not in e.read_steps(), 20, "the step to be cancelled")
        assert slurm.job(info.pid)["JobState"] == "RUNNING" and info.pid in e.allocs  # the allocation lingers
    finally:
        e.close()
        wait_until(lambda: not live_jobs(slurm), 30, "the allocation to end")


def test_another_accounts_job_never_runs_in_an_accounts_allocation(steps: SlurmStepsExecutor, slurm: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    a = steps.launch(spec("a", "true", tmp_path / "a.log", (0, 1)))
    assert wait_until(lambda: steps.poll(), 120, "a's exit") == {"a": 0}
    y = steps.launch(spec("y", "sleep 1", tmp_path / "y.log", (0,)))
    assert y.pid == a.pid
    # Slurm itself refuses a step of another uid in it
    r = slurm.run("srun", f"--jobid={a.pid}", "--uid=65534", "--gid=65534", "--exact", "--gres=gpu:g1:1",
                  "--mem=10", "/bin/true", check=False)
    assert r.returncode != 0 and "Access/permission denied" in r.stderr, r.stderr
    # a job of the service's own account onto its free GPU waits while the allocation runs a step ...
    with pytest.raises(NodeUnavailable, match=r"GPU\(s\) \[1\] of gpn0 are in an allocation of another"):
        steps.launch(spec("b", CMD, tmp_path / "b.log", (1,), user=None))
    assert wait_until(lambda: steps.poll(), 30, "y's exit") == {"y": 0}
    # ... and once it is idle, the allocation is cancelled, not used
    b = steps.launch(spec("b", CMD, tmp_path / "b.log", (1,), user=None))
    assert b.pid != a.pid and slurm.job(b.pid)["UserId"] == "root(0)"
    assert slurm.job(a.pid)["JobState"] in ("CANCELLED", "COMPLETING")
    assert wait_until(lambda: steps.poll(), 30, "b's exit") == {"b": 0}
    assert (tmp_path / "b.log").read_text() == "cvd=1 cpus=2 mem=300 id=root step=0\n"
    # a job of the account on other GPUs gets an allocation of its own beside the idle one
    c = steps.launch(spec("c", "true", tmp_path / "c.log", (2,)))
    assert c.pid not in (a.pid, b.pid) and b.pid in steps.allocs
    assert wait_until(lambda: steps.poll(), 120, "c's exit") == {"c": 0}


def test_steps_preempt_and_resume_in_the_same_allocation_run_each_step_once(
        steps: SlurmStepsExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    ckpt = job_writable(tmp_path) / "ckpt"
    log = tmp_path / "p.log"
    cmd = f"{JOB_PY} {SLEEPY} --steps 40 --step-s 0.05 --checkpoint-every 1 --checkpoint-dir {ckpt} --ledger {ckpt}/ledger"
    s = spec("p", cmd, log, (2,), GPULOOM_CHECKPOINT_DIR=str(ckpt))
    first = steps.launch(s)
    wait_until(lambda: steps.poll() == {} and "iter=5" in log.read_text(), 30, "some progress")  # (poll copies it)
    assert steps.stop("p", 10.0) == 143, log.read_text()[-800:]
    assert slurm.job(first.pid)["JobState"] == "RUNNING"  # the allocation stays for the resume
    again = steps.launch(spec("p", cmd, log, (2,), GPULOOM_CHECKPOINT_DIR=str(ckpt), GPULOOM_RESUME="1",
                              GPULOOM_ATTEMPT="2"))
    assert again.pid == first.pid
    assert wait_until(lambda: steps.poll(), 60, "the resumed job's exit") == {"p": 0}, log.read_text()
    assert [int(x) for x in (ckpt / "ledger").read_text().split()] == list(range(1, 41))
    text = log.read_text()
    assert text.count("resumed from ") == 1 and text.count("checkpointed at step") == 1 and "result=820" in text


def test_outputs_whose_logs_a_full_disk_refuses_are_kept_until_copied_whole(
        steps: SlurmStepsExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk of the jobs' logs is full (each append half written, then refused) while a step prints and
    ends and another is stopped and resumed in its allocation: the end and the stop are reported, each
    step's output is kept; once there is room every log has its lines once, and the outputs go (a's 44 MB:
    more than two reads of an output, one for its last copy at its end and one at the next poll)."""
    disk = FullLogDisk(monkeypatch)
    logs = {e: tmp_path / f"{e}.log" for e in "ac"}
    lines = "seq {} {} | sed s/^/line/"
    steps.launch(spec("a", lines.format(1, 4_000_000) + "; exit 3", logs["a"], (0,), cpus=1, mem=100))
    c = spec("c", lines.format(1, 1000) + "; exec sleep 60", logs["c"], (1,), cpus=1, mem=100)
    steps.launch(c)
    outs = {e: Path(steps.outputs[e]) for e in "ac"}
    assert wait_until(lambda: steps.poll(), 120, "a's exit") == {"a": 3}
    wait_until(lambda: outs["c"].read_text().count("line") == 1000, 120, "c's lines")
    assert steps.stop("c", 30.0) == 143
    assert all(f.exists() for f in outs.values()) and not any(f.exists() and f.read_bytes() for f in logs.values())
    # c resumes in its allocation, appending to its output not yet copied; room comes while it runs
    steps.launch(replace(c, command="sleep 1; " + lines.format(1001, 2000)))
    assert Path(steps.outputs["c"]) == outs["c"]
    disk.full = False
    assert wait_until(lambda: steps.poll(), 120, "c's exit") == {"c": 0}
    wait_until(lambda: steps.poll() == {} and not any(f.exists() for f in outs.values()), 120, "the outputs to go")
    assert logs["a"].read_bytes() == "".join(f"line{i}\n" for i in range(1, 4_000_001)).encode()
    assert [x for x in logs["c"].read_text().splitlines() if x.startswith("line")] == [f"line{i}" for i in range(1, 2001)]


def test_a_restarted_executor_adopts_its_step_and_allocation(steps: SlurmStepsExecutor, slurm: SlurmCluster,
                                                             tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    info = steps.launch(spec("s", CMD + "; sleep 2; echo done", log, (3,)))
    again = SlurmStepsExecutor(steps.prefix, grace_s=5.0, env=slurm.env, out_dir=steps.out_dir, linger_s=1.0)
    again.read_nodes()
    (orphan,) = again.orphans()  # a step no record holds, as a restarted service sees it before adopting
    assert (orphan.job_id, orphan.pid, orphan.start_time, orphan.exit_path) == ("s", info.pid, info.start_time,
                                                                               info.exit_path)
    assert again.adopt(info) and again.alive("s") and again.orphans() == []
    assert list(again.allocs[info.pid].jobs) == ["s"]
    assert wait_until(lambda: again.poll(), 30, "the adopted step's exit") == {"s": 0}
    assert log.read_text() == "cvd=3 cpus=2 mem=300 id=gpuloom step=0\ndone\n"
    # the allocation it found is cancelled once idle; the first executor's srun is reaped there
    wait_until(lambda: again.poll() == {} and not again.allocs, 10, "the idle allocation to be cancelled")
    wait_until(lambda: steps.poll() == {"s": 0} or not steps.steps, 10, "the first srun")


def steps_named(e: SlurmStepsExecutor, name: str) -> list[str]:
    """The ids of the live steps named ``name``."""
    return [sid for sid, r in e.read_steps().items() if r.get("Name") == name]


def test_a_launch_a_dead_service_did_not_confirm_is_found_by_its_attempt(
        steps: SlurmStepsExecutor, slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch marks its step's name and its exit record's with its attempt: a restarted service's executor
    finds the step of that very launch, ended (with its code) or running, of the job's account, and no other."""
    pre = steps.launch(spec("pre", "sleep 2", tmp_path / "pre.log", (0,), attempt=1))
    assert wait_until(lambda: steps.poll(), 30, "pre's exit") == {"pre": 0}
    t0 = time.time()
    d = steps.launch(spec("ud", "exit 4", tmp_path / "ud.log", (0,), attempt=2))  # (in pre's allocation)
    e = steps.launch(spec("ue", "sleep 60", tmp_path / "ue.log", (1,), attempt=1))
    assert d.pid == pre.pid and d.start_time < t0 - 1
    assert d.exit_path.endswith(f"/ud.{d.pid}.a2.exit") and steps_named(steps, f"{steps.prefix}:ue:a1")
    again = SlurmStepsExecutor(steps.prefix, grace_s=5.0, env=slurm.env, out_dir=steps.out_dir)  # the first died
    again.read_nodes()
    wait_until(lambda: not steps_named(again, f"{steps.prefix}:ud:a2"), 30, "ud's step to end")
    found = again.launched("ud", "gpn0", 2, "gpuloom")
    assert found is not None and (found.job_id, found.node, found.pid) == ("ud", "gpn0", d.pid)
    assert t0 <= found.start_time <= time.time()  # its launch's time, not its allocation's
    assert not again.adopt(found) and again.exit_code(found) == 4 and again.exit_time(found) is not None
    assert not again.stopped(found)
    assert again.launched("ud", "gpn0", 1, "gpuloom") is None and again.launched("ud", "gpn0", 3, "gpuloom") is None
    assert again.launched("ud", "gpn0", 2, None) is None  # (launches of the service's own account: none)
    assert again.launched("ue", "gpn0", 2, "gpuloom") is None
    live = again.launched("ue", "gpn0", 1, "gpuloom")
    assert live is not None and (live.pid, live.start_time) == (e.pid, e.start_time) and live.exit_path == e.exit_path
    assert again.adopt(live) and again.alive("ue") and not again.stopped(live)
    # the service dies as its stop ends (the step ended by the stop's SIGTERM, the stop not recorded): the next
    # one takes that end for the stop's, not for the job's own
    monkeypatch.setattr(again, "_end", lambda eid: None)
    assert again.stop("ue", 5.0) == 143
    third = SlurmStepsExecutor(steps.prefix, grace_s=5.0, env=slurm.env, out_dir=steps.out_dir)
    assert third.stopped(live) and third.exit_code(live) == 143 and third.launched("ue", "gpn0", 1, "gpuloom") is None


def test_a_step_of_another_account_named_like_the_services_is_not_taken(steps: SlurmStepsExecutor, slurm: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    """Any Slurm user can name an allocation and a step of theirs like the service's: such a step is no launch of
    a job of another account's, running or ended."""
    r = slurm.run("salloc", "--no-shell", "--immediate=5", "--uid=65534", "--gid=65534",
                  f"--job-name={steps.alloc_name}", "--nodelist=gpn0", "--mem=50", "--gres=gpu:g2:1")
    sid = int(r.stderr.split("Granted job allocation ")[1].split()[0])
    try:
        srun = subprocess.Popen(
            [shutil.which("srun") or "srun", f"--jobid={sid}", "--uid=65534", "--gid=65534", "--exact", "--mem=10",
             f"--job-name={steps.prefix}:x:a2", "--chdir=/", "--output=/dev/null", "sleep", "60"],
            env=slurm.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: steps_named(steps, f"{steps.prefix}:x:a2"), 30, "the other account's step")
            assert steps.launched("x", "gpn0", 2, "gpuloom") is None and steps.launched("x", "gpn0", 2, None) is None
            # the same launch of the job's own account is found
            steps.launch(spec("x", "sleep 60", tmp_path / "x.log", (0,), attempt=2))
            mine = steps.launched("x", "gpn0", 2, "gpuloom")
            assert mine is not None and mine.pid != sid and mine.pid in steps.allocs
        finally:
            srun.kill()
            srun.wait()
    finally:
        slurm.run("scancel", str(sid), check=False)


def test_a_lost_node_cancels_its_allocations_and_their_steps(steps: SlurmStepsExecutor, slurm: SlurmCluster,
                                                             tmp_path: Path) -> None:
    info = steps.launch(spec("x", "sleep 30", tmp_path / "x.log", (0,)))
    assert steps.evict("gpn0") == ["x"] and steps.allocs == {} and steps.steps == {}
    wait_until(lambda: slurm.job(info.pid)["JobState"] == "CANCELLED", 20, "the allocation's end")
    assert steps.poll() == {}  # evicted jobs are not reported ended: the service moves them


def test_serve_slurm_steps_sigkill_then_the_new_service_adopts_the_step(serve_slurm: Any, slurm: SlurmCluster) -> None:
    s = serve_slurm("--executor", "slurm-steps")
    with s.client() as c:
        jid = submit(c, name="a", command=stepper_cmd(200, 0.05), gpus=2)
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{jid}/logs").text, 60, "progress")
    s.kill()
    (step,) = [r for r in parse_records(slurm.scontrol("show", "step")) if r["Name"].endswith(f":{jid}:a1")]
    assert step["State"] == "RUNNING"  # Slurm runs it on without the service
    s2 = serve_slurm("--executor", "slurm-steps")
    with s2.client() as c:
        row = wait_for(lambda: (j := job(c, jid))["state"] in ("finished", "failed") and j, 90, "the adopted job")
        log = c.get(f"/jobs/{jid}/logs").text
        events = [e["kind"] for e in c.get(f"/jobs/{jid}/events").json()]
    s2.stop()
    assert (row["state"], row["exit_code"], row["attempts"]) == ("finished", 0, 1), \
        (s2.state_dir / "serve.out").read_text()[-3000:]
    assert "adopt" in events and events.count("launch") == 1, events
    assert ledger(row["checkpoint_dir"]) == list(range(200))  # ran once, through the restart
    assert len(start_records(log)) == 1 and log.count("GPULOOM_PROGRESS iter=200") == 1  # its log copied once
    wait_until(lambda: not live_jobs(slurm), 30, "the allocation to be cancelled")


def test_serve_slurm_steps_preempts_and_resumes_each_step_once(serve_slurm: Any, slurm: SlurmCluster) -> None:
    """``--executor slurm-steps``: the short job that preempts the long one runs as a step in the
    long one's allocation (its account's), and the long one resumes there, every step run once."""
    s = serve_slurm("--executor", "slurm-steps", "--order", "sjf", "--grace", "10")
    short, long, _, _ = preempt_short_over_long(s, slurm)
    pids = {j: slurm_ids(s, j) for j in (short["id"], long["id"])}
    s.stop()
    long_id, short_id = long["id"], short["id"]
    assert len({*pids[long_id], *pids[short_id]}) == 1, pids
    rec = slurm.job(pids[long_id][0])
    assert rec["JobName"].endswith(".alloc") and rec["UserId"].startswith("gpuloom("), rec
    wait_until(lambda: not live_jobs(slurm), 30, "the service's allocations to be cancelled at its stop")

