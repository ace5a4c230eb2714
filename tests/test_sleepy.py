"""examples/sleepy_train.py as a stand-in for training on fake GPUs: the ready line, the cores it was given,
stages on exclusive GPUs and links (checked by holding the locks, not by timing)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

SLEEPY = Path(__file__).resolve().parents[1] / "examples" / "sleepy_train.py"


def start(tmp: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SLEEPY), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "GPULOOM_CHECKPOINT_DIR": str(tmp / "ck"), **env})


def progress_lines(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("GPULOOM_PROGRESS")]


def test_ready_line_first_and_the_cores_it_was_given(tmp_path: Path) -> None:
    p = start(tmp_path, "--steps", "2", "--stages", "0.001,0,0", "--cpu-ref", "8", GPULOOM_CPUS="0-3,7")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    assert progress_lines(out) == ["iter=0", "iter=1", "iter=2"]  # ready (launch over), then every step
    # 5 cores given, CPU stage quoted for 8: 0.001 * 8 / 5
    assert "cores=5 gpus='' step_s=0.0016 stages=0.0016,0.0000,0.0000" in out
    bad = start(tmp_path, "--stages", "1,2,3,4")
    assert bad.wait(timeout=60) == 2


def wait_line(p: subprocess.Popen[str], text: str) -> list[str]:
    assert p.stdout is not None
    seen = []
    while True:
        line = p.stdout.readline()
        assert line, f"the job ended before printing {text!r}: {seen}"
        seen.append(line)
        if text in line:
            return seen


def test_a_gpu_held_by_another_job_stops_the_gpu_stage_only(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    fd = os.open(locks / "gpu1.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another job holds GPU 1
    try:
        # only a network stage: GPU 1's link is free, so it runs to the end
        net = start(tmp_path, "--steps", "3", "--stages", "0,0,0.001", "--gpu-lock-dir", str(locks),
                    CUDA_VISIBLE_DEVICES="1")
        out, _ = net.communicate(timeout=60)
        assert net.returncode == 0 and progress_lines(out)[-1] == "iter=3"
        gpu = start(tmp_path / "g", "--steps", "3", "--stages", "0,0.001,0", "--gpu-lock-dir", str(locks),
                    CUDA_VISIBLE_DEVICES="0,1")
        wait_line(gpu, "iter=0")
        time.sleep(0.5)  # whatever the machine's speed: without GPU 1 it cannot finish a step
        assert gpu.poll() is None
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    out, _ = gpu.communicate(timeout=60)
    assert gpu.returncode == 0 and progress_lines(out) == ["iter=1", "iter=2", "iter=3"]
    assert sorted(p.name for p in locks.iterdir()) == ["gpu0.lock", "gpu1.lock", "net0.lock", "net1.lock"]
