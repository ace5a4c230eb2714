"""Multi-resource interleaving (Muri, SIGCOMM'22): how fast jobs run when they share GPUs.

A training iteration passes through *stages*, each stressing one resource.  Jobs
whose bottlenecks differ can share one set of GPUs and interleave their stages
so that, at every moment, each resource serves a different job.

Stage profiles
--------------
A profile is a tuple of ``k`` stage times (seconds per iteration), one per
resource, in the order an iteration visits them.  For Muri's traces
(``resource_time_0..2`` columns, milliseconds; the trace reader stores them in
seconds as ``attrs["resource_times"]``) ``k = 3`` and the columns are:

=====  ===================  ================================================
index  resource             evidence in the traces
=====  ===================  ================================================
0      CPU (data loading)   large for the RL jobs (dqn 446 of 490 ms, a2c
                            514 of 517 ms: environment simulation) and the
                            image jobs with big batches (resnet18/shufflenet
                            at batch 128: decoding + augmentation); ~0.5 ms
                            for bert/gpt2, whose token batches need no work
1      GPU (forward/back)   large for bert/gpt2/vgg; 8 ms for dqn
2      network (all-reduce) exactly 0 for every 1-GPU job and growing with
                            the GPU count (bert: 18 ms on 2-4 GPUs, 59 ms on
                            8, 133 ms on 32)
=====  ===================  ================================================

Muri's paper names four resources: storage I/O, CPU, GPU and network, and a
group interleaves up to four jobs, one per resource.  Its profiler measures
data loading (reading samples from storage and preprocessing them on the CPU)
as one stage, ``resource_time_0``; Muri's own simulator lets that stage span
the storage and CPU slots of its 4-resource cycle.  gpuloom does the same: a
profile has a *layout*, the number of consecutive phases (resources) each
stage occupies.  A Muri trace profile (3 stages) has layout ``(2, 1, 1)``:
data loading over storage + CPU, then GPU, then network, a 4-phase cycle
(:data:`MURI_LAYOUT`).  A profile with four measured stages (storage, CPU,
GPU, network) has layout ``(1, 1, 1, 1)``.  ``InterleaveFactor(resources=3)``
keeps the older model in which storage and CPU are one resource (layout
``(1, 1, 1)``, groups of at most 3).

The trace's stage times do not add up to its ``iteration_time``: stages overlap
(a prefetching data loader works while the GPU computes: vgg19 on 1 GPU lists
114 + 80 ms in a 109 ms iteration) or leave time unattributed (framework
overhead: dqn lists 446 + 8 of 490 ms).  :func:`stage_profile` makes a profile
that sums to the iteration time, following "the dominant resource at each
moment counts":

* the *dominant* stage is the longest one;
* unattributed time (iteration − Σ stages > 0) is charged to the dominant stage
  (the job is waiting on its bottleneck; a co-runner cannot use that resource);
* overlapped time (Σ stages − iteration > 0) belongs to the dominant resource,
  so it is removed from the other stages in proportion to their length (and
  from the dominant one only if they cannot absorb it all);
* a stage shorter than ``threshold`` × iteration (default 2 %) counts as zero:
  the resource is not really busy (bert's 0.5 ms of CPU); its time moves to
  the dominant stage.

So a profile always sums to the job's solo iteration time.

Interleaving efficiency
-----------------------
With a layout of spans ``w`` (one per stage) the cycle has ``K = Σ w`` phases
and a group holds at most ``K`` jobs.  A group of ``m <= K`` jobs runs in
lock-step *phases*.  An *ordering* gives
each member a distinct offset ``s_j`` in ``0..k-1``; in phase ``p`` member ``j``
runs its stage on resource ``(p - s_j) mod k``, so no two members ever want the
same resource at once.  A phase lasts as long as its longest stage; one cycle
of ``k`` phases completes one iteration of *every* member::

    T(ordering) = Σ_p  max_j  t_j[(p - s_j) mod k]

A stage spanning two phases (data loading over storage and CPU) only needs the
two phases together to be as long as it: with phase lengths ``d_p``, single-phase
stages require ``d_p >= a_p`` (the longest single-phase stage in phase ``p``) and
two-phase stages ``d_p + d_{p+1} >= b_p``.  The cycle is the least ``Σ d_p``, a
tiny LP solved in closed form: with ``c_p = max(0, b_p - a_p - a_{p+1})`` it is
``Σ a_p`` plus the largest total of ``c`` over edges of the phase ring that share
no phase (a maximum matching on the cycle of phases, LP duality; on a 4-ring,
``max(c_0 + c_2, c_1 + c_3)``).  With every span 1 this is the sum of maxima
above.  Muri's simulator solves the same constraints by an as-soon-as-possible
recurrence over two cycles (``matching.py``, ``calc_iteration_time``); the
steady state is the same where its recurrence converges.

Orderings that differ by a rotation are the same cycle, so the first member is
fixed at offset 0: ``(k-1)!/(k-m)!`` orderings (2 for pairs at k=3, 3 for pairs
and 6 for triples or quadruples at k=4); with ``m < k`` some offsets stay
empty, which can beat every packed ordering.  The group's cycle is its best
ordering's ``T``; *efficiency* = fraction of resource time busy =
``Σ_j Σ_r t_j[r] / (k · T)``.  Every member's iteration time inside the group
is ``T`` (times an optional measured sharing overhead per group size, e.g.
Muri's 1.33/1.5/1.37 for 2/3/4 jobs, :data:`MURI_OVERHEAD`), so its speed is
``solo / T``; ``T >= solo`` always, so sharing never speeds a job up (with
normalised profiles; raw ones, :data:`PROFILE_KINDS`, need not keep to that).

Speed: the hot entry points are :func:`cycle_times` (numpy over a batch of
groups, all orderings at once) and :func:`group_cycle` (one group, cached by
its tuple of profiles; traces have few distinct profiles - Muri's ~50 model x
GPU-count pairs - so the cache hits almost always).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ..core.job import Job, JobError, JobSpec
from ..core.plan import Allocation

#: resource names of the stages in Muri's traces (``resource_time_0..2``)
MURI_RESOURCES = ("cpu", "gpu", "network")
#: phases each of those stages occupies in Muri's 4-resource cycle: data loading
#: spans storage and CPU, then GPU, then network (Muri's paper, Sec. 3; its simulator)
MURI_LAYOUT = (2, 1, 1)
#: resources a group interleaves on by default (storage, CPU, GPU, network)
DEFAULT_RESOURCES = 4
#: stages shorter than this fraction of the iteration count as zero
DEFAULT_THRESHOLD = 0.02
#: how a factor reads stage times: ``normalised`` (:func:`stage_profile`, summing to the iteration time) or
#: ``raw``, the trace's stage times as given, as Muri's simulator interleaves them (its groups' cycles come
#: from them, while a job alone takes its iteration time: a group can then outrun its members alone)
PROFILE_KINDS = ("normalised", "raw")
#: Muri's measured slowdown of a shared iteration, by group size, relative to a job
#: alone: its simulator (``jobs.py``, ``itertime_overhead_list``) charges a job alone
#: 1.015 x its iteration time and a group of 2/3/4 its ideal cycle x 1.33, 1.5,
#: 1.37 over 1.015, i.e. 1.310, 1.478, 1.350.  On by default (``build_model``).
MURI_OVERHEAD: Mapping[int, float] = {2: 1.33 / 1.015, 3: 1.5 / 1.015, 4: 1.37 / 1.015}

Profile = tuple[float, ...]


class ProfileError(JobError):
    """A job whose stage profile is missing or malformed; the message names it."""


# ---------------------------------------------------------------------------
# profiles
def stage_profile(
    resource_times: Sequence[float], iteration_time: float | None = None, threshold: float = DEFAULT_THRESHOLD
) -> Profile:
    """A profile summing to ``iteration_time`` (see the module docstring for the rules)."""
    t = [float(x) for x in resource_times]
    if not t:
        raise ProfileError("a stage profile needs at least one stage")
    if any(not math.isfinite(x) or x < 0 for x in t):
        raise ProfileError(f"stage times must be finite and >= 0, got {t}")
    total = sum(t)
    it = total if iteration_time is None else float(iteration_time)
    if not math.isfinite(it) or it <= 0:
        raise ProfileError(f"iteration time must be > 0, got {iteration_time}")
    if not 0 <= threshold < 1:
        raise ProfileError(f"threshold must be in [0, 1), got {threshold}")
    d = max(range(len(t)), key=lambda i: (t[i], -i))  # dominant stage, lowest index on ties
    diff = it - total
    if diff >= 0:
        t[d] += diff
    else:
        excess = -diff
        others = total - t[d]
        take = min(excess, others)
        if others > 0:
            f = (others - take) / others
            t = [x if i == d else x * f for i, x in enumerate(t)]
        t[d] -= excess - take
    cut = threshold * it
    moved = 0.0
    for i in range(len(t)):
        if i != d and t[i] < cut:
            moved += t[i]
            t[i] = 0.0
    t[d] += moved
    # exact sum: fold rounding residue into the dominant stage
    t[d] += it - sum(t)
    return tuple(t)


def spec_profile(spec: JobSpec, threshold: float = DEFAULT_THRESHOLD) -> Profile | None:
    """The profile of a job from ``attrs["resource_times"]`` (seconds) and its iteration time.

    The iteration time is ``attrs["iteration_time"]``, else ``spec.iter_time``,
    else the sum of the stages.  ``None`` if the job carries no stage times.
    """
    rt = spec.attrs.get("resource_times") if spec.attrs else None
    if rt is None:
        return None
    it = spec.attrs.get("iteration_time", spec.iter_time)
    try:
        return _cached_profile(tuple(float(x) for x in rt), None if it is None else float(it), threshold)
    except (TypeError, ValueError) as e:
        raise ProfileError(f"job {spec.id}: bad stage profile: {e}") from None


def raw_profile(spec: JobSpec) -> Profile | None:
    """The trace's stage times of a job as given (seconds; ``attrs["resource_times"]``), or ``None``."""
    rt = spec.attrs.get("resource_times") if spec.attrs else None
    if rt is None:
        return None
    try:
        t = tuple(float(x) for x in rt)
    except (TypeError, ValueError) as e:
        raise ProfileError(f"job {spec.id}: bad stage profile: {e}") from None
    if not t or any(not math.isfinite(x) or x < 0 for x in t) or not sum(t) > 0:
        raise ProfileError(f"job {spec.id}: raw stage times must be finite, >= 0 and not all 0, got {list(t)}")
    return t


@lru_cache(maxsize=4096)
def _cached_profile(rt: tuple[float, ...], it: float | None, threshold: float) -> Profile:
    return stage_profile(rt, it, threshold)


# ---------------------------------------------------------------------------
# layouts
Layout = tuple[int, ...]


def layout_for(stages: int, resources: int = DEFAULT_RESOURCES) -> Layout:
    """The layout of a ``stages``-stage profile on a ``resources``-phase cycle.

    Equal counts: one phase per stage.  Three stages on four resources: Muri's
    trace layout :data:`MURI_LAYOUT` (data loading over storage and CPU).
    """
    if stages == resources:
        return (1,) * stages
    if stages == 3 and resources == 4:
        return MURI_LAYOUT
    raise ProfileError(f"no layout for {stages}-stage profiles on {resources} resources "
                       "(profiles need as many stages as resources, or Muri's 3 stages on 4)")


def _check_layout(spans: Layout, k: int) -> None:
    if len(spans) != k or any(w not in (1, 2) for w in spans):
        raise ProfileError(f"layout {spans} must give 1 or 2 phases to each of the {k} stages")


@lru_cache(maxsize=64)
def _ring_matchings(K: int) -> np.ndarray:
    """Vertices of the fractional matching polytope of a K-ring of phases: shape (M, K).

    Edge ``p`` joins phases ``p`` and ``p+1``.  Rows are the integral matchings
    and, for odd K, the all-1/2 vector; max over rows of ``c @ row`` is the LP value.
    """
    rows: list[Sequence[float]] = []
    for mask in range(1 << K):
        e = [(mask >> p) & 1 for p in range(K)]
        if K > 1 and any(e[p] and e[(p + 1) % K] for p in range(K)) and K != 2:
            continue
        if K == 2 and e[0] and e[1]:
            continue
        rows.append(e)
    if K % 2 == 1 and K > 1:
        rows.append([0.5] * K)
    out = np.array(rows, dtype=np.float64)
    out.setflags(write=False)
    return out


# ---------------------------------------------------------------------------
# orderings and cycle times
@lru_cache(maxsize=64)
def orderings(m: int, k: int) -> np.ndarray:
    """All offset assignments of ``m`` members on a ``k``-cycle, first member at 0: shape (O, m)."""
    if not 1 <= m <= k:
        raise ValueError(f"a group of {m} jobs cannot interleave on {k} resources")
    rows = [(0, *rest) for rest in itertools.permutations(range(1, k), m - 1)]
    out = np.array(rows, dtype=np.int64).reshape(len(rows), m)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=64)
def _gather_index(m: int, k: int) -> np.ndarray:
    # idx[o, j, p] = (p - s_oj) mod k : the resource member j uses in phase p
    offs = orderings(m, k)
    return (np.arange(k)[None, None, :] - offs[:, :, None]) % k


@lru_cache(maxsize=64)
def _span_index(m: int, spans: Layout) -> tuple[np.ndarray, np.ndarray]:
    """For a layout: idx[o, j, p] = stage member j *starts* in phase p (k = none), and its span there."""
    K = sum(spans)
    k = len(spans)
    start = np.full(K, k, dtype=np.int64)
    width = np.zeros(K, dtype=np.int64)
    q = 0
    for r, w in enumerate(spans):
        start[q], width[q] = r, w
        q += w
    rel = _gather_index(m, K)  # relative phase of member j in phase p
    return start[rel], width[rel]


def cycle_times(profiles: np.ndarray, spans: Layout | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best cycle time of each group in a batch.

    ``profiles``: shape (E, m, k) - E groups of m members with k stages;
    ``spans``: the layout (phases per stage; default one each).  Returns
    ``(T, best)``: the minimum cycle time over all orderings (E,) and the index
    of the best ordering into :func:`orderings` ``(m, K)`` (E,), ``K = Σ spans``.
    """
    P = np.asarray(profiles, dtype=np.float64)
    if P.ndim != 3:
        raise ValueError(f"profiles must have shape (groups, members, stages), got {P.shape}")
    E, m, k = P.shape
    if spans is None or all(w == 1 for w in spans):
        if spans is not None:
            _check_layout(tuple(spans), k)
        idx = _gather_index(m, k)  # (O, m, k)
        # G[e, o, j, p] = P[e, j, idx[o, j, p]]
        G = P[:, np.arange(m)[None, :, None], idx]
        T = G.max(axis=2).sum(axis=2)  # (E, O)
    else:
        spans = tuple(int(w) for w in spans)
        _check_layout(spans, k)
        K = sum(spans)
        if m > K:
            raise ValueError(f"a group of {m} jobs cannot interleave on {K} resources")
        sidx, width = _span_index(m, spans)  # (O, m, K)
        Ppad = np.concatenate([P, np.zeros((E, m, 1))], axis=2)
        G = Ppad[:, np.arange(m)[None, :, None], sidx]  # (E, O, m, K): stage starting at p
        a = np.where(width == 1, G, 0.0).max(axis=2)  # (E, O, K)
        b = np.where(width == 2, G, 0.0).max(axis=2)
        c = np.maximum(b - a - np.roll(a, -1, axis=2), 0.0)
        extra = (c @ _ring_matchings(K).T).max(axis=2)
        T = a.sum(axis=2) + extra
    best = T.argmin(axis=1)
    return T[np.arange(E), best], best


def cycle_time_of(profiles: Sequence[Profile], offsets: Sequence[int]) -> float:
    """Cycle time of one explicit ordering (member ``j`` at offset ``offsets[j]``; one phase per stage)."""
    k = len(profiles[0])
    if len(set(o % k for o in offsets)) != len(offsets):
        raise ValueError("offsets must be distinct modulo the number of resources")
    return float(sum(max(p[(ph - s) % k] for p, s in zip(profiles, offsets, strict=True)) for ph in range(k)))


@lru_cache(maxsize=65536)
def _group_cycle_sorted(profiles: tuple[Profile, ...], spans: Layout | None = None) -> float:
    if len(profiles) == 1:
        return float(sum(profiles[0]))
    T, _ = cycle_times(np.array([profiles]), spans)
    return float(T[0])


def group_cycle(profiles: Sequence[Profile], spans: Layout | None = None) -> float:
    """The cycle time of a group at its best ordering (cached; member order is irrelevant).

    ``spans``: the profiles' layout (default one phase per stage).
    """
    if not profiles:
        raise ValueError("empty group")
    k = len(profiles[0])
    if any(len(p) != k for p in profiles):
        raise ProfileError("all members of a group need profiles over the same resources")
    K = k if spans is None else sum(spans)
    if len(profiles) > K:
        raise ProfileError(f"a group of {len(profiles)} jobs cannot interleave on {K} resources")
    sp = None if spans is None or all(w == 1 for w in spans) else tuple(spans)
    return _group_cycle_sorted(tuple(sorted(tuple(p) for p in profiles)), sp)


def best_ordering(profiles: Sequence[Profile], spans: Layout | None = None) -> tuple[float, tuple[int, ...]]:
    """``(T, offsets)`` of the best ordering, offsets in the members' given order."""
    K = len(profiles[0]) if spans is None else sum(spans)
    T, best = cycle_times(np.array([list(profiles)]), spans)
    return float(T[0]), tuple(int(x) for x in orderings(len(profiles), K)[int(best[0])])


def efficiency(profiles: Sequence[Profile], spans: Layout | None = None) -> float:
    """Fraction of resource time busy at the best ordering: Σ stage times / (K · T)."""
    K = len(profiles[0]) if spans is None else sum(spans)
    return float(sum(sum(p) for p in profiles) / (K * group_cycle(profiles, spans)))


def group_iteration_times(profiles: Sequence[Profile], overhead: Mapping[int, float] | None = None,
                          spans: Layout | None = None) -> list[float]:
    """Each member's iteration time inside the group (the same cycle for all)."""
    m = len(profiles)
    T = group_cycle(profiles, spans) * (overhead or {}).get(m, 1.0) if m > 1 else float(sum(profiles[0]))
    return [max(T, float(sum(p))) for p in profiles]


def parse_overhead(value: Any) -> dict[int, float] | None:
    """Sharing overhead per group size from an option: ``None``/``"none"``, ``"muri"``
    (:data:`MURI_OVERHEAD`), one factor for every size, a list for sizes 2, 3, ...,
    or a mapping size → factor."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, str) and value.strip().lower() == "muri":
        return dict(MURI_OVERHEAD)
    try:
        if isinstance(value, Mapping):
            out = {int(k): float(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            out = {m: float(v) for m, v in enumerate(value, start=2)}
        else:
            f = float(value)
            out = dict.fromkeys(range(2, 9), f)
    except (TypeError, ValueError):
        raise ValueError(f"interleave overhead {value!r}: expected muri, a number, a list or size=factor pairs") from None
    return out


# ---------------------------------------------------------------------------
class InterleaveFactor:
    """Throughput factor ``"interleave"``: a job's speed while it shares GPUs with its group.

    speed = solo iteration time / iteration time inside the group, where the
    group is ``alloc.group`` (the co-runners' ids).  The factor needs the
    co-runners' specs, so it holds a *lookup* from job id to a
    :class:`~gpuloom.core.job.Job` or :class:`~gpuloom.core.job.JobSpec`:
    pass it at construction, or let the consumer :meth:`bind` one (the
    simulator binds its id → Job table; a runtime binds its job store).  A job
    alone returns 1.0 without looking anything up, so the factor costs nothing
    to runs without groups.

    ``overhead`` multiplies the cycle of a group of size m by ``overhead[m]``
    (measured interference of sharing; :data:`MURI_OVERHEAD` are Muri's
    values); ``threshold`` is the stage threshold of :func:`stage_profile`;
    ``resources`` is the cycle a group interleaves on (4: storage, CPU, GPU,
    network, Muri's model; a 3-stage trace profile then has layout
    :data:`MURI_LAYOUT`; 3: storage and CPU as one resource).  ``profiles``
    (:data:`PROFILE_KINDS`): ``raw`` takes the stage times as given (no
    threshold), a job's own time is its iteration time (:meth:`solo_time`) and
    a member's speed is that over the group's iteration time, not capped at 1.
    """

    name = "interleave"

    def __init__(
        self,
        jobs: Mapping[str, Job | JobSpec] | Callable[[str], Job | JobSpec] | None = None,
        threshold: float = DEFAULT_THRESHOLD,
        overhead: Mapping[int, float] | None = None,
        resources: int = DEFAULT_RESOURCES,
        profiles: str = "normalised",
    ) -> None:
        if profiles not in PROFILE_KINDS:
            raise ValueError(f"interleave profiles must be one of {', '.join(PROFILE_KINDS)}, got {profiles!r}")
        self.raw = profiles == "raw"
        if int(resources) < 1:
            raise ValueError(f"interleave resources must be >= 1, got {resources}")
        self.resources = int(resources)
        if not 0 <= threshold < 1:
            raise ValueError(f"interleave threshold must be in [0, 1), got {threshold}")
        for m, f in (overhead or {}).items():
            if int(m) < 2 or not f >= 1.0:
                raise ValueError(f"interleave overhead for group size {m} must be >= 1 (size >= 2), got {f}")
        self.threshold = float(threshold)
        self.overhead = {int(m): float(f) for m, f in (overhead or {}).items()}
        self._lookup: Callable[[str], Any] | None = None
        self._profiles: dict[str, tuple[JobSpec, Profile | None]] = {}  # by id, checked by identity
        # group_time by the members' profiles as __call__ lists them (a job, then its co-runners):
        # a plan that regroups or moves many jobs asks for the same few groups again and again
        self._times: dict[tuple[Profile, ...], float] = {}
        self._speeds: dict[tuple[Profile, ...], float] = {}  # __call__'s answer by the same key (not raw)
        if jobs is not None:
            self.bind(jobs)

    def bind(self, jobs: Mapping[str, Job | JobSpec] | Callable[[str], Job | JobSpec]) -> None:
        """Set where co-runners are looked up (id → Job or JobSpec)."""
        self._lookup = jobs.__getitem__ if isinstance(jobs, Mapping) else jobs

    def overhead_for(self, m: int) -> float:
        return self.overhead.get(m, 1.0) if m > 1 else 1.0

    def layout(self, stages: int) -> Layout:
        """Phases per stage for ``stages``-stage profiles on this factor's cycle."""
        if stages != self.resources and not (stages == 3 and self.resources == 4):
            return (1,) * stages  # profiles of another length: one phase per stage
        return layout_for(stages, self.resources)

    def cycle_length(self, stages: int) -> int:
        """Most jobs a group of ``stages``-stage profiles can hold."""
        return sum(self.layout(stages))

    def profile(self, job: Job | JobSpec) -> Profile | None:
        spec = job.spec if isinstance(job, Job) else job
        hit = self._profiles.get(spec.id)
        if hit is not None and hit[0] is spec:
            return hit[1]
        p = raw_profile(spec) if self.raw else spec_profile(spec, self.threshold)
        if len(self._profiles) > 1_000_000:
            self._profiles.clear()
        self._profiles[spec.id] = (spec, p)
        return p

    def profiles_gpus(self, jobs: Sequence[Job]) -> tuple[list[Profile | None], list[int]]:
        """:meth:`profile` of each of ``jobs``, in order, and each one's GPU count, read in the same pass."""
        cache, profile = self._profiles, self.profile  # (a hit read here, as profile() reads it)
        out: list[Profile | None] = []
        gpus: list[int] = []
        for j in jobs:
            spec = j.spec
            hit = cache.get(spec.id)
            out.append(hit[1] if hit is not None and hit[0] is spec else profile(j))
            gpus.append(spec.gpus)
        return out, gpus

    def solo_time(self, job: Job | JobSpec) -> float:
        """A job's iteration time alone: its profile's sum, or with raw profiles its iteration time
        (``attrs["iteration_time"]``, else ``iter_time``, else the sum of its stages)."""
        prof = self._require(job)
        if not self.raw:
            return float(sum(prof))
        spec = job.spec if isinstance(job, Job) else job
        it = spec.attrs.get("iteration_time", spec.iter_time) if spec.attrs else spec.iter_time
        return float(sum(prof)) if it is None else float(it)

    def _require(self, job: Job | JobSpec) -> Profile:
        p = self.profile(job)
        if p is None:
            spec = job.spec if isinstance(job, Job) else job
            raise ProfileError(f"job {spec.id}: shares GPUs but has no stage profile (attrs['resource_times'])")
        return p

    def group_time(self, profiles: Sequence[Profile]) -> float:
        """Iteration time of every member of a group with these profiles (overhead included)."""
        if len(profiles) == 1:
            return float(sum(profiles[0]))
        return group_cycle(profiles, self.layout(len(profiles[0]))) * self.overhead_for(len(profiles))

    def __call__(self, job: Job, alloc: Allocation) -> float:
        group = alloc.group
        if not group:
            return 1.0
        lookup = self._lookup
        if lookup is None:
            raise ProfileError(f"job {job.id}: interleave factor has no job lookup bound (call bind())")
        # each member's profile read from the cache here, as profile() reads it (the driver rates
        # every member of every group it starts, moves or regroups: the calls were half the cost),
        # the job's own first, then each co-runner's as it is looked up
        cache = self._profiles
        spec = job.spec
        hit = cache.get(spec.id)
        p = hit[1] if hit is not None and hit[0] is spec else None
        profs: list[Profile] = [self._require(job) if p is None else p]
        for oid in group:
            try:
                m = lookup(oid)
            except KeyError:
                raise ProfileError(f"job {job.id}: co-runner {oid!r} is unknown to the interleave factor") from None
            spec = m.spec if isinstance(m, Job) else m
            hit = cache.get(spec.id)
            p = hit[1] if hit is not None and hit[0] is spec else None
            profs.append(self._require(m) if p is None else p)
        key = tuple(profs)
        if not self.raw:  # (the speed is a function of the key, the job's own profile first: kept whole)
            v = self._speeds.get(key)
            if v is None:
                v = self._speeds[key] = min(1.0, float(sum(profs[0])) / self._time(key))
            return v
        # (Muri's simulator: the cycle of the raw stages against the iteration time, uncapped)
        return self.solo_time(job) / self._time(key)

    def _time(self, key: tuple[Profile, ...]) -> float:
        """:meth:`group_time` of ``key``, kept."""
        t = self._times.get(key)
        if t is None:
            t = self.group_time(key)
            if len(self._times) > 100_000:
                self._times.clear()
                self._speeds.clear()
            self._times[key] = t
        return t
