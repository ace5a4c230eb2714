"""``Store.add_jobs_row``: the insert and the first job's row read back under one hold of the store's lock,
the listeners told after it is let go."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.state.store import Store


def test_the_row_read_back_is_the_first_job_as_stored_and_listeners_run_outside_the_lock(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        free: list[bool] = []

        def listener(job_id: int | None, kind: str, detail: Any, fields: Any) -> None:
            # another thread takes the lock and lets it go at once: this one does not hold it
            t = threading.Thread(target=lambda: (store.lock.acquire(), store.lock.release()))
            t.start()
            t.join(5)
            free.append(not t.is_alive())

        store.listeners.append(listener)
        ids, row = store.add_jobs_row([{"name": "a", "command": "true", "gpus": 1}] * 3, "alice", "standby",
                                      now=100.0, array_tasks=[0, 2, 4])
        assert ids == [1, 2, 3] and free == [True, True, True]
        assert row == store.get_job(1)
        assert (row.id, row.name, row.user, row.state, row.submit_time, row.array_id, row.array_task) == \
            (1, "a", "alice", "standby", 100.0, 1, 0)
        ids, row = store.add_jobs_row([{"command": "x", "gpus": 2}], "bob", "standby", now=101.0)
        assert ids == [4] and (row.id, row.name, row.user, row.array_id, row.spec["gpus"]) == (4, "job", "bob", None, 2)
        with pytest.raises(ValueError, match=r"^one array task index per spec$"):
            store.add_jobs_row([{"command": "x", "gpus": 1}], "bob", "standby", array_tasks=[0, 1])
        assert store.count_jobs() == 4
    finally:
        store.close()
