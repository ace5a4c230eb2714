"""Rounds that events trigger: a lone submission is taken at once, a stream of them a few times a second.

* the gap doubles with each event that comes soon after a round, up to its cap, and is back at its
  least for an event after a quiet moment;
* the scheduling loop under a stream of submissions runs few rounds, each taking many jobs, and takes a
  submission that comes after a quiet moment with the least gap.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.gather import Gather
from gpuloom.runtime.service.service import MAX_EVENT_GAP_S, MIN_EVENT_GAP_S, Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import wait_for

CONTACT = "waiting_for_initial_resource"  # the state a round gives the jobs it takes


def test_the_gap_doubles_while_events_stream_and_falls_back_after_a_quiet_moment() -> None:
    g = Gather(0.02, 0.2, 0.1)
    assert g.gap == 0.02
    assert [g.next(0.01) for _ in range(6)] == [0.04, 0.08, 0.16, 0.2, 0.2, 0.2]
    assert g.next(0.1) == 0.02  # quiet for 0.1 s: a lone event
    assert g.next(0.099) == 0.04
    assert [Gather(0.0, 0.0, 0.1).next(s) for s in (0.0, 1.0)] == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"^gather gaps must be 0 <= least <= most, got 0.3 and 0.2$"):
        Gather(0.3, 0.2, 0.1)


@pytest.mark.serial  # the gap adapts to how fast submissions arrive
def test_a_stream_of_submissions_is_taken_a_few_times_a_second(tmp_path: Path, cgroup_parent: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cl = Cluster.homogeneous(1, 1)
    svc = Service(store, cl, local_executor(cl, tmp_path / "run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig(tmp_path, round_s=5.0, grace_s=1.0, launch_timeout_s=60.0))
    assert (svc.gather.least, svc.gather.most) == (MIN_EVENT_GAP_S, MAX_EVENT_GAP_S)
    svc.start()
    try:
        blocker = svc.submit({"name": "blocker", "command": "sleep 60", "gpus": 1}, "alice")
        wait_for(lambda: store.get_job(blocker).state == "launching", what="the blocker to launch")  # type: ignore[union-attr]
        ids: list[int] = []

        def stream() -> None:  # a submission every 5 ms for 2 s
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                ids.append(svc.submit({"name": "s", "command": "true", "gpus": 1}, "alice"))
                time.sleep(0.005)

        t = threading.Thread(target=stream)
        t.start()
        t.join(60)
        wait_for(lambda: store.get_job(ids[-1]).state == CONTACT, what="the stream's last job to be taken")  # type: ignore[union-attr]
        taken = sorted({e["time"] for e in store.events() if e["kind"] == CONTACT and e["job_id"] in set(ids)})
        gaps = [b - a for a, b in zip(taken, taken[1:], strict=False)]
        # one round per 0.02 s (plus its own time) before; now the gap doubles to 0.2 s within four rounds
        assert len(taken) <= 2.0 / MAX_EVENT_GAP_S + 6, (len(ids), taken)
        assert sum(g >= MAX_EVENT_GAP_S - 0.01 for g in gaps) >= len(gaps) / 2, gaps
        # quiet: the loop waits for events, and a lone job is taken with the least gap, not the stream's.  (A
        # round of the loop's own, e.g. a periodic one, may end just before a submission, which then counts as
        # part of a stream: on a loaded machine that can happen once, not three times running)
        gaps_after = []
        for _ in range(3):
            time.sleep(0.5)
            late = svc.submit({"name": "late", "command": "true", "gpus": 1}, "alice")
            wait_for(lambda: store.get_job(late).state == CONTACT, what="the late job to be taken")  # type: ignore[union-attr]  # noqa: B023
            gaps_after.append(svc.gather.gap)
            if gaps_after[-1] == MIN_EVENT_GAP_S:
                break
        assert gaps_after[-1] == MIN_EVENT_GAP_S, gaps_after
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()
