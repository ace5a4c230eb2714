"""The example jobs under the executor: preemption (SIGTERM -> checkpoint -> resume) runs every step
exactly once; the PyTorch example really runs faster with more cores (skipped without torch)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpuloom.runtime.executor import LaunchSpec
from gpuloom.runtime.local import LocalExecutor
from gpuloom.runtime.profiling import RealProfiler
from gpuloom.runtime.progress import ProgressTail

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PY = shlex.quote(sys.executable)
CORES = sorted(os.sched_getaffinity(0))


def run_cmd(script: str, args: str) -> str:
    return f"{PY} {shlex.quote(str(EXAMPLES / script))} {args}"


def wait_for(pred, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_exit(ex: LocalExecutor, job: str, timeout: float = 60.0) -> int | None:
    got: dict[str, int | None] = {}
    wait_for(lambda: got.update(ex.poll()) or job in got, timeout, f"{job} to end")
    return got[job]


def reached(log: Path, steps: int):
    tail = ProgressTail(log)

    def check() -> bool:
        tail.read()
        return tail.latest is not None and tail.latest.iter >= steps

    return check


def ledger_steps(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_sleepy_preempted_twice_resumes_exactly_once(tmp_path: Path) -> None:
    ex = LocalExecutor("local")
    job = f"sleepy-{uuid.uuid4().hex[:6]}"
    ckpt, ledger, log = tmp_path / "ckpt", tmp_path / "ledger", tmp_path / "job.log"
    cmd = run_cmd("sleepy_train.py", f"--steps 60 --step-s 0.01 --ledger {shlex.quote(str(ledger))}")
    env = {"GPULOOM_CHECKPOINT_DIR": str(ckpt)}
    allocations = [((0,), CORES[:1], 100), ((1,), CORES, 200), ((0, 1), CORES[-1:], 150)]  # start, move, resize
    for n, (gpus, cpus, mem) in enumerate(allocations):
        resume = {"GPULOOM_RESUME": "1"} if n else {}
        ex.launch(LaunchSpec(job, cmd, "local", gpus, tuple(cpus), mem, str(log), {**env, **resume}))
        if n < 2:
            wait_for(reached(log, 12 * (n + 1)), what="progress")
            assert ex.stop(job, 5.0) == 143
            done = len(ledger_steps(ledger))
            assert f'"step": {done}' in (ckpt / "sleepy.json").read_text()
    assert wait_exit(ex, job) == 0
    assert ledger_steps(ledger) == list(range(1, 61))  # no lost, no repeated step
    text = log.read_text()
    assert text.count("resumed from") == 2
    assert f"done steps=60 result={60 * 61 // 2}" in text
    assert "gpus='1'" in text and "gpus='0,1'" in text


def test_resume_without_checkpoint_starts_over(tmp_path: Path) -> None:
    ex = LocalExecutor("local")
    job = f"sleepy-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "job.log"
    env = {"GPULOOM_CHECKPOINT_DIR": str(tmp_path / "none"), "GPULOOM_RESUME": "1"}
    ex.launch(LaunchSpec(job, run_cmd("sleepy_train.py", "--steps 3 --step-s 0"), "local", (), (), 0, str(log), env))
    assert wait_exit(ex, job) == 0
    assert "no checkpoint: starting from step 0" in log.read_text()
    assert "done steps=3 result=6" in log.read_text()


# -- PyTorch ------------------------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="the PyTorch example needs the optional extra: pip install '.[torch]'")


def test_torch_example_is_faster_with_more_cores(tmp_path: Path) -> None:
    if len(CORES) < 2:
        pytest.skip("needs 2 CPU cores")
    prof = RealProfiler(LocalExecutor("local"), f"torch-{uuid.uuid4().hex[:6]}",
                        run_cmd("train.py", "--steps 100000 --work 12 --image-size 48"), "local", (), CORES[:2],
                        tmp_path, warmup_s=0.5, window_s=2.0, startup_timeout_s=90.0, grace_s=10.0)
    one = prof(1, 0)
    two = prof(2, 0)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert any("cores=1 workers=1" in t for t in logs.values())
    assert any("cores=2 workers=2" in t for t in logs.values())
    assert one > 0 and two > 1.15 * one, f"1 core: {one:.2f} it/s, 2 cores: {two:.2f} it/s"
    assert all(r.exit_code == 143 for r in prof.runs)


def test_torch_example_preempted_ends_with_the_same_weights(tmp_path: Path) -> None:
    ex = LocalExecutor("local")
    tag = uuid.uuid4().hex[:6]
    args = "--steps 16 --work 1 --image-size 16 --batch-size 16"
    runs = {}
    for name in ("straight", "preempted"):
        d = tmp_path / name
        d.mkdir()
        runs[name] = d
        cmd = run_cmd("train.py", f"{args} --ledger {shlex.quote(str(d / 'ledger'))}")
        ex.launch(LaunchSpec(f"{name}-{tag}", cmd, "local", (0,), CORES[:1], 0, str(d / "job.log"),
                             {"GPULOOM_CHECKPOINT_DIR": str(d / "ckpt")}))
    pre = runs["preempted"]
    wait_for(reached(pre / "job.log", 5), 90.0, "torch progress")
    assert ex.stop(f"preempted-{tag}", 30.0) == 143
    stopped_at = len(ledger_steps(pre / "ledger"))
    assert 5 <= stopped_at < 16
    assert re.search(rf"checkpointed at step {stopped_at}\b", (pre / "job.log").read_text())
    ex.launch(LaunchSpec(f"preempted-{tag}", run_cmd("train.py", f"{args} --ledger {shlex.quote(str(pre / 'ledger'))}"),
                         "local", (0,), CORES[-1:], 0, str(pre / "job.log"),
                         {"GPULOOM_CHECKPOINT_DIR": str(pre / "ckpt"), "GPULOOM_RESUME": "1"}))
    assert wait_exit(ex, f"straight-{tag}", 120.0) == 0
    assert wait_exit(ex, f"preempted-{tag}", 120.0) == 0
    assert ledger_steps(pre / "ledger") == list(range(1, 17))
    a = torch.load(runs["straight"] / "ckpt" / "train.pt")
    b = torch.load(pre / "ckpt" / "train.pt")
    assert a["step"] == b["step"] == 16
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
