"""A new job's contact (waiting for initial contact -> waiting for resources) that the store refuses is
made again at the next round: the job is not left behind, and the jobs queued after it are not held
back by it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store, StoreFull
from gpuloom.scheduler import Scheduler
from service_util import fill

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@needs_root
def test_a_contact_refused_on_a_full_disk_is_made_at_the_next_round(
        tmp_path: Path, tmpfs: Callable[[str, str], Path], cgroup_parent: str) -> None:
    db = tmpfs("db", "8m")
    store = Store(f"sqlite:///{db / 'gpuloom.db'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0, launch_timeout_s=60.0))
    try:
        a = svc.submit({"name": "a", "command": "sleep 60", "gpus": 1}, "alice")
        filler = fill(db)
        with pytest.raises(StoreFull):
            svc.round()  # the new job is read; its contact cannot be stored
        assert store.get_job(a).state == "waiting_for_initial_contact"  # type: ignore[union-attr]
        filler.unlink()
        svc.round()
        row = store.get_job(a)
        assert row is not None and row.state == "launching"
        assert [e["kind"] for e in store.events(a)] == ["submit", "waiting_for_initial_resource",
                                                         "launch-intent", "launch"]
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
