"""Jobs: what a user asked for (:class:`JobSpec`) and what happened to it (:class:`Job`).

Units.  A job's *work* is measured in reference seconds: the time it would run at
speed 1.0, i.e. with its requested GPUs on one node, GPU-proportional CPU and
memory, median GPUs and nobody sharing them.  ``duration`` is that figure;
when a trace gives iterations and a per-iteration time instead, ``duration =
iterations * iter_time``.  The throughput model (:mod:`gpuloom.perf.model`)
returns speeds relative to that reference, so a job at speed 0.5 needs twice
its duration of wall time.

``JobSpec`` is immutable input; ``Job`` is the mutable record the simulator and
the runtime update (plain attributes, ``__slots__``, no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any, overload

from .lifecycle import TERMINAL, JobState, Lifecycle


class JobError(ValueError):
    """A job that cannot be accepted; the message names the job and the field."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """An immutable job request.

    ``attrs`` carries what only some policies read (e.g. ``batch_size``, Muri's
    per-resource stage times, PAL's application class); ``profile`` an optional
    throughput profile object understood by the throughput model.
    """

    id: str
    arrival: float
    gpus: int
    duration: float
    model: str = ""
    iterations: int | None = None
    iter_time: float | None = None
    user: str = ""
    cpus: int | None = None
    mem_mb: int | None = None
    profile: Any = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise JobError("job id must not be empty")
        if self.gpus < 1:
            raise JobError(f"job {self.id}: gpus must be >= 1, got {self.gpus}")
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise JobError(f"job {self.id}: arrival must be a finite time >= 0, got {self.arrival}")
        if not math.isfinite(self.duration) or self.duration <= 0:
            raise JobError(f"job {self.id}: duration must be > 0, got {self.duration}")
        if self.cpus is not None and self.cpus < 0:
            raise JobError(f"job {self.id}: cpus must be >= 0")
        if self.mem_mb is not None and self.mem_mb < 0:
            raise JobError(f"job {self.id}: mem_mb must be >= 0")

    @classmethod
    def from_iterations(cls, id: str, arrival: float, gpus: int, iterations: int, iter_time: float, **kw: Any) -> JobSpec:
        if iterations <= 0 or iter_time <= 0:
            raise JobError(f"job {id}: iterations and iter_time must be > 0")
        return cls(id, arrival, gpus, iterations * iter_time, iterations=iterations, iter_time=iter_time, **kw)

    @classmethod
    def from_columns(cls, ids: Sequence[str], arrivals: Sequence[float], gpus: Sequence[int],
                     durations: Sequence[float], attrs: Sequence[Mapping[str, Any]]) -> list[JobSpec]:
        """``[JobSpec(ids[k], arrivals[k], gpus[k], durations[k], attrs=attrs[k]) for each k]``: the same specs
        and the same checks, made a column at a time (a column with a bad value: spec by spec, so the error is
        the one its spec raises)."""
        n = len(ids)
        if not len(arrivals) == len(gpus) == len(durations) == len(attrs) == n:
            raise ValueError(f"columns of {n}, {len(arrivals)}, {len(gpus)}, {len(durations)} and {len(attrs)} specs")
        inf = math.inf
        fields = cls.__dataclass_fields__
        if not (all(ids) and min(gpus, default=1) >= 1 and all(0 <= a < inf for a in arrivals)
                and all(0 < d < inf for d in durations)) or tuple(fields) != _FIELDS:
            return [cls(i, a, g, d, attrs=x) for i, a, g, d, x in zip(ids, arrivals, gpus, durations, attrs, strict=True)]
        # the frozen class's own slot setters, as its __init__ sets each field (without a call by name each)
        (set_id, set_arrival, set_gpus, set_duration, set_model, set_iterations, set_iter_time, set_user, set_cpus,
         set_mem_mb, set_profile, set_attrs) = (getattr(cls, name).__set__ for name in _FIELDS)
        model, iterations, iter_time, user, cpus, mem_mb, profile = (fields[name].default for name in _FIELDS[4:11])
        new = object.__new__
        specs = []
        for i, a, g, d, x in zip(ids, arrivals, gpus, durations, attrs, strict=True):
            s = new(cls)
            set_id(s, i)
            set_arrival(s, a)
            set_gpus(s, g)
            set_duration(s, d)
            set_model(s, model)
            set_iterations(s, iterations)
            set_iter_time(s, iter_time)
            set_user(s, user)
            set_cpus(s, cpus)
            set_mem_mb(s, mem_mb)
            set_profile(s, profile)
            set_attrs(s, x)
            specs.append(s)
        return specs


#: within :func:`attr_keys_known`: its specs and the keys their ``attrs`` hold
_KNOWN_KEYS: ContextVar[tuple[Sequence[JobSpec], frozenset[Any]] | None] = ContextVar("_KNOWN_KEYS", default=None)


@contextmanager
def attr_keys_known(specs: Sequence[JobSpec]) -> Iterator[None]:
    """Within: :func:`may_hold` answers for ``specs`` from the keys their ``attrs`` hold, gathered here in one pass
    (readers that each look for a key of their own, such as a trace's files, then skip theirs where none holds it).
    Within one for the same sequence, nothing more is gathered."""
    known = _KNOWN_KEYS.get()
    if known is not None and known[0] is specs:
        yield
        return
    keys = frozenset().union(*filter(None, map(attrgetter("attrs"), specs)))
    token = _KNOWN_KEYS.set((specs, keys))
    try:
        yield
    finally:
        _KNOWN_KEYS.reset(token)


def may_hold(specs: Sequence[JobSpec], key: Any) -> bool:
    """False where the ``attrs`` of none of ``specs`` holds ``key``, as :func:`attr_keys_known` gathered them for
    this very sequence; True otherwise (where a reader must look)."""
    known = _KNOWN_KEYS.get()
    return known is None or known[0] is not specs or key in known[1]


#: :class:`JobSpec`'s fields, in order (:meth:`JobSpec.from_columns` sets each)
_FIELDS = ("id", "arrival", "gpus", "duration", "model", "iterations", "iter_time", "user", "cpus", "mem_mb", "profile",
           "attrs")

#: keys of :attr:`Job.extra` that record what happened (why a job failed), not caches
RECORD_KEYS: tuple[str, ...] = ("failure",)


Shape = tuple[int, int | None, int | None]  #: a spec's (gpus, cpus, mem_mb): Job.shape
#: one tuple per distinct shape, shared by its jobs (8 bytes a job, not a tuple a job; :meth:`Job.__init__`)
_SHAPES: dict[Shape, Shape] = {}
# read once per job (an Enum's class attribute is read through EnumType.__getattr__)
_WAITING_CONTACT, _WAITING_RESOURCE = JobState.WAITING_FOR_INITIAL_CONTACT, JobState.WAITING_FOR_INITIAL_RESOURCE


class JobStatus(StrEnum):
    """A coarse view of a job, derived (:attr:`Job.status`): never stored."""

    PENDING = "pending"  # not yet arrived
    WAITING = "waiting"  # arrived, holds no resources
    RUNNING = "running"  # holds an allocation
    FINISHED = "finished"  # its lifecycle ended (finished, failed or cancelled)


class Job:
    """Mutable state of one job during a run.

    ``lifecycle`` is the job's :class:`~gpuloom.core.lifecycle.Lifecycle` from
    its arrival on (None before); ``status`` is derived from it and from
    ``alloc``: a job *runs* while it holds an allocation (the simulator frees a
    stopped job's GPUs at the decision, while its lifecycle may still show it
    checkpointing).

    Progress is kept lazily: ``remaining`` is exact as of ``last_update``;
    between updates the job progresses at ``speed`` once ``busy_until`` (end of
    a launch/restart, i.e. its entry to RUNNING_PROTECTED) has passed.  Call
    :meth:`advance` before reading.
    """

    __slots__ = (
        "spec", "id", "index", "lifecycle", "remaining", "attained_gpu_time", "attained_time",
        "alloc", "speed", "busy_until", "last_update", "first_start", "finish",
        "preemptions", "migrations", "resizes", "version", "last_start", "queued_time",
        "overhead_time", "reason", "extra", "shape",
    )

    def __init__(self, spec: JobSpec, index: int = 0) -> None:
        self.spec = spec
        self.id = spec.id  # a plain attribute: read in every hot loop
        # (gpus, cpus, mem_mb): what the incremental rounds group waiting jobs by; one tuple per
        # distinct shape (a spec replaced later keeps these three: only its profile changes)
        shape = (spec.gpus, spec.cpus, spec.mem_mb)
        if len(_SHAPES) >= 4096:  # (sharing only saves memory: a long-lived service's many shapes start over)
            _SHAPES.clear()
        self.shape: Shape = _SHAPES.setdefault(shape, shape)
        self.index = index  # position in arrival order: the tie-breaker of every order policy
        self.lifecycle: Lifecycle | None = None
        self.remaining = float(spec.duration)
        self.attained_gpu_time = 0.0  # GPU-seconds held (LAS/2D-LAS service)
        self.attained_time = 0.0  # wall seconds held
        self.alloc: Any = None  # Allocation | None
        self.speed = 0.0
        self.busy_until = 0.0
        self.last_update = spec.arrival
        self.first_start: float | None = None
        self.finish: float | None = None
        self.preemptions = 0
        self.migrations = 0
        self.resizes = 0
        self.version = 0
        self.last_start: float | None = None
        self.queued_time = 0.0
        self.overhead_time = 0.0
        self.reason: str | None = None  # why it waits, as of the last round (None while it holds resources)
        # caches of policies and factors (never scheduling state), and the records in RECORD_KEYS
        self.extra: dict[str, Any] = {}

    def drop_caches(self) -> None:
        """Forget what ``extra`` caches, keeping its records (:data:`RECORD_KEYS`): called when the
        job ends, so a run of a million jobs does not keep a cached request per finished job."""
        x = self.extra
        if x:
            kept = None
            for k in RECORD_KEYS:  # (a loop, not a comprehension: no frame per job, and mostly none kept)
                if k in x:
                    if kept is None:
                        kept = {}
                    kept[k] = x[k]
            x.clear()  # (frees the table: an empty dict is the smallest)
            if kept:
                x.update(kept)

    # convenient read-through properties
    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def arrival(self) -> float:
        return self.spec.arrival

    @property
    def status(self) -> JobStatus:
        lc = self.lifecycle
        if lc is None:
            return JobStatus.PENDING
        if lc.state in TERMINAL:
            return JobStatus.FINISHED
        return JobStatus.WAITING if self.alloc is None else JobStatus.RUNNING

    @property
    def state(self) -> JobState | None:
        """The lifecycle state (None before arrival)."""
        lc = self.lifecycle
        return None if lc is None else lc.state

    @property
    def running(self) -> bool:
        return self.alloc is not None

    def arrive(self, now: float, protect_factor: float = 3.0,
               state: JobState = JobState.WAITING_FOR_INITIAL_RESOURCE) -> Lifecycle:
        """Start the job's lifecycle at ``now``.

        By default the job makes contact at once (WAITING_FOR_INITIAL_CONTACT ->
        WAITING_FOR_INITIAL_RESOURCE), as a simulated job does; another ``state``
        starts the lifecycle there (the service's mirror of a stored job).
        """
        if state is _WAITING_RESOURCE:
            lc = Lifecycle(self.id, now, _WAITING_CONTACT, protect_factor)
            lc.to(state, now)
        else:
            lc = Lifecycle(self.id, now, state, protect_factor)
        self.lifecycle = lc
        self.last_update = now
        return lc

    def advance(self, now: float) -> None:
        """Bring ``remaining`` and the attained-service counters up to ``now``."""
        lu = self.last_update
        dt = now - lu
        if dt <= 0:
            return
        alloc = self.alloc
        if alloc is not None:
            self.attained_time += dt
            self.attained_gpu_time += dt * alloc.num_gpus
            bu = self.busy_until
            start = lu if lu >= bu else bu
            if now > start:
                r = self.remaining - (now - start) * self.speed
                self.remaining = 0.0 if r < 0.0 else r
            # min(dt, max(0.0, busy_until - last_update)), written out: the same value
            o = bu - lu
            if not o > 0.0:
                o = 0.0
            self.overhead_time += o if o < dt else dt
        elif self.lifecycle is not None and self.lifecycle.state not in TERMINAL:
            self.queued_time += dt
        self.last_update = now

    # what advance(now) would give, without changing the job (a round that plans nothing changes
    # nothing, so a run's results cannot depend on how many such rounds were computed)
    def remaining_at(self, now: float) -> float:
        """``remaining`` as :meth:`advance` would leave it at ``now``; the job is not changed."""
        lu = self.last_update
        if now <= lu or self.alloc is None:
            return self.remaining
        start = lu if lu >= self.busy_until else self.busy_until
        if now <= start:
            return self.remaining
        r = self.remaining - (now - start) * self.speed
        return r if r > 0.0 else 0.0

    def attained_at(self, now: float) -> float:
        """``attained_time`` (wall seconds held) as of ``now``, like :meth:`remaining_at`."""
        dt = now - self.last_update
        return self.attained_time + dt if dt > 0 and self.alloc is not None else self.attained_time

    def attained_gpu_at(self, now: float) -> float:
        """``attained_gpu_time`` (GPU-seconds held) as of ``now``, like :meth:`remaining_at`."""
        dt = now - self.last_update
        a = self.alloc
        return self.attained_gpu_time + dt * a.num_gpus if dt > 0 and a is not None else self.attained_gpu_time

    def predicted_finish(self, now: float) -> float:
        """When the job would finish if nothing changed (``inf`` if not progressing)."""
        if self.alloc is None or self.speed <= 0:
            return math.inf
        b = self.busy_until
        return (b if b > now else now) + self.remaining / self.speed  # max(now, busy_until), written out

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.status.value}, gpus={self.gpus}, remaining={self.remaining:.1f})"


class ActiveJobs(Sequence[Job]):
    """The jobs of a mapping (a driver's active jobs, in arrival order) as a read-only sequence,
    without copying them.

    A round reads only the front of a long queue (the prefix that fills the cluster and the
    jobs backfilled past it), so copying tens of thousands of jobs into a list per round would
    cost more than the round.  Iterating walks the mapping's values; indexing, slicing and
    :meth:`freeze` copy them once into a list, which every later read then uses.

    The owner must call :meth:`freeze` before it changes the mapping while the sequence may
    still be read (:class:`~gpuloom.driver.Driver` keeps a weak reference to the last one it
    handed out and freezes it before admitting or ending a job).
    """

    __slots__ = ("_by_id", "_list", "__weakref__")

    def __init__(self, by_id: Mapping[str, Job]) -> None:
        self._by_id = by_id
        self._list: list[Job] | None = None

    def freeze(self) -> list[Job]:
        """The jobs as a list (copied once: from then on the mapping is not read)."""
        lst = self._list
        if lst is None:
            lst = self._list = list(self._by_id.values())
        return lst

    def __len__(self) -> int:
        lst = self._list
        return len(self._by_id) if lst is None else len(lst)

    def ids(self) -> Collection[str]:
        """The jobs' ids, in order: the mapping's keys (its jobs' ids) while it is read, without
        reading the jobs (a view, compared with another dict's keys in C)."""
        lst = self._list
        return self._by_id.keys() if lst is None else [j.id for j in lst]

    def __iter__(self) -> Iterator[Job]:
        lst = self._list
        return iter(self._by_id.values()) if lst is None else iter(lst)

    @overload
    def __getitem__(self, i: int) -> Job: ...
    @overload
    def __getitem__(self, i: slice) -> list[Job]: ...
    def __getitem__(self, i: int | slice) -> Job | list[Job]:
        return self.freeze()[i]

    def __repr__(self) -> str:
        return f"ActiveJobs({len(self)} jobs)"
