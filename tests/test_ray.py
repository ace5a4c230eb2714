"""The service on a Ray cluster, and sweeps on Ray, on a fake 3-node cluster on this machine.

One ``ray.cluster_utils.Cluster`` for the module: nodes ``n0`` (the head), ``n1``, ``n2``, each
declaring 2 GPUs and 2 CPUs.  Every node is this machine, so the tests can check what only the
process tree tells: a job's process is a child of the agent actor whose parent is the raylet of
the node the plan chose.  Skipped without Ray (``pip install '.[ray]'``); the 2x2 training test
needs torch too (``.ci/run`` installs both).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ray = pytest.importorskip("ray")

from gpuloom.runtime.exec.cgroups import memory_limit_of  # noqa: E402
from gpuloom.runtime.exec.identity import Identities  # noqa: E402
from gpuloom.runtime.exec.ray_executor import AGENT_PREFIX, NAME_LABEL, RayExecutor, RayInventory  # noqa: E402
from gpuloom.runtime.service.config import ServiceConfig  # noqa: E402
from gpuloom.runtime.service.service import Service  # noqa: E402
from gpuloom.runtime.state.store import Store  # noqa: E402
from gpuloom.scheduler import Scheduler  # noqa: E402
from service_util import (  # noqa: E402
    JOB_PY,
    REPO,
    FullLogDisk,
    Server,
    job,
    key_events,
    remove_cgroups,
    running,
    shared_copy,
    submit,
    wait_for,
)

EXAMPLES = REPO / "examples"
PY = shlex.quote(sys.executable)
NODE = {"num_cpus": 2, "num_gpus": 2, "memory": 4 * 2**30, "object_store_memory": 80 * 2**20}


class Fake:
    """The running fake cluster: its address and the raylet pid of each node (by name)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.nodes: dict[str, Any] = {}

    def add(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(**NODE, labels={NAME_LABEL: name})

    def raylet(self, name: str) -> int:
        return int(self.nodes[name].all_processes["raylet"][0].process.pid)


@pytest.fixture(scope="module")
def fake() -> Iterator[Fake]:
    from ray.cluster_utils import Cluster

    # a node whose raylet dies without a word is declared dead after 3 missed health checks, 1 s apart
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False, "labels": {NAME_LABEL: "n0"},
                                                      "_system_config": health})
    f = Fake(c)
    f.nodes["n0"] = c.head_node
    f.add("n1")
    f.add("n2")
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        yield f
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def make(fake: Fake, tmp_path: Path) -> Iterator[Any]:
    """``make(**service options)`` -> (service, executor), on the fake cluster; cleaned up after."""
    made: list[tuple[Service, RayExecutor]] = []
    ns = f"gpuloom-test-{uuid.uuid4().hex[:6]}"

    def build(logs: str = "shared", grace: float = 3.0, place: str = "packed-sticky") -> tuple[Service, RayExecutor]:
        ex = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=grace, logs=logs)
        inv = RayInventory(ex, every_s=0.2)
        store = Store(f"sqlite:///{tmp_path / 'gpuloom.db'}")
        # jobs run as this account (not a job account), so they can run this venv's Python and torch
        svc = Service(store, inv.current, ex, Scheduler.from_names("fifo", "none", "proportional", place),
                      ServiceConfig(tmp_path,
                      round_s=0.2, grace_s=grace, launch_timeout_s=30.0, inventory=inv,
                      identities=Identities(switch=False)))
        svc.start()
        made.append((svc, ex))
        return svc, ex

    yield build
    for svc, ex in made:
        svc.terminate_all()
        svc.shutdown()
        ex.kill_agents()
    for n in list(fake.nodes) + ["n2", "n3", "n4"]:
        remove_cgroups(f"{ns}-{n}")


def sleepy(steps: int, step_s: float = 0.05, ledger: str = "$GPULOOM_CHECKPOINT_DIR/ledger", ckpt: str = "",
           py: str = PY) -> str:
    extra = f" --checkpoint-dir {ckpt}" if ckpt else ""
    script = EXAMPLES / "sleepy_train.py" if py == PY else shared_copy(EXAMPLES / "sleepy_train.py")
    return f"{py} {script} --steps {steps} --step-s {step_s} --checkpoint-every 1 --ledger {ledger}{extra}"


def state(svc: Service, jid: int) -> str:
    row = svc.store.get_job(jid)
    assert row is not None
    return row.state


#: a launched job: protected for a moment after its first progress line (see runtime/service/actuator.py), then running
RUNNING = ("running_protected", "running")


def until_state(svc: Service, jid: int, want: str | tuple[str, ...], timeout: float = 90.0) -> None:
    wants = (want,) if isinstance(want, str) else want
    try:
        wait_for(lambda: state(svc, jid) in wants, timeout, f"job {jid} to be {' or '.join(wants)}")
    except AssertionError as e:  # what the job was doing instead
        row = svc.store.get_job(jid)
        assert row is not None
        seen = [(e["kind"], e["detail"]) for e in svc.store.events(jid)][-6:]
        loop = svc._thread
        where = "".join(traceback.format_stack(sys._current_frames()[loop.ident])[-8:]) if loop and loop.ident else ""
        raise AssertionError(f"{e}: is {row.state} ({row.pending_reason or row.reason}); events {seen}; "
                             f"nodes {[n.name for n in svc.cluster.nodes]}, parked {svc.parked}; rounds {svc.rounds}, "
                             f"failed rounds {svc.backoff.failures}; the loop is at:\n{where}") from None


def nodes_of(svc: Service, jid: int) -> list[str]:
    row = svc.store.get_job(jid)
    assert row is not None and row.alloc is not None
    return [p["node"] for p in row.alloc["parts"]]


def ledger(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def ancestors(pid: int) -> list[int]:
    out = []
    p: psutil.Process | None = psutil.Process(pid)
    while p is not None:
        out.append(p.pid)
        p = p.parent()
    return out


# -- placement -----------------------------------------------------------------------------------
def test_inventory_follows_ray_and_jobs_run_on_the_node_the_plan_chose(fake: Fake, make: Any) -> None:
    svc, ex = make()
    assert [(n.name, n.gpus, n.cpus, n.mem_mb) for n in svc.cluster.nodes] == [
        ("n0", 2, 2, 4294), ("n1", 2, 2, 4294), ("n2", 2, 2, 4294)]
    info = ex.agent_info()
    assert {n: i["raylet_pid"] for n, i in info.items()} == {n: fake.raylet(n) for n in ("n0", "n1", "n2")}
    show = 'echo "CVD=$CUDA_VISIBLE_DEVICES CPUS=$GPULOOM_CPUS"; sleep 60'
    jobs = [svc.submit({"name": f"p{i}", "command": show, "gpus": 1, "mem_mb": 300}, "u") for i in range(2)]
    jobs += [svc.submit({"name": "p2", "command": show, "gpus": 2, "mem_mb": 500}, "u")]
    for j in jobs:
        until_state(svc, j, "launching")
    seen = {}
    for j in jobs:
        row = svc.store.get_job(j)
        assert row is not None and row.alloc is not None and row.procs is not None
        (part,), (proc,) = row.alloc["parts"], row.procs
        assert proc["node"] == part["node"]
        # the process was started by the agent pinned to that node: its parent's parent is that node's raylet
        chain = ancestors(proc["pid"])
        assert chain[2] == fake.raylet(part["node"]) and chain[1] == info[part["node"]]["pid"]
        limited = info[part["node"]]["cgroups"] != "none"  # the agent's cgroup memory limit, where it can make one
        assert memory_limit_of(proc["pid"]) == (part["mem_mb"] * 10**6 // 4096 * 4096 if limited else None)  # MB = 10^6 B
        assert part["mem_mb"] == row.spec["mem_mb"]
        wait_for(lambda j=j: "CVD=" in svc.log_path(j).read_text(), what=f"job {j}'s first line")
        seen[j] = (part["node"], part["local_gpus"], svc.log_path(j).read_text().split()[0])
    # packed: the two 1-GPU jobs share the first node, the 2-GPU job takes the next
    assert seen == {jobs[0]: ("n0", [0], "CVD=0"), jobs[1]: ("n0", [1], "CVD=1"), jobs[2]: ("n1", [0, 1], "CVD=0,1")}
    for j in jobs:
        svc.cancel(j, "u", admin=False)
    for j in jobs:
        until_state(svc, j, "cancelled")


def test_job_over_two_nodes_gets_the_torchrun_environment_and_logs_through_the_agents(fake: Fake, make: Any) -> None:
    svc, ex = make(logs="agent")  # logs are written on the nodes and fetched through the agents
    keys = "MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|NODE_RANK|LOCAL_WORLD_SIZE|PET_NNODES|CUDA_VISIBLE_DEVICES"
    cmd = f"env | grep -E '^({keys})=' | sort; echo GPULOOM_PROGRESS iter=1"
    jid = svc.submit({"name": "env", "command": cmd, "gpus": 4}, "u")
    until_state(svc, jid, "finished", 60)
    events = [e["detail"] for e in svc.store.events(jid) if e["kind"] == "launch"]
    parts = events[0]["alloc"]["parts"]
    assert len(parts) == 2 and parts[0]["node"] != parts[1]["node"]
    addr = ex.nodes[parts[0]["node"]].address

    def env_of(path: Path) -> dict[str, str]:
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and " " not in line)

    e0, e1 = env_of(svc.log_path(jid)), env_of(Path(f"{svc.log_path(jid)}.1"))
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == addr and e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert (e0["WORLD_SIZE"], e0["RANK"], e0["NODE_RANK"], e0["LOCAL_WORLD_SIZE"], e0["PET_NNODES"]) == ("2", "0", "0", "2", "2")
    assert (e1["WORLD_SIZE"], e1["RANK"], e1["NODE_RANK"], e1["LOCAL_WORLD_SIZE"]) == ("2", "1", "1", "2")
    assert e0["CUDA_VISIBLE_DEVICES"] == e1["CUDA_VISIBLE_DEVICES"] == "0,1"
    # the service's copies came through the agents: the node-local files are elsewhere
    assert "GPULOOM_PROGRESS iter=1" in svc.log_path(jid).read_text()
    assert not str(ex.remote_logs.get(jid, "")).startswith(str(svc.log_path(jid)))


def test_agents_sample_their_gpus_and_the_service_attributes_them(fake: Fake, make: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node's agent samples NVML (here the fake, which the service hands its agents) off the loop; the
    service reads the answers without waiting and attributes them to the job holding the GPUs."""
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [{"util": 91, "mem_used_mb": 2048, "mem_total_mb": 16384, "power_w": 120},
                                         {"util": 0, "mem_used_mb": 0, "mem_total_mb": 16384}]}))
    monkeypatch.setenv("GPULOOM_FAKE_NVML", str(nvml))
    svc, ex = make()
    jid = svc.submit({"name": "t", "command": "sleep 60", "gpus": 1}, "u")
    until_state(svc, jid, "launching", 60)
    wait_for(lambda: svc.telemetry.gpus.job_now(str(jid)), 30, "the job's GPU readings")
    (g,) = svc.telemetry.gpus.job_now(str(jid))
    assert (g["node"], g["gpu"], g["util"], g["mem_used_mb"], g["power_w"]) == (nodes_of(svc, jid)[0], 0, 91.0, 2048.0,
                                                                                 120.0)
    assert set(ex.gpu_readings()) == set(ex.agents)  # every node's agent answers
    svc.cancel(jid, "u", True)


def test_training_job_over_two_nodes_of_two_gpus_with_torch_distributed(fake: Fake, make: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    svc, _ = make()
    args = "--steps 8 --batch-size 8 --image-size 16 --work 1 --workers 0 --dist-timeout 60"
    cmd = f"{PY} {EXAMPLES / 'train.py'} {args} --ledger $GPULOOM_CHECKPOINT_DIR/ledger"
    jid = svc.submit({"name": "ddp", "command": cmd, "gpus": 4, "mem_mb": 3000}, "u")
    # the same training in one process, for the weights
    ref = tmp_path / "ref"
    single = subprocess.run(f"{PY} {EXAMPLES / 'train.py'} {args} --checkpoint-dir {ref}", shell=True,
                            env={k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")},
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout + single.stderr
    until_state(svc, jid, "finished", 300)
    row = svc.store.get_job(jid)
    assert row is not None and row.exit_code == 0 and row.attempts == 1
    launch = next(e["detail"] for e in svc.store.events(jid) if e["kind"] == "launch")
    assert sorted(len(p["gpus"]) for p in launch["alloc"]["parts"]) == [2, 2]
    assert len({p["node"] for p in launch["alloc"]["parts"]}) == 2
    log0, log1 = svc.log_path(jid).read_text(), Path(f"{svc.log_path(jid)}.1").read_text()
    assert "rank=0 world=2" in log0 and "rank=1 world=2" in log1 and "done steps=8" in log1
    assert ledger(Path(row.checkpoint_dir) / "ledger") == list(range(1, 9))
    a = torch.load(Path(row.checkpoint_dir) / "train.pt")
    b = torch.load(ref / "train.pt")
    assert a["step"] == b["step"] == 8
    assert max(float((a["model"][k] - b["model"][k]).abs().max()) for k in b["model"]) < 1e-4


# Not serial (the tests of this module run beside the suite's others): its job no longer ends before the test
# has seen the new agent, which is what failed under load.  A serial test in a group waits, mid-run, for every
# test running on the other workers, and no worker starts one meanwhile (tests/conftest.py)
def test_killed_agent_is_replaced_and_its_job_adopted(fake: Fake, make: Any) -> None:
    svc, ex = make()
    # the job ends only once the test has seen the new agent (its 3 s of steps can end first under load)
    go = "$GPULOOM_CHECKPOINT_DIR/go"
    jid = svc.submit({"name": "k", "command": f"{sleepy(60)} && until [ -e {go} ]; do sleep 0.05; done", "gpus": 2},
                     "u")
    until_state(svc, jid, RUNNING)
    node = nodes_of(svc, jid)[0]
    old = ex.agents[node]
    pid = svc.store.get_job(jid).procs[0]["pid"]
    ray.kill(old, no_restart=True)
    wait_for(lambda: node in ex.agents and ex.agents[node] is not old, 60, "a new agent")
    assert psutil.pid_exists(pid)  # the job ran on meanwhile
    assert state(svc, jid) in RUNNING
    (Path(svc.store.get_job(jid).checkpoint_dir) / "go").touch()
    until_state(svc, jid, "finished", 90)
    row = svc.store.get_job(jid)
    assert row is not None and row.attempts == 1 and row.exit_code == 0
    assert ledger(Path(row.checkpoint_dir) / "ledger") == list(range(1, 61))
    assert key_events(svc.store.events(jid)) == ["submit", "launch", "finished"]


def test_between_an_agents_death_and_its_replacement_stops_and_launches_still_work(fake: Fake, tmp_path: Path) -> None:
    from gpuloom.runtime.exec.executor import LaunchSpec, NodeUnavailable, ProcInfo

    ns = f"gpuloom-test-{uuid.uuid4().hex[:6]}"
    ex = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=3.0)
    try:
        ex.refresh(wait_s=60)
        ck = tmp_path / "ck"
        # (100 s of steps: the test stops it long before, however slow the agent's death is to be seen)
        spec = LaunchSpec("a", sleepy(2000, 0.05, ledger=str(ck / "ledger"), ckpt=str(ck)), "n1", (0,), (0,), 200,
                          str(tmp_path / "a.log"))
        info = ex.launch(spec)
        wait_for(lambda: len(ledger(ck / "ledger")) >= 3, 30, "a to step")
        ray.kill(ex.agents["n1"], no_restart=True)
        wait_for(lambda: ex.poll() == {} and "n1" in ex._dead_agents, 30, "the agent's death to be seen")
        # stopped from a one-off task on n1: SIGTERM, checkpoint, exit 143; nothing runs on unseen
        assert ex.stop("a", 30.0) == 143
        assert not running(info.pid)
        steps = ledger(ck / "ledger")
        assert steps == list(range(1, len(steps) + 1))
        # a launch on n1 replaces its agent first; while the new agent is still starting (a loaded machine: more than
        # the launch's 10 s wait) it is refused as NodeUnavailable and, as the service does, tried again later
        launched: list[ProcInfo] = []

        def launch_b() -> bool:
            try:
                launched.append(ex.launch(LaunchSpec("b", "exit 7", "n1", (1,), (1,), 100, str(tmp_path / "b.log"))))
            except NodeUnavailable:
                return False
            return True

        wait_for(launch_b, 90, "a new agent on n1 to take b")
        b = launched[0]
        assert "n1" in ex.agents and b.node == "n1"
        got: dict[str, int | None] = {}
        wait_for(lambda: got.update(ex.poll()) or "b" in got, 30, "b to end")
        assert got == {"b": 7}
        # a service that died between a launch and its record: its successor finds the process as an orphan
        c = ex.launch(LaunchSpec("c", "sleep 60", "n2", (0,), (0,), 100, str(tmp_path / "c.log")))
        again = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=3.0)
        again.refresh(wait_s=60)
        assert [(p.job_id, p.node, p.pid) for p in again.orphans()] == [("c", "n2", c.pid)]
        assert again.adopt(again.orphans()[0]) and again.stop("c", 30.0) == 143
        assert again.orphans() == []
    finally:
        ex.kill_agents()
        for n in fake.nodes:
            remove_cgroups(f"{ns}-{n}")


def test_a_launch_a_dead_service_did_not_confirm_is_found_by_its_attempt(fake: Fake, tmp_path: Path) -> None:
    from gpuloom.runtime.exec.executor import LaunchSpec

    ns = f"gpuloom-test-{uuid.uuid4().hex[:6]}"
    ex = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=3.0)
    try:
        ex.refresh(wait_s=60)
        # launch 2 of d ends on its own (exit 4), launch 1 of e runs on: the service that launched them dies
        d = ex.launch(LaunchSpec("d", "exit 4", "n2", (0,), (0,), 100, str(tmp_path / "d.log"), attempt=2))
        e = ex.launch(LaunchSpec("e", "sleep 60", "n1", (0,), (0,), 100, str(tmp_path / "e.log"), attempt=1))
        again = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=3.0)
        again.refresh(wait_s=60)
        wait_for(lambda: (p := again.launched("d", "n2", 2)) is not None and again.exit_code(p) == 4, 30,
                 "d's exit record")
        found = again.launched("d", "n2", 2)
        assert found is not None and found.node == "n2" and found.pid in (d.pid, 0) and not again.adopt(found)
        assert again.launched("d", "n2", 1) is None and again.launched("e", "n1", 2) is None
        live = again.launched("e", "n1", 1)
        assert live is not None and live.pid == e.pid and again.adopt(live) and again.stop("e", 30.0) == 143
        assert again.launched("e", "n1", 1) is None  # stopped: not an end of its own
        assert again.stopped(live) and not again.stopped(found)  # (its exit record's stop mark, or none)
    finally:
        ex.kill_agents()
        for n in fake.nodes:
            remove_cgroups(f"{ns}-{n}")


def test_log_copies_a_full_disk_refuses_are_made_later_each_line_once(fake: Fake, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With logs through the agents, the service's disk refuses every copy (full; each append half written)
    while jobs print and end: their ends are reported, a stop works, and once there is room each log is
    copied whole, each line once, at later polls (3 MB: more than one read of the agent's)."""
    from gpuloom.runtime.exec.executor import LaunchSpec

    disk = FullLogDisk(monkeypatch)
    ns = f"gpuloom-test-{uuid.uuid4().hex[:6]}"
    ex = RayExecutor(ns, node_dir=str(tmp_path / "nodes"), cgroup_parent=ns, grace_s=3.0, logs="agent",
                     log_every_s=0.1)
    try:
        ex.refresh(wait_s=60)
        lines = "seq 1 {} | sed s/^/line/"
        logs = {e: tmp_path / f"{e}.log" for e in "abc"}
        ex.launch(LaunchSpec("a", lines.format(2000) + "; exit 3", "n1", (0,), (0,), 100, str(logs["a"])))
        ex.launch(LaunchSpec("b", lines.format(300_000), "n2", (0,), (0,), 100, str(logs["b"])))
        out = tmp_path / "c.out"  # (its 1,000 lines printed)
        ex.launch(LaunchSpec("c", lines.format(1000) + f"; touch {out}; exec sleep 60", "n1", (1,), (1,), 100,
                             str(logs["c"])))
        got: dict[str, int | None] = {}
        wait_for(lambda: got.update(ex.poll()) or len(got) == 2, 60, "a and b to end on the full disk")
        assert got == {"a": 3, "b": 0}
        wait_for(out.exists, 60, "c to print its lines")
        assert ex.stop("c", 30.0) == 143
        assert all(not f.exists() or f.read_bytes() == b"" for f in logs.values())  # (every copy undone)
        disk.full = False
        want = {"a": 2000, "b": 300_000, "c": 1000}
        wait_for(lambda: ex.poll() == {} and all(f.exists() and f.read_text().count("line") >= want[e]
                                                  for e, f in logs.items()), 60, "the logs to be copied")
        for e, f in logs.items():
            assert [x for x in f.read_text().splitlines() if x.startswith("line")] == \
                [f"line{i}" for i in range(1, want[e] + 1)], e
        assert ex._copying == {}
    finally:
        ex.kill_agents()
        for n in fake.nodes:
            remove_cgroups(f"{ns}-{n}")


# -- sweeps --------------------------------------------------------------------------------------
def compare_files(tmp_path: Path, out: str, args: list[str]) -> dict[str, Any]:
    """Run ``gpuloom compare ARGS --out OUT``; every file it wrote, without what may differ: seconds of
    CPU or wall time, the command line and when it started."""
    r = subprocess.run([sys.executable, "-m", "gpuloom", "compare", *args, "--out", str(tmp_path / out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert r.returncode == 0, r.stdout + r.stderr
    files: dict[str, Any] = {}
    for f in sorted((tmp_path / out).rglob("*")):
        if f.is_dir():
            continue
        key = f.relative_to(tmp_path / out).as_posix()
        if f.suffix == ".json":
            files[key] = _without(json.loads(f.read_text()), {"wall_time_s", "command", "command_wall_time_s", "started"})
        elif f.suffix == ".csv":
            rows = [line.split(",") for line in f.read_text().splitlines()]
            keep = [i for i, h in enumerate(rows[0]) if h != "wall_time_s"]
            files[key] = [[row[i] for i in keep] for row in rows]
        elif f.suffix == ".md":
            files[key] = [x for x in f.read_text().splitlines() if "wall time" not in x and "command:" not in x]
        else:  # plots: the same pixels
            files[key] = f.read_bytes()
    return files


def test_compare_on_ray_gives_the_output_of_the_process_pool(fake: Fake, tmp_path: Path) -> None:
    configs = [f"order={o},place={p}" for o in ("fifo", "srtf", "las", "2d-las")
               for p in ("packed-sticky", "random-sticky")]
    common = ["--generate", "40", "--rate", "60", "--cluster", "4x4", "--seed", "3"]
    for c in configs:
        common += ["-c", c]
    local = compare_files(tmp_path, "pool", [*common, "-j", "2"])
    on_ray = compare_files(tmp_path, "ray", [*common, "--ray", fake.cluster.address])
    assert len(local["compare.json"]["runs"]) == 8 and len([k for k in local if k.endswith("jobs.csv")]) == 8
    assert sorted(on_ray) == sorted(local)
    for key in local:
        assert on_ray[key] == local[key], key


def test_compare_with_a_queue_tree_on_ray_gives_the_output_of_the_process_pool(fake: Fake, tmp_path: Path) -> None:
    """``--queues``' tree reaches the Ray tasks: the queue stages schedule with it and every run is measured
    against it (``queues.csv``), as in the process pool."""
    args = ["--trace", str(EXAMPLES / "queued_jobs.csv"), "--cluster", "2x4", "--queues", str(EXAMPLES / "queues.toml"),
            "-c", "order=fifo", "-c", "order=fifo,queue=quota,P.borrow=false,label=strict",
            "-c", "order=fifo,queue=quota,label=borrow", "-c", "order=fifo,queue=drf,label=drf", "--no-plots"]
    local = compare_files(tmp_path, "pool", [*args, "-j", "2"])
    on_ray = compare_files(tmp_path, "ray", [*args, "--ray", fake.cluster.address])
    assert "queues.csv" in local and {row[0] for row in local["queues.csv"][1:]} >= {"strict", "borrow", "drf"}
    assert sorted(on_ray) == sorted(local)
    for key in local:
        assert on_ray[key] == local[key], key


def _without(x: Any, keys: set[str]) -> Any:
    if isinstance(x, dict):
        return {k: _without(v, keys) for k, v in x.items() if k not in keys}
    if isinstance(x, list):
        return [_without(v, keys) for v in x]
    return x


# -- a service SIGKILL ------------------------------------------------------------------------------
def test_killed_service_reattaches_to_its_agents_and_adopts_running_jobs(fake: Fake, tmp_path: Path) -> None:
    # with a queue tree whose guarantees (8 GPUs) exceed the 6 the cluster has now: scaled to fit, not refused
    args = ("--ray", fake.cluster.address, "--round", "0.2", "--grace", "3", "--queues", str(EXAMPLES / "queues.toml"))
    s = Server(tmp_path, *args).start(timeout=120)
    ns = None
    try:
        with s.client() as c:
            got = {q["name"]: q["guarantee"]["gpus"] for q in c.get("/queues").json()["queues"]}
            assert got == {"research": 4.5, "vision": 2.25, "nlp": 2.25, "shared": 1.5}
            # a real server runs jobs as a job account (as root): a Python and a script that account can run
            # long enough (20 s) to outlive the restart of a service on a loaded machine: it is adopted running
            jid = submit(c, name="long", command=sleepy(80, 0.25, py=JOB_PY), gpus=2)
            wait_for(lambda: "iter=5" in c.get(f"/jobs/{jid}/logs").text, 60, "progress through the agent")
        store = Store(f"sqlite:///{tmp_path / 'gpuloom.db'}")
        ns = f"gpuloom-{store.get_meta('service_id')}"
        row = store.get_job(jid)
        assert row is not None and row.procs
        pid = row.procs[0]["pid"]
        s.kill()  # SIGKILL: no shutdown code runs; the detached agents and the job live on
        assert psutil.pid_exists(pid)
        time.sleep(0.5)
        s = Server(tmp_path, *args).start(timeout=120)
        with s.client() as c:
            done = wait_for(lambda: (j := job(c, jid))["state"] == "finished" and j, 120, "the job to finish")
            events = key_events(c.get(f"/jobs/{jid}/events").json())
            text = c.get(f"/jobs/{jid}/logs").text
        assert events == ["submit", "launch", "adopt", "finished"]
        assert done["attempts"] == 1 and done["exit_code"] == 0 and done["queue"] == "shared"
        assert ledger(Path(done["checkpoint_dir"]) / "ledger") == list(range(1, 81))
        # the log came through the agent, every line once, across the restart (iter=0: ready to train)
        assert [int(x.split("=")[1].split()[0]) for x in text.splitlines() if x.startswith("GPULOOM_PROGRESS")] == \
            list(range(0, 81))
    finally:
        s.stop()
        if ns is not None:
            for n in fake.nodes:
                try:
                    ray.kill(ray.get_actor(AGENT_PREFIX + n, namespace=ns), no_restart=True)
                except ValueError:
                    pass
                remove_cgroups(f"{ns}-{n}")


# -- node loss (last: it changes the cluster) -------------------------------------------------------
def test_nodes_leaving_and_joining_jobs_requeued_whole_parked_and_every_step_run_once(
        fake: Fake, make: Any, tmp_path: Path) -> None:
    svc, ex = make()
    filler = svc.submit({"name": "filler", "command": sleepy(100, 0.1), "gpus": 2}, "u")
    until_state(svc, filler, RUNNING)
    # one process per node, each with its own checkpoint and ledger
    ck = "$GPULOOM_CHECKPOINT_DIR/rank$RANK"
    multi = svc.submit({"name": "multi", "command": sleepy(120, 0.05, ledger=f"{ck}/ledger", ckpt=ck), "gpus": 4}, "u")
    until_state(svc, multi, RUNNING)
    wait_for(lambda: (svc.last_progress(multi) or 0) >= 10, 60, "multi to progress")
    where = nodes_of(svc, multi)
    assert nodes_of(svc, filler) == ["n0"] and sorted(where) == ["n1", "n2"]
    pids = [p["pid"] for p in svc.store.get_job(multi).procs]
    gone = "n2"
    t0 = time.monotonic()
    fake.cluster.remove_node(fake.nodes.pop(gone))
    # both parts are stopped: the one on the lost node by its fence, the other by the service
    wait_for(lambda: not any(running(p) for p in pids), 60, "both parts to stop")
    until_state(svc, multi, "standby", 60)
    assert [n.name for n in svc.cluster.nodes] == ["n0", "n1"]
    until_state(svc, multi, RUNNING, 180)  # once the filler is done: on n0 and n1
    recovered = time.monotonic() - t0
    assert sorted(nodes_of(svc, multi)) == ["n0", "n1"]
    until_state(svc, multi, "finished", 180)
    row = svc.store.get_job(multi)
    assert row is not None and row.attempts == 2 and row.resume_count == 1
    kinds = key_events(svc.store.events(multi))
    assert kinds == ["submit", "launch", "requeue", "launch", "finished"]
    assert [e["detail"]["nodes"] for e in svc.store.events(multi) if e["kind"] == "node-lost"] == [[gone]]
    for r in (0, 1):
        assert ledger(Path(row.checkpoint_dir) / f"rank{r}" / "ledger") == list(range(1, 121)), f"rank {r}"
    assert recovered > 0
    # a node joins: it is in the next inventory
    fake.add("n3")
    wait_for(lambda: [n.name for n in svc.cluster.nodes] == ["n0", "n1", "n3"], 60, "n3 to join")
    wide = svc.submit({"name": "wide", "command": sleepy(150, 0.05, ledger=f"{ck}/ledger", ckpt=ck), "gpus": 6}, "u")
    until_state(svc, wide, RUNNING, 180)  # its first launch on the new node n3: slow on a loaded machine
    assert sorted(nodes_of(svc, wide)) == ["n0", "n1", "n3"]
    wait_for(lambda: (svc.last_progress(wide) or 0) >= 10, 60, "wide to progress")
    # n3's raylet dies without a word (a crashed machine): Ray's health checks notice it; the job loses its
    # three parts together, and the 4 GPUs left cannot hold it: it is parked, not failed
    os.kill(fake.raylet("n3"), signal.SIGKILL)
    wait_for(lambda: (r := svc.store.get_job(wide)).pending_reason is not None and r.pending_reason.startswith("Nodes:"),
             90, "wide to be parked")
    row = svc.store.get_job(wide)
    assert row is not None and row.state == "standby" and [n.name for n in svc.cluster.nodes] == ["n0", "n1"]
    fake.add("n4")  # until a node joins
    until_state(svc, wide, "finished", 180)
    assert sorted(nodes_of_launch(svc, wide)[-1]) == ["n0", "n1", "n4"]
    row = svc.store.get_job(wide)
    assert row is not None and row.attempts == 2
    for r in (0, 1, 2):
        assert ledger(Path(row.checkpoint_dir) / f"rank{r}" / "ledger") == list(range(1, 151)), f"rank {r}"


def nodes_of_launch(svc: Service, jid: int) -> list[list[str]]:
    """The nodes of each launch of a job."""
    return [[p["node"] for p in e["detail"]["alloc"]["parts"]] for e in svc.store.events(jid) if e["kind"] == "launch"]

