"""The shortcuts of ``policies/incremental.py`` change no plan.

Every round of these runs is scheduled twice: with the shortcuts (the view
carries the driver's tally of its jobs: a round where everything fits extends
the current plan, a long queue is backfilled without walking it) and without
them (the whole queue is sized and placed, and every request tried even when
one of the same shape was refused before, as without ``pure_choose``).  The
plans must be identical, with the same actions in the same order, the same
free GPUs and the same pending reasons.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuloom.core import Cluster, JobSpec
from gpuloom.core.plan import diff
from gpuloom.policies import base as pb
from gpuloom.scheduler import Round, Scheduler
from gpuloom.sim import SimConfig, Simulator
from gpuloom.sim.generator import PHILLY_DURATIONS, generate


class BothWays(Scheduler):
    """Schedules each round with and without the tail walk and insists they agree."""

    walked = fitted = extended = partial = 0
    known: dict[str, str] = {}  # every waiting job's reason, as the rounds so far gave them

    def schedule(self, view: pb.View, reasons: bool = True) -> Round:
        fast = super().schedule(view, True)
        # the whole queue, and every request tried even if one of its shape was refused
        self.place.pure_choose = False  # type: ignore[misc]
        try:
            slow = super().schedule(dataclasses.replace(view, tally=None), True)
        finally:
            del self.place.pure_choose  # type: ignore[misc]
        assert fast.plan.allocations == slow.plan.allocations
        assert diff(view.current, fast.plan) == diff(view.current, slow.plan)
        assert fast.plan.free_gpus == slow.plan.free_gpus
        if fast.reasons_of is None:
            BothWays.known = dict(fast.reasons)
        else:  # the new jobs' reasons only: every other waiting job's is the one it had
            BothWays.partial += 1
            assert set(fast.reasons) <= {j.id for j in fast.reasons_of}
            BothWays.known.update(fast.reasons)
        assert {j: BothWays.known.get(j) for j in slow.reasons} == slow.reasons
        assert view.tally is not None
        if view.tally.demand <= view.cluster.num_gpus and fast.plan.base is not None:
            BothWays.fitted += 1
        elif len(fast.requests) < len(slow.requests):
            BothWays.walked += 1
            if fast.plan.base is not None:  # placed by prefix_plan: only what changes visited
                BothWays.extended += 1
        return fast


def workload(seed: int, n: int = 300) -> list[JobSpec]:
    """A queue that builds up: 1-16 GPU jobs, some asking for their own cores and memory."""
    rng = np.random.default_rng(seed)
    base = generate(n, 40.0, seed, gpu_dist={1: 0.6, 2: 0.1, 4: 0.1, 8: 0.15, 16: 0.05},
                    duration_dist=PHILLY_DURATIONS.clipped(300.0, 8 * 3600.0))
    out = []
    for s in base:
        if rng.random() < 0.2:
            s = dataclasses.replace(s, cpus=int(rng.integers(1, 4)) * s.gpus, mem_mb=int(rng.integers(1, 6)) * 10_000)
        out.append(s)
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("order", "params"), [
    ("fifo", {}), ("fifo", {"consolidate": False}), ("sjf", {}), ("srtf", {}), ("las", {"consolidate": False}),
])
def test_shortcuts_plan_what_the_whole_queue_plans(order: str, params: dict, seed: int) -> None:
    BothWays.walked = BothWays.fitted = BothWays.extended = BothWays.partial = 0
    BothWays.known = {}
    sched = BothWays.from_names(order, params=params)
    cl = Cluster.homogeneous(3, 8, 24, 200_000)
    Simulator(cl, workload(seed), sched, config=SimConfig(round_len=600.0, restart_overhead=30.0)).run()
    assert BothWays.walked > 10  # the walk stopped short of the whole queue in many rounds
    assert BothWays.extended > 10  # most of them extending the current plan
    assert BothWays.fitted > 0  # and everything fitted in some
    if order == "fifo" and params.get("consolidate", True):
        assert BothWays.partial > 5  # rounds that gave the reasons of their new jobs only


@pytest.mark.parametrize("order", ["fifo", "srtf"])
def test_everything_fits_under_light_load(order: str) -> None:
    BothWays.walked = BothWays.fitted = 0
    sched = BothWays.from_names(order)
    specs = generate(200, 6.0, 5, duration_dist=PHILLY_DURATIONS.clipped(300.0, 4 * 3600.0))
    Simulator(Cluster.homogeneous(4, 8), specs, sched, config=SimConfig(round_len=300.0)).run()
    assert BothWays.fitted > 50


def test_no_walk_without_the_declarations() -> None:
    # random placement draws from the generator: every job of the tail must be tried
    sched = Scheduler.from_names("fifo", place="random-sticky")
    assert not sched.place.pure_choose
    cl = Cluster.homogeneous(4, 4)
    sim = Simulator(cl, workload(3, 80), sched, config=SimConfig(round_len=600.0))
    view = sim.driver.view(0.0)
    assert sched.fast.tail([], 0, view) is None


class Quiet(Scheduler):
    """Schedules each round without reasons (as the simulator does: the appended-jobs shortcut may
    apply) and again on the whole queue, and insists they agree."""

    appended = after_actions = 0
    _acted = False  # the last round planned actions

    def schedule(self, view: pb.View, reasons: bool = True) -> Round:
        fast = super().schedule(view, False)
        self.place.pure_choose = False  # type: ignore[misc]
        try:
            slow = super().schedule(dataclasses.replace(view, tally=None, appended=None), False)
        finally:
            del self.place.pure_choose  # type: ignore[misc]
        assert fast.plan.allocations == slow.plan.allocations
        assert diff(view.current, fast.plan) == diff(view.current, slow.plan)
        assert fast.plan.free_gpus == slow.plan.free_gpus
        if view.appended is not None and len(fast.requests) <= len(view.appended):
            Quiet.appended += 1  # only the new jobs were sized: the round placed nothing else
            Quiet.after_actions += self._acted  # (the last round's actions carried out: Driver.apply)
        self._acted = bool(diff(view.current, fast.plan))
        return fast


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jobs_appended_after_a_quiet_round_are_only_backfilled(seed: int) -> None:
    # a long FIFO queue: rounds after a round that planned nothing, with only arrivals since, place
    # just the new jobs on what is free (Scheduler._appended_round)
    Quiet.appended = Quiet.after_actions = 0
    sched = Quiet.from_names("fifo")
    Simulator(Cluster.homogeneous(3, 8, 24, 200_000), workload(seed, 400), sched,
              config=SimConfig(round_len=300.0)).run()
    assert Quiet.appended > 10
    assert Quiet.after_actions > 5  # some after a round whose actions were carried out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("order", "params"), [
    ("fifo", {}), ("fifo", {"consolidate": False}), ("sjf", {}), ("srtf", {}), ("las", {"consolidate": False}),
])
def test_placement_is_a_fixed_point_on_its_own_plan(order: str, params: dict, seed: int) -> None:
    # what lets Driver.apply treat a round whose actions were all carried out like one that planned
    # none: the same round again, on the state its plan left, plans no action
    sched = Scheduler.from_names(order, params=params)
    rounds = []

    def again(sim: Simulator, what: str) -> None:
        if what == "round":
            drv = sim.driver
            rnd = drv.scheduler.schedule(drv.view(sim.now), False)
            assert diff(drv.current, rnd.plan) == []
            rounds.append(rnd.full)

    cl = Cluster.homogeneous(3, 8, 24, 200_000)
    Simulator(cl, workload(seed), sched, config=SimConfig(round_len=600.0, restart_overhead=30.0),
              observers=[again]).run()
    assert sum(rounds) > 20  # many of them with a long queue (the prefix filled the cluster)
