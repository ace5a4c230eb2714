"""The incremental round check catches what the whole-plan check catches.

The driver checks each round's plan in O(actions) (``Scheduler.check_changes``,
``core.plan.check_actions``): every changed allocation against what the
unchanged ones hold, relying on the current allocations having passed.  Here
broken plans are injected into a driver with sound running jobs (groups
included): each must be refused by both checks, every sound plan passed by
both; and on random plans the two always agree.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.core import Cluster, JobSpec
from gpuloom.core.job import Job
from gpuloom.core.plan import Allocation, Part, Plan, PlanError, diff
from gpuloom.driver import Driver
from gpuloom.perf.assembly import build_model
from gpuloom.policies.base import Request
from gpuloom.scheduler import Round, Scheduler
from gpuloom.sim.engine import SimBackend, SimConfig

# 3 nodes x 4 GPUs (GPUs 0-3, 4-7, 8-11), 12 cores and 12,000 MB each
CLUSTER = Cluster.homogeneous(3, 4, 12, 12_000)
GPUS = {"a": 2, "b": 1, "c": 4, "e": 1, "f": 1, "x": 2, "y": 1, "z": 1}


def A(jid: str, node: int, gpus: tuple[int, ...], cpus: int = 1, mem: int = 100,  # noqa: N802
      group: tuple[str, ...] = ()) -> Allocation:
    return Allocation(jid, (Part(node, gpus, cpus, mem),), group)


def running_driver() -> Driver:
    """a on GPUs 0-1, b on 2, c on 4-7, e and f sharing 8 (a Muri group); x, y, z wait."""
    sched = Scheduler.from_names("fifo")
    d = Driver(CLUSTER, sched, build_model(CLUSTER), SimBackend(SimConfig().times))
    for i, (jid, g) in enumerate(GPUS.items()):
        d.admit(Job(JobSpec(jid, 0.0, g, 100.0), i), 0.0)
    for a in (A("a", 0, (0, 1)), A("b", 0, (2,)), A("c", 1, (4, 5, 6, 7), cpus=8),
              A("e", 2, (8,), group=("f",)), A("f", 2, (8,), group=("e",))):
        d.hold(d.jobs[a.job_id], a)
    d.check_state()
    return d


def verdicts(d: Driver, changes: dict[str, Allocation | None]) -> tuple[str | None, str | None]:
    """(whole check's error, incremental check's error) for ``current`` with ``changes`` (None: stopped)."""
    plan = Plan(dict(d.current))
    for jid, a in changes.items():
        if a is None:
            plan.allocations.pop(jid, None)
        else:
            plan.allocations[jid] = a
    # one request per planned job asking for its spec's GPUs (what a fixed-GPU sizer asks)
    requests = [Request((d.jobs[j],), d.jobs[j].spec.gpus) for j in plan.allocations if j in d.jobs]
    rnd = Round(plan, requests)
    view = d.view(1.0)
    out: list[str | None] = []
    for check in (lambda: d.scheduler.check(rnd, view),
                  lambda: d.scheduler.check_changes(rnd, view, diff(d.current, plan), d.holders, d.jobs)):
        try:
            check()
            out.append(None)
        except PlanError as e:
            out.append(str(e))
    return out[0], out[1]


BROKEN = {
    "a start on a held GPU": {"x": A("x", 0, (1, 3))},
    "two starts on one GPU": {"y": A("y", 0, (3,)), "z": A("z", 0, (3,))},
    "a move onto a held GPU": {"b": A("b", 0, (0,))},
    "a GPU on another node": {"y": A("y", 1, (3,))},
    "an unknown GPU": {"y": A("y", 2, (12,))},
    "an unknown node": {"y": A("y", 3, (3,))},
    "too many cores": {"y": A("y", 1, (4,), cpus=5)} | {"c": None} | {"x": A("x", 1, (5, 6), cpus=8)},
    "too much memory": {"y": A("y", 0, (3,), mem=11_850)},
    "two nodes over at once": {"y": A("y", 1, (4,), cpus=5), "c": None, "x": A("x", 1, (5, 6), cpus=8),
                               "z": A("z", 0, (3,), mem=11_850)},
    "a resize past the node": {"c": A("c", 1, (4, 5, 6, 7), cpus=13)},
    "a broken gang": {"x": A("x", 0, (3,))},
    "an inactive job": {"ghost": A("ghost", 0, (3,))},
    "a GPU listed twice": {"x": Allocation("x", (Part(0, (3, 3), 1, 1),))},
    "no GPU": {"y": Allocation("y", (Part(0, (), 1, 1),))},
    "a mislabelled allocation": {"y": A("z", 0, (3,))},
    "negative cores": {"y": A("y", 0, (3,), cpus=-1)},
    "a node in two parts": {"x": Allocation("x", (Part(0, (3,), 1, 1), Part(0, (3,), 1, 1)))},
    "joining a group unlisted": {"y": A("y", 2, (8,), group=("e", "f"))},
    "joining with other GPUs": {"x": A("x", 2, (8, 9), group=("e", "f")),
                                "e": A("e", 2, (8,), group=("f", "x")), "f": A("f", 2, (8,), group=("e", "x"))},
    # regroups: the same parts as before, other co-runners
    "a regroup leaving its partner unlisted": {"e": A("e", 2, (8,))},
    "a regroup mislabelled": {"e": A("f", 2, (8,), group=("f",))},
}

SOUND = {
    "nothing": {},
    "a start on free GPUs": {"x": Allocation("x", (Part(2, (10, 11), 2, 200),))},
    "a stop and a start on its GPUs": {"b": None, "y": A("y", 0, (2,))},
    "a move into GPUs freed the same round": {"a": None, "b": A("b", 0, (1,))},
    "a job joins a group": {"y": A("y", 2, (8,), group=("e", "f")),
                            "e": A("e", 2, (8,), group=("f", "y")), "f": A("f", 2, (8,), group=("e", "y"))},
    "a group member leaves": {"f": None, "e": A("e", 2, (8,))},
    "a resize within the node": {"c": A("c", 1, (4, 5, 6, 7), cpus=12, mem=11_000)},
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_both_checks_refuse_a_broken_plan(name: str) -> None:
    whole, incremental = verdicts(running_driver(), BROKEN[name])
    assert whole is not None and incremental is not None, (whole, incremental)


@pytest.mark.parametrize("name", list(SOUND))
def test_both_checks_pass_a_sound_plan(name: str) -> None:
    assert verdicts(running_driver(), SOUND[name]) == (None, None)


def test_messages_name_the_same_fault() -> None:
    d = running_driver()
    for name in ("a GPU on another node", "too much memory", "a broken gang", "an inactive job", "no GPU",
                 "a resize past the node", "two nodes over at once"):
        whole, incremental = verdicts(d, BROKEN[name])
        assert whole == incremental, name


# -- random plans: the two checks always agree ---------------------------------------------------
@st.composite
def changes(draw):  # noqa: ANN001, ANN201
    out: dict[str, Allocation | None] = {}
    for jid in draw(st.lists(st.sampled_from(sorted(GPUS) + ["ghost"]), max_size=4, unique=True)):
        if draw(st.booleans()) and jid != "ghost":
            out[jid] = None
            continue
        node = draw(st.integers(0, 2))
        gpus = draw(st.lists(st.integers(4 * node - 1, 4 * node + 3), min_size=1, max_size=4))
        group = tuple(draw(st.lists(st.sampled_from(sorted(GPUS)), max_size=2, unique=True)))
        out[jid] = Allocation(jid, (Part(node, tuple(gpus), draw(st.integers(0, 13)),
                                         draw(st.sampled_from([100, 6_000, 12_500]))),), group)
    return out


@settings(max_examples=400, deadline=None)
@given(changes())
def test_incremental_and_whole_checks_agree(ch: dict) -> None:
    whole, incremental = verdicts(running_driver(), ch)
    assert (whole is None) == (incremental is None), (whole, incremental)


# -- the driver's incremental state ----------------------------------------------------------------
def test_check_state_finds_drifted_bookkeeping() -> None:
    d = running_driver()
    d.free.cpu_counts[0] -= 1
    with pytest.raises(PlanError, match="node_cpus"):
        d.check_state()
    d = running_driver()
    d.holders[3] = {"x"}
    with pytest.raises(PlanError, match="each GPU"):
        d.check_state()


def test_driver_checks_every_round_and_the_whole_plan_now_and_then() -> None:
    d = running_driver()
    d.full_check_every = 3
    bad = Plan(dict(d.current) | {"x": A("x", 0, (1, 3))})

    def schedule(view, reasons=True):  # noqa: ANN001, ANN202
        return Round(bad, [])

    d.scheduler.schedule = schedule  # type: ignore[method-assign]
    before = dict(d.current)
    for _ in range(4):  # incremental rounds and a whole one (the third): each refuses the plan
        with pytest.raises(PlanError, match="GPU 1"):
            d.plan(1.0)
    assert d.current == before
