"""Bounded load on loopback: 1,000 submissions from concurrent clients, none lost."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from gpuloom.runtime.service.service import QUEUED_STATES
from gpuloom.runtime.state.store import Store
from service_util import Server, kill_jobs, wait_for

N = 1000
CLIENTS = 16


def test_thousand_concurrent_submissions_are_all_stored(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x1", "--cpus-per-node", "1", "--round", "0.2").start()
    try:
        with s.client() as c:
            blocker = c.post("/jobs", json={"name": "blocker", "command": "sleep 120", "gpus": 1}).json()["id"]
            wait_for(lambda: c.get(f"/jobs/{blocker}").json()["state"] == "launching", what="blocker to launch")
        acked: list[int] = []
        errors: list[str] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token}"}, timeout=60) as h:
                for i in range(k, N, CLIENTS):
                    r = h.post("/jobs", json={"name": f"load-{i}", "command": "true", "gpus": 1})
                    with lock:
                        if r.status_code == 201:
                            acked.append(r.json()["id"])
                        else:
                            errors.append(r.text)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors
        assert len(acked) == N and len(set(acked)) == N
        with s.client() as c:
            listed = c.get("/jobs", params={"limit": 5000}).json()
        assert len(listed) == N + 1
        s.kill()  # the count must hold without a clean shutdown too
        store = Store(f"sqlite:///{tmp_path / 'gpuloom.db'}")
        try:
            stored = {r.id for r in store.list_jobs() if r.name.startswith("load-")}
            assert stored == set(acked)
            assert store.count_jobs(QUEUED_STATES) == N  # the blocker still holds the only GPU
            assert store.journal_mode() == "wal"
        finally:
            store.close()
    finally:
        s.stop()
        kill_jobs(tmp_path)
