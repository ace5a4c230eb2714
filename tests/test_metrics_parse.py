"""``/metrics`` read by prometheus-client's parser: pending by reason sums to the pending jobs (held ones
included), per-queue usage sums to the allocated GPUs, build info and the process collectors are there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuloom import __version__
from gpuloom.core.cluster import Cluster
from gpuloom.core.queues import parse_queues
from gpuloom.runtime.api.app import create_app, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

TREE = {"default": "shared", "queue": [
    {"name": "research", "guarantee": 2, "limit": 3},
    {"name": "vision", "parent": "research", "guarantee": 1},
    {"name": "nlp", "parent": "research", "guarantee": 1},
    {"name": "shared", "guarantee": 1}]}


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    parents = own_cgroup_parent()
    parent = next(parents)
    cl = Cluster.homogeneous(1, 4)
    s = Service(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), cl, local_executor(cl, tmp_path / "run", True, parent),
                Scheduler.from_names(queue="quota"), ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0))
    s.queues.configure(parse_queues(TREE))
    yield s
    s.terminate_all()
    s.shutdown()
    s.store.close()
    next(parents, None)


def scrape(svc: Service, tmp_path: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted labels: value}} of one ``GET /metrics``."""
    admin = ensure_admin_token(svc.store, tmp_path)
    with TestClient(create_app(svc)) as c:
        text = c.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(m: dict[tuple[tuple[str, str], ...], float], key: str) -> dict[str, float]:
    return {dict(k)[key]: v for k, v in m.items()}


def test_pending_by_reason_sums_to_the_pending_jobs_and_queue_usage_to_the_allocated_gpus(
        svc: Service, tmp_path: Path) -> None:
    sub: Any = svc.submit
    a = sub({"name": "a", "command": "sleep 60", "gpus": 1, "queue": "vision"}, "alice")
    sub({"name": "b", "command": "sleep 60", "gpus": 2, "queue": "nlp"}, "bob")
    sub({"name": "arr", "command": "sleep 60", "gpus": 1, "queue": "shared", "array": "0-3%1"}, "bob")
    sub({"name": "dep", "command": "true", "gpus": 1, "queue": "vision", "dependency": f"afterok:{a}"}, "alice")
    sub({"name": "big", "command": "sleep 60", "gpus": 2, "queue": "nlp"}, "bob")
    svc.round()
    sub({"name": "late", "command": "sleep 60", "gpus": 1}, "carol")  # not picked up by a round yet
    m = scrape(svc, tmp_path)
    # a, b and array task 0 run (4 GPUs); 3 array tasks (limit), dep, big (quota) and late wait
    pd = sum(v for k, v in m["gpuloom_jobs"].items() if dict(k)["st"] == "PD")
    assert pd == 6.0
    reasons = by(m["gpuloom_pending_jobs"], "reason")
    assert sum(reasons.values()) == pd
    # (late: no round has looked at it yet, Slurm's "None")
    assert reasons == {"JobArrayTaskLimit": 3.0, "Dependency": 1.0, "QueueAtQuota": 1.0, "None": 1.0}
    allocated = sum(m["gpuloom_node_gpus_allocated"].values())
    assert allocated == 4.0
    used = by(m["gpuloom_queue_gpus_used"], "queue")
    assert used == {"research": 3.0, "vision": 1.0, "nlp": 2.0, "shared": 1.0}
    assert used["vision"] + used["nlp"] + used["shared"] == allocated  # the leaves' usage: every allocated GPU
    assert by(m["gpuloom_queue_gpus_nominal"], "queue") == {"research": 2.0, "vision": 1.0, "nlp": 1.0, "shared": 1.0}
    assert by(m["gpuloom_queue_gpus_limit"], "queue") == {"research": 3.0}
    # the gate's held jobs in their queues: 3 array tasks in shared, dep in vision (and research above it)
    assert by(m["gpuloom_queue_pending_jobs"], "queue") == {"research": 2.0, "vision": 1.0, "nlp": 1.0, "shared": 3.0}
    assert by(m["gpuloom_queue_admitted_jobs"], "queue") == {"research": 2.0, "vision": 1.0, "nlp": 1.0, "shared": 1.0}
    (labels, one), = m["gpuloom_build_info"].items()
    assert one == 1.0 and dict(labels)["version"] == __version__
    assert m["process_resident_memory_bytes"][()] > 0 and m["process_cpu_seconds_total"][()] > 0
    assert "python_info" in m
