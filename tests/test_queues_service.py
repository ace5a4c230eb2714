"""Queues in the service: the stored tree, submit --queue and default queues, usage vs quota, admin changes.

In process (FastAPI's TestClient) with real ``sleep`` processes launched by
the service's rounds, run by hand (``Service.round``) so nothing is timed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.core.queues import QueueError, parse_queues
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

TREE = {
    "default": "shared",
    "users": {"alice": "vision"},
    "queue": [
        {"name": "research", "guarantee": 2, "limit": 3},
        {"name": "vision", "parent": "research", "guarantee": 2},
        {"name": "shared", "guarantee": 2, "weight": 2},
    ],
}


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()


def make_service(tmp: Path, cgroup_parent: str, policy: str = "quota") -> Service:
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    cluster = Cluster.homogeneous(1, 4)
    return Service(store, cluster, local_executor(cluster, tmp / "run", True, cgroup_parent),
                   Scheduler.from_names(queue=policy), ServiceConfig(tmp, round_s=1000.0, grace_s=0.0))


@pytest.fixture
def api(tmp_path: Path, cgroup_parent: str) -> Iterator[tuple[TestClient, dict[str, str], Service]]:
    svc = make_service(tmp_path, cgroup_parent)
    svc.queues.configure(parse_queues(TREE))
    tokens = {"admin": ensure_admin_token(svc.store, tmp_path), "alice": create_token(svc.store, "alice"),
              "bob": create_token(svc.store, "bob")}
    with TestClient(create_app(svc)) as client:
        yield client, tokens, svc
    svc.terminate_all()
    svc.shutdown()
    svc.store.close()


def h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def job(gpus: int, **kw: Any) -> dict[str, Any]:
    return {"command": "sleep 30", "gpus": gpus, **kw}


def by_name(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {q["name"]: q for q in out["queues"]}


def test_jobs_go_to_the_named_queue_else_the_users_default_else_the_default(api) -> None:  # noqa: ANN001
    client, tok, _ = api
    assert client.post("/jobs", json=job(1), headers=h(tok["alice"])).json()["queue"] == "vision"
    assert client.post("/jobs", json=job(1), headers=h(tok["bob"])).json()["queue"] == "shared"
    assert client.post("/jobs", json=job(1, queue="shared"), headers=h(tok["alice"])).json()["queue"] == "shared"
    r = client.post("/jobs", json=job(1, queue="nope"), headers=h(tok["bob"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "queue"]
    assert "no queue 'nope'" in r.json()["detail"][0]["msg"]
    r = client.post("/jobs", json=job(1, queue="research"), headers=h(tok["bob"]))
    assert r.status_code == 422 and "has sub-queues" in r.json()["detail"][0]["msg"]
    r = client.post("/jobs", json=job(4), headers=h(tok["alice"]))  # vision is under research's limit of 3
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] == "queue 'vision' can never hold more than 3 GPUs; the job asks for 4"
    assert len(client.get("/jobs", headers=h(tok["admin"])).json()) == 3  # nothing refused was stored


def test_usage_vs_quota_and_pending_reasons(api) -> None:  # noqa: ANN001
    client, tok, svc = api
    # strict limits: research (vision) may hold 3 GPUs; shared is guaranteed 2 and borrows the rest
    for g in (2, 1, 1):
        client.post("/jobs", json=job(g), headers=h(tok["alice"]))  # vision: 2 + 1 fit the limit of 3
    client.post("/jobs", json=job(1), headers=h(tok["bob"]))  # shared: 1
    svc.round()
    out = by_name(client.get("/queues", headers=h(tok["bob"])).json())
    assert out["vision"]["used"]["gpus"] == 3 and out["research"]["used"]["gpus"] == 3
    assert out["vision"]["borrowed"] == 1 and out["research"]["limit"] == {"gpus": 3.0}
    assert out["shared"]["used"]["gpus"] == 1 and out["shared"]["default"] is True
    assert out["vision"]["running"] == 2 and out["vision"]["pending"] == 1
    assert out["vision"]["reasons"] == {"QueueAtQuota": 1}
    jobs = {j["id"]: j for j in client.get("/jobs", headers=h(tok["admin"])).json()}
    assert [jobs[i]["queue"] for i in sorted(jobs)] == ["vision", "vision", "vision", "shared"]
    assert svc.jobs["3"].reason == "QueueAtQuota"


def test_admin_changes_are_validated_stored_and_used(api, tmp_path: Path, cgroup_parent: str) -> None:  # noqa: ANN001
    client, tok, svc = api
    r = client.put("/queues/ops", json={"guarantee": 1, "limit": 2}, headers=h(tok["bob"]))
    assert r.status_code == 403
    r = client.put("/queues/ops", json={"guarantee": 1, "limit": 2}, headers=h(tok["admin"]))
    assert r.status_code == 422 and "ask for 5 gpus, the cluster has 4" in r.json()["detail"]
    r = client.put("/queues/ops", json={"guarantee": 3, "limit": 2}, headers=h(tok["admin"]))
    assert r.status_code == 422 and "exceeds its limit" in r.json()["detail"]
    r = client.put("/queues/shared", json={"guarantee": 1, "weight": 3}, headers=h(tok["admin"]))
    assert r.status_code == 200 and by_name(r.json())["shared"]["weight"] == 3
    assert client.put("/queues/ops", json={"guarantee": 1}, headers=h(tok["admin"])).status_code == 200
    assert client.put("/users/bob/queue", json={"queue": "ops"}, headers=h(tok["admin"])).status_code == 200
    assert client.post("/jobs", json=job(1), headers=h(tok["bob"])).json()["queue"] == "ops"
    # a queue with an active job cannot go
    r = client.delete("/queues/ops", headers=h(tok["admin"]))
    assert r.status_code == 409 and "job 1" in r.json()["detail"]
    assert client.delete("/queues/nope", headers=h(tok["admin"])).status_code == 404
    assert client.put("/queue-default", json={"queue": "vision"}, headers=h(tok["admin"])).json()["default"] == "vision"
    # the stored tree is what a restarted service schedules with
    svc2 = make_service(tmp_path, cgroup_parent)
    tree = svc2.queues.tree
    assert tree is not None and tree.users == {"alice": "vision", "bob": "ops"} and tree.default == "vision"
    assert [(q.name, q.guarantee.gpus, q.weight) for q in tree.queues][-2:] == [("shared", 1.0, 3.0), ("ops", 1.0, 1.0)]
    svc2.store.close()


def test_a_tree_that_would_strand_active_jobs_is_refused(tmp_path: Path, cgroup_parent: str) -> None:
    svc = make_service(tmp_path, cgroup_parent, "drf")  # no tree: a queue per name
    try:
        assert svc.queues.tree is None
        spec = svc.queues.assign({"command": "sleep 1", "gpus": 1}, "carol")
        assert spec["queue"] == "carol"
        svc.submit(spec, "carol")
        with pytest.raises(QueueError, match="active jobs would have no queue: job 1"):
            svc.queues.configure(parse_queues(TREE))
        assert svc.queues.tree is None  # nothing changed
    finally:
        svc.store.close()


def test_a_service_without_queues_refuses_a_queue(tmp_path: Path, cgroup_parent: str) -> None:
    svc = make_service(tmp_path, cgroup_parent, "none")
    try:
        with pytest.raises(QueueError, match="runs without queues"):
            svc.queues.assign({"command": "x", "gpus": 1, "queue": "a"}, "bob")
        assert svc.queues.usage()["queues"] == []
    finally:
        svc.store.close()


def test_a_stored_tree_that_no_longer_fits_is_an_error_at_start(tmp_path: Path, cgroup_parent: str) -> None:
    svc = make_service(tmp_path, cgroup_parent)
    svc.queues.configure(parse_queues(TREE))
    svc.store.close()
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    small = Cluster.homogeneous(1, 2)
    svc2 = Service(store, small, local_executor(small, tmp_path / "run", True, cgroup_parent),
                   Scheduler.from_names(queue="quota"), ServiceConfig(tmp_path))
    try:
        with pytest.raises(QueueError, match="guarantees ask for 4 gpus, the cluster has 2"):
            svc2.queues.validate()
    finally:
        store.close()


def test_a_stored_tree_is_stamped_by_the_services_clock(tmp_path: Path, cgroup_parent: str) -> None:
    # the queue tree's "updated" time is the injected clock's wall time, not the machine's
    from sqlalchemy import select

    from gpuloom.runtime.exec.clock import ManualClock
    from gpuloom.runtime.service.queues import queue_config_t

    clock = ManualClock(1_000.0)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cluster = Cluster.homogeneous(1, 4)
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names(queue="quota"), ServiceConfig(tmp_path, round_s=1000.0, clock=clock))
    try:
        svc.queues.configure(parse_queues(TREE))
        clock.advance(5.0)
        svc.queues.configure(parse_queues({**TREE, "default": "vision"}))
        with store.engine.connect() as c:
            assert c.execute(select(queue_config_t.c.updated)).scalar() == 1_005.0
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
