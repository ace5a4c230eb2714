"""End-to-end: the service profiles a new model once, reuses the profile, and runs silent jobs unprofiled.

The job is ``examples/sleepy_train.py --cpu-ref 2``: a step takes ``step_s * 2 / min(cores, 2)``,
so its throughput doubles from 1 to 2 cores and is flat beyond (and flat in memory).  On a node
of 4 GPUs, 4 cores and 4000 MB the optimistic profiler searches CPU points 1..4 and memory
points 1000..4000: it measures (4, 4000), (2, 4000), (1, 4000), then memory at 2 cores
(2000, then 1000): 5 points of the 16-point grid, demand 2 cores / 1000 MB.  Synergy-greedy
then gives every job of that model 2 cores, where GPU-proportional would give 1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from service_util import JOB_PY, REPO, job, job_writable, shared_copy, wait_for

NCPU = len(os.sched_getaffinity(0))
SLEEPY = REPO / "examples" / "sleepy_train.py"

pytestmark = pytest.mark.skipif(NCPU < 2, reason="the speed curve needs 2 CPU cores")


@pytest.fixture(autouse=True)
def _nothing_left_behind(tmp_path: Path) -> Iterator[None]:
    """No job or profile run outlives the test (their command lines name the test's directory): checked
    after the servers are stopped (an autouse fixture is set up before ``server``, so torn down after)."""
    yield
    left = [p for p in psutil.process_iter(["cmdline"]) if tmp_path.name in " ".join(p.info["cmdline"] or [])]
    assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"


def serve_args() -> list[str]:
    return ["--cluster", "1x4", "--cpus-per-node", "4", "--mem-gb-per-node", "4", "--round", "0.2",
            "--size", "greedy", "--profile-warmup", "0.1", "--profile-window", "0.4", "--profile-timeout", "1",
            "--grace", "2"]


def sleepy(tmp: Path, tag: str, steps: int = 60) -> str:
    return (f"{JOB_PY} {shared_copy(SLEEPY)} --steps {steps} --step-s 0.01 --cpu-ref 2 "
            f"--ledger {job_writable(tmp) / ('ledger-' + tag)}")


def silent(tmp: Path) -> str:
    return f"{JOB_PY} -c 'import time, sys; time.sleep(0.3)' {tmp}"


def events(c, jid: int) -> list[dict]:  # noqa: ANN001
    return c.get(f"/jobs/{jid}/events").json()


def launches(c, jid: int) -> list[dict]:  # noqa: ANN001
    return [e["detail"]["alloc"]["parts"] for e in events(c, jid) if e["kind"] in ("launch", "resize", "move")]


def stored_profile(state_dir: Path, key: str) -> dict | None:
    from gpuloom.runtime.state.store import Store

    store = Store(f"sqlite:///{state_dir / 'gpuloom.db'}")
    try:
        return store.get_profile(key)
    finally:
        store.close()


def finished(c, jid: int) -> dict:  # noqa: ANN001
    return wait_for(lambda: (j := job(c, jid))["state"] in ("finished", "failed") and j, timeout=60,
                    what=f"job {jid} to end")


def test_first_job_is_profiled_second_reuses_the_profile(server, tmp_path: Path) -> None:  # noqa: ANN001
    s = server(*serve_args())
    with s.client() as c:
        r1 = c.post("/jobs", json={"name": "a", "command": sleepy(tmp_path, "a"), "gpus": 1, "model": "sleepy"})
        assert r1.status_code == 201, r1.text
        # b comes once a's profiling has begun: submitted together, both could be planned in one
        # round and a profiled beside b, on the memory b does not hold (the points would be 750..3000)
        wait_for(lambda: "profile-start" in {e["kind"] for e in events(c, 1)}, timeout=60,
                 what="job 1's profiling to begin")
        r2 = c.post("/jobs", json={"name": "b", "command": sleepy(tmp_path, "b"), "gpus": 1, "model": "sleepy"})
        assert r2.status_code == 201, r2.text
        j1, j2 = finished(c, 1), finished(c, 2)
        ev1, ev2 = events(c, 1), events(c, 2)
        l1, l2 = launches(c, 1), launches(c, 2)
    assert j1["exit_code"] == 0 and j2["exit_code"] == 0
    # each ran once, from its start: profile runs are not attempts and never touch its checkpoints
    assert j1["attempts"] == 1 and j2["attempts"] == 1
    # the ledger is on the command line, so job a's profile runs wrote to it too, before its real run
    steps = [str(i) for i in range(1, 61)]
    assert (job_writable(tmp_path) / "ledger-b").read_text().split() == steps
    led_a = (job_writable(tmp_path) / "ledger-a").read_text().split()
    assert led_a[-60:] == steps and len(led_a) > 60

    rec = stored_profile(tmp_path, "sleepy/1gpu")
    assert rec is not None and rec["status"] == "ok"
    assert rec["cpu_points"] == [1, 2, 3, 4] and rec["mem_points"] == [1000, 2000, 3000, 4000]
    # saturates at 2 cores (cpu-ref 2), memory-insensitive: the smallest memory point
    assert (rec["gpus"], rec["cpus"], rec["mem_mb"]) == (1, 2, 1000)
    measured = {(c, m) for c, m, _ in rec["points"]}
    assert measured == {(4, 4000), (2, 4000), (1, 4000), (2, 2000), (2, 1000)}
    assert rec["points_measured"] == 5 < rec["grid_size"] == 16
    tput = {(c, m): v for c, m, v in rec["points"]}
    assert 0.35 < tput[(1, 4000)] / tput[(2, 4000)] < 0.7  # one core: half speed
    assert 0.85 < tput[(4, 4000)] / tput[(2, 4000)] < 1.15
    assert len(rec["matrix"]) == 4 and all(len(row) == 4 for row in rec["matrix"])

    kinds1 = [e["kind"] for e in ev1]
    assert kinds1.count("profile-start") == 1 and kinds1.count("profiled") == 1
    assert kinds1.index("profiled") < kinds1.index("launch")
    assert not {"profile-start", "profiled", "unprofilable"} & {e["kind"] for e in ev2}
    profile_logs = sorted(p.name for p in (tmp_path / "logs" / "profile").glob("*.log"))
    assert profile_logs == ["1.profile-c1-m4000.log", "1.profile-c2-m1000.log", "1.profile-c2-m2000.log",
                            "1.profile-c2-m4000.log", "1.profile-c4-m4000.log"]
    # both launched once with the profile's demand (greedy), not GPU-proportional (1 core, 1000 MB)
    for parts in (l1, l2):
        assert len(parts) == 1
        ((p,),) = parts
        assert (len(p["gpus"]), p["cpus"], p["mem_mb"], len(p["cores"])) == (1, 2, 1000, 2)


def test_silent_job_runs_proportional_and_is_recorded_unprofilable(server, tmp_path: Path) -> None:  # noqa: ANN001
    s = server(*serve_args())
    with s.client() as c:
        spec = {"command": silent(tmp_path), "gpus": 1, "model": "quiet"}
        assert c.post("/jobs", json={"name": "q1", **spec}).status_code == 201
        j1 = finished(c, 1)
        assert c.post("/jobs", json={"name": "q2", **spec}).status_code == 201
        # a job without a model that asks for profiling by flag, and one that opts out
        assert c.post("/jobs", json={"name": "flag", "command": silent(tmp_path), "gpus": 1,
                                     "profile": True}).status_code == 201
        assert c.post("/jobs", json={"name": "out", "command": silent(tmp_path), "gpus": 1, "model": "other",
                                     "profile": False}).status_code == 201
        jobs = [j1] + [finished(c, i) for i in (2, 3, 4)]
        ev = {i: [e["kind"] for e in events(c, i)] for i in (1, 2, 3, 4)}
        l1 = launches(c, 1)
    assert [j["state"] for j in jobs] == ["finished"] * 4
    rec = stored_profile(tmp_path, "quiet/1gpu")
    assert rec is not None and rec["status"] == "unprofilable"
    assert "GPULOOM_PROGRESS" in rec["reason"]
    assert ev[1].count("profile-start") == 1 and "unprofilable" in ev[1]
    assert "profile-start" not in ev[2]  # not retried for the model
    assert "unprofilable" in ev[3] and stored_profile(tmp_path, "flag/1gpu")["status"] == "unprofilable"
    assert "profile-start" not in ev[4] and stored_profile(tmp_path, "other/1gpu") is None
    # GPU-proportional on a 4-GPU, 4-core, 4000 MB node: 1 core, 1000 MB
    ((p,),) = l1
    assert (p["cpus"], p["mem_mb"]) == (1, 1000)


def test_profiling_off_by_flag(server, tmp_path: Path) -> None:  # noqa: ANN001
    s = server(*serve_args(), "--no-profile")
    with s.client() as c:
        assert c.post("/jobs", json={"name": "a", "command": sleepy(tmp_path, "a", 5), "gpus": 1,
                                     "model": "sleepy"}).status_code == 201
        j = finished(c, 1)
        kinds = [e["kind"] for e in events(c, 1)]
    assert j["exit_code"] == 0 and "profile-start" not in kinds
    assert stored_profile(tmp_path, "sleepy/1gpu") is None


def test_profile_record_round_trip_gives_the_demand() -> None:
    from gpuloom.perf.profiler import optimistic_profile
    from gpuloom.perf.sensitivity import SensitivityProfile, demand_vector
    from gpuloom.runtime.service.profiles import (
        profile_from_record,
        profile_key,
        record_from_result,
        unprofilable_record,
        wants_profile,
    )

    assert wants_profile({"model": "m"}) and wants_profile({"profile": True})
    assert not wants_profile({"model": "m", "profile": False}) and not wants_profile({"name": "x"})
    assert not wants_profile({"profile": {"cpus": 2}})  # an inline profile dict is not a request
    assert profile_key({"model": "resnet", "gpus": 2, "name": "j"}) == "resnet/2gpu"
    assert profile_key({"name": "j", "gpus": 1}) == "j/1gpu"
    # 2 GPUs, 10 it/s per core up to 4 cores, memory-insensitive
    res = optimistic_profile(lambda c, m: 10.0 * min(c, 4), range(1, 9), [2000, 4000, 6000, 8000], gpus=2)
    rec = record_from_result(res)
    assert (rec["cpus"], rec["mem_mb"], rec["points_measured"], rec["grid_size"]) == (4, 2000, 6, 32)
    p = profile_from_record("m/2gpu", rec)
    assert isinstance(p, SensitivityProfile) and p.gpus == 2
    assert p.cpu_axis == tuple(c / 2 for c in range(1, 9)) and p.mem_axis == (1000, 2000, 3000, 4000)
    assert p.throughput_at(4, 2000, 2) == 40.0 and p.throughput_at(2, 8000, 2) == 20.0
    d = demand_vector(p, 2, range(1, 9), [2000, 4000, 6000, 8000], 0.10)
    assert (d.gpus, d.cpus, d.mem_mb) == (2, 4, 2000)
    assert profile_from_record("q/1gpu", unprofilable_record(1, "no progress")) is None
