"""gpuloom over a real Slurm (tests/slurm_util.py starts one here): the executor, its inventory,
and ``gpuloom serve --slurm``; plus the parsers of Slurm's output on hand-written records."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec.executor import LaunchSpec, NodeUnavailable, ProcInfo
from gpuloom.runtime.exec.identity import lookup
from gpuloom.runtime.exec.slurm import (
    SlurmExecutor,
    SlurmInventory,
    exit_of,
    gres_gpus,
    gres_indices,
    node_state_ok,
    parse_records,
    read_output,
    slurm_argv,
    slurm_node,
)
from gpuloom.runtime.exec.slurm_parse import attempt_comment, attempt_mark, owner_uid, stop_marked
from gpuloom.runtime.exec.slurm_steps import SlurmStepsExecutor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import (
    JOB_PY,
    Crash,
    Server,
    crashed_launch,
    job,
    job_writable,
    key_events,
    ledger,
    start_records,
    stepper_cmd,
    submit,
    wait_for,
)
from slurm_util import (  # noqa: F401 (*_fixture: fixtures)
    MEM_MB,
    SlurmCluster,
    preempt_short_over_long,
    serve_slurm_fixture,
    slurm_fixture,
    slurm_ids,
    slurm_jobs_cancelled_fixture,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
PY = shlex.quote(sys.executable)


# -- Slurm's output, parsed ----------------------------------------------------------------------
def test_parse_records_keeps_spaced_values_and_repeated_keys() -> None:
    text = ("NodeName=n1 Gres=gpu:g0:1,gpu:g1:1 State=IDLE+DRAIN Reason=Not responding [root@2026] CPUTot=8\n"
            "JobId=7 JobState=RUNNING JOB_GRES=gpu:g1:1 Nodes=n1 CPU_IDs=0-1 GRES=gpu:g1:1(IDX:1) "
            "TresPerNode=gres:gpu:g1:1\nNo more\n")
    recs = parse_records(text)
    assert recs[0] == {"NodeName": "n1", "Gres": "gpu:g0:1,gpu:g1:1", "State": "IDLE+DRAIN",
                       "Reason": "Not responding [root@2026]", "CPUTot": "8"}
    assert recs[1]["GRES"] == "gpu:g1:1(IDX:1)" and recs[1]["CPU_IDs"] == "0-1" and len(recs) == 2


def test_gres_and_exit_codes() -> None:
    assert gres_gpus("gpu:g0:1,gpu:g1:1(S:0),license:3") == [("g0", 1), ("g1", 1)]
    assert gres_gpus("gpu:4(S:0-1)") == [("", 4)]
    assert gres_gpus("gpu:a100:2,gpu:v100:1") == [("a100", 2), ("v100", 1)]
    assert gres_indices("gpu:g1:1(IDX:1),gpu:g3:1(IDX:3)") == [1, 3]
    assert gres_indices("gpu:3(IDX:0,2-3)") == [0, 2, 3]
    assert gres_indices("gpu:g0:0(IDX:N/A),gpu:g2:1(IDX:2)") == [2]
    assert [exit_of(c) for c in ("0:0", "3:0", "0:15", "0:9", "x")] == [0, 3, 143, 137, None]


def test_one_argv_builder_places_a_job_for_each_command() -> None:
    """sbatch, srun, a step in an allocation and salloc get the same placement from one function."""
    common = dict(name="gl:7", node="gpn0", cpus=4, mem_mb=300, gres="gpu:g1:1,gpu:g3:1", partition="gpu",
                  workdir="/w", account=(999, 995))
    place = ["--job-name=gl:7", "--nodes=1", "--ntasks=1", "--cpus-per-task=4", "--mem=300", "--nodelist=gpn0"]
    run = ["--chdir=/w", "--export=NONE", "--output=/o/7.log", "--error=/o/7.log", "--open-mode=append"]
    who = ["--uid=999", "--gid=995"]
    assert slurm_argv("sbatch", out="/o/7.log", **common) == \
        ["sbatch", "--parsable", *place, *run, "--requeue", "--gres=gpu:g1:1,gpu:g3:1", "--partition=gpu", *who]
    assert slurm_argv("srun", out="/o/7.log", **common) == \
        ["srun", "-v", *place, *run, "--input=none", "--immediate", "--gres=gpu:g1:1,gpu:g3:1", "--partition=gpu",
         *who]
    assert slurm_argv("step", out="/o/7.log", jobid=41, **common) == \
        ["srun", "-v", "--jobid=41", *place, *run, "--input=none", "--exact", "--gres=gpu:g1:1,gpu:g3:1", *who]
    assert slurm_argv("salloc", **{**common, "gres": None, "partition": None, "account": None, "mem_mb": 0}) == \
        ["salloc", "--no-shell", *place[:4], "--mem=1", "--nodelist=gpn0"]
    with pytest.raises(ValueError, match="mode 'step' with jobid None"):
        slurm_argv("step", **common)


def test_attempt_comments_name_the_launch_and_its_stop() -> None:
    assert attempt_mark(attempt_comment(3)) == (3, False) and attempt_mark(attempt_comment(3, True)) == (3, True)
    assert attempt_mark("") is None and attempt_mark("gpuloom:attempt=x") is None
    assert attempt_mark("mine gpuloom:attempt=2") is None  # (a comment someone else gave the job)
    assert stop_marked("gpuloom:attempt=2:stopped") and not stop_marked("gpuloom:attempt=2")
    assert not stop_marked("x:stopped")


def test_owner_uid_reads_scontrol_jobs_and_steps_and_sacct() -> None:
    assert owner_uid({"UserId": "gpuloom(1001)"}) == 1001 and owner_uid({"UserId": "0"}) == 0  # a job's, a step's
    assert owner_uid({"UID": "1001", "UserId": "x(7)"}) == 1001 and owner_uid({}) == -1
    assert owner_uid({"UserId": "nobody(x)"}) == -1


def test_a_launch_ended_longer_ago_than_min_job_age_is_found_in_accounting(monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld no longer holds the jobs: sacct's records (with their comments) name each launch."""
    me = os.geteuid()  # (the service's own account: launches without a user ran as it)
    acct = {"41": f"41|COMPLETED|0:0|gpuloom:attempt=1|2026-11-30T10:00:00|2026-11-30T10:05:00|gpn0|{me}",
            "42": f"42|FAILED|3:0|gpuloom:attempt=2|2026-11-30T11:00:00|2026-11-30T11:05:00|gpn0|{me}",
            "43": f"43|CANCELLED by 0|0:0|gpuloom:attempt=3|2026-11-30T12:00:00|2026-11-30T12:00:01|None assigned|{me}",
            "44": f"44|FAILED|0:15|gpuloom:attempt=4:stopped|2026-11-30T13:00:00|2026-11-30T13:05:00|gpn0|{me}",
            # another account's job named and commented like launch 2: any Slurm user can make one
            "45": f"45|COMPLETED|0:0|gpuloom:attempt=2|2026-11-30T11:01:00|2026-11-30T11:02:00|gpn0|{me + 4242}"}

    def cmd(*argv: str, **_: Any) -> str:
        if argv[0] == "scontrol":
            return ""  # (none: forgotten after MinJobAge)
        if "--name=gltest:x" in argv:
            return "\n".join(acct.values()) + "\n"
        return acct.get(argv[argv.index("-j") + 1], "") + "\n" if "-j" in argv else ""

    ex = SlurmExecutor("gltest", env={})
    monkeypatch.setattr(ex, "cmd", cmd)
    found = ex.launched("x", "gpn0", 2)
    assert found is not None and (found.pid, found.node) == (42, "gpn0") and not ex.adopt(found)
    assert ex.exit_code(found) == 3 and ex.exit_time(found) == datetime(2026, 11, 30, 11, 5).timestamp()
    assert found.start_time == datetime(2026, 11, 30, 11, 0).timestamp()
    assert (p := ex.launched("x", "gpn0", 1)) is not None and p.pid == 41 and ex.exit_code(p) == 0
    # never given a node; stopped by the service; no such launch
    assert ex.launched("x", "gpn0", 3) is None and ex.launched("x", "gpn0", 4) is None
    assert ex.launched("x", "gpn0", 5) is None and ex.launched("y", "gpn0", 2) is None


def test_node_states_and_gpu_declarations() -> None:
    assert [node_state_ok(s) for s in ("IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN", "MIXED+DRAIN", "DOWN",
                                       "IDLE*", "DOWN+NOT_RESPONDING", "IDLE+COMPLETING")] == \
        [True, True, True, False, False, False, False, False, True]
    per_device = slurm_node({"NodeName": "a", "Gres": "gpu:g0:1,gpu:g1:1,gpu:g2:1", "CPUTot": "8",
                             "RealMemory": "1000", "State": "IDLE", "Partitions": "gpu,all"})
    assert per_device is not None
    assert (per_device.gpus, per_device.types, per_device.gpu_type, per_device.cpus, per_device.mem_mb,
            per_device.partitions) == (3, ("g0", "g1", "g2"), "generic", 8, 1000, ("gpu", "all"))
    model = slurm_node({"NodeName": "b", "Gres": "gpu:a100:4", "CPUTot": "16", "RealMemory": "9", "State": "MIXED"})
    assert model is not None and (model.gpus, model.types, model.gpu_type) == (4, (), "a100")
    assert slurm_node({"NodeName": "c", "Gres": "(null)", "CPUTot": "4", "State": "IDLE"}) is None


def test_job_output_is_copied_only_from_a_plain_file_of_its_owner(tmp_path: Path) -> None:
    """The job's account owns its output directory: a link it puts there is never followed by the service."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    d = tmp_path / "out"
    d.mkdir()
    (d / "ok.log").write_bytes(b"line 1\nline 2\n")
    (d / "sym.log").symlink_to(secret)
    os.link(secret, d / "hard.log")
    os.mkfifo(d / "fifo.log")
    assert read_output(str(d / "ok.log"), 7) == b"line 2\n"
    assert [read_output(str(d / f), 0) for f in ("sym.log", "hard.log", "fifo.log", "none.log")] == [None] * 4
    if os.geteuid() == 0:  # a file of another owner than the directory's
        os.chown(d / "ok.log", 65534, 65534)
        assert read_output(str(d / "ok.log"), 0) is None


# -- the test Slurm itself -----------------------------------------------------------------------
def test_sbatch_runs_a_job_on_the_pinned_gpus(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The harness works: a typed-gres job gets exactly the GPU indices it named."""
    out = tmp_path / "out.log"
    r = slurm.run("sbatch", "--parsable", f"--output={out}", "--gres=gpu:g2:1", "--mem=10", "--cpus-per-task=1",
                  f"--chdir={tmp_path}", "--wrap", "echo cvd=$CUDA_VISIBLE_DEVICES")
    sid = r.stdout.strip()
    wait_until(lambda: slurm.job(sid).get("JobState") == "COMPLETED", 30, f"job {sid} to complete", slurm.logs)
    assert slurm.job(sid)["ExitCode"] == "0:0"
    assert out.read_text() == "cvd=2\n"


# -- the executor against the test Slurm -----------------------------------------------------------

SLEEPY = REPO / "examples" / "sleepy_train.py"


def jobs_ended(slurm: SlurmCluster) -> None:
    wait_until(lambda: not slurm.scontrol("show", "job").strip().startswith("JobId") or
               all(r.get("JobState") not in ("RUNNING", "COMPLETING", "CONFIGURING")
                   for r in parse_records(slurm.scontrol("show", "job"))), 30, "jobs to end",
               lambda: slurm.scontrol("show", "job"))


@pytest.fixture
def ex(slurm: SlurmCluster) -> Iterator[SlurmExecutor]:
    e = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env, start_wait_s=20.0)
    e.read_nodes()
    yield e
    slurm.cancel_all()
    jobs_ended(slurm)


def sleepy(steps: int, ckpt: Path, step_s: float = 0.05) -> str:
    return (f"{PY} {SLEEPY} --steps {steps} --step-s {step_s} --checkpoint-every 1 --checkpoint-dir {ckpt} "
            f"--ledger {ckpt}/ledger")


def spec(eid: str, command: str, log: Path, gpus: tuple[int, ...] = (), cpus: int = 1, mem: int = 200,
         attempt: int = 0, **env: str) -> LaunchSpec:
    return LaunchSpec(eid, command, "gpn0", gpus, tuple(range(cpus)), mem, str(log), env, attempt=attempt)


def test_launch_places_the_job_on_the_chosen_gpus_cores_and_memory(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    log = tmp_path / "j1.log"
    cmd = 'echo "cvd=$CUDA_VISIBLE_DEVICES cpus=$GPULOOM_CPUS mem=$GPULOOM_MEM_MB x=$X attempt=$GPULOOM_ATTEMPT"'
    info = ex.launch(spec("j1", cmd, log, gpus=(1, 3), cpus=2, mem=300, X="a b $(echo no) ';\"`"))
    rec = wait_until(lambda: (r := slurm.job(info.pid))["JobState"] != "PENDING" and r, 30, "the start")
    assert rec["JobName"] == "gltest:j1" and rec["NodeList"] == "gpn0"
    assert slurm.scontrol("show", "job", "-d", str(info.pid)).count("GRES=gpu:g1:1(IDX:1),gpu:g3:1(IDX:3)") == 1
    assert (rec["NumCPUs"], rec["MinMemoryNode"]) == ("2", "300M")
    got = wait_until(lambda: ex.poll(), 30, "the job's exit")
    assert got == {"j1": 0}
    assert log.read_text() == "cvd=1,3 cpus=2 mem=300 x=a b $(echo no) ';\"` attempt=1\n"  # values stay data
    assert ex.poll() == {} and "j1" not in ex.procs


def test_a_batch_job_of_an_account_has_its_groups_only(slurm: SlurmCluster, tmp_path: Path) -> None:
    """sbatch as root with --uid alone would leave the job root's group: the launch names the account's."""
    e = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env, start_wait_s=20.0,
                      out_dir=str(job_writable(tmp_path) / "out"))
    e.read_nodes()
    log = job_writable(tmp_path) / "g.log"
    try:
        info = e.launch(LaunchSpec("g", 'echo "id=$(id -un):$(id -g):$(id -G)"', "gpn0", (0,), (0,), 100, str(log),
                                   {}, None, "gpuloom"))
        assert wait_until(lambda: e.poll(), 30, "the job's exit") == {"g": 0}
        acc = lookup("gpuloom")
        assert slurm.job(info.pid)["GroupId"].startswith("gpuloom(")
        assert log.read_text() == f"id=gpuloom:{acc.gid}:{' '.join(str(g) for g in acc.groups)}\n"
    finally:
        slurm.cancel_all()
        jobs_ended(slurm)


def test_exit_codes_and_reasons_read_back(ex: SlurmExecutor, tmp_path: Path) -> None:
    ex.launch(spec("bad", "exit 3", tmp_path / "bad.log"))
    ex.launch(spec("sig", "kill -KILL $$", tmp_path / "sig.log"))
    got: dict[str, int | None] = {}
    wait_until(lambda: got.update(ex.poll()) or len(got) == 2, 30, "both exits")
    assert got == {"bad": 3, "sig": 137}
    assert ex.end_reason("bad") is None


def test_gpus_held_by_a_job_submitted_directly_are_not_overlaid(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                tmp_path: Path) -> None:
    r = slurm.run("sbatch", "--parsable", "--gres=gpu:g0:1", "--mem=10", f"--output={tmp_path}/o",
                  f"--chdir={tmp_path}", "--wrap", "sleep 60")
    sid = r.stdout.strip()
    wait_until(lambda: slurm.job(sid).get("JobState") == "RUNNING", 30, "the direct job to run")
    with pytest.raises(NodeUnavailable, match=r"GPU\(s\) \[0\] of gpn0 are held by jobs submitted to Slurm"):
        ex.launch(spec("j2", "true", tmp_path / "j2.log", gpus=(0, 1)))
    assert not [rec for rec in parse_records(slurm.scontrol("show", "job")) if rec["JobName"] == "gltest:j2"]
    ex.launch(spec("j3", "true", tmp_path / "j3.log", gpus=(1,)))  # other GPUs: fine
    assert wait_until(lambda: ex.poll(), 30, "j3's exit") == {"j3": 0}


def test_a_launch_does_not_wait_and_one_slurm_does_not_start_is_cancelled(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    """A Slurm reservation (the node stays up) keeps ours pending: reported ended after ``start_wait_s``."""
    slurm.run("scontrol", "create", "reservation", "ReservationName=gltest", "Users=root", f"Nodes={slurm.node}",
              "StartTime=now", "Duration=10", "Flags=IGNORE_JOBS")
    try:
        ex.start_wait_s = 2.0
        t0 = time.monotonic()
        info = ex.launch(spec("w", "true", tmp_path / "w.log", gpus=(1,), mem=200))
        assert time.monotonic() - t0 < 2.0 and slurm.job(info.pid)["JobState"] == "PENDING"
        assert ex.alive("w") and ex.poll() == {}
        assert wait_until(lambda: ex.poll(), 20, "the launch to be given up") == {"w": None}
        why = ex.end_reason("w") or ""
    finally:
        slurm.run("scontrol", "delete", "ReservationName=gltest")
    assert re.fullmatch(rf"Slurm did not start its job {info.pid} within 2 s \(Reason=\S+\): cancelled", why), why
    assert slurm.job(info.pid)["JobState"] == "CANCELLED" and "w" not in ex.procs


def test_cores_and_memory_held_by_a_job_submitted_directly_refuse_a_launch(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    r = slurm.run("sbatch", "--parsable", "--gres=gpu:g0:1", f"--mem={MEM_MB - 300}", "--cpus-per-task=6",
                  f"--output={tmp_path}/o", f"--chdir={tmp_path}", "--wrap", "sleep 60")
    wait_until(lambda: slurm.job(r.stdout.strip()).get("JobState") == "RUNNING", 30, "the direct job to run")
    with pytest.raises(NodeUnavailable, match=r"^job m: gpn0 has 2 core\(s\) and 300 MB free \(jobs submitted to "
                                              r"Slurm directly hold 6 and 7700 MB\), it needs 1 and 400 MB$"):
        ex.launch(spec("m", "true", tmp_path / "m.log", gpus=(1,), mem=400))
    with pytest.raises(NodeUnavailable, match="it needs 3 and 100 MB"):
        ex.launch(spec("c", "true", tmp_path / "c.log", gpus=(1,), cpus=3, mem=100))
    ex.launch(spec("ok", "true", tmp_path / "ok.log", gpus=(1,), cpus=2, mem=300))  # what is left: fine
    assert wait_until(lambda: ex.poll(), 30, "its exit") == {"ok": 0}


@pytest.fixture
def ex_out(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmExecutor]:
    """An executor whose jobs' output (and exit records) Slurm writes under ``out_dir``, as the service's."""
    e = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env, start_wait_s=20.0, out_dir=str(tmp_path / "out"))
    e.read_nodes()
    yield e
    slurm.cancel_all()


def test_the_exit_record_of_the_batch_script_reports_the_end(ex_out: SlurmExecutor, slurm: SlurmCluster,
                                                             tmp_path: Path) -> None:
    log = tmp_path / "o.log"
    info = ex_out.launch(spec("o", "echo hi", log))
    assert wait_until(lambda: ex_out.poll(), 30, "the exit") == {"o": 0}
    assert log.read_text() == "hi\n" and os.listdir(tmp_path / "out" / "_server") == []  # copied, then removed
    wait_until(lambda: slurm.job(info.pid)["JobState"] == "COMPLETED", 30, "Slurm's end")


def test_an_exit_record_that_is_not_a_plain_file_is_refused_and_logged_once(ex_out: SlurmExecutor,
                                                                           slurm: SlurmCluster, tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    info = ex_out.launch(spec("h", "sleep 60", tmp_path / "h.log", gpus=(3,)))
    wait_until(lambda: slurm.job(info.pid)["JobState"] == "RUNNING", 30, "the job to run")
    zero = tmp_path / "zero"
    zero.write_text("0\n")
    record = tmp_path / "out" / "_server" / f"h.{info.pid}.exit"
    os.link(zero, record)  # a second name of a file it does not own alone
    for _ in range(3):
        assert ex_out.poll() == {}
    assert [r.getMessage() for r in caplog.records if "not a plain file" in r.getMessage()] == \
        [f"{record}: not a plain file of its directory's owner: not copied"]
    assert ex_out.stop("h", 5.0) == 143 and not record.exists()  # removed with the job's other files


def test_an_exit_record_ends_the_job_at_once_and_one_that_lies_is_cancelled(ex_out: SlurmExecutor,
                                                                            slurm: SlurmCluster,
                                                                            tmp_path: Path) -> None:
    """Only a clean exit is taken from the record (a failure waits for Slurm's reason); a job that wrote
    one and runs on is cancelled in Slurm after ENDED_GRACE_S."""
    info = ex_out.launch(spec("f", "sleep 60", tmp_path / "f.log", gpus=(2,)))
    wait_until(lambda: slurm.job(info.pid)["JobState"] == "RUNNING", 30, "the job to run")
    record = tmp_path / "out" / "_server" / f"f.{info.pid}.exit"
    record.write_text("3\n")
    assert ex_out.poll() == {}
    record.write_text("0\n")
    t0 = time.monotonic()
    assert ex_out.poll() == {"f": 0} and not record.exists()
    assert slurm.job(info.pid)["JobState"] == "RUNNING"
    ex_out.launch(spec("g", "true", tmp_path / "g.log", gpus=(2,)))  # f's GPU: ours, not refused as another's
    got: dict[str, int | None] = {}
    wait_until(lambda: got.update(ex_out.poll()) or "g" in got, 30, "g's exit")
    assert got == {"g": 0} and slurm.job(info.pid)["JobState"] == "CANCELLED"
    assert time.monotonic() - t0 >= 5.0  # g waited in Slurm for f's GPU until f was cancelled


def test_preempt_and_resume_keep_the_slurm_job_and_run_each_step_once(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                     tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "p.log"
    s = spec("p", sleepy(40, ckpt), log, gpus=(2,), cpus=1, GPULOOM_CHECKPOINT_DIR=str(ckpt), GPULOOM_ATTEMPT="1")
    first = ex.launch(s)
    wait_until(lambda: "iter=5" in log.read_text(), 30, "some progress")
    assert ex.stop("p", 10.0) == 143
    held = slurm.job(first.pid)
    assert (held["JobState"], held["Reason"]) == ("PENDING", "job_requeued_in_held_state")
    # the relaunch comes before a poll re-reads Slurm: what the executor read last predates the requeue
    ex.jobs[first.pid] = {**ex.jobs[first.pid], "JobState": "COMPLETING"}
    ex._read_at = time.monotonic()
    t0 = time.monotonic()
    again = ex.launch(LaunchSpec(**{**{f: getattr(s, f) for f in s.__slots__}, "mem_mb": 250,  # type: ignore[attr-defined]
                                    "env": {**s.env, "GPULOOM_RESUME": "1", "GPULOOM_ATTEMPT": "2"}}))
    assert time.monotonic() - t0 < 15  # not Slurm's 121 s requeue delay
    assert again.pid == first.pid
    assert wait_until(lambda: ex.poll(), 60, "the resumed job's exit") == {"p": 0}, log.read_text() + slurm.logs()
    rec = slurm.job(first.pid)
    assert (rec["Restarts"], rec["MinMemoryNode"]) == ("1", "250M")
    steps = [int(x) for x in (ckpt / "ledger").read_text().split()]
    assert steps == list(range(1, 41))
    text = log.read_text()
    assert text.count("resumed from ") == 1 and text.count("checkpointed at step") == 1 and "result=820" in text


def test_relaunch_on_other_gpus_submits_a_new_job(ex: SlurmExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    """Slurm 22.05 piles gres Types up when a held job is re-pinned: a move gets a fresh Slurm job."""
    log = tmp_path / "m.log"
    first = ex.launch(spec("m", 'echo "cvd=$CUDA_VISIBLE_DEVICES resume=${GPULOOM_RESUME-}"; sleep 30', log,
                           gpus=(0,)))
    wait_until(lambda: "cvd=" in log.read_text(), 30, "the first run")
    ex.stop("m", 2.0)
    second = ex.launch(spec("m", 'echo "cvd=$CUDA_VISIBLE_DEVICES resume=${GPULOOM_RESUME-}"; sleep 30', log,
                            gpus=(3,), GPULOOM_RESUME="1"))
    assert second.pid != first.pid
    wait_until(lambda: log.read_text().count("cvd=") == 2, 30, "the second run")
    assert [ln for ln in log.read_text().splitlines() if ln.startswith("cvd=")] == ["cvd=0 resume=", "cvd=3 resume=1"]
    assert slurm.job(first.pid).get("JobState") == "CANCELLED"


# -- gpuloom serve --slurm ------------------------------------------------------------------------------
def test_serve_slurm_places_preempts_and_resumes_each_step_once(serve_slurm: Any, slurm: SlurmCluster) -> None:
    s = serve_slurm("--order", "sjf", "--grace", "10")
    with s.client() as c:
        assert [(n["name"], n["gpus"]) for n in c.get("/nodes").json()] == [("gpn0", 4)]
    _, long, _, short_log = preempt_short_over_long(s, slurm)
    long_id = long["id"]
    assert long["attempts"] == 2
    (short_rec,) = start_records(short_log)
    assert len(short_rec["cvd"].split(",")) == 2
    # the resumed launch is the same Slurm job, released again (Slurm counts the restart)
    first, again = slurm_ids(s, long_id)
    assert first == again
    # (the service takes a clean exit from the job's exit record, before Slurm has torn the job down)
    rec = wait_until(lambda: (r := slurm.job(first)).get("JobState") not in ("RUNNING", "COMPLETING") and r, 60,
                     "Slurm's teardown")
    assert (rec["JobName"], rec["Restarts"], rec["JobState"]) == (f"gpuloom-{service_id(s)}:{long_id}", "1",
                                                                   "COMPLETED")
    assert rec["UserId"].startswith("gpuloom(")  # the job's own account, not root


def test_serve_slurm_resizes_a_running_job_by_a_stop_and_a_relaunch(serve_slurm: Any, slurm: SlurmCluster) -> None:
    """Elastic sizing gives a lone job the node's 4 GPUs, then shrinks it to 2 when a second job comes:
    a stop (checkpoint, requeued held) and a relaunch on other GPUs, which is a new Slurm job."""
    s = serve_slurm("--size", "elastic")
    curve = [1.0, 2.0, 3.0, 4.0]
    with s.client() as c:
        # (a is resized once out of its protection: 3 x its launch time, which Slurm's start makes 1-4 s)
        a = submit(c, name="a", command=stepper_cmd(500, 0.04), gpus=1, throughput=curve)
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{a}/logs").text, 60, "a's progress")
        b = submit(c, name="b", command=stepper_cmd(10, 0.05), gpus=1, throughput=curve)
        rows = {j: wait_for(lambda j=j: (x := job(c, j))["state"] == "finished" and x, 120, f"job {j}") for j in (a, b)}
        log_a = c.get(f"/jobs/{a}/logs").text
        ev_a = c.get(f"/jobs/{a}/events").json()
    launches = [e for e in ev_a if e["kind"] in ("launch", "resize")]
    assert [e["kind"] for e in launches][:2] == ["launch", "resize"]
    assert [len(e["detail"]["alloc"]["parts"][0]["gpus"]) for e in launches][:2] == [4, 2]
    recs = start_records(log_a)
    assert [len(r["cvd"].split(",")) for r in recs][:2] == [4, 2] and recs[1]["resume"] == "1"
    assert ledger(rows[a]["checkpoint_dir"]) == list(range(500)) and ledger(rows[b]["checkpoint_dir"]) == list(range(10))
    first, second = slurm_ids(s, a)[:2]
    assert first != second and slurm.job(first)["JobState"] == "CANCELLED"  # the held one, not reused elsewhere


def service_id(s: Server) -> str:
    from gpuloom.runtime.state.store import Store

    store = Store(f"sqlite:///{s.state_dir / 'gpuloom.db'}")
    try:
        return str(store.get_meta("service_id"))
    finally:
        store.close()


def events_of(s: Server, jid: int) -> list[str]:
    with s.client() as c:
        return key_events(c.get(f"/jobs/{jid}/events").json())


def test_service_sigkill_then_the_new_service_adopts_its_slurm_job(serve_slurm: Any, slurm: SlurmCluster) -> None:
    s = serve_slurm()
    with s.client() as c:
        jid = submit(c, name="a", command=stepper_cmd(400, 0.05), gpus=2)
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{jid}/logs").text, 60, "progress")
    (sid,) = slurm_ids(s, jid)
    s.kill()
    assert slurm.job(sid)["JobState"] == "RUNNING"  # Slurm runs it on without the service
    s2 = serve_slurm()
    with s2.client() as c:
        row = wait_for(lambda: (j := job(c, jid))["state"] in ("finished", "failed") and j, 90, "the adopted job")
        log = c.get(f"/jobs/{jid}/logs").text
    assert row["state"] == "finished" and row["exit_code"] == 0 and row["attempts"] == 1
    assert events_of(s2, jid) == ["submit", "launch", "adopt", "finished"], (s2.state_dir / "serve.out").read_text()
    assert ledger(row["checkpoint_dir"]) == list(range(400))  # ran once, through the restart
    assert len(start_records(log)) == 1 and log.count("GPULOOM_PROGRESS iter=400") == 1  # its log copied once
    rec = wait_until(lambda: (r := slurm.job(sid)).get("JobState") not in ("RUNNING", "COMPLETING") and r, 60,
                     "Slurm's teardown")
    assert (rec["Restarts"], rec["JobState"]) == ("0", "COMPLETED")


def test_slurmctld_restart_loses_no_job(serve_slurm: Any, slurm: SlurmCluster, tmp_path: Path) -> None:
    s = serve_slurm()
    go = job_writable(tmp_path) / "go"  # (the job ends once the controller is back, however long its stop took)
    with s.client() as c:
        jid = submit(c, name="a", command=f"STEPPER_HOLD={go} {stepper_cmd(60, 0.1)}", gpus=1)
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{jid}/logs").text, 60, "progress")
        slurm.stop_daemon("slurmctld")
        time.sleep(1.0)  # the service's loop meets a controller that does not answer
        assert job(c, jid)["state"] in ("running", "running_protected")
        slurm.start_ctld()
        go.touch()
        row = wait_for(lambda: (j := job(c, jid))["state"] in ("finished", "failed") and j, 90, "the job")
    assert (row["state"], row["exit_code"], row["attempts"]) == ("finished", 0, 1)
    assert ledger(row["checkpoint_dir"]) == list(range(60))


def test_drained_node_gets_no_new_job_and_keeps_its_running_one(serve_slurm: Any, slurm: SlurmCluster,
                                                                 tmp_path: Path) -> None:
    s = serve_slurm()
    go = job_writable(tmp_path) / "go"  # (a ends once the node is back: it must still run when it is checked)
    try:
        with s.client() as c:
            a = submit(c, name="a", command=f"STEPPER_HOLD={go} {stepper_cmd(40, 0.1)}", gpus=1)
            wait_for(lambda: "GPULOOM_PROGRESS iter=2" in c.get(f"/jobs/{a}/logs").text, 60, "progress")
            slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN", "Reason=gpuloom-test")
            b = submit(c, name="b", command=stepper_cmd(2, 0.05), gpus=1)
            time.sleep(2.0)  # rounds go by: b is planned onto the drained node and refused there
            assert job(c, b)["state"] not in ("running", "running_protected", "finished", "launching")
            assert job(c, a)["state"] in ("running", "running_protected")
            resumed = time.time()
            slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")
            go.touch()
            rows = [wait_for(lambda i=i: (j := job(c, i))["state"] in ("finished", "failed") and j, 90, f"job {i}")
                    for i in (a, b)]
    finally:
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME", check=False)
    assert [(r["state"], r["exit_code"], r["attempts"] >= 1) for r in rows] == [("finished", 0, True)] * 2
    assert rows[0]["attempts"] == 1 and ledger(rows[0]["checkpoint_dir"]) == list(range(40))
    assert datetime.fromisoformat(rows[1]["first_start"]).timestamp() > resumed  # b started once the node was back


def test_evict_requeues_the_job_held_and_a_relaunch_resumes_it(ex: SlurmExecutor, slurm: SlurmCluster,
                                                               tmp_path: Path) -> None:
    """What a lost node's jobs get: requeued held (Slurm's SIGTERM, checkpoint), not reported as exits."""
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "e.log"
    s = spec("e", sleepy(30, ckpt), log, gpus=(0,), GPULOOM_CHECKPOINT_DIR=str(ckpt))
    first = ex.launch(s)
    wait_until(lambda: "iter=4" in log.read_text(), 30, "progress")
    assert ex.evict("gpn0") == ["e"]
    wait_until(lambda: slurm.job(first.pid).get("Reason") == "job_requeued_in_held_state", 30, "the held job")
    assert ex.poll() == {} and not ex.alive("e")
    wait_until(lambda: "checkpointed at step" in log.read_text(), 30, "the checkpoint on SIGTERM")
    ex.launch(LaunchSpec("e", s.command, "gpn0", (1,), (0,), 200, str(log), {**s.env, "GPULOOM_RESUME": "1"}))
    assert wait_until(lambda: ex.poll(), 60, "the resumed job's exit") == {"e": 0}
    assert [int(x) for x in (ckpt / "ledger").read_text().split()] == list(range(1, 31))


def test_inventory_follows_slurm_nodes(ex: SlurmExecutor, slurm: SlurmCluster) -> None:
    inv = SlurmInventory(ex, every_s=0.0)
    assert [(n.name, n.gpus, n.cpus, n.mem_mb, n.gpu_type) for n in inv.current.nodes] == \
        [("gpn0", 4, 8, 8000, "generic")]
    assert ex.nodes["gpn0"].types == ("g0", "g1", "g2", "g3")
    assert ex.rendezvous("gpn0")[0] == "127.0.0.1"  # the node's NodeAddr
    assert inv.poll() is None
    try:
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN", "Reason=gpuloom-test")
        assert inv.poll() is None  # no node left up: the inventory is kept
        assert not ex.nodes["gpn0"].up
        with pytest.raises(NodeUnavailable, match="Slurm node 'gpn0' is not up now"):
            ex.launch(spec("x", "true", Path("/dev/null")))
    finally:
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")
    wait_until(lambda: inv.poll() is None and ex.nodes["gpn0"].up, 10, "the node to be up again")


def test_held_jobs_are_cancelled_when_no_relaunch_comes_even_after_a_restart(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    first = ex.launch(spec("h", "sleep 30", tmp_path / "h.log"))
    wait_until(lambda: slurm.job(first.pid)["JobState"] == "RUNNING", 30, "the start")  # (launch does not wait)
    assert ex.stop("h", 5.0) == 143
    assert slurm.job(first.pid)["Reason"] == "job_requeued_in_held_state"
    later = SlurmExecutor("gltest", env=slurm.env, hold_s=0.0)  # a restarted service, which never relaunches it
    assert later.poll() == {}
    wait_until(lambda: slurm.job(first.pid).get("JobState") == "CANCELLED", 10, "the held job to be cancelled")
    assert later.held == {}


def test_a_job_done_before_its_stop_is_not_kept_held(ex: SlurmExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    info = ex.launch(spec("d", "true", tmp_path / "d.log"))
    wait_until(lambda: slurm.job(info.pid).get("JobState") == "COMPLETED", 30, "the job to complete")
    assert ex.stop("d", 2.0) == 0
    assert slurm.job(info.pid)["JobState"] == "COMPLETED" and ex.held == {} and ex.poll() == {}


def test_a_launch_a_dead_service_did_not_confirm_is_found_by_its_attempt(ex: SlurmExecutor, slurm: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    """Each launch marks its Slurm job with its attempt (its Comment), and a stop marks it too: a restarted
    service's executor finds the job of that very launch, ended (with its code) or running, and no other."""
    d = ex.launch(spec("ud", "exit 4", tmp_path / "ud.log", attempt=2))
    e = ex.launch(spec("ue", "sleep 60", tmp_path / "ue.log", attempt=1))
    again = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env)  # the service that launched them died
    again.read_nodes()
    wait_until(lambda: slurm.job(d.pid)["JobState"] == "FAILED", 30, "ud's end")
    found = again.launched("ud", "gpn0", 2)
    assert found is not None and (found.pid, found.node) == (d.pid, "gpn0") and not again.adopt(found)
    assert again.exit_code(found) == 4 and again.exit_time(found) is not None and not again.stopped(found)
    assert again.launched("ud", "gpn0", 1) is None and again.launched("ue", "gpn0", 2) is None
    live = again.launched("ue", "gpn0", 1)
    assert live is not None and live.pid == e.pid and again.adopt(live) and not again.stopped(live)
    wait_until(lambda: slurm.job(e.pid)["JobState"] == "RUNNING", 30, "ue's start")
    assert ex.stop("ue", 5.0) == 143
    assert again.launched("ue", "gpn0", 1) is None and again.stopped(live)  # stopped: not an end of its own
    # its relaunch (the held Slurm job released) is launch 2, found by that attempt alone
    ex.launch(spec("ue", "sleep 60", tmp_path / "ue.log", attempt=2))
    resumed = wait_until(lambda: ex.poll() == {} and again.launched("ue", "gpn0", 2), 30, "the release")
    assert resumed.pid == e.pid and again.launched("ue", "gpn0", 1) is None and not again.stopped(resumed)


class CrashAfterLaunch(SlurmExecutor):
    """The server dies right after Slurm took its first launch, before the launch was confirmed."""

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        super().launch(spec)
        raise Crash


class CrashAfterStep(SlurmStepsExecutor):
    """The server dies right after Slurm started its first launch's step, before the launch was confirmed."""

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        super().launch(spec)
        raise Crash


class Servers:
    """One store and job directory, and the servers started on them one after the other (``launcher``'s:
    ``sbatch``, ``srun``, or ``steps`` for the steps executor)."""

    def __init__(self, slurm: SlurmCluster, tmp_path: Path, launcher: str) -> None:
        self.slurm, self.tmp_path, self.launcher = slurm, tmp_path, launcher
        self.dir = job_writable(tmp_path)
        self.store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        self.prefix = f"glunc{uuid.uuid4().hex[:6]}"
        self.servers: list[Service] = []

    def server(self, crash: bool = False) -> Service:
        """The next server; ``crash``: it dies right after its first launch (:class:`CrashAfterLaunch`)."""
        # (as serve --slurm makes it: Slurm writes the jobs' output under the job directory)
        out = str(self.dir / "jobs" / "slurm-out")
        ex: SlurmExecutor
        if self.launcher == "steps":
            ex = (CrashAfterStep if crash else SlurmStepsExecutor)(self.prefix, grace_s=5.0, env=self.slurm.env,
                                                                   out_dir=out)
        else:
            ex = (CrashAfterLaunch if crash else SlurmExecutor)(self.prefix, grace_s=5.0, env=self.slurm.env,
                                                                out_dir=out, launcher=self.launcher)
        ex.read_nodes()
        svc = Service(self.store, ex.cluster(), ex, Scheduler.from_names(),
                      ServiceConfig(self.tmp_path / "state", job_dir=self.dir / "jobs", round_s=1000.0, grace_s=5.0))
        self.servers.append(svc)
        return svc

    def crashed_launch(self, command: str) -> int:
        """Submit a job whose first launch the server does not live to confirm: only its intent is stored."""
        return crashed_launch(self.server(crash=True), command, "gpn0")

    def slurm_state(self, jid: int) -> str | None:
        """The state of the Slurm job of gpuloom job ``jid`` (its latest); for steps, of its step (of its first
        launch), "ENDED" once it is gone."""
        if self.launcher == "steps":
            name = f"{self.prefix}:{jid}:a1"
            recs = [r for r in parse_records(self.slurm.scontrol("show", "step")) if r.get("Name") == name]
            return recs[-1].get("State") if recs else "ENDED"
        recs = [r for r in parse_records(self.slurm.scontrol("show", "job")) if r.get("JobName") == f"{self.prefix}:{jid}"]
        return recs[-1].get("JobState") if recs else None

    def close(self) -> None:
        for svc in reversed(self.servers):
            svc.terminate_all()
        for svc in self.servers[:-1]:  # (the servers that died: their threads alone)
            svc.actuator.close()
        if self.servers:
            self.servers[-1].shutdown()
        self.store.close()
        self.slurm.cancel_all()
        self.slurm.run("scancel", "--user=gpuloom", check=False)  # (a crashed server's allocation of the job's account)
        jobs_ended(self.slurm)  # (the next test's GPUs are free once they have ended)


@pytest.fixture
def servers(slurm: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Servers]:
    w = Servers(slurm, tmp_path, getattr(request, "param", "sbatch"))
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("servers", ["sbatch", "srun", "steps"], indirect=True)
def test_a_slurm_job_that_ended_after_its_server_died_unconfirmed_ends_once(servers: Servers) -> None:
    """The server dies between a launch's intent and its confirmation; the Slurm job (or step) ends on its own
    before the next server starts: that server finds it by its attempt, ends the job with its code, and never
    runs it again."""
    ledger = servers.dir / "ledger"
    jid = servers.crashed_launch(f"echo ran >> {ledger}; exit 3")
    ended = "ENDED" if servers.launcher == "steps" else "FAILED"
    wait_until(lambda: servers.slurm_state(jid) == ended, 60, "the Slurm job's end")
    svc = servers.server()
    svc.recover()
    row = servers.store.get_job(jid)
    assert row is not None and (row.state, row.exit_code, row.attempts) == ("failed", 3, 1), row.reason
    assert row.reason == f"process {jid} ended with code 3 while the service was down, its launch unconfirmed"
    for _ in range(3):
        svc.round()
    assert ledger.read_text() == "ran\n"
    kinds = [e["kind"] for e in servers.store.events(jid)]
    assert "launch" not in kinds and kinds.index("launch-unconfirmed") < kinds.index("failed"), kinds


@pytest.mark.parametrize("servers", ["sbatch", "steps"], indirect=True)
def test_a_slurm_job_still_running_after_its_server_died_unconfirmed_is_stopped_and_runs_again(
        servers: Servers) -> None:
    ledger, go = servers.dir / "ledger", servers.dir / "go"
    jid = servers.crashed_launch(f"echo started >> {ledger}; until [ -e {go} ]; do sleep 0.05; done; "
                                 f"echo ran >> {ledger}")
    wait_until(ledger.exists, 60, "the job to start")
    svc = servers.server()
    svc.recover()  # its Slurm job is stopped (SIGTERM: the shell ends with 143), the gpuloom job queued again
    row = servers.store.get_job(jid)
    assert row is not None and row.state == "waiting_for_initial_resource" and row.procs is None
    found = [e["detail"] for e in servers.store.events(jid) if e["kind"] == "launch-unconfirmed"]
    assert [f["found"] for f in found] == ["still running: stopped"]
    go.touch()

    def final() -> Any:
        svc.round()
        r = servers.store.get_job(jid)
        return r if r is not None and r.state in ("finished", "failed", "cancelled") else None

    row = wait_until(final, 90, "the job to end")
    assert (row.state, row.attempts) == ("finished", 2) and ledger.read_text() == "started\nstarted\nran\n"
    if servers.launcher == "steps":  # the first launch's files (its script, srun's messages, its exit) went with it
        assert not list((servers.dir / "jobs" / "slurm-out").rglob(f"*{jid}.*.a1.*"))


def test_serve_slurm_plans_around_a_job_submitted_directly(serve_slurm: Any, slurm: SlurmCluster,
                                                           tmp_path: Path) -> None:
    """A job submitted to Slurm directly holds GPUs 0 and 1: gpuloom's plan puts its jobs on 2 and 3,
    and the one that does not fit beside them waits (not failed, not refused at launch) until they end."""
    r = slurm.run("sbatch", "--parsable", "--gres=gpu:g0:1,gpu:g1:1", "-c", "2", "--mem=500",
                  f"--output={tmp_path}/direct.out", f"--chdir={tmp_path}", "--wrap", "sleep 300")
    direct = r.stdout.strip()
    wait_until(lambda: slurm.job(direct).get("JobState") == "RUNNING", 30, "the direct job to run")
    s = serve_slurm()
    with s.client() as c:
        a = submit(c, name="a", command=stepper_cmd(20, 0.1), gpus=2)
        b = submit(c, name="b", command=stepper_cmd(3, 0.05), gpus=2)
        rows = {j: wait_for(lambda j=j: (x := job(c, j))["state"] in ("finished", "failed") and x, 90, f"job {j}")
                for j in (a, b)}
        logs = {j: c.get(f"/jobs/{j}/logs").text for j in (a, b)}
    for j in (a, b):
        assert (rows[j]["state"], rows[j]["attempts"]) == ("finished", 1)
        assert [r["cvd"] for r in start_records(logs[j])] == ["2,3"]
        assert events_of(s, j) == ["submit", "launch", "finished"]
    spans = sorted((datetime.fromisoformat(rows[j]["first_start"]), datetime.fromisoformat(rows[j]["end_time"]))
                   for j in (a, b))
    assert spans[0][1] <= spans[1][0]  # whichever the plan took first, the other waited for its GPUs
    assert slurm.job(direct)["JobState"] == "RUNNING"  # untouched


# -- the srun launcher: an allocation with one step per job ------------------------------------------
@pytest.fixture
def ex_srun(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmExecutor]:
    """An executor launching with srun, its output under a directory the job account reaches."""
    e = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env, start_wait_s=20.0,
                      out_dir=str(job_writable(tmp_path) / "out"), launcher="srun")
    e.read_nodes()
    jobs_ended(slurm)  # (a service's jobs from an earlier test may still be completing)
    yield e
    slurm.cancel_all()
    slurm.run("scancel", "--user=gpuloom", check=False)
    jobs_ended(slurm)


def test_srun_launch_runs_as_the_account_on_the_chosen_gpus_and_a_new_executor_adopts_it(
        ex_srun: SlurmExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    cmd = 'echo "cvd=$CUDA_VISIBLE_DEVICES cpus=$GPULOOM_CPUS id=$(id -un):$(id -G)"; sleep 2; echo done'
    info = ex_srun.launch(LaunchSpec("s", cmd, "gpn0", (1, 3), (0, 1), 300, str(log), {}, None, "gpuloom"))
    rec = slurm.job(info.pid)
    assert (rec["JobName"], rec["BatchFlag"]) == ("gltest:s", "0")  # not a batch job: an allocation and a step
    assert rec["UserId"].startswith("gpuloom(") and rec["GroupId"].startswith("gpuloom(")
    assert slurm.scontrol("show", "job", "-d", str(info.pid)).count("GRES=gpu:g1:1(IDX:1),gpu:g3:1(IDX:3)") == 1
    # a restarted service's executor finds it by its Slurm id and submit time, with its output
    again = SlurmExecutor("gltest", grace_s=5.0, env=slurm.env, out_dir=ex_srun.out_dir, launcher="srun")
    again.read_nodes()
    assert again.adopt(info)
    assert wait_until(lambda: again.poll(), 30, "the adopted job's exit") == {"s": 0}
    out = Path(str(again.out_dir))  # its script and srun's messages are gone with it, though another srun ran it
    assert [n for n in os.listdir(out / "gpuloom") if n.endswith(".sh")] == [] and \
        [n for n in os.listdir(out) if n.startswith(".srun-")] == []
    groups = " ".join(str(g) for g in lookup("gpuloom").groups)  # its own groups only, none of the service's
    assert log.read_text() == f"cvd=1,3 cpus=2 id=gpuloom:{groups}\ndone\n"
    wait_until(lambda: slurm.job(info.pid)["JobState"] == "COMPLETED", 30, "Slurm's end")
    bad = again.launch(LaunchSpec("b", "exit 3", "gpn0", (0,), (0,), 100, str(tmp_path / "b.log"), {}, None,
                                  "gpuloom"))
    assert wait_until(lambda: again.poll(), 30, "b's exit") == {"b": 3}
    assert slurm.job(bad.pid)["JobState"] == "FAILED"
    wait_until(lambda: again.poll() == {} and not again._sruns, 10, "b's srun to be reaped")


def test_srun_preempt_and_resume_run_each_step_once(ex_srun: SlurmExecutor, slurm: SlurmCluster,
                                                   tmp_path: Path) -> None:
    ckpt = job_writable(tmp_path) / "ckpt"
    log = tmp_path / "p.log"
    cmd = f"{JOB_PY} {SLEEPY} --steps 40 --step-s 0.05 --checkpoint-every 1 --checkpoint-dir {ckpt} --ledger {ckpt}/ledger"
    s = LaunchSpec("p", cmd, "gpn0", (2,), (0,), 200, str(log), {"GPULOOM_CHECKPOINT_DIR": str(ckpt)}, None, "gpuloom")
    first = ex_srun.launch(s)
    wait_until(lambda: ex_srun.poll() == {} and "iter=5" in log.read_text(), 30, "some progress")  # (poll copies it)
    code = ex_srun.stop("p", 10.0)
    assert code == 143, (slurm.job(first.pid), log.read_text()[-800:])
    assert slurm.job(first.pid)["JobState"] in ("CANCELLED", "FAILED")  # no requeue: a resume is a new job
    again = ex_srun.launch(LaunchSpec(**{**{f: getattr(s, f) for f in s.__slots__},  # type: ignore[attr-defined]
                                         "env": {**s.env, "GPULOOM_RESUME": "1", "GPULOOM_ATTEMPT": "2"}}))
    assert again.pid != first.pid
    assert wait_until(lambda: ex_srun.poll(), 60, "the resumed job's exit") == {"p": 0}, log.read_text()
    assert [int(x) for x in (ckpt / "ledger").read_text().split()] == list(range(1, 41))
    text = log.read_text()
    assert text.count("resumed from ") == 1 and text.count("checkpointed at step") == 1 and "result=820" in text


def test_srun_launch_onto_gpus_slurm_still_holds_is_refused_and_the_job_runs_once_they_are_free(
        ex_srun: SlurmExecutor, slurm: SlurmCluster, tmp_path: Path) -> None:
    """The service may relaunch onto GPUs that Slurm still holds (a job reported ended by its exit record
    is still being torn down): srun does not queue there (root's srun --uid loses the message that grants a
    queued allocation, and slurmctld kills the job), the launch is refused and the job stays queued."""
    first = ex_srun.launch(LaunchSpec("a", "echo a; sleep 60", "gpn0", (0, 1), (0, 1), 100, str(tmp_path / "a.log"),
                                      {}, None, "gpuloom"))
    wait_until(lambda: ex_srun.poll() == {} and "a" in (tmp_path / "a.log").read_text(), 30, "a to run")
    b = LaunchSpec("wide", "echo b", "gpn0", (0, 1, 2, 3), (0, 1), 100, str(tmp_path / "b.log"), {}, None, "gpuloom")
    with pytest.raises(NodeUnavailable, match="gpn0 has no room now: .*Requested nodes are busy"):
        ex_srun.launch(b)
    assert "wide" not in ex_srun.procs and not ex_srun._sruns.keys() - {first.pid}
    # nothing waits in Slurm: slurmctld keeps the refused request's record, failed
    assert [r["JobState"] for r in parse_records(slurm.scontrol("show", "job")) if r.get("JobName") == "gltest:wide"] \
        == ["FAILED"]
    assert ex_srun.stop("a", 5.0) == 143
    wait_until(lambda: slurm.job(first.pid)["JobState"] in ("CANCELLED", "FAILED"), 30, "a's end in Slurm")
    again = ex_srun.launch(b)
    assert wait_until(lambda: ex_srun.poll(), 30, "b's exit") == {"wide": 0}
    assert (tmp_path / "b.log").read_text() == "b\n" and slurm.job(again.pid)["JobState"] == "COMPLETED"


def test_srun_that_ends_before_its_step_leaves_the_job_queued(slurm: SlurmCluster, tmp_path: Path) -> None:
    """An allocation whose srun ends before it launches the step ran nothing of the job: the launch is
    refused (the job stays queued) and the allocation is cancelled, never reported as the job's failure."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\n"  # what srun says where its step cannot be created in its allocation
                               "echo 'srun: jobid 999999: nodes(1):gpn0, cpu counts: 1(x1)' >&2\n"
                               "echo 'srun: error: Unable to create step for job 999999: Job/step already "
                               "completing or completed' >&2\nexit 1\n")
    (fake / "srun").chmod(0o755)
    e = SlurmExecutor("gltest", grace_s=5.0, env={**slurm.env, "PATH": f"{fake}:{slurm.env.get('PATH', '')}"},
                      out_dir=str(job_writable(tmp_path) / "out"), launcher="srun")
    e.read_nodes()
    with pytest.raises(NodeUnavailable, match="Slurm job 999999 ran no step: srun: error: Unable to create step"):
        e.launch(LaunchSpec("c", "echo c", "gpn0", (0,), (0,), 100, str(tmp_path / "c.log"), {}, None, "gpuloom"))
    assert e.procs == {} and e._sruns == {} and os.listdir(str(e.out_dir)) == ["gpuloom"]  # its files gone too
    assert os.listdir(Path(str(e.out_dir)) / "gpuloom") == []


def test_srun_job_is_reported_ended_with_all_of_its_output(ex_srun: SlurmExecutor, tmp_path: Path) -> None:
    """srun writes the job's output as slurmstepd forwards it: the script's exit record comes before its last
    lines do, and the end is reported once srun has exited, so the job's log has every line.  (10,000 lines:
    Slurm itself loses the end of some bursts of 100,000 as a step ends, 3 of 20 here.)"""
    log = tmp_path / "o.log"
    ex_srun.launch(LaunchSpec("o", "seq 1 10000", "gpn0", (0,), (0,), 100, str(log), {}, None, "gpuloom"))
    record, end = ex_srun._exit_files["o"], time.monotonic() + 30
    while not os.path.exists(record) and time.monotonic() < end:  # a poll as soon as the exit record shows
        time.sleep(0.002)
    assert wait_until(lambda: ex_srun.poll(), 30, "o's exit") == {"o": 0}
    assert log.read_text() == "".join(f"{i}\n" for i in range(1, 10001))
    # and a stopped one with what it printed as it stopped
    cmd = "trap 'trap \"\" TERM; seq 1 10000; exit 143' TERM; echo up; while :; do sleep 0.05; done"
    log = tmp_path / "t.log"
    t = LaunchSpec("t", cmd, "gpn0", (1,), (0,), 100, str(log), {}, None, "gpuloom")

    # o's allocation may still be ending in Slurm, holding core 0: the launch is refused then, and tried again,
    # as the service's next round would
    def launched() -> bool:
        try:
            ex_srun.launch(t)
        except NodeUnavailable as e:
            assert "no room now" in str(e), e
            return False
        return True

    wait_until(launched, 30, "t's launch")
    wait_until(lambda: ex_srun.poll() == {} and "up" in log.read_text(), 30, "t to run")
    assert ex_srun.stop("t", 10.0) == 143
    # (slurmstepd's line for each TERM, "*** STEP N.0 ON gpn0 CANCELLED AT ...", may come among them)
    assert [ln for ln in log.read_text().splitlines() if ln.isdigit()] == [str(i) for i in range(1, 10001)]


def test_serve_slurm_srun_preempts_and_resumes_each_step_once(serve_slurm: Any, slurm: SlurmCluster) -> None:
    """``--executor slurm-srun``: the preempted job ends in Slurm and resumes as a new Slurm job, its
    account's, every step run once."""
    s = serve_slurm("--executor", "slurm-srun", "--order", "sjf", "--grace", "10")
    _, long, _, _ = preempt_short_over_long(s, slurm)
    long_id = long["id"]
    first, again = slurm_ids(s, long_id)
    assert first != again
    rec = wait_until(lambda: (r := slurm.job(again)).get("JobState") not in ("RUNNING", "COMPLETING") and r, 60,
                     "Slurm's teardown")
    assert (rec["JobName"], rec["BatchFlag"], rec["JobState"]) == (f"gpuloom-{service_id(s)}:{long_id}", "0",
                                                                   "COMPLETED")
    assert rec["UserId"].startswith("gpuloom(") and rec["GroupId"].startswith("gpuloom(")
