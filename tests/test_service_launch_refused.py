"""A launch whose confirmation the store refuses (the database down, the state disk full) is undone, its job
queued again; unless the job has already ended on its own meanwhile: it ran, and undone it would run again,
so the launch stands and is recorded, with its end, once the store takes them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store, StoreUnavailable
from gpuloom.scheduler import Scheduler
from service_util import job_writable, wait_for


@pytest.fixture
def setup(tmp_path: Path, cgroup_parent: str) -> Iterator[tuple[Service, Store, list[str]]]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=1000.0, grace_s=1.0, launch_timeout_s=60.0))
    refusals: list[str] = []  # what the store is made to refuse, once each ("launch": a launch's confirmation)
    real = store.update_job

    def update_job(jid: int, fields: dict[str, Any], event: str | None = None, *a: Any, **k: Any) -> Any:
        if event in refusals:
            refusals.remove(event)
            hook()
            raise StoreUnavailable("the database is down")
        return real(jid, fields, event, *a, **k)

    hook = lambda: None  # noqa: E731
    store.update_job = update_job  # type: ignore[method-assign]
    try:
        yield svc, store, refusals
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def rounds_until_final(svc: Service, store: Store, jid: int) -> str:
    def final() -> str | None:
        svc.round()
        row = store.get_job(jid)
        return row.state if row is not None and row.state in ("finished", "failed", "cancelled") else None
    return str(wait_for(final, what="the job to end"))


def test_a_job_that_ended_while_its_launch_was_refused_is_not_run_again(
        setup: tuple[Service, Store, list[str]], tmp_path: Path) -> None:
    svc, store, refusals = setup
    ledger = job_writable(tmp_path) / "ledger"
    jid = svc.submit({"name": "a", "command": f"echo ran >> {ledger}", "gpus": 1}, "alice")
    refusals.append("launch")
    real_write = svc.actuator.mirror.write

    def write(j: str, fields: dict[str, Any], event: str | None = None, *a: Any, **k: Any) -> Any:
        if event == "launch":  # the store is slow to refuse: the job has run to its end by then
            wait_for(lambda: ledger.exists() and not svc.executor.alive(j), what="the job to end")
        return real_write(j, fields, event, *a, **k)

    svc.actuator.mirror.write = write  # type: ignore[method-assign]
    svc.round()  # launched, confirmation refused: the launch stands (its record waits)
    assert store.get_job(jid).state != "finished"  # type: ignore[union-attr]
    assert rounds_until_final(svc, store, jid) == "finished"
    assert ledger.read_text() == "ran\n"
    row = store.get_job(jid)
    assert row is not None and row.attempts == 1 and row.exit_code == 0
    kinds = [e["kind"] for e in store.events(jid)]
    assert kinds.count("launch") == 1 and kinds.index("launch") < kinds.index("finished"), kinds


def test_a_running_job_whose_launch_was_refused_is_undone_and_launched_again(
        setup: tuple[Service, Store, list[str]], tmp_path: Path) -> None:
    svc, store, refusals = setup
    ledger, go = job_writable(tmp_path) / "ledger", job_writable(tmp_path) / "go"
    jid = svc.submit({"name": "a", "command": f"echo started >> {ledger}; until [ -e {go} ]; do sleep 0.05; done; "
                                              f"echo ran >> {ledger}", "gpus": 1}, "alice")
    refusals.append("launch")
    real_write = svc.actuator.mirror.write

    def write(j: str, fields: dict[str, Any], event: str | None = None, *a: Any, **k: Any) -> Any:
        if event == "launch" and "launch" in refusals:  # the job runs when its confirmation is refused
            wait_for(ledger.exists, what="the job to start")
        return real_write(j, fields, event, *a, **k)

    svc.actuator.mirror.write = write  # type: ignore[method-assign]
    svc.round()  # launched, confirmation refused, the process still running: undone
    row = store.get_job(jid)
    assert row is not None and row.state == "waiting_for_initial_resource" and not svc.actuator.running
    assert ledger.read_text() == "started\n"
    go.touch()
    assert rounds_until_final(svc, store, jid) == "finished"
    assert ledger.read_text() == "started\nstarted\nran\n"
    row = store.get_job(jid)
    assert row is not None and row.attempts == 2
