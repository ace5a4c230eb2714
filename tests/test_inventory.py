"""Without Ray: the gang environment, allocations read back by node name, Ray's node table as a
cluster, and the service rebuilding itself when nodes leave and join (:mod:`gpuloom.runtime.service.inventory`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster, Node
from gpuloom.core.plan import Allocation, Part
from gpuloom.runtime.exec.executor import InventoryChange
from gpuloom.runtime.exec.gang import gang_env
from gpuloom.runtime.exec.identity import Identities
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.inventory import follow
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.codec import alloc_from_json, alloc_to_json
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import wait_for

SLEEPY = Path(__file__).resolve().parents[1] / "examples" / "sleepy_train.py"


def test_gang_env_of_a_job_over_two_nodes_of_two_gpus() -> None:
    env = [gang_env(r, [2, 2], "10.0.0.5", 29_400) for r in (0, 1)]
    assert env[1] == {
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400", "WORLD_SIZE": "2", "RANK": "1", "NODE_RANK": "1",
        "GROUP_RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "PET_NNODES": "2", "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "10.0.0.5", "PET_MASTER_PORT": "29400",
    }
    assert env[0]["RANK"] == env[0]["NODE_RANK"] == "0"
    assert gang_env(2, [4, 1, 3], "h", 1)["LOCAL_WORLD_SIZE"] == "3"
    with pytest.raises(ValueError, match="rank 2"):
        gang_env(2, [2, 2], "h", 1)
    with pytest.raises(ValueError, match="port 0"):
        gang_env(0, [2, 2], "h", 0)


def test_allocation_is_read_back_by_node_name_in_a_rebuilt_cluster() -> None:
    a, b, c = Node("a", 2, 4, 1000), Node("b", 4, 4, 1000), Node("c", 2, 4, 1000)
    old = Cluster((a, b, c))
    alloc = Allocation("7", (Part(1, (3, 4), 2, 500), Part(2, (6,), 1, 100)), ("8",))
    d = alloc_to_json(alloc, old)
    new = Cluster((c, b))  # a left, c moved first: b keeps its local GPUs 1 and 2 (global 3 and 4)
    back = alloc_from_json("7", d, new)
    assert back == Allocation("7", (Part(1, (3, 4), 2, 500), Part(0, (0,), 1, 100)), ("8",))
    with pytest.raises(KeyError):
        alloc_from_json("7", d, Cluster((a, c)))  # b is gone
    with pytest.raises(ValueError, match="not on node b"):
        alloc_from_json("7", d, Cluster((c, Node("b", 1, 4, 1000))))  # b has fewer GPUs now


def test_ray_node_table_becomes_the_gpu_nodes_by_name() -> None:
    from gpuloom.runtime.exec.ray_executor import gpu_nodes, node_name

    table = [
        {"NodeID": "aa11bb22cc", "Alive": True, "NodeManagerHostname": "gpu7.example.org",
         "NodeManagerAddress": "10.0.0.7", "Resources": {"CPU": 32.0, "GPU": 4.0, "memory": 64 * 2**30,
                                                         "accelerator_type:A100": 1.0}, "Labels": {}},
        {"NodeID": "ff00", "Alive": True, "NodeManagerHostname": "head", "NodeManagerAddress": "10.0.0.1",
         "Resources": {"CPU": 8.0, "memory": 2**30}},  # no GPUs: carries no jobs
        {"NodeID": "dead", "Alive": False, "Resources": {"GPU": 8.0}},
        {"NodeID": "ee99", "Alive": True, "NodeManagerHostname": "x", "NodeManagerAddress": "10.0.0.9",
         "Resources": {"CPU": 4.0, "GPU": 2.0, "memory": 2**31}, "Labels": {"gpuloom.io/name": "box"}},
    ]
    nodes = gpu_nodes(table)
    assert [(n.name, n.address, n.gpus, n.cpus, n.mem_mb, n.gpu_type) for n in nodes] == [
        ("box", "10.0.0.9", 2, 4, 2147, "generic"), ("gpu7-aa11bb", "10.0.0.7", 4, 32, 68_719, "A100")]  # MB = 10^6 B
    assert node_name(table[1]) == "head-ff00"


# -- rebuild ------------------------------------------------------------------------------------
def until(svc: Service, pred, what: str, timeout: float = 60.0) -> None:  # noqa: ANN001
    """Run rounds until ``pred()`` holds."""
    def step() -> bool:
        if pred():
            return True
        svc.round()
        return False

    wait_for(step, timeout, what)


class Source:
    """An inventory source the test changes by hand."""

    def __init__(self) -> None:
        self.next: InventoryChange | None = None

    def poll(self) -> InventoryChange | None:
        change, self.next = self.next, None
        return change


def test_node_loss_requeues_its_jobs_after_the_fence_and_parks_what_no_longer_fits(
        tmp_path: Path, cgroup_parent: str) -> None:
    nodes = tuple(Node(f"n{i}", 2, 2, 4000) for i in range(3))
    full = Cluster(nodes)
    src = Source()
    store = Store(f"sqlite:///{tmp_path / 'db'}")
    svc = Service(store, full, local_executor(full, tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"), ServiceConfig(tmp_path,
                  round_s=1000.0, grace_s=5.0, launch_timeout_s=0.0, inventory=src,
                  identities=Identities(switch=False)))  # jobs as this account: they run this venv's Python
    try:
        def cmd(steps: int) -> str:
            return (f"{sys.executable} {SLEEPY} --steps {steps} --step-s 0.05 --checkpoint-every 1 "
                    f"--ledger $GPULOOM_CHECKPOINT_DIR/ledger")

        # on a loaded machine a's 3 s of steps could end before the nodes it runs on leave, and b's 0.4 s before
        # n0 does: after their steps they run on until the test makes their file
        go, go_b = tmp_path / "go", tmp_path / "go-b"
        a = svc.submit({"name": "a", "command": f"{cmd(60)} && until [ -e {go} ]; do sleep 0.05; done", "gpus": 2},
                       "u")  # n0
        b = svc.submit({"name": "b", "command": f"{cmd(8)} && until [ -e {go_b} ]; do sleep 0.05; done", "gpus": 4},
                       "u")  # n1 + n2
        svc.round()
        assert {str(a), str(b)} <= set(svc.running)
        assert [p.node for p in svc.running[str(a)].procs.values()] == ["n0"]
        wait_for(lambda: (svc.last_progress(a) or 0) >= 3, what="a to progress")

        # n0 leaves: a's process cannot be reached there (here: it is stopped, as the fence would)
        src.next = InventoryChange(Cluster(nodes[1:]), frozenset({"n0"}), fence_s=0.6)
        t0 = time.time()
        assert follow(svc)
        row = store.get_job(a)
        assert row is not None and row.state == "standby" and row.procs is None
        assert a in svc.parked and str(a) not in svc.jobs  # waits for the fence
        assert str(b) in svc.running  # b's processes, on n1 and n2, were adopted
        go_b.touch()
        assert [n.name for n in svc.cluster.nodes] == ["n1", "n2"]
        svc.round()
        assert str(a) not in svc.running
        wait_for(lambda: time.time() - t0 > 0.6, what="the fence period")
        until(svc, lambda: store.get_job(b).state == "finished", "b to finish")
        until(svc, lambda: str(a) in svc.running, "a to resume")  # on a node of the new cluster
        run = svc.running[str(a)]
        assert {p.node for p in run.procs.values()} <= {"n1", "n2"}
        # n1 and n2 leave, n0 is back: the 4-GPU job c cannot fit and is parked, not failed
        c = svc.submit({"name": "c", "command": cmd(3), "gpus": 4}, "u")
        src.next = InventoryChange(Cluster(nodes[:1]), frozenset({"n1", "n2"}), fence_s=0.0)
        assert follow(svc)
        svc.round()
        row = store.get_job(c)
        assert row is not None and row.state in ("waiting_for_initial_contact", "waiting_for_initial_resource")
        assert row.pending_reason is not None and row.pending_reason.startswith("Nodes:")
        assert c in svc.parked
        # every node is back: both finish, a having run each step exactly once
        go.touch()
        src.next = InventoryChange(full, frozenset(), 0.0)
        assert follow(svc)
        for jid in (a, c):
            until(svc, lambda jid=jid: store.get_job(jid).state == "finished", f"job {jid} to finish")
        ledger = Path(store.get_job(a).checkpoint_dir) / "ledger"
        assert [int(x) for x in ledger.read_text().split()] == list(range(1, 61))
        kinds = [e["kind"] for e in store.events(a)]
        assert kinds.count("node-lost") == 2 and kinds.count("requeue") == 2
        assert store.get_job(a).resume_count == 2 and store.get_job(c).resume_count == 0
    finally:
        svc.terminate_all()
        svc.shutdown()


def test_a_job_submitted_while_a_node_joins_is_loaded_by_the_next_round(
        tmp_path: Path, cgroup_parent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API does not wait for the loop: a submission that lands while a rebuild reads the store is
    a new job for the next round, not skipped (it once waited in contact forever)."""
    from gpuloom.runtime.service import recovery

    nodes = tuple(Node(f"n{i}", 2, 2, 4000) for i in range(2))
    src = Source()
    store = Store(f"sqlite:///{tmp_path / 'db'}")
    svc = Service(store, Cluster(nodes[:1]), local_executor(Cluster(nodes), tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"), ServiceConfig(tmp_path,
                  round_s=1000.0, grace_s=5.0, launch_timeout_s=0.0, inventory=src,
                  identities=Identities(switch=False)))
    try:
        first = svc.submit({"name": "first", "command": f"{sys.executable} -c pass", "gpus": 1}, "u")
        svc.round()
        sweep, late = recovery._sweep, []

        def sweep_then_submit(s: Service) -> None:  # a submission between recovery's reads
            sweep(s)
            late.append(s.submit({"name": "late", "command": f"{sys.executable} -c pass", "gpus": 4}, "u"))

        monkeypatch.setattr(recovery, "_sweep", sweep_then_submit)
        src.next = InventoryChange(Cluster(nodes), frozenset(), 0.0)
        assert follow(svc)
        monkeypatch.setattr(recovery, "_sweep", sweep)
        assert late == [first + 1]
        until(svc, lambda: store.get_job(late[0]).state == "finished", "the late job to finish")
        assert "launch" in [e["kind"] for e in store.events(late[0])]
    finally:
        svc.terminate_all()
        svc.shutdown()


def test_queue_guarantees_shrink_with_the_cluster_and_come_back_with_it(tmp_path: Path, cgroup_parent: str) -> None:
    """A queue tree whose guarantees fill the whole cluster: when a node leaves, the stage schedules
    with the guarantees scaled to what is left (no job is failed, rounds go on); the stored tree is
    kept, and given back whole when the node returns.  A restart on the smaller cluster starts too."""
    from gpuloom.core.queues import parse_queues

    nodes = tuple(Node(f"n{i}", 2, 2, 4000) for i in range(3))
    full = Cluster(nodes)
    tree = {"default": "b", "queue": [{"name": "a", "guarantee": {"gpus": 4, "cpus": 4}, "limit": 6},
                                      {"name": "b", "guarantee": {"gpus": 2, "cpus": 2}}]}

    def service(cluster: Cluster, src: Source) -> Service:
        return Service(Store(f"sqlite:///{tmp_path / 'db'}"), cluster,
                       local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                       Scheduler.from_names(queue="quota"), ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0,
                       launch_timeout_s=0.0, inventory=src, identities=Identities(switch=False)))

    src = Source()
    svc = service(full, src)
    try:
        svc.queues.configure(parse_queues(tree))
        a = svc.submit({"name": "a", "command": "sleep 60", "gpus": 2, "queue": "a"}, "u")
        b = svc.submit({"name": "b", "command": "sleep 60", "gpus": 2}, "u")
        svc.round()
        assert {str(a), str(b)} <= set(svc.running)
        guarantees = {q["name"]: (q["guarantee"]["gpus"], q["guarantee"]["cpus"]) for q in svc.queues.usage()["queues"]}
        assert guarantees == {"a": (4, 4), "b": (2, 2)}
        lost = next(p.node for p in svc.running[str(b)].procs.values())
        left = Cluster(tuple(n for n in nodes if n.name != lost))
        src.next = InventoryChange(left, frozenset({lost}), fence_s=0.0)
        assert follow(svc)
        # 4 of 6 GPUs and cores left: every guarantee at 2/3
        got = [(q["guarantee"]["gpus"], q["guarantee"]["cpus"]) for q in svc.queues.usage()["queues"]]
        assert got == [pytest.approx((8 / 3, 8 / 3)), pytest.approx((4 / 3, 4 / 3))]
        until(svc, lambda: str(b) in svc.running, "b to run again")  # on the 2 GPUs a leaves
        assert {store_row(svc, j).state for j in (a, b)} <= {"running_protected", "running", "launching"}
        assert store_row(svc, a).attempts == 1 and store_row(svc, b).attempts == 2
        # a restart on the smaller cluster: the stored tree (whole) is scaled there too
        svc.shutdown()
        svc = service(left, Source())
        svc.queues.validate()
        assert svc.queues.tree is not None and svc.queues.tree.guarantee[0][0] == pytest.approx(8 / 3)
        assert svc.queues.configured is not None and svc.queues.configured.guarantee[0][0] == 4
        # an edit while the node is away is made to the stored tree, not the scaled one
        svc.queues.set_user("zoe", "a")
        assert svc.queues.configured.guarantee[0][0] == 4 and svc.queues.configured.users == {"zoe": "a"}
        # the node is back: the whole tree again
        svc.inventory = src
        src.next = InventoryChange(full, frozenset(), 0.0)
        assert follow(svc)
        assert svc.queues.tree is not None and svc.queues.tree.guarantee[0][0] == 4
    finally:
        svc.terminate_all()
        svc.shutdown()


def store_row(svc: Service, jid: int):  # noqa: ANN201
    row = svc.store.get_job(jid)
    assert row is not None
    return row


# -- without Ray ----------------------------------------------------------------------------------
def _without_ray(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpuloom ARGS`` in a Python where ``import ray`` fails (as without the ray extra)."""
    code = ("import runpy, sys\nsys.modules['ray'] = None  # import ray: ImportError\n"
            f"sys.argv = ['gpuloom', *{list(args)!r}]\n"
            "try:\n    runpy.run_module('gpuloom', run_name='__main__')\n"
            "finally:\n    print('RAY IMPORTED' if sys.modules.get('ray') is not None else 'no ray')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src")))


def test_everything_but_ray_works_without_ray_and_ray_options_say_how_to_get_it(tmp_path: Path) -> None:
    r = _without_ray(tmp_path, "compare", "--generate", "10", "--cluster", "2x4", "-c", "order=fifo",
                     "-c", "order=srtf", "-j", "2", "--no-plots", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("no ray") and (tmp_path / "out" / "compare.json").exists()
    for cmd in (["compare", "--generate", "10", "--cluster", "2x4", "-c", "order=fifo", "--ray", "auto", "--no-plots",
                 "--out", str(tmp_path / "out2")],
                ["serve", "--ray", "local", "--gpus", "2", "--state-dir", str(tmp_path / "sd"), "--port", "0"]):
        r = _without_ray(tmp_path, *cmd)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "--ray needs Ray: pip install 'gpuloom[ray]'" in r.stdout + r.stderr, cmd[0]
