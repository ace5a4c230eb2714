"""Advance reservations (core/reservations.py, policies/backfill.py, sim/reservations.py): exact starts on
hand-checked cases in the simulator, and bad reservations refused with a clear reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuloom.core.cluster import parse_cluster
from gpuloom.core.job import JobSpec
from gpuloom.core.reservations import Reservation, ReservationError, check_overlaps
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.reservations import load_calendar


def _run(cluster: str, specs: list[JobSpec], reservations: list[Reservation], depth: int = 0,
         observers=()) -> dict[str, tuple[float | None, int]]:
    sched = Scheduler.from_names(preemptive=False)
    bf = sched.reserve(depth)
    bf.reservations = list(reservations)
    sim = Simulator(parse_cluster(cluster), specs, sched, None, SimConfig(round_len=10.0, restart_overhead=0.0),
                    observers=[o(bf) for o in observers])
    return {j.id: (j.first_start, j.preemptions) for j in sim.run().jobs}


def test_a_reserved_node_is_kept_for_its_users() -> None:
    # 2x2 (node-0, node-1); node-1 reserved for alice from 100 to 300.  bob's b0, b1 (500 s) fill node-0 at 0;
    # b2 (50 s) ends before the window and runs on node-1 at 0.  bob's b3 (1000 s, at 60) would take node-1:
    # it waits for the window's end (300).  alice's 2-GPU job (at 100) starts at 100 on node-1.
    specs = [JobSpec("b0", 0, 1, 500.0, user="bob"), JobSpec("b1", 0, 1, 500.0, user="bob"),
             JobSpec("b2", 0, 1, 50.0, user="bob"), JobSpec("b3", 60, 1, 1000.0, user="bob"),
             JobSpec("a0", 100, 2, 100.0, user="alice")]
    resv = Reservation("maint", 100.0, 300.0, frozenset({"alice"}), ("node-1",))
    got = _run("2x2", specs, [resv])
    assert {k: v[0] for k, v in got.items()} == {"b0": 0.0, "b1": 0.0, "b2": 0.0, "b3": 300.0, "a0": 100.0}
    # without it b3 takes node-1 at 60 and alice waits for node-0 (500)
    got = _run("2x2", specs, [])
    assert {k: v[0] for k, v in got.items()} == {"b0": 0.0, "b1": 0.0, "b2": 0.0, "b3": 60.0, "a0": 500.0}


def test_a_gpu_count_reservation_keeps_that_many_gpus() -> None:
    # 1x4; 2 GPUs reserved for alice from 100 to 300: two of bob's four 1000 s jobs start at 0, the two that
    # would overlap the reserved GPUs wait until 300; alice's 2-GPU job runs 100-200
    specs = [JobSpec(f"b{i}", 0, 1, 1000.0, user="bob") for i in range(4)] + [JobSpec("a0", 100, 2, 100.0, user="alice")]
    kept: list[tuple[int, ...]] = []

    def watch(bf):  # noqa: ANN001, ANN202
        def obs(sim, what):  # noqa: ANN001, ANN202
            if what == "round" and sim.now == 150.0:
                kept.append(bf.kept["lab"])
        return obs

    got = _run("1x4", specs, [Reservation("lab", 100.0, 300.0, frozenset({"alice"}), gpus=2)], observers=[watch])
    assert sorted(v[0] for k, v in got.items() if k.startswith("b")) == [0.0, 0.0, 300.0, 300.0]
    assert got["a0"][0] == 100.0
    assert len(kept[0]) == 2


def test_a_job_of_another_user_on_a_reservation_that_begins_is_stopped() -> None:
    # 1x2; bob's job runs on both GPUs from 0; at 50 an admin reserves node-0 for alice from 100: at 100 bob's
    # job is stopped (requeued), alice's job starts, and bob's resumes when the window ends (300)
    specs = [JobSpec("b0", 0, 2, 1000.0, user="bob"), JobSpec("a0", 100, 1, 100.0, user="alice")]

    def late(bf):  # noqa: ANN001, ANN202
        def obs(sim, what):  # noqa: ANN001, ANN202
            if what == "round" and sim.now == 50.0:
                bf.reservations = [Reservation("now", 100.0, 300.0, frozenset({"alice"}), ("node-0",))]
        return obs

    sched = Scheduler.from_names(preemptive=False)
    bf = sched.reserve(0)
    sim = Simulator(parse_cluster("1x2"), specs, sched, None, SimConfig(round_len=10.0, restart_overhead=0.0),
                    observers=[late(bf)])
    jobs = {j.id: j for j in sim.run().jobs}
    assert (jobs["b0"].first_start, jobs["b0"].preemptions) == (0.0, 1)
    assert jobs["a0"].first_start == 100.0
    # 100 s of work done before the stop, 900 left from 300
    assert jobs["b0"].finish == 1200.0


def test_waiting_jobs_estimates_count_the_reservations() -> None:
    # 1x2, node-0 reserved for alice 0-1000: bob's 2-GPU job's estimate is the window's end; alice's job
    # ignores the reservation she may use
    specs = [JobSpec("b0", 0, 2, 100.0, user="bob"), JobSpec("a0", 0, 2, 100.0, user="alice")]
    seen: dict[str, float] = {}

    def watch(bf):  # noqa: ANN001, ANN202
        def obs(sim, what):  # noqa: ANN001, ANN202
            if what == "round" and sim.now == 0.0:
                seen.update(bf.starts)
        return obs

    got = _run("1x2", specs, [Reservation("r", 0.0, 1000.0, frozenset({"alice"}), ("node-0",))], depth=2,
               observers=[watch])
    assert seen == {"b0": 1000.0}  # (a0 started at once)
    assert got == {"b0": (1000.0, 0), "a0": (0.0, 0)}


@pytest.mark.parametrize("kw,msg", [
    ({"end": 100.0}, "reservation 'r': duration must be > 0 (start 100, end 100)"),
    ({"users": frozenset()}, "reservation 'r': users must name at least one user"),
    ({"nodes": (), "gpus": 0}, "reservation 'r': give either nodes or gpus (a number > 0), not neither"),
    ({"gpus": 2}, "reservation 'r': give either nodes or gpus (a number > 0), not both"),
    ({"name": "bad name"}, "reservation 'bad name': name must be"),
])
def test_bad_reservations_refused(kw: dict, msg: str) -> None:
    args = {"name": "r", "start": 100.0, "end": 200.0, "users": frozenset({"alice"}), "nodes": ("node-0",), **kw}
    with pytest.raises(ReservationError) as e:
        Reservation(**args)
    assert str(e.value).startswith(msg)


def test_reservations_checked_against_the_cluster_and_each_other() -> None:
    cl = parse_cluster("2x2")
    with pytest.raises(ReservationError, match=r"reservation 'r': nodes: no node 'node-9' in this cluster"):
        Reservation("r", 0, 10, frozenset({"a"}), ("node-9",)).check(cl)
    with pytest.raises(ReservationError, match=r"reservation 'r': gpus: 5 asked, the cluster has 4"):
        Reservation("r", 0, 10, frozenset({"a"}), gpus=5).check(cl)
    with pytest.raises(ReservationError, match=r"reservation 'q': nodes: node-0 is reserved by 'r'"):
        check_overlaps([Reservation("r", 0, 10, frozenset({"a"}), ("node-0",)),
                        Reservation("q", 5, 15, frozenset({"b"}), ("node-0", "node-1"))])


def test_calendar_file(tmp_path: Path) -> None:
    cl = parse_cluster("2x2")
    cal = tmp_path / "cal.csv"
    cal.write_text('name,start,duration,users,nodes,gpus\nmaint,100,200,"alice,bob",node-1,\nlab,0,50,carol,,2\n')
    assert load_calendar(cal, cl) == [
        Reservation("maint", 100.0, 300.0, frozenset({"alice", "bob"}), ("node-1",)),
        Reservation("lab", 0.0, 50.0, frozenset({"carol"}), (), 2)]
    for body, msg in [
        ("name,start,duration,users,nodes,gpus\nm,soon,10,a,node-0,\n", f"{cal}:2: start: expected seconds"),
        ("name,start,duration,users,nodes,gpus\nm,0,10,a,node-0,\nn,0,-5,a,node-1,\n",
         f"{cal}:3: duration: expected seconds >= 0"),
        ("name,start,duration,users,nodes,gpus\nm,0,10,a,node-7,\n", f"{cal}:2: reservation 'm': nodes: no node"),
        ("name,start,duration,users,nodes,gpus\nm,0,10,a,,x\n", f"{cal}:2: gpus: expected a whole number"),
        ("name,start,duration,users\n", f"{cal}:1: the header must be"),
        ("name,start,duration,users,nodes,gpus\nm,0,10,a,node-0\n", f"{cal}:2: expected 6 fields"),
    ]:
        cal.write_text(body)
        with pytest.raises(ReservationError) as e:
            load_calendar(cal, cl)
        assert str(e.value).startswith(msg), str(e.value)


# -- the service: real processes -----------------------------------------------------------------------------

def test_service_reservation_keeps_a_node_for_its_users(tmp_path: Path) -> None:
    # 2 nodes of 1 GPU; node-1 reserved for admin from now for an hour: bob's second job waits rather than
    # take node-1, admin's job runs there; the reservation survives a restart; deleted, bob's job starts
    from service_util import Server, job, kill_jobs, submit, wait_for

    s = Server(tmp_path, "--cluster", "2x1", "--round", "0.2").start()
    try:
        with s.client() as c:
            bob_token = c.post("/tokens", json={"user": "bob"}).json()["token"]
            r = c.post("/reservations", json={"name": "maint", "nodes": "node-1", "duration": "1h",
                                              "users": ["admin"]})
            assert r.status_code == 201, r.text
            assert r.json()["state"] == "active" and r.json()["nodes"] == ["node-1"]
            with s.client(bob_token) as b:
                assert b.post("/reservations", json={"nodes": "node-0", "duration": 60, "users": "bob"}).status_code == 403
                assert b.delete("/reservations/maint").json()["detail"] == "only an admin may delete reservations"
                b1 = submit(b, command="sleep 60", gpus=1, time_limit="120s")
                b2 = submit(b, command="sleep 60", gpus=1, time_limit="120s")
            wait_for(lambda: job(c, b1)["st"] == "R", what="bob's first job running")
            time.sleep(1.0)  # rounds pass: bob's second job stays off node-1
            assert job(c, b1)["nodes"] == ["node-0"] and job(c, b2)["st"] == "PD"
            mine = submit(c, command="sleep 60", gpus=1, time_limit="120s")
            wait_for(lambda: job(c, mine)["st"] == "R", what="admin's job in the reservation")
            assert job(c, mine)["nodes"] == ["node-1"]
            listed = c.get("/reservations").json()
            assert [(x["name"], x["users"], x["gpu_ids"]) for x in listed] == [("maint", ["admin"], [1])]
            from prometheus_client.parser import text_string_to_metric_families

            fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
            assert [(x.labels, x.value) for x in fams["gpuloom_reservation_gpus"].samples] == [
                ({"name": "maint", "state": "active"}, 1.0)]
        s.stop()
        s = Server(tmp_path, "--cluster", "2x1", "--round", "0.2").start()
        with s.client() as c:
            assert [x["name"] for x in c.get("/reservations").json()] == ["maint"]
            c.delete(f"/jobs/{mine}")
            time.sleep(1.0)
            assert job(c, b2)["st"] == "PD"  # still kept off node-1 after the restart
            assert c.delete("/reservations/maint").json() == {"name": "maint", "deleted": True}
            wait_for(lambda: job(c, b2)["st"] == "R", what="bob's job once the reservation is gone")
            assert c.get("/reservations").json() == []
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_service_refuses_bad_reservations(tmp_path: Path) -> None:
    from service_util import Server

    s = Server(tmp_path, "--cluster", "2x1", "--round", "0.2").start()
    try:
        with s.client() as c:
            def refused(body: dict) -> tuple[int, object]:
                r = c.post("/reservations", json=body)
                d = r.json()["detail"]
                return r.status_code, (d[0]["loc"][-1], d[0]["msg"]) if isinstance(d, list) else d

            base = {"duration": "1h", "users": "alice"}
            assert refused({**base, "nodes": "node-7"}) == (
                422, ("nodes", "reservation 'resv1': nodes: no node 'node-7' in this cluster (nodes: node-0, node-1)"))
            assert refused({**base, "gpus": 3}) == (422, ("gpus", "reservation 'resv1': gpus: 3 asked, the cluster has 2"))
            assert refused({**base, "nodes": "node-0", "start": "soon"})[1][0] == "start"  # type: ignore[index]
            code, (field, msg) = refused({**base, "nodes": "node-0", "duration": "0"})  # type: ignore[misc]
            assert (code, field, msg) == (422, "duration", "duration: must be a finite time > 0, got '0'")
            code, (field, msg) = refused({**base, "nodes": "node-0", "start": "2020-01-01"})  # type: ignore[misc]
            assert (code, field, msg) == (422, "start", "the reservation would be over before it is made")
            assert refused({"duration": "1h", "users": "", "nodes": "node-0"}) == (
                422, ("users", "reservation 'resv1': users must name at least one user"))
            assert c.post("/reservations", json={**base, "nodes": "node-0", "start": "now+1h"}).status_code == 201
            code, msg = refused({**base, "nodes": "node-0,node-1", "start": "now+90m", "name": "late"})
            assert (code, msg) == (409, "reservation 'late': nodes: node-0 is reserved by 'resv1' over an overlapping window")
            assert c.delete("/reservations/nope").status_code == 404
    finally:
        s.stop()


def test_a_job_submitted_to_a_reservation_runs_only_inside_it() -> None:
    # 1x4; 2 GPUs reserved for alice from 100 to 300.  Her job for the reservation (at 0, 50 s) waits for it
    # and runs 100-150 on a reserved GPU; her plain job runs at once; her 500 s job for it never fits in it
    specs = [JobSpec("in", 0, 1, 50.0, user="alice", attrs={"reservation": "lab"}),
             JobSpec("plain", 0, 1, 50.0, user="alice"),
             JobSpec("long", 0, 1, 500.0, user="alice", attrs={"reservation": "lab"})]
    gpus: dict[str, tuple[int, ...]] = {}
    kept: list[tuple[int, ...]] = []

    def watch(bf):  # noqa: ANN001, ANN202
        def obs(sim, what):  # noqa: ANN001, ANN202
            if what == "round":
                for jid, a in sim.driver.current.items():
                    gpus.setdefault(jid, a.gpu_ids)
                if sim.now == 100.0:
                    kept.append(bf.kept["lab"])
        return obs

    got = _run("1x4", specs, [Reservation("lab", 100.0, 300.0, frozenset({"alice"}), gpus=2)], observers=[watch])
    assert got["in"][0] == 100.0 and got["plain"][0] == 0.0 and got["long"][0] is None
    assert set(gpus["in"]) <= set(kept[0])


def test_service_submit_to_a_reservation(tmp_path: Path) -> None:
    # 2 nodes of 1 GPU, node-1 reserved for admin: `submit --reservation maint` runs on node-1 although
    # node-0 is free; an unknown reservation is refused (422), and so is one not open to the user (403)
    from typer.testing import CliRunner

    from gpuloom.cli import app
    from service_util import Server, job, kill_jobs, wait_for

    runner = CliRunner()
    sd = ("--state-dir", str(tmp_path))
    s = Server(tmp_path, "--cluster", "2x1", "--round", "0.2").start()
    try:
        r = runner.invoke(app, ["reservation", "create", "--name", "maint", "--nodes", "node-1", "--duration", "60",
                                "--users", "admin", *sd])
        assert r.exit_code == 0 and r.output.strip() == "Reservation created: maint"
        r = runner.invoke(app, ["submit", "--reservation", "maint", "--time", "5", "--json", *sd, "--", "sleep", "30"])
        assert r.exit_code == 0, r.output
        jid = int(__import__("json").loads(r.output)["id"])
        with s.client() as c:
            wait_for(lambda: job(c, jid)["st"] == "R", what="the job in its reservation")
            assert job(c, jid)["nodes"] == ["node-1"]
            r2 = c.post("/jobs", json={"command": "true", "gpus": 1, "reservation": "nope"})
            assert r2.status_code == 422 and r2.json()["detail"][0]["loc"] == ["body", "reservation"]
            assert r2.json()["detail"][0]["msg"] == "no reservation 'nope'"
            bob = c.post("/tokens", json={"user": "bob"}).json()["token"]
            with s.client(bob) as b:
                r3 = b.post("/jobs", json={"command": "true", "gpus": 1, "reservation": "maint"})
            assert (r3.status_code, r3.json()["detail"]) == (403, "reservation 'maint' is not open to 'bob' (users: admin)")
        r = runner.invoke(app, ["reservation", "list", *sd])
        assert r.output.splitlines()[0].split() == ["NAME", "STATE", "START", "END", "USERS", "NODES", "GPUS"]
        assert r.output.splitlines()[1].split()[:2] == ["maint", "active"]
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_the_reservations_table_is_made_when_the_store_opens_even_on_an_older_database(tmp_path: Path) -> None:
    # an older release's database: no reservations table.  Opening the store alone (in a fresh interpreter,
    # so no module that uses the table has been imported) adds it; reservations then go in and come back.
    import sqlite3
    import subprocess
    import sys

    from gpuloom.runtime.state import reservations as stored
    from gpuloom.runtime.state.store import Store

    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE reservations")
    code = ("import sqlite3, sys; from gpuloom.runtime.state.store import Store; Store(sys.argv[1]).close(); "
            "print(sqlite3.connect(sys.argv[2]).execute(\"SELECT name FROM sqlite_master WHERE name = "
            "'reservations'\").fetchall())")
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{db}", str(db)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[('reservations',)]"
    store = Store(f"sqlite:///{db}")
    r = Reservation("maint", 100.0, 200.0, frozenset({"alice"}), ("node-0",), 0)
    stored.add(store, r, "admin", 50.0)
    assert stored.load(store) == [r]
    store.close()
