"""The job lifecycle state machine: every legal transition, a sample of illegal ones,
history, durations, measured launch time and protection."""

from __future__ import annotations

import itertools

import pytest

from gpuloom.core import lifecycle
from gpuloom.core.lifecycle import (
    PROGRESS_STATES,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    Lifecycle,
    is_legal,
    phase_times_of,
)

S = JobState

# the legal transitions, written out by hand from the specification
FORWARD = {
    (S.WAITING_FOR_INITIAL_CONTACT, S.WAITING_FOR_INITIAL_RESOURCE),
    (S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY),
    (S.STANDBY, S.LAUNCHING),
    (S.LAUNCHING, S.RUNNING_PROTECTED),
    (S.LAUNCHING, S.STOPPING),  # a launch called off
    (S.RUNNING_PROTECTED, S.RUNNING),
    (S.RUNNING_PROTECTED, S.FINISHED),
    (S.RUNNING, S.CHECKPOINTING),
    (S.RUNNING, S.FINISHED),
    (S.CHECKPOINTING, S.STOPPING),
    (S.STOPPING, S.STANDBY),
}
NON_TERMINAL = [s for s in S if s not in (S.FINISHED, S.CANCELLED, S.FAILED)]
LEGAL = FORWARD | {(s, t) for s in NON_TERMINAL for t in (S.CANCELLED, S.FAILED)}

# a path from the initial state to each state (to set up a lifecycle in state s)
PATH = [
    S.WAITING_FOR_INITIAL_CONTACT, S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY, S.LAUNCHING,
    S.RUNNING_PROTECTED, S.RUNNING, S.CHECKPOINTING, S.STOPPING,
]


def lifecycle_in(state: JobState) -> Lifecycle:
    lc = Lifecycle("j", 0.0)
    if state is S.FINISHED:
        for s in PATH[1:6]:
            lc.to(s, 1.0)
        lc.to(S.FINISHED, 1.0)
        return lc
    if state in (S.CANCELLED, S.FAILED):
        lc.to(state, 1.0)
        return lc
    for s in PATH[1 : PATH.index(state) + 1]:
        lc.to(s, 1.0)
    assert lc.state is state
    return lc


def test_table_matches_specification() -> None:
    table = {(s, t) for s, ts in TRANSITIONS.items() for t in ts}
    assert table == LEGAL
    assert TERMINAL == {S.FINISHED, S.CANCELLED, S.FAILED}
    assert PROGRESS_STATES == {S.RUNNING_PROTECTED, S.RUNNING}


@pytest.mark.parametrize("src,dst", sorted(LEGAL, key=lambda p: (p[0].value, p[1].value)))
def test_every_legal_transition(src: JobState, dst: JobState) -> None:
    lc = lifecycle_in(src)
    n = len(lc.history)
    lc.to(dst, 5.0)
    assert lc.state is dst
    assert lc.since == 5.0
    assert len(lc.history) == n + 1
    assert is_legal(src, dst)


ILLEGAL_SAMPLE = [
    (S.WAITING_FOR_INITIAL_CONTACT, S.RUNNING),
    (S.WAITING_FOR_INITIAL_CONTACT, S.STANDBY),
    (S.WAITING_FOR_INITIAL_RESOURCE, S.LAUNCHING),
    (S.STANDBY, S.RUNNING),
    (S.STANDBY, S.FINISHED),
    (S.LAUNCHING, S.RUNNING),
    (S.LAUNCHING, S.STANDBY),
    (S.LAUNCHING, S.CHECKPOINTING),  # nothing to checkpoint yet
    (S.RUNNING_PROTECTED, S.CHECKPOINTING),  # protection is a promise
    (S.RUNNING_PROTECTED, S.STOPPING),
    (S.RUNNING, S.STOPPING),  # must checkpoint first
    (S.RUNNING, S.RUNNING_PROTECTED),
    (S.CHECKPOINTING, S.RUNNING),
    (S.CHECKPOINTING, S.FINISHED),
    (S.STOPPING, S.LAUNCHING),
    (S.FINISHED, S.RUNNING),
    (S.FINISHED, S.CANCELLED),
    (S.CANCELLED, S.STANDBY),
    (S.FAILED, S.FAILED),
    (S.RUNNING, S.RUNNING),
]


@pytest.mark.parametrize("src,dst", ILLEGAL_SAMPLE)
def test_illegal_transitions_raise_naming_states_and_job(src: JobState, dst: JobState) -> None:
    lc = lifecycle_in(src)
    n = len(lc.history)
    with pytest.raises(IllegalTransition) as e:
        lc.to(dst, 5.0)
    msg = str(e.value)
    assert src.name in msg and dst.name in msg and "job j" in msg
    assert (e.value.src, e.value.dst, e.value.job_id) == (src, dst, "j")
    assert lc.state is src and len(lc.history) == n  # unchanged


def test_every_pair_is_either_legal_or_raises() -> None:
    for src, dst in itertools.product(S, S):
        lc = lifecycle_in(src)
        if (src, dst) in LEGAL:
            lc.to(dst, 2.0)
        else:
            with pytest.raises(IllegalTransition):
                lc.to(dst, 2.0)


def test_time_may_not_go_backwards() -> None:
    lc = Lifecycle("a", 10.0)
    with pytest.raises(IllegalTransition, match="before the last transition"):
        lc.to(S.WAITING_FOR_INITIAL_RESOURCE, 9.0)
    with pytest.raises(IllegalTransition):
        lc.to(S.WAITING_FOR_INITIAL_RESOURCE, float("nan"))
    lc.to(S.WAITING_FOR_INITIAL_RESOURCE, 10.0)  # equal times are fine


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="job x"):
        Lifecycle("x", float("inf"))
    with pytest.raises(ValueError, match="protect_factor"):
        Lifecycle("x", 0.0, protect_factor=-1)


def test_full_cycle_history_durations_and_protection() -> None:
    lc = Lifecycle("r50", 0.0)
    assert not lc.makes_progress
    lc.to(S.WAITING_FOR_INITIAL_RESOURCE, 0.0)
    lc.to(S.STANDBY, 4.0)
    lc.to(S.LAUNCHING, 4.0)
    assert not lc.makes_progress
    lc.to(S.RUNNING_PROTECTED, 14.0)  # launch took 10 s
    assert lc.makes_progress
    assert lc.last_launch_time == 10.0
    assert lc.protected_until == 44.0  # 14 + 3 x 10
    assert lc.is_protected(43.9) and not lc.is_protected(44.0)
    assert lc.refresh(30.0) is S.RUNNING_PROTECTED
    assert lc.refresh(50.0) is S.RUNNING  # recorded at 44, when protection ended
    assert lc.history[-1] == (44.0, S.RUNNING)
    assert lc.protected_until is None and not lc.is_protected(50.0)
    assert lc.makes_progress
    lc.to(S.CHECKPOINTING, 60.0)
    assert not lc.makes_progress
    lc.to(S.STOPPING, 65.0)
    lc.to(S.STANDBY, 67.0)
    lc.to(S.LAUNCHING, 67.0)
    lc.to(S.RUNNING_PROTECTED, 72.0)  # relaunch took 5 s: latest launch time wins
    assert lc.last_launch_time == 5.0 and lc.protected_until == 87.0
    lc.to(S.FINISHED, 80.0)  # a job may finish while protected
    assert lc.terminal and not lc.makes_progress
    assert [s for _, s in lc.history] == [
        S.WAITING_FOR_INITIAL_CONTACT, S.WAITING_FOR_INITIAL_RESOURCE, S.STANDBY, S.LAUNCHING,
        S.RUNNING_PROTECTED, S.RUNNING, S.CHECKPOINTING, S.STOPPING, S.STANDBY, S.LAUNCHING,
        S.RUNNING_PROTECTED, S.FINISHED,
    ]
    d = lc.durations(1000.0)  # terminal: `now` adds nothing
    assert d[S.WAITING_FOR_INITIAL_RESOURCE] == 4.0
    assert d[S.LAUNCHING] == 15.0
    assert d[S.RUNNING_PROTECTED] == 30.0 + 8.0
    assert d[S.RUNNING] == 16.0
    assert d[S.CHECKPOINTING] == 5.0 and d[S.STOPPING] == 2.0
    assert S.FINISHED not in d
    assert lc.time_in(PROGRESS_STATES) == 54.0
    assert sum(d.values()) == 80.0


@pytest.mark.parametrize("chunk", [1 << 15, 2])
def test_phase_times_of_many_lifecycles_equal_each_ones_own(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bulk phases (what a run's records keep) are each lifecycle's phase_times, bit for bit:
    a job preempted twice (its states' durations added in order), one still queued (counted up
    to now), one ended while queued, one in a state entered after now (counts 0), None; in one
    chunk and in chunks of two."""
    monkeypatch.setattr(lifecycle, "_PHASE_CHUNK", chunk)
    a = Lifecycle("a", 0.1)
    walk = [(S.WAITING_FOR_INITIAL_RESOURCE, 0.3), (S.STANDBY, 0.7), (S.LAUNCHING, 0.7), (S.RUNNING_PROTECTED, 1.1),
            (S.RUNNING, 2.3), (S.CHECKPOINTING, 3.7), (S.STOPPING, 4.1), (S.STANDBY, 4.3), (S.LAUNCHING, 9.9),
            (S.RUNNING_PROTECTED, 10.3), (S.RUNNING, 11.0), (S.CHECKPOINTING, 13.1), (S.STOPPING, 13.3),
            (S.STANDBY, 13.9), (S.LAUNCHING, 17.7), (S.RUNNING_PROTECTED, 17.9), (S.FINISHED, 30.3)]
    for st, t in walk:
        a.to(st, t)
    b = Lifecycle("b", 5.0)
    b.to(S.WAITING_FOR_INITIAL_RESOURCE, 5.5)
    c = Lifecycle("c", 1.0)
    c.to(S.CANCELLED, 2.5)
    d = Lifecycle("d", 50.0)
    lcs = [a, None, b, c, d]
    for now in (40.0, 5.25, 0.0, float("nan")):  # (before the current state's start, or NaN: it adds 0)
        assert phase_times_of(lcs, now) == [None if lc is None else lc.phase_times(now) for lc in lcs]
    assert phase_times_of(lcs, 40.0)[2] == (35.0, 0.0, 0.0)
    assert phase_times_of([None], 1.0) == [None] and phase_times_of([], 1.0) == []
    q, launching, running = phase_times_of([a], 40.0)[0]
    assert q == pytest.approx(0.2 + 0.4 + 5.6 + 3.8) and launching == pytest.approx(0.4 + 0.4 + 0.2 + 0.4 + 0.2 + 0.6 + 0.2)
    assert running == pytest.approx(1.2 + 1.4 + 0.7 + 2.1 + 12.4)


def test_current_state_counts_up_to_now() -> None:
    lc = Lifecycle("q", 100.0)
    lc.to(S.WAITING_FOR_INITIAL_RESOURCE, 101.0)
    assert lc.time_in(S.WAITING_FOR_INITIAL_RESOURCE, 131.0) == 30.0
    assert lc.time_in(S.WAITING_FOR_INITIAL_RESOURCE) == 0.0
    assert lc.time_in(S.WAITING_FOR_INITIAL_CONTACT, 131.0) == 1.0


def test_zero_launch_time_gives_no_protection_and_custom_factor() -> None:
    lc = lifecycle_in(S.LAUNCHING)  # entered LAUNCHING at 1.0
    lc.to(S.RUNNING_PROTECTED, 1.0)
    assert lc.protected_until == 1.0 and not lc.is_protected(1.0)
    assert lc.refresh(1.0) is S.RUNNING
    lc2 = Lifecycle("f", 0.0, protect_factor=1.5)
    for s in PATH[1:4]:
        lc2.to(s, 0.0)
    lc2.to(S.RUNNING_PROTECTED, 2.0)
    assert lc2.protected_until == 5.0


def test_cancel_and_fail_from_protected_clear_protection() -> None:
    lc = lifecycle_in(S.LAUNCHING)
    lc.to(S.RUNNING_PROTECTED, 3.0)
    assert lc.protected_until == 9.0
    lc.to(S.FAILED, 4.0)
    assert lc.terminal and lc.protected_until is None and not lc.is_protected(5.0)
    assert lc.refresh(100.0) is S.FAILED
