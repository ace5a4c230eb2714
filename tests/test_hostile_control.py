"""A hostile user against the operator controls: others' jobs, admin-only node actions, oversized
and malformed selections.  Each attempt is refused with a clear answer and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_control import Env


@pytest.fixture
def env(tmp_path: Path, cgroup_parent: str) -> Iterator[Env]:  # noqa: F811
    e = Env(tmp_path, cgroup_parent)
    yield e
    e.close()


def test_mallory_cannot_touch_others_jobs_or_nodes(env: Env) -> None:
    env.tok["mallory"] = env.tok["alice"]
    b = env.submit("bob", gpus=1)
    first = env.ok("bob", "POST", "/jobs", json={"command": "sleep 60", "gpus": 1, "array": "0-2"})
    # named: refused; by filter: skipped and counted; nothing of bob's changes
    for action in ("cancel", "hold", "release", "requeue"):
        r = env.call("mallory", "POST", "/jobs/actions", json={"action": action, "jobs": [str(b)]})
        assert r.status_code == 403, (action, r.text)
        r = env.call("mallory", "POST", "/jobs/actions", json={"action": action, "jobs": [str(first["array_id"])]})
        assert r.status_code == 403, (action, r.text)
        out = env.ok("mallory", "POST", "/jobs/actions", json={"action": action, "user": "bob"})
        assert out["jobs"] == [] and out["skipped"] == 4
        out = env.ok("mallory", "POST", "/jobs/actions", json={"action": action, "state": ["PD"]})
        assert out["jobs"] == [] and out["skipped"] == 0  # (no filter reaches past mallory's own jobs)
    r = env.call("mallory", "POST", f"/jobs/{b}/update", json={"gpus": 4})
    assert r.status_code == 403 and "belongs to bob" in r.json()["detail"]
    assert env.store.get_job(b).spec["gpus"] == 1  # type: ignore[union-attr]
    assert not env.svc.control.holds
    states = {r.state for r in env.store.list_jobs(user="bob")}
    assert states == {"waiting_for_initial_contact"}
    # node actions are the admin's
    for path, body in (("drain", {"reason": "x"}), ("resume", None),
                       ("maintenance", {"start": "now", "duration": "1h", "reason": "x"})):
        r = env.call("mallory", "POST", f"/nodes/node-0/{path}", json=body)
        assert r.status_code == 403 and "admin" in r.json()["detail"], path
    assert env.svc.control.nodes == {}
    # raising a priority past the default, or naming another user's queue, goes through the submit checks
    j = env.submit("mallory")
    r = env.call("mallory", "POST", f"/jobs/{j}/update", json={"priority": 10**6})
    assert r.status_code == 403 and "priority" in r.json()["detail"]


def test_oversized_and_malformed_selections_are_refused_fast(env: Env) -> None:
    first = env.ok("alice", "POST", "/jobs", json={"command": "sleep 60", "gpus": 1, "array": "0-1"})
    aid = first["array_id"]
    t = time.perf_counter()
    r = env.call("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [f"{aid}_[0-999999999]"]})
    assert r.status_code == 422 and "too wide" in r.json()["detail"]
    assert time.perf_counter() - t < 2.0  # refused before a range is built
    for bad in ("1_[1-", "x", "1_[]", "-1", "1__2", "1_[5-2]"):
        r = env.call("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": [bad]})
        assert r.status_code == 422 and "jobs" in str(r.json()["detail"]), bad
    r = env.call("alice", "POST", "/jobs/actions", json={"action": "hold", "jobs": ["1"] * 10_001})
    assert r.status_code == 422
    r = env.call("alice", "POST", "/jobs/actions", json={"action": "rm -rf", "jobs": ["1"]})
    assert r.status_code == 422 and "action" in r.json()["detail"]
    r = env.call("admin", "POST", "/nodes/node-0/drain", json={"reason": "x" * 501})
    assert r.status_code == 422
    r = env.call("admin", "POST", "/nodes/..%2Fnode-0/drain", json={"reason": "x"})
    assert r.status_code == 404
    r = env.call("admin", "POST", "/nodes/node-0/drain", json={"reason": "x", "mode": "now"})
    assert r.status_code == 422 and r.json()["detail"] == "mode: expected one of wait, checkpoint, got 'now'"
    for path, body in (("drain", {"reason": "x"}), ("resume", None),
                       ("maintenance", {"start": "now", "duration": "1h", "reason": "x"})):
        r = env.call("admin", "POST", f"/nodes/nope/{path}", json=body)
        assert (r.status_code, r.json()["detail"]) == (404, "no node 'nope'"), path
    r = env.call("admin", "POST", "/nodes/node-0/maintenance", json={"start": "yesterday-ish", "duration": "1h",
                                                                     "reason": "x"})
    assert r.status_code == 422 and "start" in r.json()["detail"]
    for bad in ("now+soon", "now+0", "nan"):  # (a bad duration after now+ was a 500)
        r = env.call("admin", "POST", "/nodes/node-0/maintenance", json={"start": bad, "duration": "1h", "reason": "x"})
        assert r.status_code == 422 and r.json()["detail"].startswith("start: "), (bad, r.text)
    r = env.call("admin", "POST", "/nodes/node-0/maintenance", json={"start": "now", "duration": "-5",
                                                                     "reason": "x"})
    assert r.status_code == 422 and "duration" in r.json()["detail"]
    assert env.svc.control.nodes == {} and not env.svc.control.holds
