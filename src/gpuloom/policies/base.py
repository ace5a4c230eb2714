"""The pipeline stages, their registry, and the shared placement machinery.

A round is ``order → queue → group → size → place`` over a :class:`View`:

* **order** (:class:`OrderPolicy`) sorts the active jobs, highest priority first;
* **queue** (:class:`~.queue_base.QueuePolicy`, :mod:`.queues`) admits and interleaves them
  across teams' queues (guarantees, limits, borrowing, fair share); ``none``
  (the default) passes them on unchanged;
* **group** (:class:`GroupPolicy`) turns the ordered jobs into *units*: one job,
  or several jobs that will share one set of GPUs (Muri);
* **size** (:class:`SizePolicy`) says how much of each resource a unit gets,
  as a :class:`Request` (GPUs; CPU cores and memory, ``None`` = GPU-proportional
  on whichever node it lands);
* **place** (:class:`PlacePolicy`) picks nodes and GPU ids and returns the
  :class:`~gpuloom.core.plan.Plan`.

Selection and placement (``PlacePolicy.place``) run in three phases, so that a
placement quirk can never leave a multi-GPU job half placed:

1. *select* – walk the requests in order, admitting each whose GPU count still
   fits the cluster's total (skipping, i.e. backfilling, those that don't);
   a non-preemptive order admits every running job first;
2. *place* – sticky policies keep selected running jobs where they are; then
   every other selected request gets a full gang from ``choose`` or nothing;
3. *backfill* – requests left over, in order, take what is still free.

``backfill=False`` (a parameter of every place policy built on this loop)
makes the queue strict: selection stops at the first request that does not
fit what is left, placement stops at the first selected request that gets no
GPUs, and there is no phase 3, so no job ever starts ahead of an earlier
waiting one.  This is how Blox's placement loops (and so PAL's artifact)
behave: they walk the queue and ``break`` at the first job they cannot place.

Running jobs that end up without an allocation are preempted.  A new policy
is one class registered through :func:`register` in a module of this package (every
module here is imported on first lookup), or, from outside gpuloom, a class under the
``gpuloom.policies`` entry points or named ``module:Class`` (docs/extending.md).

**The stage contract.**  Every stage derives from :class:`Stage`, which
declares what the scheduler and the drivers may rely on, as class attributes
and methods with defaults (never found with ``hasattr``):

* ``dynamic``: a round can change this stage's output although no job arrived
  or finished (time-dependent orders, protection that expires);
* :meth:`Stage.next_change`: *when* it can, if no job arrives or ends and the
  plan stays (``math.inf`` when not ``dynamic``: the simulator skips rounds
  until the next event; ``view.now`` when it is; orders compute when two keys cross);
* ``requires_factors``: throughput-model factors the stage reads, name -> a
  constructor of a default one (or None: no default, the user must configure
  it); enforced when a scheduler is bound to a model
  (:meth:`gpuloom.scheduler.Scheduler.bind`), in the simulator and the service;
* ``needs_profiles``: the stage reads per-job CPU/memory sensitivity profiles
  (the service profiles new jobs before their first launch for it, with the stage's
  :meth:`Stage.profiling_threshold`);
* ``reads_factors``: factors the stage reads when the model has them, falling back without
  (PAL's PM-scores and locality penalties); with ``requires_factors``, every factor a stage
  looks up is declared (``tests/test_capabilities.py`` checks the built-in stages);
* what a round's fast paths (:mod:`gpuloom.policies.fastpath`) rest on:
  ``fixed_gpus`` (size: every request asks for exactly the job's GPUs),
  ``static_requests`` (size), ``negotiates`` (size: overrides :meth:`SizePolicy.allocate`),
  ``merges`` (group: may put several jobs in one unit), ``three_phase`` (place: places
  with :meth:`PlacePolicy.place`'s loop), ``arranges`` (place: overrides
  :meth:`PlacePolicy.arrange`), ``pure_choose`` (place), ``keyed`` and ``follows_view``
  (order: sorts by :meth:`OrderPolicy.sort_key`); see :mod:`gpuloom.policies.incremental`.
  A class that overrides one of those methods without declaring so is refused when defined;
* ``shared_params``: parameter names two stages take with one meaning (static
  slots), so a bare ``-P name=value`` reaches both;
* :meth:`Stage.plan_hooks`: callables ``hook(plan, view) -> Plan`` run after
  placement (e.g. hysteresis);
* :meth:`Stage.stats`: counters of the last round, for reports;
* :meth:`Stage.pending_reasons`: why the stage holds jobs back (a queue at
  its quota), shown as the job's pending reason.

Place policies also own the *order in which requests are placed*
(:meth:`PlacePolicy.arrange`: PAL's class priority, non-preemptive running
first) and the *backfill rule*; sizers that place job by job (Synergy's
greedy/tune/opt) walk :meth:`PlacePolicy.arrange`'s order and stop at the
first request that gets nothing when ``backfill`` is off, so both hold under
them too.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from ..core.cluster import Cluster
from ..core.fit import GPU_TYPE_KEY, spec_types
from ..core.job import Job
from ..core.parse import normalise_gpu_type, parse_bool
from ..core.plan import Allocation, Part, Plan
from ..core.registry import STAGE_DEFAULTS, STAGES, Registry  # noqa: F401 (STAGE_DEFAULTS: imported from here too)
from ..perf.gputype import runnable_types
from ..perf.model import Factor, ThroughputModel
from ..perf.sensitivity import DEFAULT_THRESHOLD as DEFAULT_SENSITIVITY_THRESHOLD
from .free import FreeState
from .incremental import TailWalk, Tally, try_new


class PolicyError(ValueError):
    """Unknown policy name or bad policy parameter."""


def _base_of(stage: str) -> type[Stage]:
    if stage == "queue":
        from .queue_base import QueuePolicy  # the queue stage's base lives beside it

        return QueuePolicy
    return {"order": OrderPolicy, "group": GroupPolicy, "size": SizePolicy, "place": PlacePolicy}[stage]


def _checker(stage: str) -> Callable[[Any, str], type[Stage]]:
    def check(obj: Any, where: str) -> type[Stage]:
        base = _base_of(stage)
        if not (isinstance(obj, type) and issubclass(obj, Stage)):
            raise PolicyError(f"{where} is not a policy class (one derived from OrderPolicy, GroupPolicy, "
                              "SizePolicy, PlacePolicy or QueuePolicy)")
        if not issubclass(obj, base):
            raise PolicyError(f"{where} is registered as a {stage} policy but does not derive from {base.__name__}")
        return obj
    return check


def _accepts(stage: str) -> Callable[[Any], bool]:
    """An entry point's class belongs to its stage's registry; anything else to the first (which refuses it)."""
    def accepts(obj: Any) -> bool:
        if isinstance(obj, type) and issubclass(obj, Stage):
            return obj.stage == stage
        return stage == STAGES[0]
    return accepts


def _name(cls: type[Stage], name: str) -> None:
    if not cls.__dict__.get("name"):  # a class without its own name is known by its first one
        cls.name = name


#: one registry per stage (:class:`~gpuloom.core.registry.Registry`): the modules of this package
#: register the built-ins; outside classes come by the ``gpuloom.policies`` entry points or module:Class
_REGISTRY: dict[str, Registry[type[Stage]]] = {
    s: Registry(f"{s} policy", home=__package__, group="gpuloom.policies", check=_checker(s),
                accepts=_accepts(s),
                named=_name, outside="module:Class", error=PolicyError)
    for s in STAGES}


def register(stage: str, *names: str) -> Callable[[type], type]:
    """Class decorator: make a policy findable by ``names`` in ``stage``."""
    if stage not in _REGISTRY:
        raise PolicyError(f"unknown stage {stage!r}")

    def deco(cls: type) -> type:
        _REGISTRY[stage].add(cls, *names, where=cls.__name__)
        return cls

    return deco


def names(stage: str) -> list[str]:
    return sorted(_REGISTRY[stage])


def accepted_params(stage: str, name: str) -> set[str]:
    cls = lookup(stage, name)
    sig = inspect.signature(cls)
    return {n for n, p in sig.parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def lookup(stage: str, name: str) -> type[Stage]:
    """The class of policy ``name`` of ``stage``: registered, or ``module:Class`` imported."""
    return _REGISTRY[stage].lookup(name)


def make(stage: str, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Instantiate a policy, passing only the parameters its constructor takes."""
    cls = lookup(stage, name)
    params = dict(params or {})
    accepted = accepted_params(stage, name)
    try:
        obj = cls(**{k: v for k, v in params.items() if k in accepted})
    except (TypeError, ValueError) as e:
        raise PolicyError(f"{stage} policy {name!r}: {e}") from None
    return obj


# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Blocked:
    """Nodes out of service for new work this round (drained, or in or before a maintenance window),
    and what work outside the plan holds (jobs submitted to Slurm directly).

    ``room[node]``: the longest time limit (seconds) a job may have to start there now (< 0: no job
    may); ``limit(job id)``: a job's time limit (None: none, so it starts on none of these nodes);
    ``held``: parts (global GPU ids, cores, memory) no new allocation may take (:meth:`PlacePolicy.choose_for`)."""

    room: Mapping[int, float]
    limit: Callable[[str], float | None]
    #: nodes whose running jobs leave them now (a checkpoint drain, a maintenance window begun)
    evicts: frozenset[int] = frozenset()
    held: tuple[Part, ...] = ()
    #: masks made, by the jobs' time limits (most jobs of a round share one: none, or a queue's default)
    _made: dict[tuple[float | None, ...], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False)

    def masks(self, cluster: Cluster, jobs: Sequence[Job]) -> tuple[np.ndarray, np.ndarray]:
        """(per node, per GPU) 0/1 masks of the nodes all of ``jobs`` may start on."""
        limits = tuple(self.limit(j.id) for j in jobs)
        hit = self._made.get(limits)
        if hit is not None and len(hit[0]) == cluster.num_nodes:
            return hit
        node_ok = np.ones(cluster.num_nodes, dtype=np.uint8)
        for node, room in self.room.items():
            if any(t is None or t > room for t in limits):
                node_ok[node] = 0
        made = self._made[limits] = (node_ok, node_ok[cluster.gpu_node])
        return made

    def keeps(self, jobs: Sequence[Job], parts: Sequence[Part], staying: bool) -> bool:
        """Whether ``jobs`` may hold ``parts``: as they run now (``staying``) unless a node evicts them,
        else only on nodes all of them may start on (as :meth:`masks` has it)."""
        if staying:
            return not any(p.node in self.evicts for p in parts)
        room = self.room
        on = [room[p.node] for p in parts if p.node in room]
        return not on or all((t := self.limit(j.id)) is not None and t <= min(on) for j in jobs)


@dataclass(slots=True, weakref_slot=True)
class View:
    """What a policy sees in one round.  Policies must not mutate it."""

    now: float
    cluster: Cluster
    jobs: Sequence[Job]  # active jobs (arrived, unfinished) in arrival order: Job.index increasing
    current: Mapping[str, Allocation]  # what runs now
    model: ThroughputModel
    rng: np.random.Generator
    round_index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    free: FreeState | None = None  # free resources given ``current``, if the caller keeps them
    by_id: Mapping[str, Job] | None = None  # the active jobs by id, if the caller keeps them
    tally: Tally | None = None  # counts of the active jobs, if the caller keeps them (policies/incremental.py)
    #: the jobs admitted since the caller's last round, when that round filled the cluster's GPUs
    #: with its prefix (``Round.full``), planned no action or had all its actions carried out, and
    #: nothing else changed since; else None
    appended: Sequence[Job] | None = None
    #: nodes new work may not go to (operator control), what work outside the plan holds; placement
    #: through choose_for keeps off both
    blocked: Blocked | None = None


@dataclass(slots=True)
class Request:
    """How much a unit (one job, or a group sharing GPUs) should get.

    ``cpus``/``mem_mb`` are totals over all the unit's nodes; ``None`` means the
    GPU-proportional share of whichever node(s) it lands on.  ``types`` restricts
    the GPU types it may be placed on (normalised names,
    :func:`~gpuloom.core.parse.normalise_gpu_type`; ``()``: none this round);
    ``None`` leaves the jobs' own asks (``attrs["gpu_type"]``), which placement
    always honours (:func:`allowed_types`).
    """

    jobs: tuple[Job, ...]
    gpus: int
    cpus: int | None = None
    mem_mb: int | None = None
    types: tuple[str, ...] | None = None
    _key: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple:
        """(gpus, cpus, mem_mb, job ids[, types]): equal keys mean an unchanged request."""
        k = self._key
        if k is None or k[0] != self.gpus or k[1] != self.cpus or k[2] != self.mem_mb:
            jobs = self.jobs
            ids = jobs[0].id if len(jobs) == 1 else tuple(j.id for j in jobs)
            types = self.types
            k = self._key = (self.gpus, self.cpus, self.mem_mb, ids) if types is None else (
                self.gpus, self.cpus, self.mem_mb, ids, types)
        return k

    @property
    def job(self) -> Job:
        return self.jobs[0]

    @property
    def running(self) -> bool:
        return any(j.alloc is not None for j in self.jobs)

    @property
    def prev(self) -> Allocation | None:
        return self.jobs[0].alloc


PlanHook = Callable[["Plan", "View"], "Plan"]


class Stage:
    """The common base of every pipeline stage: what a stage declares (see the module notes)."""

    stage: ClassVar[str] = ""
    name: ClassVar[str] = ""
    #: True if a round can change this stage's output without an arrival or completion
    dynamic: ClassVar[bool] = False
    #: throughput-model factors the stage reads: name -> constructor of a default one (given the
    #: cluster), or None when there is no default (the user must configure the factor)
    requires_factors: ClassVar[Mapping[str, Callable[[Cluster], Factor] | None]] = {}
    #: the stage reads per-job CPU/memory sensitivity profiles (Synergy)
    needs_profiles: ClassVar[bool] = False
    #: factors the stage reads when the model has them (it falls back without them)
    reads_factors: ClassVar[frozenset[str]] = frozenset()
    #: parameters meant to be shared: a bare ``-P name=`` reaches every chosen stage that shares it
    shared_params: ClassVar[frozenset[str]] = frozenset()
    #: method -> (the flag a class overriding it must declare, the value that declares it)
    overrides_declared: ClassVar[Mapping[str, tuple[str, bool]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("overrides_declared") is not None  # the class whose methods these are
        for meth, (flag, value) in cls.overrides_declared.items():
            if not own and meth in cls.__dict__ and getattr(cls, flag) != value:
                raise TypeError(f"{cls.__qualname__} overrides {meth}() but does not declare {flag} = {value}")

    def next_change(self, view: View) -> float:
        """The earliest time this stage's output could differ from its output at ``view.now``, on
        the state a round left unchanged (no action): never later, or results would depend on it."""
        return view.now if self.dynamic else math.inf

    def plan_hooks(self) -> Sequence[PlanHook]:
        """Hooks run after placement, in order; none by default."""
        return ()

    def profiling_threshold(self) -> float:
        """For a stage that ``needs_profiles``: how close to its best speed-up a CPU/memory point
        must come (the sensitivity threshold the service's profiling measures with)."""
        return DEFAULT_SENSITIVITY_THRESHOLD

    def stats(self) -> dict[str, Any]:
        """Counters of the last round (reports and benchmarks); none by default."""
        return {}

    def refuse(self, stages: Mapping[str, Stage]) -> str | None:
        """Why this stage cannot run beside the other chosen ``stages`` (by stage name), or None;
        the scheduler refuses such a stack when it is built."""
        return None

    def pending_reasons(self, plan: Plan, view: View) -> Mapping[str, str]:
        """Why this stage holds jobs back in ``plan`` (job id -> reason), overriding the
        scheduler's own (``Resources``/``Priority``/``Placement``); none by default."""
        return {}


class OrderPolicy(Stage):
    """Sort active jobs, highest priority first.

    ``dynamic`` is False when the order can only change on arrivals and
    completions (FIFO, SJF); the simulator then skips rounds in which nothing
    happened.
    """

    stage: ClassVar[str] = "order"
    dynamic: ClassVar[bool] = True
    #: :meth:`order` sorts by :meth:`sort_key` (ties by ``Job.index``)
    keyed: ClassVar[bool] = False
    #: the order is View.jobs' own (FIFO): ``sort_key`` matches it only while jobs arrive in index order
    follows_view: ClassVar[bool] = False

    def order(self, jobs: Sequence[Job], view: View) -> Sequence[Job]:
        raise NotImplementedError

    def sort_key(self, job: Job, view: View) -> tuple[float, int]:
        """Where ``job`` stands in :meth:`order` (only for a ``keyed`` order)."""
        raise NotImplementedError(f"order policy {self.name!r} is not keyed")


class GroupPolicy(Stage):
    stage: ClassVar[str] = "group"
    #: the policy may put several jobs in one unit (False: every job is a unit of its own, in order)
    merges: ClassVar[bool] = True

    def group(self, ordered: Sequence[Job], view: View) -> list[tuple[Job, ...]]:
        raise NotImplementedError


class SizePolicy(Stage):
    stage: ClassVar[str] = "size"
    #: every request asks for exactly its job's GPUs (lets the scheduler size only a prefix)
    fixed_gpus: ClassVar[bool] = False
    static_requests: ClassVar[bool] = False  #: a lone job asks for its spec's GPUs, cores, memory
    #: it sizes a group of jobs sharing GPUs (Muri's) as one request; False: grouping is refused up front
    sizes_groups: ClassVar[bool] = True
    #: it never lets a job that one node could hold span nodes (the job waits instead): a place policy that
    #: spreads GPUs over the cluster (``PlacePolicy.spreads``) is refused up front with it
    one_node: ClassVar[bool] = False

    def least_gpus(self, job: Job, model: ThroughputModel) -> int | None:
        """The fewest GPUs this sizer ever asks for ``job`` (None: not known before a round)."""
        return job.spec.gpus if self.fixed_gpus else None

    def never_sizes(self, job: Job, model: ThroughputModel) -> str | None:
        """Why this sizer can never give ``job`` a request it runs on (None: it can); asked before a run."""
        return None
    #: :meth:`allocate` places job by job with the place policy instead of handing it the requests
    negotiates: ClassVar[bool] = False
    overrides_declared: ClassVar[Mapping[str, tuple[str, bool]]] = {"allocate": ("negotiates", True)}

    def size(self, units: Sequence[tuple[Job, ...]], view: View) -> list[Request]:
        raise NotImplementedError

    def request(self, job: Job, view: View) -> Request:
        """One lone job's request (what :meth:`size` gives it alone)."""
        return self.size([(job,)], view)[0]

    def allocate(self, requests: list[Request], view: View, place: PlacePolicy, preemptive: bool) -> Plan:
        """Turn requests into a plan; sizers that must negotiate with placement override this
        (walking ``place.arrange(...)`` and honouring ``place.backfill``)."""
        return place.place(requests, view, preemptive)


def parse_flag(value: bool | str, name: str) -> bool:
    """A boolean policy parameter given as a bool or as true/false/1/0/yes/no/on/off (from ``-P``).

    :func:`gpuloom.core.parse.parse_bool` under its policy name.
    """
    return parse_bool(value, name)


def req_key(req: Request) -> tuple:
    return req.key


def allowed_types(req: Request, model: ThroughputModel | None = None) -> tuple[str, ...] | None:
    """The GPU types ``req`` may be placed on: its own ``types``, else what its jobs ask for
    (:func:`~gpuloom.core.fit.spec_types`; every member's ask for a group) and, given the model,
    can run on (:func:`~gpuloom.perf.gputype.runnable_types`); None: any type."""
    t = req.types
    if t is not None:
        return t
    out: tuple[str, ...] | None = None
    for j in req.jobs:
        mine = spec_types(j.spec) if j.spec.attrs and GPU_TYPE_KEY in j.spec.attrs else None
        if model is not None:
            can = runnable_types(j, model)
            if can is not None:
                mine = can if mine is None else tuple(x for x in mine if x in can)
        if mine is not None:
            out = mine if out is None else tuple(x for x in out if x in mine)
    return out


def type_masks(cluster: Cluster, types: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(per node, per GPU) 0/1 masks of ``cluster``'s nodes of one of ``types`` (cached per cluster)."""
    key = (id(cluster), types)
    hit = _MASKS.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1], hit[2]
    ok = np.array([normalise_gpu_type(n.gpu_type) in types for n in cluster.nodes], dtype=np.uint8)
    gpu = ok[cluster.gpu_node] if cluster.num_gpus else np.zeros(0, dtype=np.uint8)
    if len(_MASKS) > 256:
        _MASKS.clear()
    _MASKS[key] = (cluster, ok, gpu)
    return ok, gpu


_MASKS: dict[tuple[int, tuple[str, ...]], tuple[Cluster, np.ndarray, np.ndarray]] = {}


def on_types(cluster: Cluster, parts: Sequence[Part], types: tuple[str, ...]) -> bool:
    """Whether every part of ``parts`` is on a node of one of ``types``."""
    node_ok = type_masks(cluster, types)[0]
    return all(node_ok[p.node] for p in parts)


def split_parts(cluster: Cluster, req: Request, by_node: Mapping[int, Sequence[int]]) -> tuple[Part, ...]:
    """Build parts for ``req`` from GPU ids grouped by node, sharing CPU/memory by GPU count.

    Totals are split in proportion to the GPUs on each node (integer cores,
    remainders to the first parts); ``None`` takes each node's proportional share.
    A part's CPU/memory are *per member* (charged once per member of the unit),
    so for a group of ``m`` jobs sharing GPUs the proportional share is split
    evenly: each member gets ``share // m`` and the group together no more than
    a lone job would.
    """
    parts: list[Part] = []
    nodes = sorted(by_node)
    total = req.gpus
    cpu_left = req.cpus
    mem_left = req.mem_mb
    members = len(req.jobs)
    for node in nodes:
        gids = tuple(sorted(by_node[node]))
        k = len(gids)
        pc, pm = cluster.proportional(node, k)
        pc, pm = pc // members, pm // members
        if req.cpus is not None:
            pc = req.cpus * k // total
        if req.mem_mb is not None:
            pm = req.mem_mb * k // total
        parts.append(Part(node, gids, pc, pm))
        if cpu_left is not None:
            cpu_left -= pc
        if mem_left is not None:
            mem_left -= pm
    if parts and (cpu_left or mem_left):
        first = parts[0]
        parts[0] = replace(first, cpus=first.cpus + (cpu_left or 0), mem_mb=first.mem_mb + (mem_left or 0))
    return tuple(parts)


def need_on(cluster: Cluster, req: Request, node: int, k: int) -> tuple[int, int]:
    """CPU and memory ``req`` needs on ``node`` for ``k`` of its GPUs, all members together (upper bound)."""
    m = len(req.jobs)
    pc, pm = cluster.proportional(node, k)
    pc, pm = pc // m, pm // m
    if req.cpus is not None:
        pc = -(-req.cpus * k // req.gpus)
    if req.mem_mb is not None:
        pm = -(-req.mem_mb * k // req.gpus)
    return pc * m, pm * m


class PlacePolicy(Stage):
    """Base placement: the three-phase loop; subclasses implement :meth:`choose`.

    :meth:`arrange` decides the order in which requests are placed (the order
    policy's, with running jobs first when not preemptive; PAL puts classes
    first); ``backfill`` whether a request that does not fit lets later ones
    pass.  Sizers that place job by job use both.
    """

    stage: ClassVar[str] = "place"
    #: GPU types: a job is placed only on the types it can run on (choose_for)
    reads_factors: ClassVar[frozenset[str]] = frozenset({"gpu_type"})
    sticky: ClassVar[bool] = True
    pure_choose: ClassVar[bool] = False  #: see policies/incremental.py
    #: it draws a job's GPUs from the whole cluster, one node or several alike (random placement)
    spreads: ClassVar[bool] = False
    #: places with this class's three-phase loop (:meth:`place` not overridden)
    three_phase: ClassVar[bool] = True
    #: :meth:`arrange` is its own (not the order policy's order, running first when not preemptive)
    arranges: ClassVar[bool] = False
    overrides_declared: ClassVar[Mapping[str, tuple[str, bool]]] = {
        "place": ("three_phase", False), "arrange": ("arranges", True)}
    backfill: bool = True

    def __init__(self, backfill: bool | str = True) -> None:
        self.backfill = parse_flag(backfill, "backfill")

    def choose(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        raise NotImplementedError

    def choose_for(self, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
        """:meth:`choose` within the GPU types ``req`` may use (:func:`allowed_types`): the other
        nodes look full while it chooses, as do nodes ``view.blocked`` keeps this request off and what it
        says work outside the plan holds.  Callers outside the loop place through this."""
        b = view.blocked
        if b is not None:
            with ExitStack() as held:
                if b.held and free.outside is not b.held:  # (place() took them in for the round)
                    held.enter_context(free.holding(b.held))
                if b.room:
                    held.enter_context(free.masked(*b.masks(free.cluster, req.jobs)))
                return self.choose_for(req, free, replace(view, blocked=None))
        if req.types is None and len(req.jobs) == 1 and view.model.get("gpu_type") is None:
            attrs = req.jobs[0].spec.attrs
            if not attrs or GPU_TYPE_KEY not in attrs:
                return self.choose(req, free, view)  # (no type to keep to: most tries)
        types = allowed_types(req, view.model)
        if types is None:
            return self.choose(req, free, view)
        if not types:
            return None
        node_ok, gpu_ok = type_masks(free.cluster, types)
        with free.masked(node_ok, gpu_ok):
            parts = self.choose(req, free, view)
        return parts

    def never_places(self, gpus: int, cluster: Cluster) -> str | None:
        """Why no request of ``gpus`` GPUs could ever be placed, even on the empty ``cluster`` (None: it
        could); asked before a run (the cluster-wide limits are :func:`~gpuloom.core.fit.never_fits`')."""
        return None

    def arrange(self, requests: Sequence[Request], view: View, preemptive: bool = True) -> list[Request]:
        """The order in which requests are placed: as given, running requests first when not preemptive."""
        if preemptive:
            return list(requests)
        return [r for r in requests if r.running] + [r for r in requests if not r.running]

    # -- helpers shared by subclasses ---------------------------------------
    def _allocs(self, req: Request, parts: tuple[Part, ...]) -> list[Allocation]:
        if len(req.jobs) == 1:
            return [Allocation(req.jobs[0].id, parts, (), req.key)]
        ids = tuple([j.id for j in req.jobs])
        key = req_key(req)
        # (each member's co-runners: the others in order, by slicing rather than a filtering generator)
        return [Allocation(jid, parts, ids[:i] + ids[i + 1:], key) for i, jid in enumerate(ids)]

    def _sticky_start(
        self, requests: Sequence[Request], order: Sequence[int], selected: list[bool], done: list[bool],
        plan: Plan, view: View,
    ) -> FreeState:
        """Keep every selected running request whose request is unchanged; free the rest.

        Starts from the current free state and releases only allocations that
        are not kept, so the cost is proportional to what changes.
        """
        allocations = plan.allocations
        # (a plan that starts empty holds the kept jobs alone: its allocations are the set of them)
        own = not allocations
        kept: set[str] = set()
        blocked = view.blocked
        for i in order:
            if not selected[i]:
                continue
            req = requests[i]
            jobs = req.jobs
            prev = jobs[0].alloc
            if prev is None:
                continue
            # (keys compared by identity first: a kept request's allocations hold its own key object)
            pk, rk = prev.key, req.key
            if pk is not rk and pk != rk:
                continue
            if blocked is not None and not blocked.keeps(jobs, prev.parts, True):
                continue  # on a node that evicts: placed again, off it
            if len(jobs) > 1 and not _all_keyed(jobs, pk):
                continue
            if own:
                for j in jobs:
                    allocations[j.id] = j.alloc
            else:
                for j in jobs:
                    allocations[j.id] = j.alloc
                    kept.add(j.id)
            done[i] = True
        free = view.free.copy() if view.free is not None else FreeState.of(view.cluster, view.current)
        current = view.current
        kept_ids: Collection[str] = allocations if own else kept
        # the order of releases does not matter (they add up): only the jobs not kept are visited
        released: set[tuple[int, ...]] = set()
        for jid in current.keys() - kept_ids:
            a = current[jid]
            g = a.gpu_ids
            share = g in released or any(o in kept_ids for o in a.group)
            free.release(a.parts, 1, gpus=not share)
            released.add(g)
        return free

    def keep_parts(self, req: Request, free: FreeState, view: View | None = None) -> tuple[Part, ...] | None:
        """The request's previous GPUs with its new CPU/memory, if all still free (and of a type
        the request may use, and on nodes ``view.blocked`` lets it keep: :meth:`Blocked.keeps`)."""
        prev = req.jobs[0].alloc  # req.prev, without the property call (every try reads it)
        if prev is None or prev.num_gpus != req.gpus:
            return None
        if req.types is not None or len(req.jobs) > 1 or GPU_TYPE_KEY in req.jobs[0].spec.attrs:
            types = allowed_types(req)
            if types is not None and not on_types(free.cluster, prev.parts, types):
                return None
        if prev.key == req.key:  # the same request: split_parts would give its parts again
            parts = prev.parts
        else:
            parts = split_parts(free.cluster, req, {p.node: p.gpus for p in prev.parts})
        if view is not None and view.blocked is not None and not view.blocked.keeps(req.jobs, parts,
                                                                                    prev.key == req.key):
            return None
        return parts if free.fits(parts, len(req.jobs)) else None

    def _try(self, plan: Plan, req: Request, free: FreeState, view: View) -> bool:
        """Place ``req`` (its old GPUs if sticky, else ``choose``) and commit; False if it gets nothing."""
        if self.sticky and len(req.jobs) == 1:  # a lone job kept as it is (what the steps below do)
            prev = req.jobs[0].alloc
            if (prev is not None and not prev.group and prev.key == req.key
                    and (view.blocked is None or view.blocked.keeps(req.jobs, prev.parts, True))
                    and free.take_if_fits(prev.parts)):
                plan.add(prev)
                return True
        parts = place_request(self, req, free, view)
        if parts is None:
            return False
        self._commit(plan, req, parts, free)
        return True

    def _commit(self, plan: Plan, req: Request, parts: tuple[Part, ...], free: FreeState) -> None:
        free.take(parts, len(req.jobs))
        for a in self._allocs(req, parts):
            plan.add(a)

    def place(self, requests: Sequence[Request], view: View, preemptive: bool = True,
              tail: TailWalk | None = None) -> Plan:
        """The three phases over ``requests``; phase 3 goes on over ``tail`` (jobs past them)."""
        plan = Plan()
        requests = self.arrange(requests, view, preemptive)
        n = len(requests)
        # phase 1: select by GPU count
        order = list(range(n))
        cap = view.cluster.num_gpus
        selected = [False] * n
        # the requests past the last one selected are never selected: phases 2a and 2b walk up to it
        reach = 0
        for i in order:
            if cap <= 0:
                break
            g = requests[i].gpus
            if g <= cap:
                selected[i] = True
                cap -= g
                reach = i + 1
            elif not self.backfill:
                break
        chosen = order[:reach]
        done = [False] * n
        if self.sticky:
            free = self._sticky_start(requests, chosen, selected, done, plan, view)
        else:
            free = FreeState(view.cluster)
        if view.blocked is not None and view.blocked.held:
            free.take_held(view.blocked.held)  # (work outside the plan: not free all round, so not walked for)
        # phase 2a: sticky keeps selected running requests whose size changed on their GPUs if they fit
        if self.sticky:
            for i in chosen:
                if done[i] or not selected[i] or not requests[i].running:
                    continue
                parts = self.keep_parts(requests[i], free, view)
                if parts is not None:
                    self._commit(plan, requests[i], parts, free)
                    done[i] = True
        # phase 2b: place the rest of the selection in order (from here on resources are only taken)
        refused: set[tuple] = set()  # shapes of new requests refused (policies/incremental.py: try_new)
        for i in chosen:
            if selected[i] and not done[i]:
                done[i] = try_new(self, plan, requests[i], free, view, refused)
                if not done[i] and not self.backfill:
                    break
        # phase 3: backfill leftovers in order
        for i in order if self.backfill else ():
            if free.free_gpus <= 0:
                break
            if not done[i] and requests[i].gpus <= free.free_gpus:
                done[i] = try_new(self, plan, requests[i], free, view, refused)
        if tail is not None and self.backfill:
            tail.backfill(self, plan, free, view, refused)
        plan.free_gpus = free.free_gpus
        return plan


def _all_keyed(jobs: Sequence[Job], key: tuple) -> bool:
    """Every one of ``jobs`` holds an allocation made for ``key`` (identity first, then equality)."""
    for j in jobs:
        a = j.alloc
        if a is None or (a.key is not key and a.key != key):
            return False
    return True


def place_request(policy: PlacePolicy, req: Request, free: FreeState, view: View) -> tuple[Part, ...] | None:
    """One request through a policy's stickiness and ``choose`` (used by sizers that place job by job)."""
    parts = policy.keep_parts(req, free, view) if policy.sticky else None
    return parts if parts is not None else policy.choose_for(req, free, view)
