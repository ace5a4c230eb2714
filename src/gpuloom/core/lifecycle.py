"""The job lifecycle: one state machine shared by the simulator and the real service.

Every :class:`~gpuloom.core.job.Job` carries one (``job.lifecycle``) from its
arrival on; :attr:`Job.status <gpuloom.core.job.Job.status>` is derived from it.

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
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


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

#: the phases of :meth:`Lifecycle.phases`, in order
PHASES: tuple[str, str, str] = ("queued", "launching", "running")
_STATES: tuple[JobState, ...] = tuple(JobState)  # a state's code in Lifecycle's compact history
_CODE: dict[JobState, int] = {st: k for k, st in enumerate(_STATES)}
_C_CONTACT, _C_RESOURCE, _C_STANDBY, _C_LAUNCHING, _C_PROTECTED, _C_RUNNING, _C_CHECKPOINTING, _C_STOPPING = (
    _CODE[s] for s in (JobState.WAITING_FOR_INITIAL_CONTACT, JobState.WAITING_FOR_INITIAL_RESOURCE, JobState.STANDBY,
                       JobState.LAUNCHING, JobState.RUNNING_PROTECTED, JobState.RUNNING, JobState.CHECKPOINTING,
                       JobState.STOPPING)
)
TERMINAL: frozenset[JobState] = frozenset({S.FINISHED, S.CANCELLED, S.FAILED})
PROGRESS_STATES: frozenset[JobState] = frozenset({S.RUNNING_PROTECTED, S.RUNNING})
#: the states in which a job holds (or is acquiring / releasing) resources
HOLDING_STATES: frozenset[JobState] = frozenset(
    {S.LAUNCHING, S.RUNNING_PROTECTED, S.RUNNING, S.CHECKPOINTING, S.STOPPING}
)
# the states the hot paths compare with, as plain globals (an enum member read through its class
# costs a class attribute lookup each time)
_STANDBY, _LAUNCHING, _PROTECTED, _RUNNING = S.STANDBY, S.LAUNCHING, S.RUNNING_PROTECTED, S.RUNNING
_CHECKPOINTING, _STOPPING = S.CHECKPOINTING, S.STOPPING

#: Slurm's short state codes (squeue's ST column): pending, running, completing (stopping),
#: completed, failed, cancelled
SHORT_STATE: Mapping[JobState, str] = {
    S.WAITING_FOR_INITIAL_CONTACT: "PD", S.WAITING_FOR_INITIAL_RESOURCE: "PD", S.STANDBY: "PD",
    S.LAUNCHING: "R", S.RUNNING_PROTECTED: "R", S.RUNNING: "R",
    S.CHECKPOINTING: "CG", S.STOPPING: "CG",
    S.FINISHED: "CD", S.FAILED: "F", S.CANCELLED: "CA",
}

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


# TRANSITIONS for Lifecycle.to: each state's legal next states with their codes, so that one lookup
# both checks a transition and finds the code the history keeps (a state's value, a plain string,
# finds it too)
_NEXT: dict[JobState, dict[JobState, int]] = {s: {d: _CODE[d] for d in TRANSITIONS[s]} for s in JobState}


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

    ``planned`` holds transitions decided but not yet due, as ``(time, state)``
    pairs in time order (the simulator times a whole stop/launch sequence at the
    decision, see :class:`LifecycleTimes`); :meth:`sync` records those due by
    ``now``, so the history never shows a state before it happens.
    """

    __slots__ = ("job_id", "_times", "_codes", "_state", "protect_factor", "last_launch_time", "protected_until",
                 "_launch_start", "planned")

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
        # the history, kept compact (a million jobs' histories are most of a large run's memory):
        # transition times in an array of doubles, states as their index in _STATES
        st = state if type(state) is JobState else JobState(state)
        self._times = array("d", (float(now),))
        self._codes = bytearray((_CODE[st],))
        self._state = st
        self.protect_factor = float(protect_factor)
        self.last_launch_time: float | None = None
        self.protected_until: float | None = None
        self._launch_start: float | None = now if state is _LAUNCHING else None
        self.planned: list[tuple[float, JobState]] = []

    # -- reading ------------------------------------------------------------
    @property
    def state(self) -> JobState:
        return self._state

    @property
    def since(self) -> float:
        """When the current state was entered."""
        return self._times[-1]

    @property
    def history(self) -> list[tuple[float, JobState]]:
        """Every state entered, as ``(time, state)`` pairs in order (a new list on each call)."""
        states = _STATES
        return [(t, states[c]) for t, c in zip(self._times, self._codes, strict=True)]

    @property
    def makes_progress(self) -> bool:
        return self.state in PROGRESS_STATES

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def holding(self) -> bool:
        return self.state in HOLDING_STATES

    @property
    def launched(self) -> bool:
        """Whether the job has ever entered LAUNCHING (its next launch is a relaunch)."""
        return self._launch_start is not None

    def is_protected(self, now: float) -> bool:
        """True while RUNNING_PROTECTED and ``now`` is before ``protected_until``."""
        return (
            self.state is JobState.RUNNING_PROTECTED
            and self.protected_until is not None
            and now < self.protected_until
        )

    def _sums(self, now: float | None) -> list[float]:
        """Seconds spent in each state, by state code (0.0 for a state never entered); the current
        state counts up to ``now`` (if given).  State k lasts from time k to time k + 1."""
        d = [0.0] * len(_STATES)
        times = iter(self._times)
        t0 = next(times)
        codes = self._codes
        for c, t1 in zip(codes, times, strict=False):  # (the last code, the current state, is left)
            d[c] = d[c] + (t1 - t0)
            t0 = t1
        if now is not None and self._state not in TERMINAL:
            c = codes[-1]
            d[c] = d[c] + max(0.0, now - t0)
        return d

    def durations(self, now: float | None = None) -> dict[JobState, float]:
        """Seconds spent in each state entered; the current state counts up to ``now`` (if given)."""
        d = self._sums(now)
        codes = self._codes
        entered = dict.fromkeys(codes[:-1])  # the states left, in the order first entered
        if now is not None and self._state not in TERMINAL:
            entered[codes[-1]] = None  # and the current one, counted up to now
        return {_STATES[c]: d[c] for c in entered}

    def time_in(self, states: JobState | Iterable[JobState], now: float | None = None) -> float:
        d = self.durations(now)
        if isinstance(states, JobState):
            return d.get(states, 0.0)
        return sum(d.get(s, 0.0) for s in states)

    def phases(self, now: float) -> dict[str, float]:
        """Seconds queued (waiting states), launching (incl. checkpoint and stop) and running."""
        return dict(zip(PHASES, self.phase_times(now), strict=True))

    def phase_times(self, now: float) -> tuple[float, float, float]:
        """:meth:`phases` as a tuple in :data:`PHASES` order (what a run's records keep)."""
        return _phases(self._sums(now))

    # -- changing -----------------------------------------------------------
    def to(self, state: JobState, now: float) -> None:
        """Move to ``state`` at time ``now``; raises :class:`IllegalTransition` if not allowed."""
        # (every job walks half a dozen of these: the state and the last time are read from the
        # slots, not through the properties, and the states compared with module constants)
        src = self._state
        try:
            code = _NEXT[src][state]
        except (KeyError, TypeError):
            dst = state if type(state) is JobState else JobState(state)  # (not a state: ValueError)
            raise IllegalTransition(self.job_id, src, dst) from None
        dst = _STATES[code]
        times = self._times
        if not now >= times[-1]:  # also rejects NaN
            raise IllegalTransition(self.job_id, src, dst, f"at time {now}, before the last transition at {times[-1]}")
        if type(now) is not float:
            now = float(now)
        if dst is _LAUNCHING:
            self._launch_start = now
        elif dst is _PROTECTED:
            assert self._launch_start is not None  # LAUNCHING is the only way in
            self.last_launch_time = now - self._launch_start
            self.protected_until = now + self.protect_factor * self.last_launch_time
        if src is _PROTECTED:
            self.protected_until = None
        times.append(now)
        self._codes.append(code)
        self._state = dst

    def walk(self, states: Iterable[JobState], now: float) -> JobState:
        """Go through ``states`` in order at ``now`` (never before the current state's entry)."""
        for st in states:
            self.to(st, max(now, self.since))
        return self.state

    def refresh(self, now: float) -> JobState:
        """End protection if it has expired by ``now`` (recorded at ``protected_until``).

        Returns the (possibly new) state.  Call it before asking whether a job may
        be reallocated.
        """
        pu = self.protected_until
        if self._state is _PROTECTED and pu is not None and now >= pu:
            t = self._times[-1]
            self.to(_RUNNING, t if t > pu else pu)  # max(pu, t), written out (builtin max is slow in 3.11)
        return self._state

    def sync(self, now: float) -> JobState:
        """Record the planned transitions due by ``now``, then expire protection."""
        pend = self.planned
        if pend:
            k = 0
            n = len(pend)
            while k < n:
                t, st = pend[k]
                if not t <= now:
                    break
                self.to(st, t)
                k += 1
            if k:
                del pend[:k]
        # (refresh, written out: every job's lifecycle is synced before each of its actions and at
        # every round while it has steps planned)
        pu = self.protected_until
        if self._state is _PROTECTED and pu is not None and now >= pu:
            t = self._times[-1]
            self.to(_RUNNING, t if t > pu else pu)
        return self._state

    def __repr__(self) -> str:
        return f"Lifecycle({self.job_id}, {self.state.name} since {self.since:g})"


def phase_times_of(lifecycles: Sequence[Lifecycle | None], now: float) -> list[tuple[float, float, float] | None]:
    """:meth:`Lifecycle.phase_times` of each lifecycle (None for None), all at once: what a run's
    records keep for every job at its end.

    The same sums, bit for bit: ``np.bincount`` adds each state's durations in order starting from
    0.0, as ``_sums`` does (its weights are the same differences, ``t1 - t0``, and the current
    state's ``max(0.0, now - t0)`` comes last), and the phases add the states in the same order.
    One pass in numpy over the histories instead of a Python loop per job: on Philly's 82,247
    jobs (7 transitions each for most) 0.065 s instead of 0.126 s.  In chunks of
    :data:`_PHASE_CHUNK` lifecycles, so that the arrays stay a few MB: over a million jobs at once
    they raised the 1M-job benchmark's peak memory by 160 MB.
    """
    lcs = [lc for lc in lifecycles if lc is not None]
    out: list[tuple[float, float, float] | None] = []
    for a in range(0, len(lcs), _PHASE_CHUNK):
        out.extend(_phase_times_chunk(lcs[a:a + _PHASE_CHUNK], now))
    if len(lcs) < len(lifecycles):
        it = iter(out)
        out = [None if lc is None else next(it) for lc in lifecycles]
    return out


_PHASE_CHUNK = 1 << 15


def _phase_times_chunk(lcs: list[Lifecycle], now: float) -> Iterable[tuple[float, float, float]]:
    n, ns = len(lcs), len(_STATES)
    code_lists = [lc._codes for lc in lcs]
    lengths = np.fromiter(map(len, code_lists), dtype=np.int64, count=n)
    times = np.frombuffer(b"".join([lc._times for lc in lcs]), dtype=np.float64)
    codes = np.frombuffer(b"".join(code_lists), dtype=np.uint8)
    # entry k lasts until entry k + 1, except each history's last entry: the current state, counted
    # up to now unless terminal
    dt = np.empty(len(times))
    dt[:-1] = times[1:] - times[:-1]
    last = np.cumsum(lengths) - 1
    live = np.fromiter((lc._state not in TERMINAL for lc in lcs), dtype=bool, count=n)
    left = now - times[last]
    dt[last] = np.where(live & (left > 0.0), left, 0.0)  # (max(0.0, left) as Python's max gives it, NaN too)
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    d = np.bincount(owner * ns + codes, weights=dt, minlength=n * ns).reshape(n, ns)
    queued, launching, running = _phases(d.T)  # (d.T[code]: that state's seconds, job by job)
    return zip(queued.tolist(), launching.tolist(), running.tolist(), strict=True)


def _phases(d: Any) -> tuple[Any, Any, Any]:
    """The phases from the seconds in each state, ``d[code]`` (one lifecycle's floats, or a numpy
    row of every lifecycle's), added in one order for both."""
    return (
        d[_C_CONTACT] + d[_C_RESOURCE] + d[_C_STANDBY],
        d[_C_LAUNCHING] + d[_C_CHECKPOINTING] + d[_C_STOPPING],
        d[_C_PROTECTED] + d[_C_RUNNING],
    )


# -- the sequences an action walks ---------------------------------------------------------
_STOP_FROM: dict[JobState, tuple[JobState, ...]] = {
    S.RUNNING_PROTECTED: (S.RUNNING, S.CHECKPOINTING, S.STOPPING, S.STANDBY),
    S.RUNNING: (S.CHECKPOINTING, S.STOPPING, S.STANDBY),
    S.LAUNCHING: (S.STOPPING, S.STANDBY),
    S.CHECKPOINTING: (S.STOPPING, S.STANDBY),
    S.STOPPING: (S.STANDBY,),
    S.STANDBY: (),
}
_START_FROM: dict[JobState, tuple[JobState, ...]] = {
    S.WAITING_FOR_INITIAL_RESOURCE: (S.STANDBY, S.LAUNCHING, S.RUNNING_PROTECTED),
    S.STANDBY: (S.LAUNCHING, S.RUNNING_PROTECTED),
}


def stop_steps(job_id: str, state: JobState) -> tuple[JobState, ...]:
    """The states a job in ``state`` walks to STANDBY when stopped (preemption, or the first half
    of a move/resize).  A protected job ends its protection first (the plan overrides it)."""
    try:
        return _STOP_FROM[state]
    except KeyError:
        raise IllegalTransition(job_id, state, S.STANDBY, "cannot stop a job in this state") from None


def start_steps(job_id: str, state: JobState) -> tuple[JobState, ...]:
    """The states a job holding nothing walks to RUNNING_PROTECTED when launched."""
    try:
        return _START_FROM[state]
    except KeyError:
        raise IllegalTransition(job_id, state, S.LAUNCHING, "cannot launch a job in this state") from None


def _step_s(state: JobState, launch: float, checkpoint: float, stop: float) -> float:
    """How long ``state`` lasts in a planned sequence (0 for a state passed through at once)."""
    return launch if state is _LAUNCHING else checkpoint if state is _CHECKPOINTING else stop if state is _STOPPING else 0.0


@dataclass(frozen=True, slots=True)
class LifecycleTimes:
    """How long the non-progress states last in a simulation, and the protection factor.

    ``launch`` is a job's first launch, ``relaunch`` (default: ``launch``) every
    later one (a resume after preemption, or the second half of a move or
    resize); ``checkpoint`` and ``stop`` the two halves of a stop.  Per job,
    ``attrs["launch_time"|"checkpoint_time"|"stop_time"]`` override them (e.g.
    times the service measured).

    :meth:`overheads` is the classic overhead model as a preset: a first start
    costs ``launch_overhead`` seconds, every resume, migration or resize
    ``restart_overhead``, a stop frees its GPUs at once, and no protection.
    """

    launch: float = 10.0
    checkpoint: float = 5.0
    stop: float = 2.0
    protect_factor: float = 3.0
    relaunch: float | None = None

    def __post_init__(self) -> None:
        for k in ("launch", "checkpoint", "stop", "protect_factor", "relaunch"):
            v = getattr(self, k)
            if k == "relaunch" and v is None:
                continue
            if isinstance(v, bool) or not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"lifecycle {k} must be a finite number >= 0, got {v!r}")

    @classmethod
    def overheads(cls, launch_overhead: float = 0.0, restart_overhead: float = 10.0) -> LifecycleTimes:
        return cls(launch=launch_overhead, checkpoint=0.0, stop=0.0, protect_factor=0.0, relaunch=restart_overhead)

    def of(self, job_id: str, attrs: Mapping[str, Any] | None, first: bool) -> tuple[float, float, float]:
        """(launch, checkpoint, stop) seconds for a job; ``first``: its first launch."""
        a = attrs or {}
        base = self.launch if first or self.relaunch is None else self.relaunch
        if "launch_time" not in a and "checkpoint_time" not in a and "stop_time" not in a:
            return float(base), float(self.checkpoint), float(self.stop)  # (checked when made)
        out = []
        for key, dflt in (("launch_time", base), ("checkpoint_time", self.checkpoint), ("stop_time", self.stop)):
            v = a.get(key, dflt)
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"job {job_id}: attrs[{key!r}] must be a number, got {v!r}") from None
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"job {job_id}: attrs[{key!r}] must be >= 0, got {v}")
            out.append(v)
        return out[0], out[1], out[2]

    def schedule(self, lc: Lifecycle, stop: tuple[JobState, ...] | None, start: tuple[JobState, ...],
                 now: float, times: tuple[float, float, float], not_before: float | None = None) -> float:
        """Time the ``stop`` then ``start`` steps from ``now`` into ``lc.planned``; record what is due.

        ``stop`` is None for an action without a stop half (a start).  Returns
        when the job makes progress again (its entry to RUNNING_PROTECTED), or
        ``now`` when there is no start.  A stop already under way (checkpointing
        or stopping) keeps its own timing down to STANDBY; a stop of a job in
        STANDBY calls off a launch still waiting; a start waits for a stop to
        finish, and its LAUNCHING does not begin before ``not_before`` (the
        service launches a round's starts once the round's stops are done).
        """
        launch, ckpt, stop_s = times
        pend = lc.planned
        if stop is not None:
            cut = None
            for i, (_, s2) in enumerate(pend):
                if s2 is _STANDBY:
                    cut = i
                    break
            if cut is not None and lc.state in (S.CHECKPOINTING, S.STOPPING):
                del pend[cut + 1:]  # already on its way down: keep that schedule
            else:
                # the steps due now walked at once, as for a start below (what appending them and
                # syncing would record: the same transitions in the same order)
                pend.clear()
                t = now
                direct = True
                for st in stop:
                    if direct and t <= now:
                        lc.to(st, t)
                    else:
                        direct = False
                        pend.append((t, st))
                    # (_step_s, written out: a few calls per stop and start)
                    t += (launch if st is _LAUNCHING else ckpt if st is _CHECKPOINTING else stop_s if st is _STOPPING
                          else 0.0)
        ready = now
        if start:
            # with nothing planned before them, the start steps due now are walked at once: the same
            # transitions, in the same order, that appending them and syncing would record (the times
            # never decrease, so the steps due are a prefix)
            direct = not pend
            t = pend[-1][0] if pend else now
            for st in start:
                if st is _LAUNCHING and not_before is not None and not_before > t:
                    t = not_before
                if direct and t <= now:
                    lc.to(st, t)
                else:
                    direct = False
                    pend.append((t, st))
                ready = t
                t += (launch if st is _LAUNCHING else ckpt if st is _CHECKPOINTING else stop_s if st is _STOPPING
                      else 0.0)
        # zero-length steps happen now: sync, unless it would do nothing (no planned step due, and not
        # protected, the only state refresh() may end)
        if (pend and not pend[0][0] > now) or lc._state is _PROTECTED:
            lc.sync(now)
        return ready
