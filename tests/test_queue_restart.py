"""A restarted ``gpuloom serve`` keeps its stored queue tree and policy unless told otherwise, and says so."""

from __future__ import annotations

import json
from pathlib import Path

from gpuloom.runtime.service.queues import POLICY_KEY, stored_queues
from gpuloom.runtime.state.store import Store
from service_util import Server, kill_jobs, wait_for

TREE = 'default = "small"\n[[queue]]\nname = "small"\nguarantee = 1\nlimit = 1\n'


def _jobs(srv: Server) -> dict[int, dict]:
    with srv.client() as c:
        return {j["id"]: j for j in c.get("/jobs").json()}


def test_a_restart_without_queue_flags_keeps_the_stored_tree_and_its_policy(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    tree = tmp_path / "q.toml"
    tree.write_text(TREE)
    url = f"sqlite:///{sd / 'gpuloom.db'}"
    args = ("--cluster", "1x2", "--round", "0.2", "--log-level", "info")
    srv = Server(sd, *args, "--queues", str(tree), "--queue-policy", "drf").start()
    srv.stop()
    assert stored_queues(url) == (1, "drf")
    srv = Server(sd, *args).start()  # no --queues, no --queue-policy
    try:
        with srv.client() as c:
            q = c.get("/queues").json()
            assert q["policy"] == "drf" and [x["name"] for x in q["queues"]] == ["small"]
            a = c.post("/jobs", json={"command": "sleep 30", "gpus": 1}).json()
            b = c.post("/jobs", json={"command": "sleep 30", "gpus": 1}).json()
        assert (a["queue"], b["queue"]) == ("small", "small")
        wait_for(lambda: _jobs(srv)[a["id"]]["st"] == "R" and _jobs(srv)[b["id"]]["pending_reason"],
                 what="one job running and the other held")
        held = _jobs(srv)[b["id"]]
        # the queue's limit of 1 GPU holds the second job although a GPU is free
        assert (held["st"], held["pending_reason"]) == ("PD", "QueueAtQuota"), held
    finally:
        srv.stop()
        kill_jobs(sd)
    out = (sd / "serve.out").read_text()
    assert "queues: scheduling with the stored tree (1 queues) and its policy drf" in out
    # the operator's override is said, not silent: none runs without the tree (and leaves it stored)
    srv = Server(sd, *args, "--queue-policy", "none").start()
    try:
        with srv.client() as c:
            assert c.get("/queues").json()["policy"] == "none"
    finally:
        srv.stop()
        kill_jobs(sd)
    out = (sd / "serve.out").read_text()
    assert ("queues: --queue-policy none: this service runs without the stored tree of 1 queues (stored policy "
            "drf); restart without --queue-policy to use it") in out
    assert stored_queues(url) == (1, "drf")
    # another policy replaces the stored one, and is kept for the next restart
    srv = Server(sd, *args, "--queue-policy", "quota").start()
    srv.stop()
    assert "queues: --queue-policy quota replaces the stored policy drf for the stored tree of 1 queues" in \
        (sd / "serve.out").read_text()
    assert stored_queues(url) == (1, "quota")


def test_a_tree_stored_before_policies_were_recorded_is_quota(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert stored_queues(url) is None  # a new store: no tree
    from gpuloom.runtime.service.queues import queue_config_t

    store = Store(url)
    queue_config_t.create(store.engine, checkfirst=True)
    with store.engine.begin() as c:
        c.execute(queue_config_t.insert().values(id=1, updated=0.0, doc=json.dumps(
            {"queue": [{"name": "a", "guarantee": {"gpus": 1.0}}, {"name": "b"}]})))
    assert store.get_meta(POLICY_KEY) is None
    store.close()
    assert stored_queues(url) == (2, "quota")
