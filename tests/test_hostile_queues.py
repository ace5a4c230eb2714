"""A hostile but authenticated user against queues, priorities and limits (issue 34, items 3 and 9).

In process (FastAPI's TestClient) with real ``sleep`` processes launched by rounds run by hand
(``Service.round``), so nothing is timed: another team's queue, a priority above the limit, invented
queue names under ``--queue-policy drf``, per-user queues under an open parent, each submission limit
with its 4xx, and ``/history`` in pages.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpuloom.cli import app as cli_app
from gpuloom.cli import jobs as jobs_cli
from gpuloom.core.cluster import Cluster
from gpuloom.core.queues import QueueError, parse_queues
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.admission import Limiter, SubmitLimits
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import HOLDING, Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import REPO, Server, kill_jobs

TEAMS = {
    "default": "shared",
    "groups": {"cv": ["carol"]},
    "queue": [
        {"name": "research", "guarantee": 2, "max_priority": 10},
        {"name": "vision", "parent": "research", "guarantee": 2, "groups": ["cv"]},
        {"name": "shared", "guarantee": 2, "max_pending": 2},
    ],
}
#: only what b95b707 could read: carol is a member of vision by her default queue
VISION = {
    "default": "shared",
    "users": {"carol": "vision"},
    "queue": [
        {"name": "research", "guarantee": 2},
        {"name": "vision", "parent": "research", "guarantee": 2},
        {"name": "shared", "guarantee": 2},
    ],
}
STUDENTS = {
    "default": "shared",
    "queue": [
        {"name": "students", "guarantee": 2, "per_user": True, "per_user_limit": 1},
        {"name": "shared", "guarantee": 2},
    ],
}

Api = tuple[TestClient, Callable[[str], dict[str, str]], Service]


@pytest.fixture
def serve(tmp_path: Path, cgroup_parent: str) -> Iterator[Callable[..., Api]]:
    """``serve(policy, tree=None)`` -> (client, headers of a user, service) on a 1x4 cluster."""
    made: list[tuple[TestClient, Service]] = []

    def _serve(policy: str = "quota", tree: dict[str, Any] | None = None) -> Api:
        store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        cluster = Cluster.homogeneous(1, 4)
        svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                      Scheduler.from_names(queue=policy), ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0))
        if tree is not None:
            svc.queues.configure(parse_queues(tree))
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
        svc.shutdown()
        svc.store.close()


def job(gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return {"command": "sleep 60", "gpus": gpus, **kw}


def running_by_user(svc: Service) -> Counter[str]:
    return Counter(svc.mirror.rows[jid].user for jid in svc.current)


# -- who may submit where ----------------------------------------------------------------------------
def test_alice_cannot_submit_into_another_teams_queue_nor_preempt_its_job(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("quota", VISION)
    team = client.post("/jobs", json=job(4), headers=h("carol"))
    assert team.status_code == 201 and team.json()["queue"] == "vision"
    svc.round()
    assert list(svc.current) == ["1"]
    r = client.post("/jobs", json=job(4, queue="vision", priority=1_000_000_000), headers=h("alice"))
    assert r.status_code == 403
    assert r.json()["detail"] == ("queue 'vision' is not open to user 'alice' (it takes: users carol); ask an admin "
                                  "to add you to its users or to one of its groups; queues open to you: shared")
    assert client.post("/jobs", json=job(4, queue="vision"), headers=h("alice")).status_code == 403
    svc.round()
    row = svc.store.get_job(1)
    assert row is not None and row.state in HOLDING and (row.attempts, row.preemptions) == (1, 0)
    assert list(svc.current) == ["1"] and svc.store.count_jobs() == 1  # nothing of alice's was stored
    # the default queue takes everyone; an admin may submit anywhere, on anyone's behalf
    assert client.post("/jobs", json=job(1), headers=h("alice")).json()["queue"] == "shared"
    r = client.post("/jobs", json=job(1, queue="vision", user="alice"), headers=h("admin"))
    assert r.status_code == 201 and r.json()["queue"] == "vision"


def test_membership_is_inherited_down_the_tree_and_given_by_a_default_queue() -> None:
    tree = parse_queues({
        "default": "shared", "users": {"erin": "nlp"}, "groups": {"cv": ["carol"]},
        "queue": [{"name": "research", "users": ["dave"]}, {"name": "vision", "parent": "research", "groups": ["cv"]},
                  {"name": "nlp", "parent": "research"}, {"name": "lab", "open": True},
                  {"name": "lab-a", "parent": "lab"}, {"name": "shared"}]})
    open_to = {u: [q for q in tree.leaf_names if tree.member(u, tree.index[q])]
               for u in ("alice", "carol", "dave", "erin")}
    assert open_to == {"alice": ["lab-a", "shared"], "carol": ["vision", "lab-a", "shared"],
                       "dave": ["vision", "nlp", "lab-a", "shared"], "erin": ["nlp", "lab-a", "shared"]}


def test_a_priority_above_the_limit_is_refused_for_a_user_and_taken_from_an_admin(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("none")
    r = client.post("/jobs", json=job(priority=1_000_000_000), headers=h("alice"))
    assert r.status_code == 403
    assert r.json()["detail"] == ("priority 1000000000 is above this service's max_priority (serve --max-priority) "
                                  "of 0: users may set a priority up to it (lower is always allowed); an admin may "
                                  "set any")
    assert client.post("/jobs", json=job(priority=1), headers=h("alice")).status_code == 403
    assert client.post("/jobs", json=job(priority=-5), headers=h("alice")).status_code == 201
    assert client.post("/jobs", json=job(priority=1_000_000_000), headers=h("admin")).status_code == 201
    assert [r.spec.get("priority") for r in svc.store.list_jobs()] == [-5, 1_000_000_000]


def test_a_queues_max_priority_is_inherited_down_the_tree(serve) -> None:  # noqa: ANN001
    client, h, _ = serve("quota", TEAMS)
    assert client.post("/jobs", json=job(queue="vision", priority=10), headers=h("carol")).status_code == 201
    r = client.post("/jobs", json=job(queue="vision", priority=11), headers=h("carol"))
    assert r.status_code == 403 and r.json()["detail"].startswith(
        "priority 11 is above queue 'vision''s max_priority (set on 'research') of 10")
    r = client.post("/jobs", json=job(priority=1), headers=h("carol"))  # shared sets none: the service's 0
    assert r.status_code == 403 and "this service's max_priority (serve --max-priority) of 0" in r.json()["detail"]


def test_drf_without_a_tree_refuses_invented_queues_and_shares_by_user(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("drf")
    for name in ("sybil0", "sybil1", "sybil2", "sybil3", "bob"):
        r = client.post("/jobs", json=job(queue=name), headers=h("alice"))
        assert r.status_code == 403, name
        assert r.json()["detail"] == (f"queue {name!r}: this service has no queue tree, so each user's jobs go to a "
                                      "queue of their own ('alice'); only an admin may name another")
    assert client.post("/jobs", json=job(queue="alice"), headers=h("alice")).status_code == 201
    for _ in range(3):
        client.post("/jobs", json=job(), headers=h("alice"))
    for _ in range(4):
        assert client.post("/jobs", json=job(), headers=h("bob")).json()["queue"] == "bob"
    svc.round()
    assert running_by_user(svc) == {"alice": 2, "bob": 2}


def test_a_per_user_open_parent_makes_each_user_a_queue_of_their_own(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("quota", STUDENTS)
    assert client.post("/jobs", json=job(queue="students"), headers=h("alice")).json()["queue"] == "students.alice"
    r = client.post("/jobs", json=job(queue="students.alice"), headers=h("bob"))
    assert r.status_code == 403 and r.json()["detail"].startswith(
        "queue 'students.alice' is not open to user 'bob' (it takes: users alice)")
    assert client.post("/jobs", json=job(queue="students.bob"), headers=h("bob")).json()["queue"] == "students.bob"
    r = client.post("/jobs", json=job(2, queue="students"), headers=h("alice"))  # the per-user limit
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] == "queue 'students.alice' can never hold more than 1 GPUs; the job asks for 2"
    rows = {q["name"]: q for q in client.get("/queues", headers=h("bob")).json()["queues"]}
    assert {k: rows["students.alice"][k] for k in ("parent", "weight", "guarantee", "limit", "users")} == {
        "parent": "students", "weight": 1.0, "guarantee": {"gpus": 0.0, "cpus": 0.0, "mem_mb": 0.0},
        "limit": {"gpus": 1.0}, "users": ["alice"]}
    assert rows["students"]["guarantee"]["gpus"] == 2 and rows["students"]["leaf"] is False
    svc.round()
    assert running_by_user(svc) == {"alice": 1, "bob": 1}
    # stored with the tree: a restarted service schedules with both
    store = Store(f"sqlite:///{svc.state_dir / 'db.sqlite'}")
    again = Service(store, svc.cluster, svc.executor, Scheduler.from_names(queue="quota"), ServiceConfig(svc.state_dir))
    try:
        tree = again.queues.tree
        assert tree is not None and tree.names == ["students", "students.alice", "students.bob", "shared"]
    finally:
        store.close()
    r = client.post("/jobs", json=job(queue="students.j.doe"), headers=h("j.doe"))  # a dotted user name
    assert r.status_code == 201 and r.json()["queue"] == "students.j.doe"


def test_access_fields_are_validated_with_what_and_where() -> None:
    base = {"name": "a", "guarantee": 1}
    for extra, msg in (({"groups": ["nope"]}, "queues: queue 'a': no group 'nope' (groups: none)"),
                       ({"per_user_limit": 1}, "queues: queue 'a': per_user_limit needs per_user = true"),
                       ({"max_priority": True}, "queues: queue 1 ('a'): max_priority must be a whole number, got True"),
                       ({"max_pending": -1}, "queues: queue 'a': max_pending must be >= 0, got -1"),
                       ({"users": "alice"}, "queues: queue 1 ('a'): users must be a list of names, got 'alice'"),
                       ({"open": "yes"}, "queues: queue 1 ('a'): open must be true or false, got 'yes'")):
        with pytest.raises(QueueError) as e:
            parse_queues({"queue": [{**base, **extra}]})
        assert str(e.value) == msg


def test_the_simulator_ignores_who_may_submit(tmp_path: Path) -> None:
    """The same trace and tree with and without access fields: identical results."""
    import tomllib

    plain = tomllib.loads((REPO / "examples" / "queues.toml").read_text())
    guarded = {**plain, "groups": {"cv": ["carol"]}}
    guarded["queue"] = [{**q, "groups": ["cv"], "max_priority": 0, "max_pending": 1, "per_user": q["name"] == "nlp"}
                        if q["name"] != "research" else {**q, "users": ["x"], "open": True}
                        for q in plain["queue"]]
    outs = []
    for k, tree in enumerate((plain, guarded)):
        f = tmp_path / f"q{k}.toml"
        f.write_text(_toml(tree))
        out = tmp_path / f"out{k}"
        r = CliRunner().invoke(cli_app, ["simulate", "--trace", str(REPO / "examples" / "queued_jobs.csv"),
                                         "--cluster", "2x4", "--queues", str(f), "--out", str(out), "--no-plots"])
        assert r.exit_code == 0, r.output
        outs.append([list(csv.reader(open(out / name))) for name in ("jobs.csv", "queues.csv")])
    assert outs[0] == outs[1] and len(outs[0][0]) > 30


def _toml(tree: dict[str, Any]) -> str:
    lines = [f"default = {json.dumps(tree['default'])}", "[users]"]
    lines += [f"{u} = {json.dumps(q)}" for u, q in tree["users"].items()]
    if "groups" in tree:
        lines += ["[groups]"] + [f"{g} = {json.dumps(m)}" for g, m in tree["groups"].items()]
    for q in tree["queue"]:
        lines.append("[[queue]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in q.items()]
    return "\n".join(lines) + "\n"


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


def test_a_queues_max_pending_counts_its_waiting_jobs(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("quota", TEAMS)
    assert client.post("/jobs", json=job(array="0-1"), headers=h("bob")).json()["queue"] == "shared"
    r = client.post("/jobs", json=job(), headers=h("alice"))
    assert r.status_code == 403
    assert r.json()["detail"] == ("queue 'shared' has 2 pending jobs; with 1 more that is over its max_pending of 2: "
                                  "wait for some to start or end")
    assert client.post("/jobs", json=job(queue="vision"), headers=h("carol")).status_code == 201  # another queue


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


# -- /history in pages -------------------------------------------------------------------------------
def test_history_is_paged_with_allocations_per_page(serve) -> None:  # noqa: ANN001
    client, h, svc = serve("none")
    for _ in range(5):
        client.post("/jobs", json=job(), headers=h("admin"))
    svc.round()  # four run, so four have an allocation record
    pages, after = [], None
    while True:
        r = client.get("/history", params={"limit": 2, "allocations": True, **({"after": after} if after else {})},
                       headers=h("admin"))
        assert r.status_code == 200
        pages.append([(x["id"], len(x["allocations"])) for x in r.json()])
        after = r.headers.get("X-Next-After")
        if after is None:
            break
        assert after == str(pages[-1][-1][0])
    assert pages == [[(1, 1), (2, 1)], [(3, 1), (4, 1)], [(5, 0)]]
    assert [x["id"] for x in client.get("/history", params={"job": [5, 2, 4], "limit": 2},
                                        headers=h("admin")).json()] == [2, 4]
    r = client.get("/history", headers=h("admin"))
    assert len(r.json()) == 5 and "X-Next-After" not in r.headers  # default page: 1000
    assert client.get("/history", params={"limit": 10_001}, headers=h("admin")).status_code == 422


def test_history_command_fetches_page_by_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    srv = Server(sd, "--cluster", "1x2", "--round", "0.2").start()
    env = {"GPULOOM_STATE_DIR": str(sd), "GPULOOM_URL": srv.url}
    runner = CliRunner()
    try:
        for _ in range(5):
            assert runner.invoke(cli_app, ["submit", "--gpus", "1", "--", "true"], env=env).exit_code == 0
        monkeypatch.setattr(jobs_cli, "HISTORY_PAGE", 2)
        asked: list[tuple[str | None, str | None]] = []
        call = jobs_cli.Client.call

        def spy(self: Any, method: str, path: str, **kw: Any) -> Any:
            params = kw.get("params") or {}
            asked.append((params.get("limit"), params.get("after")))
            return call(self, method, path, **kw)

        monkeypatch.setattr(jobs_cli.Client, "call", spy)
        r = runner.invoke(cli_app, ["history", "--json"], env=env)
        assert r.exit_code == 0, r.output
        assert [x["id"] for x in json.loads(r.output)] == [1, 2, 3, 4, 5]
        assert asked == [(2, None), (2, "2"), (2, "4")]
    finally:
        srv.stop()
        kill_jobs(sd)


def test_limit_options_are_checked() -> None:
    for kw, msg in (({"max_pending": 0}, "--max-pending must be >= 1, got 0"),
                    ({"max_array_size": 10_001}, "--max-array-size must be within 1..10000, got 10001"),
                    ({"rate": float("inf")}, "--submit-rate must be > 0 per second, got inf"),
                    ({"burst": 0}, "--submit-burst must be >= 1, got 0"),
                    ({"max_priority": 10**9 + 1}, "--max-priority must be within ±1000000000, got 1000000001")):
        with pytest.raises(ValueError) as e:
            SubmitLimits(**kw)
        assert str(e.value) == msg
