"""Stages declare what they can do; the round's shortcuts are chosen from those declarations alone."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

import pytest

from gpuloom.core.job import Job
from gpuloom.core.plan import Plan
from gpuloom.policies import base as pb
from gpuloom.policies.place import PackedSticky as PackedPlacement
from gpuloom.scheduler import Scheduler


def _fast(order: str = "fifo", group: str = "none", size: str = "proportional", place: str = "packed-sticky",
          preemptive: bool = True) -> tuple[bool, bool, bool, bool, bool]:
    f = Scheduler.from_names(order, group, size, place, preemptive).fast
    return f.prefix, f.incremental, f.tail_walk, f.prefix_plan, f.appended


@pytest.mark.parametrize("stack,expected", [
    ({}, (True, True, True, True, True)),
    # a time-dependent order: every shortcut but the appended round (which needs a static FIFO)
    ({"order": "srtf"}, (True, True, True, True, False)),
    ({"preemptive": False}, (True, True, True, False, False)),
    ({"group": "muri"}, (False, False, False, False, False)),  # groups: the whole queue every round
    ({"size": "synergy-tune"}, (True, False, False, False, False)),  # negotiates with placement
    ({"place": "pal"}, (True, False, False, False, False)),  # not sticky, arranges classes first
    ({"place": "packed-non-sticky"}, (True, False, False, False, False)),
    ({"place": "random-sticky"}, (True, True, False, False, False)),  # choose is not pure
])
def test_the_shortcuts_follow_the_declarations(stack: dict, expected: tuple[bool, ...]) -> None:
    assert _fast(**stack) == expected


def test_a_class_that_overrides_a_declared_method_without_declaring_it_is_refused() -> None:
    with pytest.raises(TypeError, match=r"overrides arrange\(\) but does not declare arranges = True"):
        class Reversed(PackedPlacement):
            def arrange(self, requests: Sequence[pb.Request], view: pb.View,
                        preemptive: bool = True) -> list[pb.Request]:
                return list(reversed(requests))
    with pytest.raises(TypeError, match=r"overrides place\(\) but does not declare three_phase = False"):
        class Own(PackedPlacement):
            def place(self, requests: Sequence[pb.Request], view: pb.View, preemptive: bool = True,
                      tail: object = None) -> Plan:
                return Plan()
    with pytest.raises(TypeError, match=r"overrides allocate\(\) but does not declare negotiates = True"):
        class Sizer(pb.SizePolicy):
            def allocate(self, requests: list[pb.Request], view: pb.View, place: pb.PlacePolicy,
                         preemptive: bool) -> Plan:
                return Plan()

    class Declared(PackedPlacement):
        arranges = True

        def arrange(self, requests: Sequence[pb.Request], view: pb.View,
                    preemptive: bool = True) -> list[pb.Request]:
            return list(reversed(requests))

    f = Scheduler(pb.make("order", "fifo"), pb.make("group", "none"), pb.make("size", "proportional"),
                  Declared()).fast
    assert (f.tail_walk, f.prefix_plan) == (True, False)  # its own order: no prefix plan


def test_a_keyed_order_of_any_class_takes_the_shortcuts(make_view) -> None:  # noqa: ANN001
    # an order declared keyed, not derived from order.py's KeyOrder: the scheduler reads the declaration
    class Smallest(pb.OrderPolicy):
        dynamic = False
        keyed = True

        def sort_key(self, job: Job, view: pb.View) -> tuple[float, int]:
            return (float(job.spec.gpus), job.index)

        def order(self, jobs: Sequence[Job], view: pb.View) -> Sequence[Job]:
            return sorted(jobs, key=lambda j: self.sort_key(j, view))

    sched = Scheduler(Smallest(), pb.make("group", "none"), pb.make("size", "proportional"),
                      pb.make("place", "packed-sticky"))
    assert (sched.fast.incremental, sched.fast.prefix_plan, sched.fast.appended) == (True, True, False)


def _reads(cls: type) -> set[str]:
    """The factor names a class's own gpuloom code looks up with ``model.get("name")``."""
    out: set[str] = set()
    for c in cls.__mro__:
        if c.__module__.startswith("gpuloom."):
            out |= set(re.findall(r'model\.get\("(\w+)"\)', inspect.getsource(c)))
    return out


@pytest.mark.parametrize("stage,name", [(s, n) for s in pb.STAGES for n in pb.names(s)])
def test_every_factor_a_stage_reads_is_declared(stage: str, name: str) -> None:
    cls = pb.lookup(stage, name)
    declared = set(cls.requires_factors) | set(cls.reads_factors)
    assert _reads(cls) <= declared, f"{stage} {name}: reads {sorted(_reads(cls) - declared)} undeclared"


def test_the_factors_muri_and_pal_read_are_declared() -> None:
    # the two stages that read factors without declaring them, before the declarations
    assert set(pb.lookup("group", "muri").requires_factors) == {"interleave"}
    assert pb.lookup("place", "pal").reads_factors == {"gpu_type", "variability", "locality"}
    assert _reads(pb.lookup("place", "pal")) == {"gpu_type", "variability", "locality"}


def test_the_profiling_threshold_is_the_stage_s_own() -> None:
    # the service profiles with the sizer's sensitivity threshold (-P threshold), declared, not probed
    tune = Scheduler.from_names(size="tune", params={"threshold": 0.05})
    assert (tune.needs_profiles, tune.size.profiling_threshold()) == (True, 0.05)
    assert Scheduler.from_names().size.profiling_threshold() == 0.10
