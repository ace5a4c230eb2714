"""The backfill guarantee (policies/backfill.py): reservations for the first waiting jobs, in the simulator.

Hand-checked cases with exact starts (with and without the guarantee), and invariants on seeded streams:
no GPU given twice, and no job starting later than its estimate of the first round it led the reservations
in, when estimates are exact (durations known, no overheads, a round at every arrival and completion).
(A later reservation may move: the ones ahead of it are placed again as they start.)"""

from __future__ import annotations

import random
import time
from datetime import datetime

import pytest

from gpuloom.core.cluster import parse_cluster
from gpuloom.core.job import JobSpec
from gpuloom.policies.base import PolicyError
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from gpuloom.sim.metrics import RunResult


def _run(cluster: str, specs: list[JobSpec], depth: int, observe=None, preemptive: bool = False,
         **cfg: object) -> RunResult:
    sched = Scheduler.from_names(preemptive=preemptive)
    if depth:
        sched.reserve(depth)
    obs = [] if observe is None else [observe(sched)]
    config = SimConfig(**{"round_len": 10.0, **cfg})  # type: ignore[arg-type]
    return Simulator(parse_cluster(cluster), specs, sched, None, config, observers=obs).run()


def _stream() -> list[JobSpec]:
    """1x4: four 1-GPU jobs ending at 100, 200, 300, 400; a 4-GPU job at 10; eight 1-GPU jobs of 150 s
    arriving every 10 s from 20."""
    out = [JobSpec(f"a{i}", 0.0, 1, 100.0 * (i + 1)) for i in range(4)]
    out.append(JobSpec("big", 10.0, 4, 100.0))
    out += [JobSpec(f"s{k}", 20.0 + 10 * k, 1, 150.0) for k in range(8)]
    return out


def _estimates_of(jid: str, seen: list[tuple[float, float]]):  # noqa: ANN202
    """An observer for :func:`_run`: (time, ``jid``'s estimated start) at each round that reserves it."""
    def observe(sched: Scheduler):
        bf = sched.backfill
        assert bf is not None

        def obs(sim: Simulator, what: str) -> None:
            if what == "round" and jid in bf.starts:
                seen.append((sim.now, bf.starts[jid]))
        return obs
    return observe


def test_big_job_behind_a_stream_of_small_ones() -> None:
    # without: every GPU freed goes to the next small job (s0 at 100, s1 at 200, s2 at 250, s3 at 300, s4 at 350,
    # s5 and s6 at 400, s7 at 450): four GPUs are first free together at 600, when s7 ends
    starts = {j.id: j.first_start for j in _run("1x4", _stream(), 0).jobs}
    assert starts["big"] == 600.0
    assert [starts[f"s{k}"] for k in range(8)] == [100.0, 200.0, 250.0, 300.0, 350.0, 400.0, 400.0, 450.0]
    # with: big is reserved all four GPUs from 400 (a3's end); s0 (100-250), s1 (200-350) and s2 (250-400) end
    # by then and start; s3 would run to 450 and waits; big runs 400-500, then s3..s6 start, s7 at 650
    seen: list[tuple[float, float]] = []
    observe = _estimates_of("big", seen)
    starts = {j.id: j.first_start for j in _run("1x4", _stream(), 1, observe).jobs}
    assert starts["big"] == 400.0
    assert [starts[f"s{k}"] for k in range(8)] == [100.0, 200.0, 250.0, 500.0, 500.0, 500.0, 500.0, 650.0]
    assert seen[0] == (10.0, 400.0)  # its first estimate, in the round it arrived
    assert {est for _, est in seen} == {400.0}
    assert seen[-1][0] == 390.0


def test_backfill_uses_gpus_the_reservation_does_not_need() -> None:
    # 2x2, packed: a0 (ends 100) and a1 (300) on node 0, b0 (200) and b1 (400) on node 1; a 2-GPU job at 10
    # is reserved node 0 from 300.  A 1000 s job at 20 would take a0's GPU at 100: it waits, and starts at
    # 200 on b0's GPU (node 1), which the reservation leaves alone.  Without the guarantee it takes node 0
    # at 100 and the 2-GPU job waits for node 1 until 400.
    specs = [JobSpec("a0", 0, 1, 100.0), JobSpec("a1", 0, 1, 300.0), JobSpec("b0", 0, 1, 200.0),
             JobSpec("b1", 0, 1, 400.0), JobSpec("big", 10, 2, 100.0), JobSpec("s", 20, 1, 1000.0)]
    for depth, want in ((0, {"big": 400.0, "s": 100.0}), (1, {"big": 300.0, "s": 200.0})):
        got = {j.id: j.first_start for j in _run("2x2", specs, depth).jobs if j.id in want}
        assert got == want, depth


def test_positions_and_estimates_of_waiting_jobs() -> None:
    # at 30 (1x4 stream): big, s0 and s1 wait, in that order; only big (depth 1) has an estimate
    got: dict[str, object] = {}

    def observe(sched: Scheduler):
        bf = sched.backfill
        assert bf is not None

        def obs(sim: Simulator, what: str) -> None:
            if what == "round" and sim.now == 30.0:
                got.update(positions=dict(bf.positions), starts=dict(bf.starts))
        return obs

    _run("1x4", _stream(), 1, observe)
    assert got == {"positions": {"big": (1, 1), "s0": (2, 2), "s1": (3, 3)}, "starts": {"big": 400.0}}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("depth", [1, 3])
def test_reserved_jobs_never_start_later_than_first_estimate(seed: int, depth: int) -> None:
    rng = random.Random(seed)
    specs = []
    t = 0.0
    for i in range(60):
        t += rng.choice([0.0, 5.0, 17.0, 40.0])
        gpus = rng.choice([1, 1, 1, 2, 4, 8])
        specs.append(JobSpec(f"j{i}", t, gpus, float(rng.randint(20, 400))))
    first: dict[str, float] = {}

    def observe(sched: Scheduler):
        bf = sched.backfill
        assert bf is not None

        def obs(sim: Simulator, what: str) -> None:
            if what != "round":
                return
            held: set[int] = set()
            for a in sim.driver.current.values():  # no GPU given twice
                assert held.isdisjoint(a.gpu_ids)
                held.update(a.gpu_ids)
            if bf.starts:  # the first reservation: the waiting job first in the order that has one
                jid = min(bf.starts, key=lambda k: bf.positions[k])
                first.setdefault(jid, bf.starts[jid])
        return obs

    res = _run("2x4", specs, depth, observe, reschedule_on_arrival=True, reschedule_on_completion=True)
    starts = {j.id: j.first_start for j in res.jobs}
    assert all(s is not None for s in starts.values())
    assert first, "no job was ever reserved"
    late = {jid: (starts[jid], est) for jid, est in first.items() if starts[jid] > est + 1e-9}  # type: ignore[operator]
    assert not late


def test_bad_depth_refused() -> None:
    with pytest.raises(PolicyError, match="reserve depth must be >= 0, got -1"):
        Scheduler.from_names().reserve(-1)


# -- the service: real processes -------------------------------------------------------------------------

def _wall(iso_t: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso_t).timestamp()


#: how late a started job may be against its estimate on a real service: the estimate counts the running jobs'
#: limits from their launch, a job that reaches its limit is stopped at the next round and the freed GPUs go at
#: the round after, so a loaded machine (a launch or a round slowed by a second) starts it a few rounds late
#: (0.1-0.5 s seen at load 20-40); without the reservation the stream of small jobs would hold it seconds longer
LATE_S = 1.0


def _four_then_big(c) -> tuple[int, str]:  # noqa: ANN001
    """Four sleepy 1-GPU jobs ending after 2-5 s (limits 3-6 s), running; then a 4-GPU job (limit 3 s) with
    its first estimated start."""
    from service_util import job, submit, wait_for

    for i in range(4):
        submit(c, name=f"a{i}", command=f"sleep {2 + i}", gpus=1, time_limit=f"{3 + i}s")
    wait_for(lambda: all(job(c, i + 1)["st"] == "R" for i in range(4)), what="the first four running")
    big = submit(c, name="big", command="sleep 1", gpus=4, time_limit="3s")
    return big, wait_for(lambda: job(c, big)["est_start"], what="an estimate for the 4-GPU job")


def _hold_the_gpu(c) -> int:  # noqa: ANN001
    """A running job of limit 60 s on the service's one GPU."""
    from service_util import job, submit, wait_for

    holder = submit(c, name="holder", command="sleep 60", gpus=1, time_limit="60s")
    wait_for(lambda: job(c, holder)["st"] == "R", what="the holder running")
    return holder


def _waiting_or_running(d: dict) -> dict | None:
    return d if d["queue_position"] or d["st"] == "R" else None


def test_service_big_job_starts_no_later_than_its_estimate(server) -> None:  # noqa: ANN001
    # 1x4, non-preemptive FIFO, the guarantee on (serve's default): four sleepy 1-GPU jobs end after 2-5 s
    # (limits 3-6 s), then a 4-GPU job, then a stream of 1-GPU jobs of 3 s (limit 4 s), two a second
    from service_util import job, submit, wait_for

    s = server("--gpus", "4", "--round", "0.2", "--non-preemptive")
    with s.client() as c:
        big, first = _four_then_big(c)
        small = []
        for k in range(12):
            small.append(submit(c, name=f"s{k}", command="sleep 3", gpus=1, time_limit="4s"))
            if k == 0:  # a waiting job behind it: its position, no estimate beyond the reserved ones (unless
                # a 1-GPU job ended while the machine was slow to get here and s0 fits before the reservation)
                d = wait_for(lambda: _waiting_or_running(job(c, small[0])), what="s0's position or start")
                if d["st"] != "R":
                    assert (d["queue_position"], d["queue_position_in_queue"]) == (2, 2)
            time.sleep(0.5)
        b = wait_for(lambda: (x := job(c, big))["first_start"] and x, timeout=30, what="the 4-GPU job's start")
        assert b["queue_position"] is None and b["est_start"] is None  # no longer waiting
        r = c.get("/starts")
        assert r.status_code == 200, r.text
        starts = r.json()
        assert all(x["id"] in small for x in starts)
        assert [x["queue_position"] for x in starts] == list(range(1, len(starts) + 1))
        smalls = [job(c, k) for k in small]
    # its first estimate came from the running jobs' limits (at most a3's start + 6 s); it started by then
    assert _wall(b["first_start"]) <= _wall(first) + LATE_S, (b["first_start"], first)
    # and small jobs submitted before it started waited for it (without the guarantee the stream, six
    # GPUs' worth of work on four, keeps a GPU busy until every small job has started)
    big_start = _wall(b["first_start"])
    assert any(_wall(x["submit_time"]) < big_start and (x["first_start"] is None or _wall(x["first_start"]) > big_start)
               for x in smalls)


def test_queue_start_and_show_print_positions_and_estimates(tmp_path, server) -> None:  # noqa: ANN001
    # 1 GPU held by a job of limit 60 s; two waiting jobs of limits 10 s and 20 s: positions 1 and 2,
    # estimated starts the holder's end and 10 s later (one round's plan); a third user's job is cut by --user
    import json

    from typer.testing import CliRunner

    from gpuloom.cli import app
    from service_util import job, submit, wait_for

    runner = CliRunner()
    sd = ("--state-dir", str(tmp_path))
    s = server("--gpus", "1", "--round", "0.2")
    with s.client() as c:
        _hold_the_gpu(c)
        first = submit(c, name="first", command="true", gpus=1, time_limit="10s")
        second = submit(c, name="second", command="true", gpus=1, time_limit="20s")
        wait_for(lambda: job(c, second)["est_start"], what="estimates")

    def starts() -> list[dict]:
        r = runner.invoke(app, ["queue", "--start", "--json", *sd])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    got = wait_for(lambda: (x := starts()) and all(j["est_start"] for j in x) and x, what="both estimated")
    assert [(j["id"], j["queue_position"], j["queue_position_in_queue"]) for j in got] == [(first, 1, 1),
                                                                                          (second, 2, 2)]
    ests = [datetime.fromisoformat(j["est_start"]).timestamp() for j in got]
    assert ests[1] - ests[0] == pytest.approx(10.0, abs=0.002)  # (milliseconds in the API's times)
    r = runner.invoke(app, ["queue", "--start", *sd])
    lines = r.output.splitlines()
    assert lines[0].split() == ["JOBID", "NAME", "USER", "QUEUE", "ST", "POS", "QPOS", "START_TIME", "GPUS",
                                "NODELIST(REASON)"]
    assert [ln.split()[:7] for ln in lines[1:]] == [[str(first), "first", "admin", "-", "PD", "1", "1"],
                                                    [str(second), "second", "admin", "-", "PD", "2", "2"]]
    assert runner.invoke(app, ["queue", "--start", "--user", "bob", "--json", *sd]).output.strip() == "[]"
    r = runner.invoke(app, ["show", str(second), *sd])
    assert r.exit_code == 0 and "Position=2 QueuePosition=2 EstStartTime=" in r.output
    assert "EstStartTime=N/A" not in r.output


def test_dashboard_job_page_shows_position_and_estimated_start(server, browser) -> None:  # noqa: ANN001
    from service_util import job, login, submit, wait_for

    s = server("--gpus", "1", "--round", "0.2")
    with s.client() as c:
        _hold_the_gpu(c)
        waiting = submit(c, name="waiting", command="true", gpus=1, time_limit="10s")
        est = wait_for(lambda: job(c, waiting)["est_start"], what="an estimate")
    page = browser.new_page()
    login(page, s.url + f"/?refresh=500#/job/{waiting}", s.token)
    page.wait_for_selector("#spec dd:has-text('1 (1 in its queue)')")
    shown = page.evaluate("iso => new Date(iso).toLocaleString()", est)
    terms = [t.inner_text() for t in page.query_selector_all("#spec dt")]
    assert terms[2:4] == ["position", "est. start"]
    assert page.query_selector_all("#spec dd")[3].inner_text() == shown


# -- a job held by its queue's quota: a reservation of the queue's room ------------------------------------

TEAM = {"queue": [{"name": "team", "limit": 4}]}
#: the three ways a queue's room is capped at 4 GPUs: its limit; its parent's limit (the small jobs in a
#: sibling queue); its guarantee under strict quotas
CAPS = {
    "limit": ({"queues": TEAM}, "team"),
    "parent": ({"queues": {"queue": [{"name": "org", "limit": 4}, {"name": "team", "parent": "org"},
                                     {"name": "other", "parent": "org"}]}}, "other"),
    "strict": ({"queues": {"queue": [{"name": "team", "guarantee": 4}]}, "borrow": False}, "team"),
}


def _team_stream(small_queue: str = "team") -> list[JobSpec]:
    """The 1x4 stream of :func:`_stream` on 1x8, the a-jobs and the 4-GPU job in queue ``team``, the small
    jobs in ``small_queue``: GPUs are always free, the queue's cap is what holds the 4-GPU job."""
    return [JobSpec(s.id, s.arrival, s.gpus, s.duration,
                    attrs={"queue": small_queue if s.id.startswith("s") else "team"}) for s in _stream()]


def _run_queued(specs: list[JobSpec], depth: int, observe=None, params: dict | None = None) -> RunResult:
    sched = Scheduler.from_names(preemptive=False, queue="quota", params=params or {"queues": TEAM})
    if depth:
        sched.reserve(depth)
    obs = [] if observe is None else [observe(sched)]
    return Simulator(parse_cluster("1x8"), specs, sched, None, SimConfig(round_len=10.0), observers=obs).run()


@pytest.mark.parametrize("cap", sorted(CAPS))
def test_big_job_held_by_its_queue_quota_behind_a_stream_of_small_ones(cap: str) -> None:
    params, small_queue = CAPS[cap]
    # without: each GPU of the limit that frees goes to the next small job of the queue (s0 at 100 when a0
    # ends, s1 at 200, s2 at 250, s3 at 300, s4 at 350); at 400 (a3's end) big, first in the order, is
    # admitted and the queue's limit stops s3 and s4 (even without preemption), which run again later
    res = {j.id: j for j in _run_queued(_team_stream(small_queue), 0, params=params).jobs}
    assert res["big"].first_start == 400.0
    assert [(res[f"s{k}"].first_start, res[f"s{k}"].preemptions) for k in range(5)] == [
        (100.0, 0), (200.0, 0), (250.0, 0), (300.0, 1), (350.0, 1)]
    # with: big is reserved the queue's room from 400 (a3's end, when the queue's running jobs leave it four
    # GPUs under its limit); s0 (100-250), s1 (200-350) and s2 (250-400) end by then and start; s3 and s4
    # would hold a GPU of the limit at 400 and wait; big runs 400-500 as first estimated, then s3..s6 start,
    # s7 at 650 (when s3 ends); nothing is stopped
    seen: list[tuple[float, float]] = []
    observe = _estimates_of("big", seen)
    res = {j.id: j for j in _run_queued(_team_stream(small_queue), 1, observe, params).jobs}
    assert res["big"].first_start == 400.0
    assert [res[f"s{k}"].first_start for k in range(8)] == [100.0, 200.0, 250.0, 500.0, 500.0, 500.0, 500.0,
                                                            650.0]
    assert all(j.preemptions == 0 for j in res.values())
    assert seen[0] == (10.0, 400.0)  # its estimate in the round it arrived: it started then
    assert {est for _, est in seen} == {400.0}


def test_service_big_job_held_by_its_queue_quota_starts_no_later_than_its_estimate(tmp_path, server) -> None:  # noqa: ANN001
    # 1x8, queue ``team`` limited to 4 GPUs (GPUs are never short: the limit holds the 4-GPU job): four
    # sleepy 1-GPU jobs end after 2-5 s (limits 3-6 s), then a 4-GPU job, then 1-GPU jobs of 2 s (limit 4 s),
    # two a second, all in ``team``
    from service_util import job, submit, wait_for

    tree = tmp_path / "queues.toml"
    tree.write_text('default = "team"\n[[queue]]\nname = "team"\nlimit = 4\n')
    s = server("--gpus", "8", "--round", "0.2", "--non-preemptive", "--queue-policy", "quota", "--queues", str(tree))
    with s.client() as c:
        big, first = _four_then_big(c)
        assert job(c, big)["pending_reason"] == "QueueAtQuota"
        small = []
        for k in range(12):
            # (2 s of work under a limit of 4 s: the decisions read limits alone; a margin of 1 s could be eaten
            # by a loaded machine's slow process start, a job then killed at its limit)
            small.append(submit(c, name=f"s{k}", command="sleep 2", gpus=1, time_limit="4s"))
            time.sleep(0.5)
        b = wait_for(lambda: (x := job(c, big))["first_start"] and x, timeout=30, what="the 4-GPU job's start")
        ended = wait_for(lambda: all(job(c, k)["st"] in ("CD", "F", "CA") for k in small) and
                         [job(c, k) for k in small], timeout=60, what="the small jobs' ends")
        assert all(x["st"] == "CD" for x in ended), [(x["name"], x["st"], x["reason"]) for x in ended]
        smalls = [job(c, k) for k in small]
    # its first estimate: when the queue's running jobs leave it 4 GPUs (by their limits: at most a3's
    # start + 6 s); it started by then, no small job was stopped for it, and small jobs submitted before
    # it started waited for it
    assert _wall(b["first_start"]) <= _wall(first) + LATE_S, (b["first_start"], first)
    assert [x["preemptions"] for x in smalls] == [0] * 12
    big_start = _wall(b["first_start"])
    assert any(_wall(x["submit_time"]) < big_start < _wall(x["first_start"]) for x in smalls)


ORG = {"queue": [{"name": "org", "limit": 6}, {"name": "x", "parent": "org"},
                 {"name": "y", "parent": "org", "limit": 3}, {"name": "z"}]}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("depth", [1, 3])
def test_jobs_held_by_limits_never_start_later_than_first_estimate(seed: int, depth: int) -> None:
    # 2x4; queues x and y under org (limit 6; y limit 3), z uncapped: the first reserved job (the first
    # waiting one in the order, often held by a limit) starts by its first estimate when estimates are exact
    # (durations known, no overheads, a round at every arrival and completion)
    rng = random.Random(seed)
    specs = []
    t = 0.0
    for i in range(60):
        t += rng.choice([0.0, 5.0, 17.0, 40.0])
        q = rng.choice(["x", "x", "y", "z"])
        gpus = rng.choice([1, 1, 1, 2, 3, 4] if q != "y" else [1, 1, 1, 2, 3])
        specs.append(JobSpec(f"j{i}", t, gpus, float(rng.randint(20, 400)), attrs={"queue": q}))
    first: dict[str, float] = {}
    at_quota: set[str] = set()

    def observe(sched: Scheduler):
        bf = sched.backfill
        assert bf is not None

        def obs(sim: Simulator, what: str) -> None:
            if what == "round" and bf.starts:
                jid = min(bf.starts, key=lambda k: bf.positions[k])
                first.setdefault(jid, bf.starts[jid])
                if sim.active[jid].reason == "QueueAtQuota":
                    at_quota.add(jid)
        return obs

    sched = Scheduler.from_names(preemptive=False, queue="quota", params={"queues": ORG})
    sched.reserve(depth)
    # (no restart overhead: the limits stop jobs and start them again, and a start-up is not estimated)
    config = SimConfig(round_len=10.0, reschedule_on_arrival=True, reschedule_on_completion=True,
                       restart_overhead=0.0)
    res = Simulator(parse_cluster("2x4"), specs, sched, None, config, observers=[observe(sched)]).run()
    starts = {j.id: j.first_start for j in res.jobs}
    assert all(s is not None for s in starts.values())
    assert at_quota, "no job held by a limit was ever first reserved"
    late = {jid: (starts[jid], est) for jid, est in first.items() if starts[jid] > est + 1e-9}  # type: ignore[operator]
    assert not late
