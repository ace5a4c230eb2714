"""GPU types in the service: jobs asking for a type, nodes showing theirs, and a job whose measured
speeds move it to the type where it runs fastest (a real ``gpuloom serve`` on loopback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service_util import job, ledger, stepper_cmd, submit, wait_for

NCPU = len(os.sched_getaffinity(0))


def _cluster(tmp_path: Path) -> Path:
    # a K80 node listed first: a job the policy knows nothing about ties between the types and takes it
    f = tmp_path / "cluster.toml"
    f.write_text(f'[[nodes]]\nname = "old"\ngpus = 1\ncpus = {NCPU}\nmem_gb = 4\ngpu_type = "Tesla K80"\n\n'
                 f'[[nodes]]\nname = "new"\ngpus = 1\ncpus = {NCPU}\nmem_gb = 4\ngpu_type = "Tesla V100-SXM2-16GB"\n')
    return f


def _nodes_of(c, jid: int, kinds: tuple[str, ...] = ("launch", "move")) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(e["kind"], e["detail"]["alloc"]["parts"][0]["node"]) for e in c.get(f"/jobs/{jid}/events").json()
            if e["kind"] in kinds]


def test_jobs_ask_for_types_and_measured_speeds_move_a_job_to_its_fastest_type(server, tmp_path: Path) -> None:  # noqa: ANN001
    s = server("--cluster", str(_cluster(tmp_path)), "--size", "gavel-greedy", "--round", "0.2", "--grace", "10")
    with s.client() as c:
        nodes = {n["name"]: n for n in c.get("/nodes").json()}
        assert (nodes["old-0"]["gres"], nodes["new-0"]["gres"]) == ("gpu:k80:1", "gpu:v100:1")
        # a type the cluster lacks is refused at submission, naming it
        r = c.post("/jobs", json={"command": stepper_cmd(1, 0.01), "gpus": "a100:1"})
        assert r.status_code == 422 and "needs GPU type a100, the cluster has" in r.text
        # asking for a type: Slurm's gres form, and the spec field (any spelling of the product)
        pinned = submit(c, name="pinned", command=stepper_cmd(80, 0.1), gpus="v100:1", time_limit="600s")
        wait_for(lambda: job(c, pinned)["state"].startswith("running"), what="the pinned job running")
        k80 = submit(c, name="k80-only", command=stepper_cmd(2, 0.05), gpus=1, gpu_type="k80", time_limit="600s")
        wait_for(lambda: job(c, k80)["state"] == "finished", what="the K80 job")
        # a job the scheduler knows nothing about: 20 iterations/s on a V100 (its iteration_time), 5 on a K80
        env = {"STEPPER_DT_K80": "0.2", "STEPPER_DT_V100": "0.05"}
        x = submit(c, name="x", command=stepper_cmd(150, 0.05), gpus=1, iterations=150, iteration_time=0.05,
                   env=env, time_limit="600s")
        done = [wait_for(lambda i=i: (j := job(c, i))["state"] == "finished" and j, timeout=120, what=f"job {i}")
                for i in (pinned, x)]
        events = c.get(f"/jobs/{x}/events").json()
        where = {i: _nodes_of(c, i) for i in (pinned, k80, x)}
    assert done[0]["gpu_type"] == "v100" and where[pinned] == [("launch", "new-0")]
    assert where[k80] == [("launch", "old-0")]
    # x started on the K80 (the V100 was busy), was measured there at a quarter of its reference pace,
    # and moved to the V100 once it was free, where it was measured at its reference pace.  Unmeasured,
    # it would have stayed: the types tie and the K80 comes first
    assert where[x] == [("launch", "old-0"), ("move", "new-0")]
    measured = [(e["detail"]["gpu_type"], e["detail"]["speed"]) for e in events if e["kind"] == "measured"]
    speeds = dict(measured)
    assert list(dict.fromkeys(t for t, _ in measured)) == ["k80", "v100"]
    assert speeds["k80"] == pytest.approx(0.25, rel=0.25) and speeds["v100"] == pytest.approx(1.0, rel=0.25)
    first_k80 = next(i for i, e in enumerate(events) if e["kind"] == "measured")
    moved = next(i for i, e in enumerate(events) if e["kind"] == "move")
    assert first_k80 < moved  # measured first, moved after
    assert ledger(done[1]["checkpoint_dir"]) == list(range(150))  # every step once, across the move


# -- the pieces, pure -------------------------------------------------------------------------------
def test_gpus_take_slurms_type_forms() -> None:
    from pydantic import ValidationError

    from gpuloom.runtime.api.app import JobSubmit
    from gpuloom.runtime.state.specs import parse_gres

    assert [parse_gres(v) for v in (2, "2", "v100:2", "gpu:a100:4")] == [(None, 2), (None, 2), ("v100", 2),
                                                                       ("a100", 4)]
    j = JobSubmit(command="x", gpus="v100:2")  # type: ignore[arg-type]
    assert (j.gpus, j.gpu_type) == (2, "v100") and j.to_spec()["gpu_type"] == "v100"
    assert JobSubmit(command="x", gpus=1, gpu_type="a100|h100").gpu_type == "a100|h100"
    with pytest.raises(ValidationError, match="expected a GPU count or TYPE:COUNT"):
        JobSubmit(command="x", gpus="v100:two")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="gpus v100:2 and gpu_type 'k80' disagree"):
        JobSubmit(command="x", gpus="v100:2", gpu_type="k80")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="gpu_type: a GPU type"):
        JobSubmit(command="x", gpus=1, gpu_type="v100\nrm")


def test_meter_turns_progress_into_speeds_per_type() -> None:
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.core.job import Job, JobSpec
    from gpuloom.core.lifecycle import JobState
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.perf.assembly import build_model
    from gpuloom.perf.gputype import GpuTypeFactor
    from gpuloom.runtime.service.typespeeds import TypeMeter

    cl = parse_cluster("k80:1,v100:1")
    model = build_model(cl)
    clock = {"t": 100.0}
    progress = {"a": 0, "b": 0}
    events: list[tuple[str, dict]] = []
    meter = TypeMeter(model, progress.get, lambda: clock["t"], lambda j, d: events.append((j, d)), window_s=2.0)
    assert isinstance(model.get("gpu_type"), GpuTypeFactor)  # added for a cluster of two types
    a = Job(JobSpec.from_iterations("a", 0.0, 1, 1000, 0.05))  # its reference: 20 iterations/s
    b = Job(JobSpec("b", 0.0, 1, 500.0))  # no reference pace: its first rate is speed 1.0
    jobs = {"a": a, "b": b}
    for j, node in ((a, 0), (b, 1)):
        j.arrive(0.0)
        j.lifecycle.to(JobState.STANDBY, 0.0)  # type: ignore[union-attr]
        j.lifecycle.to(JobState.LAUNCHING, 0.0)  # type: ignore[union-attr]
        j.lifecycle.to(JobState.RUNNING_PROTECTED, 0.0)  # type: ignore[union-attr]
        j.alloc = Allocation(j.id, (Part(node, (node,), 1, 1000),))
    runs = {"a": object(), "b": object()}
    speed = model.speed
    assert meter.observe(jobs, runs, speed, 1.0) == []  # the first look only notes where each run starts
    clock["t"], progress["a"], progress["b"] = 104.0, 20, 40  # a: 5 it/s on the K80, b: 10 it/s on the V100
    assert meter.observe(jobs, runs, speed, 5.0) == [("a", "k80", 0.25), ("b", "v100", 1.0)]
    assert a.speed == 0.25 and [e[1]["gpu_type"] for e in events] == ["k80", "v100"]
    # b moves to the K80 (a new run) and does 4 it/s there: 0.4 of its first rate
    b.alloc = Allocation("b", (Part(0, (0,), 1, 1000),))
    runs["b"] = object()
    meter.observe(jobs, runs, speed, 5.0)
    clock["t"], progress["a"], progress["b"] = 109.0, 45, 60  # (a goes on at 5 it/s: unchanged)
    assert meter.observe(jobs, runs, speed, 10.0) == [("b", "k80", 0.4)]
    assert model.get("gpu_type").speeds(b) == {"k80": 0.4, "v100": 1.0}  # type: ignore[union-attr]


def test_what_jobs_and_nodes_claim_is_bounded() -> None:
    import re

    from gpuloom.core.cluster import parse_cluster
    from gpuloom.core.job import Job, JobSpec
    from gpuloom.core.lifecycle import JobState
    from gpuloom.core.plan import Allocation, Part
    from gpuloom.perf.assembly import build_model
    from gpuloom.runtime.service.actuator import gpu_type_env
    from gpuloom.runtime.service.typespeeds import TypeMeter

    # a node's name for its GPUs (declared, NVML, a Ray agent's) reaches jobs' environments cleaned
    for name in ("\x1b]0;title\x07 V100", "Tesla V100-SXM2-16GB", "A100;rm -rf /", "x" * 500):
        assert re.fullmatch(r"[a-z0-9._-]{0,64}", gpu_type_env(name)), name
    assert gpu_type_env("Tesla V100-SXM2-16GB") == "v100"
    # a job claiming 1,000x its reference pace in its progress lines is measured at 4x at most
    cl = parse_cluster("k80:1,v100:1")
    model = build_model(cl)
    clock, progress = {"t": 0.0}, {"a": 0}
    meter = TypeMeter(model, progress.get, lambda: clock["t"], lambda j, d: None, window_s=1.0)
    a = Job(JobSpec.from_iterations("a", 0.0, 1, 100, 1.0))
    a.arrive(0.0)
    for st in (JobState.STANDBY, JobState.LAUNCHING, JobState.RUNNING_PROTECTED):
        a.lifecycle.to(st, 0.0)  # type: ignore[union-attr]
    a.alloc = Allocation("a", (Part(1, (1,), 1, 1000),))
    run = object()
    meter.observe({"a": a}, {"a": run}, model.speed, 0.0)
    clock["t"], progress["a"] = 2.0, 2000
    assert meter.observe({"a": a}, {"a": run}, model.speed, 2.0) == [("a", "v100", 4.0)]


def test_queue_and_nodes_show_types_as_slurm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from gpuloom.cli import app
    from gpuloom.cli.service import Client

    job = {"id": 7, "name": "x", "user": "u", "state": "waiting_for_initial_resource", "st": "PD", "gpus": 2,
           "gpu_type": "v100", "progress": None, "nodes": [], "reason": None, "pending_reason": "Resources",
           "last_start": None, "held_time": 0, "held_s": 0, "array": None, "queue": "", "command": "true",
           "attempts": 0, "resume_count": 0, "preemptions": 0, "alloc": None, "time_limit": None}
    node = {"name": "new-0", "state": "idle", "gpus": 4, "gpus_used": 0, "cpus": 8, "cpus_used": 0, "mem_mb": 1000,
            "mem_mb_used": 0, "gpu_type": "Tesla V100-SXM2-16GB", "gres": "gpu:v100:4", "jobs": []}
    answers = {"/jobs": [job], "/nodes": [node]}

    from gpuloom.cli import jobs as cli_jobs

    # the queue reads the listing a block at a time (field names, each job's values); nodes one call
    monkeypatch.setattr(cli_jobs, "_listing", lambda client, params: iter([(list(job), [list(job.values())])]))
    monkeypatch.setattr(Client, "call", lambda self, m, p, **kw: answers[p])
    queue = CliRunner().invoke(app, ["queue", "--url", "http://127.0.0.1:1", "--token", "t"])
    nodes = CliRunner().invoke(app, ["nodes", "--url", "http://127.0.0.1:1", "--token", "t"])
    assert queue.exit_code == 0 and "v100:2" in queue.output
    assert nodes.exit_code == 0 and "gpu:v100:4" in nodes.output and "Tesla V100-SXM2-16GB" in nodes.output
