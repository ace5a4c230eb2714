"""Operator control: node drain (wait, checkpoint), maintenance windows, job hold/release/requeue
and bulk selection, through the API with the loop's rounds run by hand (real processes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.perf.assembly import build_model
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.topology import add_topology, parse_topology
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

T0 = 1_700_000_000.0


class Env:
    def __init__(self, tmp: Path, cgroup_parent: str, clock: ManualClock | None = None, nodes: int = 2,
                 queue: str = "none", gpus: int = 2, place: str = "packed-sticky",
                 model: Callable[[Cluster], ThroughputModel] | None = None, size: str = "proportional") -> None:
        self.queue = queue
        self.place = place
        self.size = size
        self.tmp = tmp
        self.parent = cgroup_parent
        self.clock = clock
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        self.cluster = Cluster.homogeneous(nodes, gpus)  # node-0, node-1, ...: 2 GPUs each unless told
        self.model = model(self.cluster) if model is not None else None
        self.svc = self._service()
        self.admin = ensure_admin_token(self.store, tmp)
        self.tok = {"admin": self.admin, "alice": create_token(self.store, "alice"),
                    "bob": create_token(self.store, "bob")}
        self.client = TestClient(create_app(self.svc))

    def _service(self) -> Service:
        return Service(self.store, self.cluster,
                       local_executor(self.cluster, self.tmp / "run", True, self.parent),
                       Scheduler.from_names("fifo", "none", self.size, self.place, queue=self.queue),
                       ServiceConfig(self.tmp, round_s=1000.0, grace_s=2.0, clock=self.clock, model=self.model))

    def call(self, who: str, method: str, path: str, **kw: Any) -> Any:
        r = self.client.request(method, path, headers={"Authorization": f"Bearer {self.tok[who]}"}, **kw)
        return r

    def ok(self, who: str, method: str, path: str, **kw: Any) -> Any:
        r = self.call(who, method, path, **kw)
        assert r.status_code < 300, r.text
        return r.json()

    def submit(self, who: str, **spec: Any) -> int:
        body = {"command": "sleep 60", "gpus": 1, **spec}
        return int(self.ok(who, "POST", "/jobs", json=body)["id"])

    def job(self, jid: int) -> dict[str, Any]:
        return dict(self.ok("admin", "GET", f"/jobs/{jid}"))

    def nodes_of(self, jid: int) -> list[str]:
        return list(self.job(jid)["nodes"])

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.ok("admin", "GET", "/nodes") if n["name"] == name)

    def close(self) -> None:
        self.svc.terminate_all()
        self.svc.actuator.close()
        self.store.close()


@pytest.fixture
def env(tmp_path: Path, cgroup_parent: str) -> Iterator[Env]:
    e = Env(tmp_path, cgroup_parent)
    yield e
    e.close()


def test_drain_wait_keeps_running_jobs_and_starts_nothing_there(env: Env) -> None:
    a = env.submit("alice")
    env.svc.round()
    (node,) = env.nodes_of(a)
    other = "node-1" if node == "node-0" else "node-0"
    out = env.ok("admin", "POST", f"/nodes/{node}/drain", json={"reason": "bad fan", "mode": "wait"})
    assert (out["state"], out["reason"], out["drain_mode"]) == ("drng", "bad fan", "wait")
    b, c = env.submit("alice"), env.submit("alice")
    env.svc.round()
    assert env.job(a)["state"] in ("launching", "running", "running_protected") and env.nodes_of(a) == [node]
    # the two new jobs go to the other node although the drained one has a GPU free
    assert env.nodes_of(b) == [other] and env.nodes_of(c) == [other]
    d = env.submit("alice")
    env.svc.round()
    assert env.job(d)["st"] == "PD" and env.job(d)["nodes"] == []
    # the drained node's job ends: the node is "drain", and still takes nothing
    env.ok("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(a)]})
    env.svc.round()
    assert env.node(node)["state"] == "drain"
    assert env.job(d)["nodes"] == []
    env.ok("admin", "POST", f"/nodes/{node}/resume")
    env.svc.round()
    assert env.nodes_of(d) == [node] and env.node(node)["state"] == "mixed"


def test_drain_checkpoint_moves_running_jobs_elsewhere(env: Env) -> None:
    a, b = env.submit("alice"), env.submit("alice")
    env.svc.round()
    (node,) = set(env.nodes_of(a) + env.nodes_of(b))  # packed: both on one node
    other = "node-1" if node == "node-0" else "node-0"
    env.ok("admin", "POST", f"/nodes/{node}/drain", json={"reason": "GPU 1 Xid 79", "mode": "checkpoint"})
    env.svc.round()  # stopped there (SIGTERM: the checkpoint) and started on the other node
    for j in (a, b):
        got = env.job(j)
        assert env.nodes_of(j) == [other] and got["attempts"] == 2, got
    assert env.node(node)["state"] == "drain" and env.node(other)["state"] == "alloc"
    events = env.ok("admin", "GET", f"/jobs/{a}/events")
    kinds = [e["kind"] for e in events]
    assert "failed" not in kinds and "cancel" not in kinds
    (drained,) = [e for e in events if e["kind"] == "node-drain"]
    assert drained["detail"] == {"nodes": [node], "reason": "GPU 1 Xid 79"}


@pytest.mark.parametrize("size", ["opt", "elastic"])
def test_drain_checkpoint_moves_running_jobs_under_sizers_that_place(tmp_path: Path, cgroup_parent: str,
                                                                     size: str) -> None:
    # Synergy's opt LPs and elastic's hysteresis plan where jobs go: no plan hook re-places after them
    e = Env(tmp_path, cgroup_parent, nodes=3, size=size)
    try:
        a, b = e.submit("alice"), e.submit("alice")
        e.svc.round()
        before = {j: e.nodes_of(j) for j in (a, b)}
        assert before[a] == before[b] == ["node-0"]
        e.ok("admin", "POST", "/nodes/node-0/drain", json={"reason": "Xid 79", "mode": "checkpoint"})
        e.svc.round()
        for j in (a, b):
            got = e.job(j)
            assert got["st"] == "R" and got["attempts"] == 2 and "node-0" not in got["nodes"], got
    finally:
        e.close()


def test_pending_reason_names_drained_nodes_when_only_they_fit(env: Env) -> None:
    env.ok("admin", "POST", "/nodes/node-0/drain", json={"reason": "cabling"})
    big = env.submit("alice", gpus=3)  # needs both nodes' GPUs
    small = env.submit("alice", gpus=1)
    env.svc.round()
    assert env.job(big)["pending_reason"] == "ReqNodeNotAvail, UnavailableNodes:node-0"
    assert env.nodes_of(small) == ["node-1"]
    env.ok("admin", "POST", "/nodes/node-0/resume")
    env.ok("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(small)]})
    env.svc.round()
    env.svc.round()
    assert sorted(env.nodes_of(big)) == ["node-0", "node-1"]


def test_drain_is_admin_only_and_checked(env: Env) -> None:
    r = env.call("alice", "POST", "/nodes/node-0/drain", json={"reason": "x"})
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    assert env.call("admin", "POST", "/nodes/nope/drain", json={"reason": "x"}).status_code == 404
    r = env.call("admin", "POST", "/nodes/node-0/drain", json={"reason": "x", "mode": "later"})
    assert r.status_code == 422 and "mode" in r.json()["detail"]
    r = env.call("admin", "POST", "/nodes/node-0/drain", json={"reason": " "})
    assert r.status_code == 422 and "reason" in r.json()["detail"]
    assert env.call("alice", "POST", "/nodes/node-0/resume").status_code == 403
    assert env.node("node-0")["state"] == "idle"


def test_drain_survives_a_restart(env: Env) -> None:
    env.ok("admin", "POST", "/nodes/node-1/drain", json={"reason": "PSU", "mode": "checkpoint"})
    svc2 = env._service()
    n = next(n for n in svc2.nodes() if n["name"] == "node-1")
    assert (n["state"], n["reason"], n["drain_mode"]) == ("drain", "PSU", "checkpoint")
    svc2.actuator.close()


def test_maintenance_window_boundaries(tmp_path: Path, cgroup_parent: str) -> None:
    clock = ManualClock(T0)
    e = Env(tmp_path, cgroup_parent, clock)
    try:
        out = e.ok("admin", "POST", "/nodes/node-0/maintenance",
                   json={"start": T0 + 100, "duration": "50s", "reason": "firmware"})
        assert out["state"] == "idle" and out["maintenance"]["start"] == T0 + 100
        assert out["maintenance"]["end"] == T0 + 150
        ends_at_t = e.submit("alice", time_limit="100s")  # ends exactly at the window's start: may go there
        past_t = e.submit("alice", time_limit="101s")
        no_limit = e.submit("alice")
        e.svc.round()
        assert e.nodes_of(ends_at_t) == ["node-0"]
        assert e.nodes_of(past_t) == ["node-1"] and e.nodes_of(no_limit) == ["node-1"]
        e.ok("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(ends_at_t), str(past_t)]})
        filler = e.submit("alice")
        e.svc.round()
        assert e.nodes_of(filler) == ["node-1"]  # node-1 is full from here on
        clock.advance(100.0)  # the window opens: drained
        late = e.submit("alice", time_limit="10s")
        e.svc.round()
        assert e.node("node-0")["state"] == "maint" and e.job(late)["nodes"] == []
        clock.advance(49.0)
        e.svc.round()
        assert e.job(late)["nodes"] == []
        clock.advance(1.0)  # T + D: back by itself
        e.svc.round()
        e.svc.round()
        assert e.node("node-0")["maintenance"] is None and e.nodes_of(late) == ["node-0"]
    finally:
        e.close()


def test_hold_and_release_an_array(env: Env) -> None:
    first = env.ok("alice", "POST", "/jobs", json={"command": "sleep 60", "gpus": 1, "array": "0-3"})
    aid = first["array_id"]
    out = env.ok("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(aid)]})
    assert [(j["array"], j["result"]) for j in out["jobs"]] == [(f"{aid}_{t}", "held") for t in range(4)]
    env.svc.round()
    tasks = env.ok("alice", "GET", "/jobs", params={"user": "alice"})
    assert [(j["st"], j["pending_reason"]) for j in tasks] == [("PD", "JobHeldUser")] * 4
    out = env.ok("alice", "POST", "/jobs/actions", json={"action": "release", "jobs": [f"{aid}_[1-2]"]})
    assert [(j["array"], j["result"]) for j in out["jobs"]] == [(f"{aid}_1", "released"), (f"{aid}_2", "released")]
    env.svc.round()
    env.svc.round()
    tasks = env.ok("alice", "GET", "/jobs", params={"user": "alice"})
    assert [(j["array_task"], j["st"]) for j in tasks] == [(0, "PD"), (1, "R"), (2, "R"), (3, "PD")]
    assert [j["pending_reason"] for j in tasks if j["st"] == "PD"] == ["JobHeldUser"] * 2
    env.ok("alice", "POST", "/jobs/actions", json={"action": "release", "jobs": [str(aid)]})
    env.svc.round()
    env.svc.round()
    assert [j["st"] for j in env.ok("alice", "GET", "/jobs", params={"user": "alice"})] == ["R"] * 4


def test_cancel_of_an_array_id_cancels_every_task(env: Env) -> None:
    first = env.ok("alice", "POST", "/jobs", json={"command": "sleep 60", "gpus": 1, "array": "0-2"})
    other = env.submit("alice")
    out = env.ok("alice", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(first["array_id"])]})
    assert [j["result"] for j in out["jobs"]] == ["cancelled"] * 3
    assert env.job(other)["state"] == "waiting_for_initial_contact"


def test_requeue_runs_the_job_again_exactly_once(env: Env) -> None:
    a = env.submit("alice")
    env.svc.round()
    assert env.job(a)["attempts"] == 1
    r1 = env.ok("alice", "POST", "/jobs/actions", json={"action": "requeue", "jobs": [str(a)]})
    r2 = env.ok("alice", "POST", "/jobs/actions", json={"action": "requeue", "jobs": [str(a)]})
    assert (r1["jobs"][0]["result"], r2["jobs"][0]["result"]) == ("requeued", "already requeued")
    env.svc.round()  # stopped (checkpoint) and back in the queue
    assert env.job(a)["st"] == "PD" and env.job(a)["preemptions"] == 1
    for _ in range(3):
        env.svc.round()
    got = env.job(a)
    assert (got["st"], got["attempts"], got["preemptions"]) == ("R", 2, 1)
    kinds = [e["kind"] for e in env.ok("admin", "GET", f"/jobs/{a}/events")]
    assert kinds.count("requeue") == 1
    r = env.ok("alice", "POST", "/jobs/actions", json={"action": "requeue", "jobs": [str(env.submit("alice"))]})
    assert r["jobs"][0]["result"].startswith("not running")


def test_alice_cannot_hold_bobs_jobs(env: Env) -> None:
    b = env.submit("bob")
    a = env.submit("alice")
    r = env.call("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(b)]})
    assert r.status_code == 403 and "other users" in r.json()["detail"]
    out = env.ok("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(a), str(b)]})
    assert [j["id"] for j in out["jobs"]] == [a] and out["denied"] == [b]
    out = env.ok("alice", "POST", "/jobs/actions", json={"action": "hold", "user": "bob"})
    assert out["jobs"] == [] and out["skipped"] == 1
    out = env.ok("admin", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(b)]})
    env.svc.round()
    assert env.job(b)["pending_reason"] == "JobHeldAdmin"
    out = env.ok("bob", "POST", "/jobs/actions", json={"action": "release", "jobs": [str(b)]})
    assert out["jobs"][0]["result"].startswith("denied: job")
    out = env.ok("admin", "POST", "/jobs/actions", json={"action": "release", "jobs": [str(b)]})
    assert out["jobs"][0]["result"] == "released"


def test_bulk_cancel_by_user_state_and_name(env: Env) -> None:
    a1 = env.submit("alice", name="train")
    b1 = env.submit("bob", name="train")
    env.svc.round()  # both run
    a2, a3 = env.submit("alice", name="train"), env.submit("alice", name="eval")
    b2 = env.submit("bob", name="train")
    out = env.ok("admin", "POST", "/jobs/actions",
                 json={"action": "cancel", "user": "alice", "state": ["PD"], "name": "train"})
    assert [j["id"] for j in out["jobs"]] == [a2]
    out = env.ok("bob", "POST", "/jobs/actions", json={"action": "cancel", "state": ["PD"]})
    assert [j["id"] for j in out["jobs"]] == [b2] and out["skipped"] == 0  # bob's filter sees bob's jobs
    states = {j: env.job(j)["st"] for j in (a1, b1, a2, a3, b2)}
    assert states == {a1: "R", b1: "R", a2: "CA", a3: "PD", b2: "CA"}
    r = env.call("admin", "POST", "/jobs/actions", json={"action": "cancel"})
    assert r.status_code == 422 and "give job ids or a filter" in r.json()["detail"]
    r = env.call("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": ["7_[5-"]})
    assert r.status_code == 422 and "7_[5-" in r.json()["detail"]
    r = env.call("admin", "POST", "/jobs/actions", json={"action": "cancel", "state": ["XX"]})
    assert r.status_code == 422 and "unknown state 'XX'" in r.json()["detail"]


def test_metrics_give_node_states_and_held_jobs(env: Env) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    a = env.submit("alice")
    env.svc.round()
    (node,) = env.nodes_of(a)
    env.ok("admin", "POST", f"/nodes/{node}/drain", json={"reason": "fan"})
    b = env.submit("bob")
    env.ok("bob", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(b)]})
    text = env.client.get("/metrics", headers={"Authorization": f"Bearer {env.admin}"}).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    states = {(s.labels["node"], s.labels["state"]): s.value for s in fams["gpuloom_node_state"].samples}
    other = "node-1" if node == "node-0" else "node-0"
    assert {k for k, v in states.items() if v == 1.0} == {(node, "drng"), (other, "idle")}
    assert len(states) == 12  # 2 nodes x 6 states
    held = {s.labels["reason"]: s.value for s in fams["gpuloom_jobs_held"].samples}
    assert held == {"JobHeldUser": 1.0, "JobHeldAdmin": 0.0}


def test_update_a_pending_job_within_limits(env: Env) -> None:
    blocker = env.submit("alice", gpus=4)
    env.svc.round()
    j = env.submit("alice", gpus=2, time_limit="1:00:00")
    env.svc.round()
    out = env.ok("alice", "POST", f"/jobs/{j}/update", json={"gpus": 1, "time_limit": "30:00", "priority": -5})
    assert (out["gpus"], out["time_limit"], out["priority"]) == (1, 1800.0, -5)
    # refused past the limits: above the default priority, more GPUs than the cluster, another's job
    r = env.call("alice", "POST", f"/jobs/{j}/update", json={"priority": 1})
    assert r.status_code == 403 and "priority 1 is above" in r.json()["detail"]
    r = env.call("alice", "POST", f"/jobs/{j}/update", json={"gpus": 5})
    assert r.status_code == 422 and "needs 5 GPUs, the cluster has 4" in r.json()["detail"]
    assert env.call("bob", "POST", f"/jobs/{j}/update", json={"gpus": 1}).status_code == 403
    r = env.call("alice", "POST", f"/jobs/{blocker}/update", json={"gpus": 1})
    assert r.status_code == 409 and "only a pending job" in r.json()["detail"]
    r = env.call("alice", "POST", f"/jobs/{j}/update", json={})
    assert r.status_code == 422 and "give one or more of" in r.json()["detail"]
    assert env.ok("admin", "POST", f"/jobs/{j}/update", json={"priority": 50})["priority"] == 50
    # the loop schedules the updated job: 1 GPU once the blocker is gone
    env.ok("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(blocker)]})
    env.svc.round()
    env.svc.round()
    got = env.job(j)
    assert got["st"] == "R" and sum(len(p["gpus"]) for p in got["alloc"]["parts"]) == 1


def test_drain_checkpoint_moves_a_job_spanning_nodes(tmp_path: Path, cgroup_parent: str) -> None:
    e = Env(tmp_path, cgroup_parent, nodes=3)
    try:
        j = e.submit("alice", gpus=4)
        e.svc.round()
        assert sorted(e.nodes_of(j)) == ["node-0", "node-1"]
        e.ok("admin", "POST", "/nodes/node-0/drain", json={"reason": "IB link", "mode": "checkpoint"})
        e.svc.round()
        assert sorted(e.nodes_of(j)) == ["node-1", "node-2"] and e.job(j)["attempts"] == 2
    finally:
        e.close()


# four GPUs: 0-1 and 2-3 share a PCIe host bridge, the pairs reach each other over the SMP interconnect
TOPO_4 = ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
          "GPU0\t X \tPHB\tSYS\tSYS\t0-7\nGPU1\tPHB\t X \tSYS\tSYS\t0-7\n"
          "GPU2\tSYS\tSYS\t X \tPHB\t8-15\nGPU3\tSYS\tSYS\tPHB\t X \t8-15\n")


def test_drain_checkpoint_re_places_through_a_topology_aware_policy(tmp_path: Path, cgroup_parent: str) -> None:
    # topo-spread puts a 2-GPU job on a SYS pair: local GPUs 0 and 2 of an empty node (first fit would
    # take 0 and 1).  Moved off a drained node, the job gets the policy's choice on the other node.
    e = Env(tmp_path, cgroup_parent, gpus=4, place="topo-spread",
            model=lambda cl: add_topology(build_model(cl), parse_topology(TOPO_4, "pcie4")))
    try:
        j = e.submit("alice", gpus=2)
        e.svc.round()
        assert e.job(j)["alloc"]["parts"][0]["gpus"] == [0, 2] and e.nodes_of(j) == ["node-0"]
        e.ok("admin", "POST", "/nodes/node-0/drain", json={"reason": "PCIe errors", "mode": "checkpoint"})
        e.svc.round()
        got = e.job(j)
        assert (e.nodes_of(j), got["alloc"]["parts"][0]["gpus"], got["attempts"]) == (["node-1"], [4, 6], 2)
    finally:
        e.close()


def test_holds_of_cancelled_jobs_are_forgotten(tmp_path: Path, cgroup_parent: str) -> None:
    clock = ManualClock(T0)
    e = Env(tmp_path, cgroup_parent, clock)
    try:
        a, b = e.submit("alice"), e.submit("alice")
        e.ok("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(a), str(b)]})
        e.svc.round()
        e.ok("alice", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(a)]})
        e.svc.round()
        assert sorted(e.svc.control.holds) == [a, b]  # (looked at every 10 s)
        clock.advance(10.0)
        e.svc.round()
        assert sorted(e.svc.control.holds) == [b]
        assert e.store.get_meta("job_holds") == f'{{"{b}": "JobHeldUser"}}'
    finally:
        e.close()


def test_bulk_by_queue_and_update_through_queue_permissions(tmp_path: Path, cgroup_parent: str) -> None:
    from gpuloom.core.queues import parse_queues

    e = Env(tmp_path, cgroup_parent, queue="quota")
    try:
        e.svc.queues.configure(parse_queues({"default": "shared", "queue": [
            {"name": "shared", "guarantee": 2, "limit": 4},
            {"name": "lab", "guarantee": 2, "limit": 4, "users": ["bob"]}]}))
        a1 = e.submit("alice")
        b1 = e.submit("bob", queue="lab")
        b2 = e.submit("bob")
        out = e.ok("admin", "POST", "/jobs/actions", json={"action": "hold", "queue": "lab"})
        assert [j["id"] for j in out["jobs"]] == [b1]
        out = e.ok("admin", "POST", "/jobs/actions", json={"action": "hold", "queue": "shared", "user": "bob"})
        assert [j["id"] for j in out["jobs"]] == [b2]
        # alice may not move her job into bob's queue; bob may move his
        r = e.call("alice", "POST", f"/jobs/{a1}/update", json={"queue": "lab"})
        assert r.status_code == 403 and "lab" in r.json()["detail"]
        assert e.ok("bob", "POST", f"/jobs/{b2}/update", json={"queue": "lab"})["queue"] == "lab"
        r = e.call("bob", "POST", f"/jobs/{b2}/update", json={"queue": "nope"})
        assert r.status_code in (403, 422) and "nope" in r.text
        e.svc.round()
        assert (e.job(a1)["st"], e.job(b1)["pending_reason"], e.job(b2)["pending_reason"]) == (
            "R", "JobHeldAdmin", "JobHeldAdmin")
    finally:
        e.close()


def test_a_hold_made_while_holds_are_pruned_is_kept(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # the API thread holds job b between the loop's read of the held jobs' states and its prune
    a, b = env.submit("alice"), env.submit("alice")
    env.ok("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [str(a)]})
    real = env.store.job_states

    def read_then_hold(ids: Any) -> Any:
        out = real(ids)
        row = env.store.get_job(b)
        assert row is not None
        env.svc.control.hold(row, "alice", False)
        return out

    monkeypatch.setattr(env.store, "job_states", read_then_hold)
    env.svc.round()
    assert sorted(env.svc.control.holds) == [a, b]


def test_queue_reclaim_does_not_place_on_a_drained_node(tmp_path: Path, cgroup_parent: str) -> None:
    # lab is owed its guarantee; the only GPU it could reclaim is on the drained node: it waits, and the
    # queue checks (no queue starved two rounds while GPUs are lent) do not stop the rounds
    from gpuloom.core.queues import parse_queues

    e = Env(tmp_path, cgroup_parent, queue="quota")
    try:
        e.svc.queues.configure(parse_queues({"default": "shared", "queue": [
            {"name": "shared", "guarantee": 2, "limit": 4},
            {"name": "lab", "guarantee": 2, "limit": 4, "users": ["bob"]}]}))
        a = [e.submit("alice") for _ in range(3)]
        e.svc.round()
        assert [e.nodes_of(j) for j in a] == [["node-0"], ["node-0"], ["node-1"]]
        e.ok("admin", "POST", "/nodes/node-1/drain", json={"reason": "fan"})
        b = e.submit("bob", queue="lab")
        for _ in range(4):
            e.svc.round()
            assert e.job(b)["nodes"] == [] and [e.job(j)["st"] for j in a] == ["R"] * 3
        e.ok("admin", "POST", "/jobs/actions", json={"action": "cancel", "jobs": [str(a[0])]})
        e.svc.round()
        e.svc.round()
        assert e.nodes_of(b) == ["node-0"]
    finally:
        e.close()
