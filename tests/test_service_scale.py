"""The service with a long queue.  Behaviour only: the speeds are in ``benchmarks/bench_scale.py``.

* a round in which nothing changed reads one statement and touches no waiting job, however many
  wait; a round after a submission gives the new job its reason and leaves the others' as they were.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.clock import ManualClock
from gpuloom.runtime.router import local_executor
from gpuloom.runtime.service import Service
from gpuloom.runtime.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()


# -- rounds ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("waiting", [5, 60])
def test_a_round_in_which_nothing_changed_touches_no_waiting_job(tmp_path: Path, cgroup_parent: str,
                                                                 waiting: int) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 2)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  tmp_path, round_s=1000.0, grace_s=1.0, launch_timeout_s=1.0, clock=clock)
    try:
        run = [svc.submit({"name": "r", "command": "sleep 60", "gpus": 1}, "alice") for _ in range(2)]
        svc.round()
        clock.advance(2.0)  # past the launch timeout: running_protected
        svc.round()
        clock.advance(100.0)  # past the protection: running
        svc.round()
        assert [store.get_job(j).state for j in run] == ["running", "running"]  # type: ignore[union-attr]
        first = svc.submit({"name": "p", "command": "sleep 60", "gpus": 1, "array": f"0-{waiting - 1}"}, "alice")
        pending = [str(first + k) for k in range(waiting)]
        svc.round()  # they make contact; the cluster is full
        assert {store.get_job(int(j)).pending_reason for j in pending} == {"Resources"}  # type: ignore[union-attr]
        seen = {j: svc.jobs[j].last_update for j in pending}
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute",
                     lambda _c, _cur, sql, *_: statements.append(" ".join(sql.split()[:1])))
        for _ in range(3):
            clock.advance(5.0)
            svc.round()
            # one statement (any new submission?), however many jobs wait; no job's reason is redone
            assert statements == ["SELECT"] and list(svc.driver.reasoned) == []
            statements.clear()
        assert {j: svc.jobs[j].last_update for j in pending} == seen  # no waiting job was advanced
        assert {svc.jobs[j].last_update for j in map(str, run)} == {svc.now()}  # the running ones were
        late = svc.submit({"name": "late", "command": "sleep 60", "gpus": 1}, "alice")
        svc.round()  # the new job alone gets its reason
        assert [j.id for j in svc.driver.reasoned] == [str(late)]
        assert store.get_job(late).pending_reason == "Resources"  # type: ignore[union-attr]
        # a running job ends: the first in the queue starts, every job's reason is given again
        svc.cancel(run[0], "alice", False)
        end = time.monotonic() + 20
        while store.get_job(first).state != "launching" and time.monotonic() < end:  # type: ignore[union-attr]
            clock.advance(1.0)
            svc.round()
            time.sleep(0.05)
        assert store.get_job(first).state == "launching"  # type: ignore[union-attr]
        assert len(svc.driver.reasoned) == waiting + 2
        assert {store.get_job(int(j)).pending_reason for j in pending[1:] + [str(late)]} == {"Resources"}  # type: ignore[union-attr]
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
