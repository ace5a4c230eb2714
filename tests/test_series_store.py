"""The dashboard's time series are stored: they survive a restart, are averaged by ``step``, and kept in
two tiers (fine for 24 h, 5-minute means for 30 days)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.core.queues import parse_queues
from gpuloom.runtime.api.app import create_app, ensure_admin_token
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.series import SeriesRecorder, downsample
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state import gpudb
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

T0 = 1_800_000_000.0  # a multiple of 300: the coarse windows start at T0


def test_downsample_averages_each_step() -> None:
    pts = [{"time": T0 + t, "busy": float(b), "queues": {"a": float(b)}} for t, b in ((0, 1), (2, 3), (4, 5), (6, 7))]
    assert downsample(pts, 4.0) == [{"time": T0, "busy": 2.0, "queues": {"a": 2.0}},
                                    {"time": T0 + 4, "busy": 6.0, "queues": {"a": 6.0}}]
    assert downsample(pts, 2.0) == pts


def test_two_tiers_and_their_retention(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    rec = SeriesRecorder(store, 2.0)
    for k in range(4):  # 2 in the first 5-minute window, 2 in the next
        rec.add({"time": T0 + 150 * k, "busy": float(k)})
    rec.flush(T0 + 450)
    got = gpudb.points(store, T0)
    assert [(t - T0, s, d) for t, s, d in got] == \
        [(0.0, 2.0, {"busy": 0.0}), (150.0, 2.0, {"busy": 1.0}), (300.0, 2.0, {"busy": 2.0}), (450.0, 2.0, {"busy": 3.0})]
    # a long range reads the 5-minute means where there are some (the window from T0 + 300 is still open)
    assert [(t - T0, s, d) for t, s, d in gpudb.points(store, T0, coarse=True)] == \
        [(0.0, 300.0, {"busy": 0.5}), (300.0, 2.0, {"busy": 2.0}), (450.0, 2.0, {"busy": 3.0})]
    gpudb.prune(store, T0 + 300 + gpudb.FINE_KEEP_S + 1, 2.0)  # the fine points before T0 + 301 go
    got = gpudb.points(store, T0)
    assert [(t - T0, s, d) for t, s, d in got] == [(0.0, 300.0, {"busy": 0.5}), (450.0, 2.0, {"busy": 3.0})]
    gpudb.prune(store, T0 + gpudb.COARSE_KEEP_S + 1, 2.0)
    assert gpudb.points(store, 0) == []
    store.close()


def test_series_survive_a_restart(tmp_path: Path) -> None:
    parents = own_cgroup_parent()
    parent = next(parents)
    cl = Cluster.homogeneous(1, 2)
    tree = parse_queues({"default": "team", "queue": [{"name": "team", "guarantee": 2}]})

    def service(clock: ManualClock) -> Service:
        return Service(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), cl,
                       local_executor(cl, tmp_path / "run", True, parent), Scheduler.from_names(queue="quota"),
                       ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0, clock=clock))

    clock = ManualClock(T0)
    svc = service(clock)
    svc.queues.configure(tree)
    svc.submit({"name": "a", "command": "sleep 60", "gpus": 1}, "alice")
    svc.submit({"name": "b", "command": "sleep 60", "gpus": 2}, "alice")
    for _ in range(3):  # samples at T0, T0 + 2, T0 + 4
        svc.round()
        clock.advance(2)
    svc.terminate_all()
    svc.shutdown()
    svc.store.close()
    again = service(ManualClock(T0 + 100))
    try:
        admin = ensure_admin_token(again.store, tmp_path)
        with TestClient(create_app(again)) as c:
            h = {"Authorization": f"Bearer {admin}"}
            pts = c.get("/stats/series", params={"since": repr(T0)}, headers=h).json()
            coarse = c.get("/stats/series", params={"since": repr(T0), "step": 4}, headers=h).json()
        keep = ("gpus", "allocated", "busy", "pending", "running", "queues")
        assert [{k: p[k] for k in keep} for p in pts] == \
            [{"gpus": 2.0, "allocated": 1.0, "busy": 1.0, "pending": 1.0, "running": 1.0, "queues": {"team": 1.0}}] * 3
        assert [p["time"][:19] for p in pts] == ["2027-01-15T08:00:00", "2027-01-15T08:00:02", "2027-01-15T08:00:04"]
        assert [p["time"][:19] for p in coarse] == ["2027-01-15T08:00:00", "2027-01-15T08:00:04"]
    finally:
        again.terminate_all()
        again.shutdown()
        again.store.close()
        next(parents, None)
