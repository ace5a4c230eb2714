"""API security and validation, store behaviour, spec parsing (in process, no loop running)."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster, Node
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.admission import refuse_reason
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service, parse_duration, parse_mem
from gpuloom.runtime.state.specs import parse_mem_bytes
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler


@pytest.fixture
def api(tmp_path: Path, cgroup_parent: str):  # noqa: ANN201
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cluster = Cluster.homogeneous(2, 4)
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path))
    admin = ensure_admin_token(store, tmp_path)
    tokens = {"admin": admin, "alice": create_token(store, "alice"), "bob": create_token(store, "bob")}
    with TestClient(create_app(svc)) as client:
        yield client, tokens, tmp_path
    svc.terminate_all()
    svc.shutdown()
    store.close()


def h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_admin_token_file_is_private_and_stable(api) -> None:  # noqa: ANN001
    _, tokens, tmp = api
    f = tmp / "admin.token"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert f.read_text().strip() == tokens["admin"]
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    assert ensure_admin_token(store, tmp) == tokens["admin"]  # second start: same token
    assert store.lookup_token(tokens["admin"]) == ("admin", True)
    assert store.lookup_token("nope") is None
    store.close()


def test_tokens_are_required(api) -> None:  # noqa: ANN001
    c, tokens, _ = api
    job = {"command": "true", "gpus": 1}
    assert c.post("/jobs", json=job).status_code == 401
    assert c.post("/jobs", json=job, headers=h("wrong")).status_code == 401
    assert c.delete("/jobs/1").status_code == 401
    assert c.get("/health").status_code == 200
    r = c.post("/jobs", json=job, headers=h(tokens["alice"]))
    assert r.status_code == 201 and r.json()["user"] == "alice" and r.json()["state"] == "waiting_for_initial_contact"


def test_bad_fields_get_422_naming_them(api) -> None:  # noqa: ANN001
    c, tokens, _ = api
    hd = h(tokens["alice"])

    def locs(body: dict) -> list[str]:
        r = c.post("/jobs", json=body, headers=hd)
        assert r.status_code == 422, r.text
        return [d["loc"][-1] for d in r.json()["detail"]]

    assert locs({"command": "true", "gpus": "two"}) == ["gpus"]
    assert locs({"command": "true", "gpus": 0}) == ["gpus"]
    assert locs({"gpus": 1}) == ["command"]
    assert locs({"command": "true", "gpus": 1, "colour": "red"}) == ["colour"]
    assert locs({"command": "true", "gpus": 1, "mem": "8Q"}) == ["mem"]
    assert locs({"command": "true", "gpus": 1, "time_limit": "soon"}) == ["time_limit"]
    assert locs({"command": "true", "gpus": 1, "checkpoint_dir": "relative/dir"}) == ["checkpoint_dir"]
    assert locs({"command": "true", "gpus": 1, "env": {"CUDA_VISIBLE_DEVICES": "0"}}) == ["env"]
    assert locs({"command": "true", "gpus": 1, "user": "no spaces"}) == ["user"]


def test_jobs_that_can_never_fit_are_refused_with_the_reason(api) -> None:  # noqa: ANN001
    c, tokens, _ = api
    hd = h(tokens["alice"])
    r = c.post("/jobs", json={"command": "true", "gpus": 9}, headers=hd)
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "gpus"] and d["type"] == "never_fits"
    assert d["msg"] == "job can never run on this cluster: needs 9 GPUs, the cluster has 8"
    r = c.post("/jobs", json={"command": "true", "gpus": 1, "cpus": 25}, headers=hd)
    assert r.json()["detail"][0]["loc"] == ["body", "cpus"]
    r = c.post("/jobs", json={"command": "true", "gpus": 2, "cpus": 13}, headers=hd)  # no node has 13 cores
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cpus"]
    assert c.get("/jobs", headers=hd).json() == []  # nothing was stored


def test_users_cancel_only_their_own_jobs(api) -> None:  # noqa: ANN001
    c, tokens, _ = api
    a = c.post("/jobs", json={"command": "true", "gpus": 1}, headers=h(tokens["alice"])).json()["id"]
    b = c.post("/jobs", json={"command": "true", "gpus": 1}, headers=h(tokens["bob"])).json()["id"]
    assert c.delete(f"/jobs/{a}", headers=h(tokens["bob"])).status_code == 403
    assert c.get(f"/jobs/{a}/logs", headers=h(tokens["bob"])).status_code == 403
    r = c.delete(f"/jobs/{a}", headers=h(tokens["alice"]))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert c.delete(f"/jobs/{b}", headers=h(tokens["admin"])).json()["state"] == "cancelled"
    assert c.delete("/jobs/999", headers=h(tokens["admin"])).status_code == 404
    # submitting as someone else: admin only
    assert c.post("/jobs", json={"command": "true", "gpus": 1, "user": "bob"}, headers=h(tokens["alice"])).status_code == 403
    r = c.post("/jobs", json={"command": "true", "gpus": 1, "user": "bob"}, headers=h(tokens["admin"]))
    assert r.status_code == 201 and r.json()["user"] == "bob"
    # token creation: admin only
    assert c.post("/tokens", json={"user": "carol"}, headers=h(tokens["alice"])).status_code == 403
    t = c.post("/tokens", json={"user": "carol"}, headers=h(tokens["admin"])).json()["token"]
    assert c.post("/jobs", json={"command": "true", "gpus": 1}, headers=h(t)).json()["user"] == "carol"
    states = [j["state"] for j in c.get("/jobs", params={"state": "waiting_for_initial_contact"}, headers=h(t)).json()]
    assert states == ["waiting_for_initial_contact"] * 2
    assert c.get("/jobs", params={"state": "queued"}, headers=h(t)).status_code == 422


def test_spec_values_are_parsed(api) -> None:  # noqa: ANN001
    c, tokens, _ = api
    r = c.post("/jobs", json={"command": "true", "gpus": 1, "mem": "8G", "time_limit": "1:30:00", "cpus": 2},
               headers=h(tokens["alice"]))
    j = r.json()
    assert (j["mem_mb"], j["time_limit"], j["cpus"]) == (8000, 5400.0, 2)  # G = 10^9 bytes, MB = 10^6


def test_parsers() -> None:
    assert parse_mem("8G") == 8000 and parse_mem("512M") == 512 and parse_mem(1000) == 1000
    assert parse_mem("1.5T") == 1_500_000 and parse_mem("2gb") == 2000
    # binary units are exact powers of two, rounded up to whole MB of 10^6 bytes
    assert parse_mem("8Gi") == 8590 and parse_mem("512Mi") == 537 and parse_mem("1Ti") == 1_099_512
    assert parse_mem_bytes("8Gi") == 8 * 2**30 and parse_mem_bytes("1.5K") == 1500 and parse_mem_bytes("3KiB") == 3072
    assert parse_mem_bytes("0.1G") == 10**8  # decimal arithmetic: no float error
    for bad in (True, "8Q", "-1G", "1e3G", float("nan")):
        with pytest.raises(ValueError, match="mem"):
            parse_mem(bad)
    assert parse_duration(90) == 90.0 and parse_duration("30") == 1800.0 and parse_duration("1:30") == 90.0
    assert parse_duration("2-01:00:00") == 176400.0 and parse_duration("2h") == 7200.0
    for bad in ("x", "-1", "1:2:3:4"):
        with pytest.raises(ValueError, match="time_limit"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="mem"):
        parse_mem("lots")


def test_refuse_reason_on_a_mixed_cluster() -> None:
    cl = Cluster((Node("a", 8, 16, 100_000), Node("b", 2, 64, 500_000)))
    assert refuse_reason(cl, 10, None, None) is None
    assert refuse_reason(cl, 11, None, None) == ("gpus", "needs 11 GPUs, the cluster has 10")
    assert refuse_reason(cl, 2, 64, None) is None  # fits node b
    assert refuse_reason(cl, 1, 81, None) == ("cpus", "needs 81 CPU cores, the cluster has 80")


def test_store_concurrent_writers_and_compare_and_set(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert store.journal_mode() == "wal"
    ids: list[int] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(50):
            jid = store.add_job({"name": f"w{k}-{i}", "command": "true", "gpus": 1}, f"u{k}", "QUEUED")
            with lock:
                ids.append(jid)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(1, 401))
    assert store.count_jobs() == 400 and len(store.events()) == 400
    assert store.update_job(1, {"state": "RUNNING"}, "launch", expect_state=["QUEUED"])
    assert not store.update_job(1, {"state": "CANCELLED"}, "cancel", expect_state=["QUEUED"])
    assert store.get_job(1).state == "RUNNING"  # type: ignore[union-attr]
    assert [e["kind"] for e in store.events(1)] == ["submit", "launch"]
    store.put_profile("resnet50", {"ips": 120.5})
    store.put_profile("resnet50", {"ips": 130.0})
    assert store.get_profile("resnet50") == {"ips": 130.0}
    store.close()
    # reopened: everything is still there
    again = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert again.count_jobs(["QUEUED"]) == 399
    again.close()


def test_recovery_fails_jobs_the_cluster_can_no_longer_hold(tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl2, cl1 = Cluster.homogeneous(2, 4), Cluster.homogeneous(1, 4)
    big = Service(store, cl2, local_executor(cl2, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path))
    jid = big.submit({"name": "wide", "command": "true", "gpus": 8}, "alice")
    small = Service(store, cl1, local_executor(cl1, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                    ServiceConfig(tmp_path))
    try:
        small.recover()
        row = store.get_job(jid)
        assert row is not None and row.state == "failed"
        assert row.reason == "can never run on this cluster: needs 8 GPUs, the cluster has 4"
        assert small.jobs == {} and small.round() == []
    finally:
        small.shutdown()
        big.shutdown()
        store.close()


@pytest.mark.parametrize("kw,msg", [({"round_s": 0.0}, "round length must be > 0, got 0.0"),
                                    ({"log_cap": 5}, "log cap must be 0 .none. or at least 65536 bytes, got 5")])
def test_service_config_refuses_bad_settings(tmp_path: Path, kw: dict, msg: str) -> None:
    # refused when the settings are made, before a service touches the store
    with pytest.raises(ValueError, match=msg):
        ServiceConfig(tmp_path, **kw)
    assert ServiceConfig(tmp_path, log_cap=0).log_cap == 0  # 0: no cap
