"""The job lifecycle: one state machine shared by the simulator and the real service.

States (F-scheduling's lifecycle, plus two terminal states the service needs)::

    WAITING_FOR_INITIAL_CONTACT   submitted; the job has not yet reported to the scheduler
                                  (in the service: its agent has not called in with its
                                  throughput function; in the simulator: left at once)
      -> WAITING_FOR_INITIAL_RESOURCE   known to the scheduler, never given resources yet
      -> STANDBY                  holds no running process; ready to be launched on the
                                  resources the plan gives it (also where a stopped job waits)
      -> LAUNCHING                process starting / restoring its checkpoint: no progress
                                  (a launch the scheduler calls off goes LAUNCHING -> STOPPING)
      -> RUNNING_PROTECTED        making progress; the scheduler must not reallocate it
                                  until ``protected_until`` (= entry + 3 x latest launch time)
      -> RUNNING                  making progress; may be reallocated
      -> CHECKPOINTING -> STOPPING -> STANDBY -> LAUNCHING ...   (a reallocation / preemption)
      -> FINISHED                 its work is done (from RUNNING or RUNNING_PROTECTED)

    CANCELLED, FAILED             reachable from every non-terminal state (user cancel, crash)

Anything else raises :class:`IllegalTransition`, naming the job and both states.
In particular RUNNING_PROTECTED -> CHECKPOINTING is illegal: protection is a
promise; a scheduler that must stop a protected job anyway (say, an admin
preemption) ends protection first with ``to(RUNNING, now)`` so the history shows it.

Design: no clock reads and no simulator assumptions.  Every method takes the
current time ``now`` from its caller (simulated seconds or wall-clock seconds,
anything monotone); times may not go backwards.  A :class:`Lifecycle` records
``history`` as ``(time, state)`` pairs, from which :meth:`Lifecycle.durations`
derives the time spent in each state (queued / launching / running breakdowns).
The launch time is *measured* from the history (entry to LAUNCHING to entry to
RUNNING_PROTECTED), so the runtime gets the same protection rule with real
launch times as the simulator gets with configured ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum


class JobState(StrEnum):
    WAITING_FOR_INITIAL_CONTACT = "waiting_for_initial_contact"
    WAITING_FOR_INITIAL_RESOURCE = "waiting_for_initial_resource"
    STANDBY = "standby"
    LAUNCHING = "launching"
    RUNNING_PROTECTED = "running_protected"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    STOPPING = "stopping"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


S = JobState

TERMINAL: frozenset[JobState] = frozenset({S.FINISHED, S.CANCELLED, S.FAILED})
PROGRESS_STATES: frozenset[JobState] = frozenset({S.RUNNING_PROTECTED, S.RUNNING})
#: the states in which a job holds (or is acquiring / releasing) resources
HOLDING_STATES: frozenset[JobState] = frozenset(
    {S.LAUNCHING, S.RUNNING_PROTECTED, S.RUNNING, S.CHECKPOINTING, S.STOPPING}
)

#: where a scheduler keeps a job's :class:`Lifecycle` (``job.extra[LIFECYCLE_KEY]``)
LIFECYCLE_KEY = "lifecycle"

_FORWARD: dict[JobState, frozenset[JobState]] = {
    S.WAITING_FOR_INITIAL_CONTACT: frozenset({S.WAITING_FOR_INITIAL_RESOURCE}),
    S.WAITING_FOR_INITIAL_RESOURCE: frozenset({S.STANDBY}),
    S.STANDBY: frozenset({S.LAUNCHING}),
    S.LAUNCHING: frozenset({S.RUNNING_PROTECTED, S.STOPPING}),
    S.RUNNING_PROTECTED: frozenset({S.RUNNING, S.FINISHED}),
    S.RUNNING: frozenset({S.CHECKPOINTING, S.FINISHED}),
    S.CHECKPOINTING: frozenset({S.STOPPING}),
    S.STOPPING: frozenset({S.STANDBY}),
}

#: every legal transition: state -> the states it may go to
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    s: (_FORWARD.get(s, frozenset()) | {S.CANCELLED, S.FAILED}) if s not in TERMINAL else frozenset()
    for s in JobState
}


class IllegalTransition(ValueError):
    """A transition the state machine does not allow; names the job and both states."""

    def __init__(self, job_id: str, src: JobState, dst: JobState, why: str = "") -> None:
        self.job_id, self.src, self.dst = job_id, src, dst
        msg = f"job {job_id}: illegal transition {src.name} -> {dst.name}"
        if why:
            msg += f" ({why})"
        super().__init__(msg)


def is_legal(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


class Lifecycle:
    """The lifecycle of one job: current state, history, measured launch time, protection.

    ``protect_factor`` (3 by default) times the latest launch time is how long a
    job stays RUNNING_PROTECTED after its launch completes.
    """

    __slots__ = ("job_id", "history", "protect_factor", "last_launch_time", "protected_until", "_launch_start")

    def __init__(
        self,
        job_id: str,
        now: float,
        state: JobState = JobState.WAITING_FOR_INITIAL_CONTACT,
        protect_factor: float = 3.0,
    ) -> None:
        if not math.isfinite(now):
            raise ValueError(f"job {job_id}: lifecycle start time must be finite, got {now}")
        if protect_factor < 0:
            raise ValueError(f"job {job_id}: protect_factor must be >= 0, got {protect_factor}")
        self.job_id = job_id
        self.history: list[tuple[float, JobState]] = [(float(now), JobState(state))]
        self.protect_factor = float(protect_factor)
        self.last_launch_time: float | None = None
        self.protected_until: float | None = None
        self._launch_start: float | None = now if state is JobState.LAUNCHING else None

    # -- reading ------------------------------------------------------------
    @property
    def state(self) -> JobState:
        return self.history[-1][1]

    @property
    def since(self) -> float:
        """When the current state was entered."""
        return self.history[-1][0]

    @property
    def makes_progress(self) -> bool:
        return self.state in PROGRESS_STATES

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def is_protected(self, now: float) -> bool:
        """True while RUNNING_PROTECTED and ``now`` is before ``protected_until``."""
        return (
            self.state is JobState.RUNNING_PROTECTED
            and self.protected_until is not None
            and now < self.protected_until
        )

    def durations(self, now: float | None = None) -> dict[JobState, float]:
        """Seconds spent in each state; the current state counts up to ``now`` (if given)."""
        out: dict[JobState, float] = {}
        h = self.history
        for (t0, s), (t1, _) in zip(h, h[1:], strict=False):
            out[s] = out.get(s, 0.0) + (t1 - t0)
        if now is not None and not self.terminal:
            t0, s = h[-1]
            out[s] = out.get(s, 0.0) + max(0.0, now - t0)
        return out

    def time_in(self, states: JobState | Iterable[JobState], now: float | None = None) -> float:
        d = self.durations(now)
        if isinstance(states, JobState):
            return d.get(states, 0.0)
        return sum(d.get(s, 0.0) for s in states)

    # -- changing -----------------------------------------------------------
    def to(self, state: JobState, now: float) -> None:
        """Move to ``state`` at time ``now``; raises :class:`IllegalTransition` if not allowed."""
        src = self.state
        dst = JobState(state)
        if dst not in TRANSITIONS[src]:
            raise IllegalTransition(self.job_id, src, dst)
        if not now >= self.since:  # also rejects NaN
            raise IllegalTransition(self.job_id, src, dst, f"at time {now}, before the last transition at {self.since}")
        now = float(now)
        if dst is JobState.LAUNCHING:
            self._launch_start = now
        elif dst is JobState.RUNNING_PROTECTED:
            assert self._launch_start is not None  # LAUNCHING is the only way in
            self.last_launch_time = now - self._launch_start
            self.protected_until = now + self.protect_factor * self.last_launch_time
        if src is JobState.RUNNING_PROTECTED:
            self.protected_until = None
        self.history.append((now, dst))

    def refresh(self, now: float) -> JobState:
        """End protection if it has expired by ``now`` (recorded at ``protected_until``).

        Returns the (possibly new) state.  Call it before asking whether a job may
        be reallocated.
        """
        if (
            self.state is JobState.RUNNING_PROTECTED
            and self.protected_until is not None
            and now >= self.protected_until
        ):
            self.to(JobState.RUNNING, max(self.protected_until, self.since))
        return self.state

    def __repr__(self) -> str:
        return f"Lifecycle({self.job_id}, {self.state.name} since {self.since:g})"
