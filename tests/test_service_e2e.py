"""End-to-end: the real ``gpuloom serve`` on loopback runs real processes as planned."""

from __future__ import annotations

import os
import uuid

import pytest

from service_util import STEPPER, Server, job, ledger, running, start_records, stepper_cmd, submit, wait_for

NCPU = len(os.sched_getaffinity(0))


@pytest.mark.serial  # all four jobs placed before the first ends (3 steps of 0.05 s)
def test_jobs_get_the_planned_gpus_cores_and_memory(server) -> None:  # noqa: ANN001
    # 2 nodes x 4 fake GPUs; each node has as many cores as this machine, 4 GB
    s = server("--cluster", "2x4", "--cpus-per-node", str(NCPU), "--mem-gb-per-node", "4", "--round", "0.2")
    with s.client() as c:
        ids = []
        for i in range(4):
            r = c.post("/jobs", json={"name": f"j{i}", "command": stepper_cmd(3, 0.05), "gpus": 2})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        assert ids == [1, 2, 3, 4]
        rows = [wait_for(lambda i=i: (j := job(c, i))["state"] == "finished" and j, what=f"job {i}") for i in ids]
        logs = {i: c.get(f"/jobs/{i}/logs").text for i in ids}
        nodes = c.get("/nodes").json()
    assert [n["gpus_used"] for n in nodes] == [0, 0]
    seen_gpus: dict[str, set[int]] = {}
    for row in rows:
        assert row["exit_code"] == 0 and row["attempts"] == 1 and row["resume_count"] == 0
        assert row["progress"] == 3  # its last GPULOOM_PROGRESS line
        (rec,) = start_records(logs[row["id"]])
        # the record written at launch (store) and what the process saw agree
        launch = [e for e in c_events(s, row["id"]) if e["kind"] == "launch"]
        assert len(launch) == 1
        part = row_alloc(s, row["id"])
        assert rec["cvd"] == ",".join(str(g) for g in part["local_gpus"])
        assert rec["affinity"] == sorted(part["cores"])
        assert int(rec["mem_env"]) == part["mem_mb"]
        # where the executor gives each job its own memory cgroup, the limit is the plan's
        own_cgroup = "gpuloom" in (rec["mem_cgroup"] or "")
        if own_cgroup or os.environ.get("GPULOOM_EXPECT_CGROUP"):
            assert rec["mem_limit"] == part["mem_mb"] * 10**6 // 4096 * 4096  # MB = 10^6 bytes, whole pages
        assert len(part["local_gpus"]) == 2 and len(part["cores"]) == NCPU * 2 // 4
        assert part["mem_mb"] == 4000 * 2 // 4
        assert not seen_gpus.setdefault(part["node"], set()) & set(part["gpus"])
        seen_gpus[part["node"]] |= set(part["gpus"])
        assert ledger(row["checkpoint_dir"]) == [0, 1, 2]
    # packed FIFO placement of four 2-GPU jobs on 2x4: jobs 1,2 fill node-0, jobs 3,4 node-1
    assert seen_gpus == {"node-0": {0, 1, 2, 3}, "node-1": {4, 5, 6, 7}}


def c_events(s: Server, jid: int) -> list[dict]:
    with s.client() as c:
        return c.get(f"/jobs/{jid}/events").json()


def row_alloc(s: Server, jid: int) -> dict:
    """The (single) part of the allocation recorded for the job's launch."""
    (ev,) = [e for e in c_events(s, jid) if e["kind"] == "launch"]
    assert ev["detail"]["resume"] is False
    from gpuloom.runtime.state.store import Store

    store = Store(f"sqlite:///{s.state_dir / 'gpuloom.db'}")
    try:
        ev_alloc = [e for e in store.events(jid) if e["kind"] == "launch"][0]["detail"]["alloc"]
    finally:
        store.close()
    (part,) = ev_alloc["parts"]
    return part


def test_preempted_job_resumes_with_every_step_done_once(server) -> None:  # noqa: ANN001
    # SJF: a short job arriving later preempts the long one, which checkpoints on SIGTERM and resumes
    s = server("--cluster", "1x4", "--cpus-per-node", str(NCPU), "--order", "sjf", "--round", "0.2", "--grace", "10")
    with s.client() as c:
        long_id = c.post("/jobs", json={"name": "long", "command": stepper_cmd(30, 0.05), "gpus": 4,
                                        "time_limit": "600s"}).json()["id"]
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{long_id}/logs").text, what="long job progress")
        short_id = c.post("/jobs", json={"name": "short", "command": stepper_cmd(3, 0.05), "gpus": 2,
                                         "time_limit": "60s"}).json()["id"]
        short = wait_for(lambda: (j := job(c, short_id))["state"] == "finished" and j, what="short job")
        long = wait_for(lambda: (j := job(c, long_id))["state"] == "finished" and j, what="long job")
        log = c.get(f"/jobs/{long_id}/logs").text
        kinds = [e["kind"] for e in c.get(f"/jobs/{long_id}/events").json()]
    assert short["exit_code"] == 0 and ledger(short["checkpoint_dir"]) == [0, 1, 2]
    assert long["exit_code"] == 0 and long["progress"] == 30
    assert long["preemptions"] == 1 and long["attempts"] == 2 and long["resume_count"] == 1
    recs = start_records(log)
    assert [r["resume"] for r in recs] == [None, "1"]
    assert recs[1]["start"] > 3  # resumed from its checkpoint, not from zero
    assert "checkpointed at step" in log
    # the lifecycle: launched, progressed, checkpointed, stopped, relaunched, finished
    path = [k for k in kinds if k in ("waiting_for_initial_resource", "launch", "running_protected",
                                      "checkpointing", "stopped", "preempt", "finished")]
    assert path == ["waiting_for_initial_resource", "launch", "running_protected", "checkpointing", "stopped",
                    "preempt", "launch", "running_protected", "finished"]
    # no lost and no repeated step
    assert ledger(long["checkpoint_dir"]) == list(range(30))
    # the short job started before the long one finished: it really preempted it
    assert short["first_start"] < long["end_time"]


def test_time_limit_and_cancel(server) -> None:  # noqa: ANN001
    s = server("--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2", "--grace", "2")
    with s.client() as c:
        slow = submit(c, **{"command": stepper_cmd(1000, 0.05), "gpus": 1, "time_limit": "1s"})
        run = submit(c, **{"command": stepper_cmd(1000, 0.05), "gpus": 1})
        queued = submit(c, **{"command": "true", "gpus": 2})
        wait_for(lambda: "iter=1" in c.get(f"/jobs/{run}/logs").text, what="running")
        assert job(c, queued)["state"] == "waiting_for_initial_resource"
        assert c.delete(f"/jobs/{queued}").json()["state"] == "cancelled"
        c.delete(f"/jobs/{run}")
        r = wait_for(lambda: (j := job(c, run))["state"] == "cancelled" and j, what="cancel of running job")
        run_log = c.get(f"/jobs/{run}/logs").text
        t = wait_for(lambda: (j := job(c, slow))["state"] == "failed" and j, what="time limit")
    assert "time limit" in t["reason"]
    assert r["end_time"] is not None and r["procs"] is None
    (rec,) = start_records(run_log)
    assert not running(rec["pid"])
    with s.client() as c:
        assert job(c, queued)["attempts"] == 0


def test_job_spanning_two_nodes_gets_one_process_per_node(server) -> None:  # noqa: ANN001
    s = server("--cluster", "2x2", "--cpus-per-node", str(NCPU), "--round", "0.2")
    cmd = 'echo "rank=$GPULOOM_NODE_RANK of $GPULOOM_NUM_NODES gpus=$CUDA_VISIBLE_DEVICES total=$GPULOOM_NUM_GPUS"'
    with s.client() as c:
        jid = submit(c, **{"command": cmd, "gpus": 4})
        row = wait_for(lambda: (j := job(c, jid))["state"] == "finished" and j, what="spanning job")
        lines = sorted(c.get(f"/jobs/{jid}/logs").text.split("\n")[:-1])
        (launch,) = [e for e in c.get(f"/jobs/{jid}/events").json() if e["kind"] == "launch"]
    assert lines == ["rank=0 of 2 gpus=0,1 total=4", "rank=1 of 2 gpus=0,1 total=4"]
    assert [p["node"] for p in launch["detail"]["alloc"]["parts"]] == ["node-0", "node-1"]
    assert [p["gpus"] for p in launch["detail"]["alloc"]["parts"]] == [[0, 1], [2, 3]]
    assert len(launch["detail"]["pids"]) == 2 and row["exit_code"] == 0


def test_elastic_sizing_resizes_a_running_job_for_real(server) -> None:  # noqa: ANN001
    # elastic sizing gives a lone job the whole node, then shrinks it when a second job arrives:
    # the service carries the resize out as stop (checkpoint) + relaunch on 2 GPUs with resume
    s = server("--cluster", "1x4", "--cpus-per-node", str(NCPU), "--size", "elastic", "--round", "0.2")
    curve = [1.0, 2.0, 3.0, 4.0]
    # a's 3 s of steps may end before b comes on a loaded machine (its protection lasts a few times its launch
    # time): after them it runs on until b has ended (in a file its account sees)
    done_b = STEPPER.parent / f"{uuid.uuid4().hex[:8]}-b-done"
    with s.client() as c:
        a = submit(c, **{"name": "a", "command": f"STEPPER_HOLD={done_b} {stepper_cmd(60, 0.05)}", "gpus": 1,
                         "throughput": curve})
        wait_for(lambda: job(c, a)["state"] == "running", what="a out of its protection")
        b = submit(c, **{"name": "b", "command": stepper_cmd(10, 0.05), "gpus": 1, "throughput": curve})
        rows = {b: wait_for(lambda: (x := job(c, b))["state"] == "finished" and x, timeout=60, what=f"job {b}")}
        done_b.touch()
        rows[a] = wait_for(lambda: (x := job(c, a))["state"] == "finished" and x, timeout=60, what=f"job {a}")
        log_a = c.get(f"/jobs/{a}/logs").text
        ev_a = c.get(f"/jobs/{a}/events").json()
    launches = [e for e in ev_a if e["kind"] in ("launch", "resize")]
    assert [e["kind"] for e in launches][:2] == ["launch", "resize"]
    assert [len(e["detail"]["alloc"]["parts"][0]["gpus"]) for e in launches][:2] == [4, 2]
    recs = start_records(log_a)
    assert [len(r["cvd"].split(",")) for r in recs][:2] == [4, 2] and recs[1]["resume"] == "1"
    assert ledger(rows[a]["checkpoint_dir"]) == list(range(60))
    assert ledger(rows[b]["checkpoint_dir"]) == list(range(10))
