"""Operator control: node drain (wait, checkpoint), maintenance windows, job hold/release/requeue
and bulk selection, through the API with the loop's rounds run by hand (real processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent, wait_for

T0 = 1_700_000_000.0


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()


class Env:
    def __init__(self, tmp: Path, cgroup_parent: str, clock: ManualClock | None = None) -> None:
        self.tmp = tmp
        self.parent = cgroup_parent
        self.clock = clock
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        self.cluster = Cluster.homogeneous(2, 2)  # node-0, node-1: 2 GPUs each
        self.svc = self._service()
        self.admin = ensure_admin_token(self.store, tmp)
        self.tok = {"admin": self.admin, "alice": create_token(self.store, "alice"),
                    "bob": create_token(self.store, "bob")}
        self.client = TestClient(create_app(self.svc))

    def _service(self) -> Service:
        return Service(self.store, self.cluster,
                       local_executor(self.cluster, self.tmp / "run", True, self.parent),
                       Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"),
                       ServiceConfig(self.tmp, round_s=1000.0, grace_s=2.0, clock=self.clock))

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
