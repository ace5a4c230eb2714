"""The service with a long queue: what a round touches, the store's lock under submissions.  Behaviour only: the speeds are in ``benchmarks/bench_scale.py``.

* a round in which nothing changed reads one statement and touches no waiting job, however many
  wait; a round after a submission gives the new job its reason and leaves the others' as they were;
* the store's lock lets the scheduling loop's thread go before threads that waited longer.
"""

from __future__ import annotations

import threading
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
from gpuloom.runtime.storelock import StoreLock
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()


def _poll(cond, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


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


# -- the store's lock ------------------------------------------------------------------------------
def test_the_store_lock_is_reentrant_and_only_its_holder_releases_it() -> None:
    lock = StoreLock()
    with lock, lock:
        assert lock.waiting() == (0, 0)
        errors: list[Exception] = []

        def other() -> None:
            try:
                lock.release()
            except RuntimeError as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1 and "does not hold" in str(errors[0])
    taken: list[int] = []
    t = threading.Thread(target=lambda: (lock.acquire(), taken.append(1), lock.release()))
    t.start()
    t.join(5)
    assert taken == [1]  # released by both exits above


def test_the_loop_thread_goes_before_api_threads_that_waited_longer(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        counts: list[int] = []
        writers = [threading.Thread(target=store.add_job, args=({"command": "x", "gpus": 1}, "u", "standby"))
                   for _ in range(3)]

        def loop() -> None:
            store.lock.first()
            counts.append(store.count_jobs())

        reader = threading.Thread(target=loop)
        with store.lock:  # a commit in progress
            for t in writers:
                t.start()
            _poll(lambda: store.lock.waiting() == (0, 3), "three writers to wait")
            reader.start()
            _poll(lambda: store.lock.waiting() == (1, 3), "the loop's thread to wait")
        for t in [reader, *writers]:
            t.join(10)
        assert counts == [0]  # it read before any of the three writes that waited longer
        assert store.count_jobs() == 3
    finally:
        store.close()


def test_the_scheduling_loop_waits_for_the_store_as_the_first(tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  tmp_path, round_s=0.05)
    try:
        svc.start()
        with store.lock:  # the loop's next round waits for the store, counted as the first
            _poll(lambda: store.lock.waiting() == (1, 0), "the loop to wait")
    finally:
        svc.shutdown()
        store.close()
