"""A dependency on a job array is one small record, and a round costs the same however many tasks wait.

A 250-byte request (``array: "0-999", dependency: "afterok:<array of 10,000>"``) used to store the
10,000 task ids in each of the 1,000 tasks' specs and re-check tasks x dependencies every round.
Here: the stored form, the SQL a round issues, and Slurm's semantics for arrays with exact states."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.deps import Gate, resolve_dependency
from gpuloom.runtime.service.errors import SubmitError
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler

T0 = 1_700_000_000.0
WAIT = "waiting_for_initial_contact"


@pytest.fixture
def make(tmp_path: Path, cgroup_parent: str):  # noqa: ANN201
    """``make(name, gpus, manual)`` -> a Service (loop not started; a manual clock unless ``manual=False``)
    over a fresh store in its own directory."""
    made: list[Service] = []

    def _make(name: str = "svc", gpus: int = 2, manual: bool = True) -> Service:
        d = tmp_path / name
        d.mkdir()
        cl = Cluster.homogeneous(1, gpus)
        svc = Service(Store(f"sqlite:///{d / 'db.sqlite'}"), cl, local_executor(cl, d / "run", True, cgroup_parent),
                      Scheduler.from_names("fifo"), ServiceConfig(d, round_s=1000.0, grace_s=1.0,
                      clock=ManualClock(T0) if manual else None))
        made.append(svc)
        return svc

    yield _make
    for svc in made:
        svc.terminate_all()
        svc.shutdown()
        svc.store.close()


def stored_specs(db: Path, ids: list[int]) -> list[str]:
    """The ``spec`` column as stored (JSON text) for ``ids``."""
    con = sqlite3.connect(db)
    try:
        rows = dict(con.execute(f"SELECT id, spec FROM jobs WHERE id IN ({','.join(map(str, ids))})").fetchall())
    finally:
        con.close()
    return [rows[i] for i in ids]


def test_an_array_dependency_is_stored_once_whatever_the_arrays_size(make) -> None:  # noqa: ANN001
    svc = make()
    up = svc.submit({"name": "up", "command": "true", "gpus": 1, "array": "0-9999"}, "bob")
    small = svc.submit({"name": "small", "command": "true", "gpus": 1, "array": "0-1"}, "bob")
    spec = {"name": "dep", "command": "true", "gpus": 1, "array": "0-999", "dependency": f"afterok:{up}"}
    dep = svc.submit(spec, "alice")
    ids = list(range(dep, dep + 1000))
    want = json.dumps({**spec, "depends_on": [["afterok", [], [[up, 10_000]]]]}, sort_keys=True)
    assert set(stored_specs(svc.state_dir / "db.sqlite", ids)) == {want}
    assert len(want) < 200  # (it held 10,000 task ids: about 60 kB per task)
    # the same on a two-task array: only the ids differ
    other = svc.submit({**spec, "dependency": f"afterok:{small}"}, "alice")
    assert svc.store.get_job(other).spec["depends_on"] == [["afterok", [], [[small, 2]]]]
    # one task (ID_N) and a single job stay job ids; kinds joined by commas are kept apart
    one = svc.submit({"name": "one", "command": "true", "gpus": 1,
                      "dependency": f"afterok:{up}_7:{small},afterany:{small}_1:{up}"}, "alice")
    assert svc.store.get_job(one).spec["depends_on"] == [
        ["afterok", [up + 7], [[small, 2]]], ["afterany", [small + 1], [[up, 10_000]]]]
    single = svc.submit({"name": "single", "command": "true", "gpus": 1, "dependency": f"afterany:{one}"}, "alice")
    assert svc.store.get_job(single).spec["depends_on"] == [["afterany", [one]]]  # as older releases stored it
    with pytest.raises(SubmitError, match=f"no task 2 in job array {small}"):
        svc.submit({"name": "x", "command": "true", "gpus": 1, "dependency": f"afterok:{small}_2"}, "alice")


# -- Slurm's semantics for arrays, on the gate over a real store -------------------------------------
F, X, C, R, W, GONE = "finished", "failed", "cancelled", "running", WAIT, "gone"
#: task outcomes of a three-task array -> what each kind of dependency on the whole array does
CASES: list[tuple[tuple[str, ...], dict[str, str]]] = [
    ((F, F, F), {"afterok": "run", "afternotok": "never: all 3 tasks finished", "afterany": "run", "after": "run"}),
    ((F, X, F), {"afterok": "never: 1 of 3 tasks failed or cancelled", "afternotok": "run", "afterany": "run",
                 "after": "run"}),
    ((C, F, X), {"afterok": "never: 2 of 3 tasks failed or cancelled", "afternotok": "run", "afterany": "run",
                 "after": "run"}),
    ((F, R, W), {"afterok": "wait", "afternotok": "wait", "afterany": "wait", "after": "wait"}),
    ((X, R, R), {"afterok": "never: 1 of 3 tasks failed or cancelled", "afternotok": "wait", "afterany": "wait",
                 "after": "run"}),
    ((F, F, GONE), {"afterok": "never: 1 of 3 tasks failed or cancelled", "afternotok": "run", "afterany": "run",
                    "after": "run"}),
]


def _array(store: Store, n: int = 3) -> list[int]:
    return store.add_jobs([{"name": "up", "command": "true", "gpus": 1}] * n, "bob", WAIT, now=T0,
                          array_tasks=list(range(n)))


def _end(store: Store, jid: int, outcome: str) -> None:
    """Put one task in ``outcome`` (as the service records it); ``gone``: finished, then purged."""
    if outcome == W:
        return
    started = outcome != C
    fields: dict[str, Any] = {"state": F if outcome == GONE else outcome, "first_start": T0 + 1 if started else None}
    if outcome in (F, X, C, GONE):
        fields["end_time"] = T0 + (2 if outcome != GONE else -100)
    store.update_job(jid, fields, fields["state"], now=T0 + 2)
    if outcome == GONE:
        assert store.purge_jobs(T0, [F]) == [jid]


def _dependent(gate: Gate, store: Store, name: str, dependency: str, spec: dict[str, Any] | None = None) -> int:
    spec = {"name": name, "command": "true", "gpus": 1, "depends_on": resolve_dependency(store, dependency),
            **(spec or {})}
    jid = store.add_jobs([spec], "alice", WAIT, now=T0)[0]
    gate.add(store.get_job(jid))
    return jid


def _outcome(store: Store, jid: int, released: set[int]) -> str:
    row = store.get_job(jid)
    assert row is not None
    if jid in released:
        assert (row.state, row.pending_reason) == (WAIT, None)  # handed on to the service, which admits it
        return "run"
    if row.state == C:
        assert row.pending_reason is None and row.reason.startswith("DependencyNeverSatisfied: ")
        return row.reason.removeprefix("DependencyNeverSatisfied: ")
    assert (row.state, row.pending_reason) == (WAIT, "Dependency")
    return "wait"


@pytest.mark.parametrize("tasks,want", CASES, ids=["-".join(t) for t, _ in CASES])
def test_dependency_kinds_on_a_whole_array(tmp_path: Path, tasks: tuple[str, ...], want: dict[str, str]) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    gate = Gate(store, ManualClock(T0 + 10))
    up = _array(store)
    deps = {kind: _dependent(gate, store, kind, f"{kind}:{up[0]}") for kind in want}
    assert gate.ready() == []
    assert {k: _outcome(store, j, set()) for k, j in deps.items()} == {k: "wait" for k in want}
    for jid, outcome in zip(up, tasks, strict=True):
        _end(store, jid, outcome)
    released = {r.id for r in gate.ready()}
    got = {k: _outcome(store, j, released) for k, j in deps.items()}
    assert got == {k: v.replace("never: ", f"array {up[0]}: ") for k, v in want.items()}
    assert set(gate.held) == {j for k, j in deps.items() if want[k] == "wait"}
    for kind, jid in deps.items():
        if want[kind].startswith("never"):
            assert [e["kind"] for e in store.events(jid)] == ["submit", "cancelled"]
    store.close()


def test_one_task_of_an_array_and_specs_stored_by_older_releases(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    gate = Gate(store, ManualClock(T0 + 10))
    up = _array(store)
    task = {name: _dependent(gate, store, name, dep) for name, dep in (
        ("ok1", f"afterok:{up[0]}_1"), ("notok0", f"afternotok:{up[0]}_0"), ("ok2", f"afterok:{up[0]}_2"),
        ("ok0", f"afterok:{up[0]}_0"))}
    old = {}  # an older release expanded the array into its task ids
    for kind in ("afterok", "afternotok", "afterany"):
        old[kind] = store.add_jobs([{"name": f"old-{kind}", "command": "true", "gpus": 1,
                                     "depends_on": [[kind, list(up)]]}], "alice", WAIT, now=T0)[0]
        gate.add(store.get_job(old[kind]))
    for jid, outcome in zip(up, (X, F, R), strict=True):
        _end(store, jid, outcome)
    released = {r.id for r in gate.ready()}
    assert {k: _outcome(store, j, released) for k, j in task.items()} == {
        "ok1": "run", "notok0": "run", "ok2": "wait", "ok0": f"job {up[0]} failed"}
    assert {k: _outcome(store, j, released) for k, j in old.items()} == {
        "afterok": f"job {up[0]} failed", "afternotok": f"job {up[1]} finished", "afterany": "wait"}
    _end(store, up[2], F)
    assert [r.id for r in gate.ready()] == [task["ok2"], old["afterany"]]
    store.close()


def test_never_satisfied_cascades_through_arrays_in_one_pass(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    gate = Gate(store, ManualClock(T0 + 10))
    up = _array(store)
    x = _dependent(gate, store, "x", f"afterok:{up[0]}")
    y = store.add_jobs([{"name": "y", "command": "true", "gpus": 1,
                         "depends_on": resolve_dependency(store, f"afterok:{x}")}] * 4, "alice", WAIT, now=T0,
                       array_tasks=[0, 1, 2, 3])
    for jid in y:
        gate.add(store.get_job(jid))
    z = _dependent(gate, store, "z", f"afternotok:{x}")
    w = _dependent(gate, store, "w", f"afterany:{y[0]}")  # on the array y: every task ended
    v = _dependent(gate, store, "v", f"afterok:{y[0]}_3", {"array_limit": 1})
    assert gate.ready() == []
    assert gate.by_reason == {"Dependency": 8}
    _end(store, up[1], X)
    released = {r.id for r in gate.ready()}
    assert released == {z, w}
    assert _outcome(store, x, released) == f"array {up[0]}: 1 of 3 tasks failed or cancelled"
    assert [_outcome(store, j, released) for j in y] == [f"job {x} cancelled"] * 4
    assert _outcome(store, v, released) == f"job {y[3]} cancelled"
    assert [e["kind"] for e in store.events(y[2])] == ["submit", "cancelled"]
    assert gate.held == {} and gate.by_reason == {} and gate.by_queue == {}
    store.close()


def test_an_array_limit_applies_once_the_dependency_is_met(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    gate = Gate(store, ManualClock(T0 + 10))
    up = _array(store, 2)
    deps = resolve_dependency(store, f"afterok:{up[0]}")
    d = store.add_jobs([{"name": "d", "command": "true", "gpus": 1, "depends_on": deps, "array_limit": 2}] * 4,
                       "alice", WAIT, now=T0, array_tasks=[0, 1, 2, 3])
    for jid in d:
        gate.add(store.get_job(jid))
    assert gate.ready() == []
    _end(store, up[0], F)
    _end(store, up[1], F)
    assert [r.id for r in gate.ready()] == d[:2]
    assert [store.get_job(j).pending_reason for j in d] == [None, None, "JobArrayTaskLimit", "JobArrayTaskLimit"]
    assert gate.by_reason == {"JobArrayTaskLimit": 2}
    store.set_states(d[:2], "waiting_for_initial_resource", [WAIT], now=T0 + 3)  # admitted by the service
    assert gate.ready() == []  # two active
    _end(store, d[0], F)
    assert [r.id for r in gate.ready()] == [d[2]]
    store.close()


# -- what a round issues -------------------------------------------------------------------------
class Statements:
    """Counts the SQL statements the store's engine sends while :attr:`on`."""

    def __init__(self, store: Store) -> None:
        self.n = 0
        self.on = False
        event.listen(store.engine, "before_cursor_execute", self._count)

    def _count(self, *_: Any) -> None:
        if self.on:
            self.n += 1

    def during(self, fn: Any) -> int:
        self.n, self.on = 0, True
        try:
            fn()
        finally:
            self.on = False
        return self.n


def _held_chain(svc: Service, tasks: int) -> tuple[int, int, int]:
    """A job on both GPUs (running), a job r waiting for it, an array u of 2 on r, an array d of ``tasks`` on u."""
    svc.submit({"name": "blocker", "command": "sleep 60", "gpus": 2}, "bob")
    svc.round()
    r = svc.submit({"name": "r", "command": "true", "gpus": 1}, "bob")
    u = svc.submit({"name": "u", "command": "true", "gpus": 1, "array": "0-1", "dependency": f"afterok:{r}"}, "bob")
    d = svc.submit({"name": "d", "command": "true", "gpus": 1, "array": f"0-{tasks - 1}",
                    "dependency": f"afterok:{u}"}, "alice")
    svc.round()
    return r, u, d


def test_a_rounds_statements_do_not_grow_with_held_tasks(make) -> None:  # noqa: ANN001
    counts = {}
    for tasks in (10, 1000):
        svc = make(f"held{tasks}")
        r, u, d = _held_chain(svc, tasks)
        assert len(svc.gate) == 2 + tasks and set(svc.driver.jobs) == {str(r - 1), str(r)}
        stmts = Statements(svc.store)
        steady = [stmts.during(svc.round) for _ in range(2)]
        svc.cancel(r, "bob", False)
        cascade = stmts.during(svc.round)  # u can never run, nor d after it: all cancelled in this round
        counts[tasks] = (steady, cascade)
        assert len(svc.gate) == 0
        assert {svc.store.get_job(j).reason for j in (u, u + 1)} == {f"DependencyNeverSatisfied: job {r} cancelled"}
        assert {(row.state, row.reason) for row in svc.store.array_tasks(d)} == {
            ("cancelled", f"DependencyNeverSatisfied: array {u}: 2 of 2 tasks failed or cancelled")}
        assert svc.store.count_array(d, ["cancelled"]) == tasks
    assert counts[10] == counts[1000], counts
    assert counts[10][0][0] == counts[10][0][1]


def test_held_jobs_are_counted_in_the_metrics_by_reason(make) -> None:  # noqa: ANN001
    svc = make()
    up = svc.submit({"name": "up", "command": "true", "gpus": 1}, "bob")
    svc.submit({"name": "d", "command": "true", "gpus": 1, "array": "0-4", "dependency": f"afterok:{up}",
                "queue": "research"}, "alice")
    svc.submit({"name": "l", "command": "true", "gpus": 1, "array": "0-2%1"}, "alice")
    with svc.lock:
        svc.observe()  # loads and gates; nothing is launched
    fams = {f.name: f for f in text_string_to_metric_families(svc.telemetry.metrics_text().decode())}

    def values(name: str, key: str) -> dict:
        return {tuple(s.labels[k] for k in key.split(",")): s.value for s in fams[name].samples}

    # every pending job is counted: the two no round has looked at yet (bob's job, task l_0) as "None"
    assert values("gpuloom_pending_jobs", "reason") == {("Dependency",): 5.0, ("JobArrayTaskLimit",): 2.0,
                                                        ("None",): 2.0}
    assert values("gpuloom_queue_jobs", "queue,st") == {("research", "PD"): 5.0, ("", "PD"): 4.0}



def test_kinds_on_an_array_whose_task_fails_end_to_end(make) -> None:  # noqa: ANN001
    svc = make("e2e", gpus=4, manual=False)
    up = svc.submit({"name": "up", "command": "test $GPULOOM_ARRAY_TASK_ID != 1", "gpus": 1, "array": "0-2"}, "bob")
    dep = {kind: svc.submit({"name": kind, "command": "true", "gpus": 1, "dependency": f"{kind}:{up}"}, "alice")
           for kind in ("afterok", "afternotok", "afterany", "after")}
    dep["task0"] = svc.submit({"name": "task0", "command": "true", "gpus": 1, "dependency": f"afterok:{up}_0"}, "alice")
    dep["chain"] = svc.submit({"name": "chain", "command": "true", "gpus": 1,
                               "dependency": f"afterok:{dep['afterok']}"}, "alice")
    end = time.monotonic() + 30
    while svc.store.count_jobs(["finished", "failed", "cancelled"]) < 9 and time.monotonic() < end:
        svc.round()
        time.sleep(0.05)
    assert [(r.state, r.exit_code) for r in svc.store.array_tasks(up)] == [("finished", 0), ("failed", 1),
                                                                         ("finished", 0)]
    got = {k: (svc.store.get_job(j).state, svc.store.get_job(j).reason) for k, j in dep.items()}
    assert got == {
        "afterok": ("cancelled", f"DependencyNeverSatisfied: array {up}: 1 of 3 tasks failed or cancelled"),
        "afternotok": ("finished", None), "afterany": ("finished", None), "after": ("finished", None),
        "task0": ("finished", None), "chain": ("cancelled", f"DependencyNeverSatisfied: job {dep['afterok']} cancelled"),
    }
