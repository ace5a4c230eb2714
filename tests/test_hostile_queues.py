"""A hostile but authenticated user against the submission limits (issue 34, item 9).

In process (FastAPI's TestClient) with real ``sleep`` processes launched by rounds run by hand
(``Service.round``), so nothing is timed: each submission limit with its 4xx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.admission import Limiter, SubmitLimits
from gpuloom.runtime.api import create_app, create_token, ensure_admin_token
from gpuloom.runtime.router import local_executor
from gpuloom.runtime.service import Service
from gpuloom.runtime.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

Api = tuple[TestClient, Callable[[str], dict[str, str]], Service]


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()


@pytest.fixture
def serve(tmp_path: Path, cgroup_parent: str) -> Iterator[Callable[..., Api]]:
    """``serve(policy)`` -> (client, headers of a user, service) on a 1x4 cluster."""
    made: list[tuple[TestClient, Service]] = []

    def _serve(policy: str = "none") -> Api:
        store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        cluster = Cluster.homogeneous(1, 4)
        svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                      Scheduler.from_names(queue=policy), tmp_path, round_s=1000.0, grace_s=0.0)
        tokens = {"admin": ensure_admin_token(store, tmp_path)}

        def h(user: str) -> dict[str, str]:
            if user not in tokens:
                tokens[user] = create_token(store, user)
            return {"Authorization": f"Bearer {tokens[user]}"}

        client = TestClient(create_app(svc))
        client.__enter__()
        made.append((client, svc))
        return client, h, svc

    yield _serve
    for client, svc in made:
        client.__exit__(None, None, None)
        svc.terminate_all()
        svc.store.close()


def job(gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return {"command": "sleep 60", "gpus": gpus, **kw}


# -- limits ------------------------------------------------------------------------------------------
def test_pending_jobs_per_user_are_limited_an_array_counting_its_tasks(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("none")
    svc.limits = Limiter(SubmitLimits(max_pending=3), svc.clock.monotonic)
    assert client.post("/jobs", json=job(array="0-1"), headers=h("alice")).status_code == 201
    assert client.post("/jobs", json=job(), headers=h("alice")).status_code == 201
    r = client.post("/jobs", json=job(), headers=h("alice"))
    assert r.status_code == 403
    assert r.json()["detail"] == ("user 'alice' has 3 pending jobs; with 1 more that is over this service's "
                                  "max_pending of 3 per user (serve --max-pending): wait for some to start or end, "
                                  "or cancel some")
    assert client.post("/jobs", json=job(), headers=h("bob")).status_code == 201  # per user
    assert client.post("/jobs", json=job(user="alice"), headers=h("admin")).status_code == 201  # admins exempt
    svc.round()  # 4 GPUs: four of the five start; alice has one pending again, room for two more
    assert client.post("/jobs", json=job(array="0-1"), headers=h("alice")).status_code == 201
    assert client.post("/jobs", json=job(), headers=h("alice")).status_code == 403


def test_array_size_is_limited_in_tasks_and_indices(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("none")
    for spec, msg in (("0-1001", "1002 tasks"), ("1001", "index 1001")):  # the default, Slurm's
        r = client.post("/jobs", json=job(array=spec), headers=h("admin"))  # admins too
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "array"]
        assert r.json()["detail"][0]["msg"] == (f"array: {msg} is over this service's max_array_size of 1001 (at most "
                                                "1001 tasks, indices 0-1000; serve --max-array-size)")
    svc.limits = Limiter(SubmitLimits(max_array_size=4), svc.clock.monotonic)
    assert client.post("/jobs", json=job(array="0-3"), headers=h("alice")).status_code == 201
    assert client.post("/jobs", json=job(array="1-4"), headers=h("alice")).status_code == 422
    assert svc.store.count_jobs() == 4


def test_submissions_per_second_are_a_token_bucket_with_retry_after(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("none")
    now = [100.0]
    svc.limits = Limiter(SubmitLimits(rate=0.5, burst=2), lambda: now[0])
    assert [client.post("/jobs", json=job(), headers=h("alice")).status_code for _ in range(2)] == [201, 201]
    r = client.post("/jobs", json=job(), headers=h("alice"))
    assert r.status_code == 429 and r.headers["Retry-After"] == "2"
    assert r.json()["detail"] == ("too many submissions: at most 0.5 per second per user (bursts of 2; serve "
                                  "--submit-rate/--submit-burst); retry in 2 s, or submit many jobs as one array")
    assert client.post("/jobs", json=job(), headers=h("bob")).status_code == 201  # per user
    assert client.post("/jobs", json=job(), headers=h("admin")).status_code == 201  # admins exempt
    now[0] += 1.0
    assert client.post("/jobs", json=job(), headers=h("alice")).status_code == 429  # half a token
    now[0] += 1.0
    assert client.post("/jobs", json=job(), headers=h("alice")).status_code == 201
    assert svc.store.count_jobs() == 5


