"""Named simulator configurations, and running several of them on one trace.

(About 590 lines on purpose: the configuration's two textual forms and the one runner of
configurations, in a process pool or on Ray, share :class:`RunConfig`'s fields and change
together; the runner starts at :class:`RunProgress`.)

A :class:`RunConfig` is everything that distinguishes one simulator run from
another on the same cluster and trace: the four pipeline stages by name,
preemption, policy parameters, the throughput model's locality penalty and the
:class:`~gpuloom.sim.engine.SimConfig` fields.  It is plain data, so it travels
to worker processes and into ``summary.json`` as is.

Two textual forms, both parsed against a *base* configuration (the CLI's
global options), so a config only states how it differs:

* a string ``"order=srtf,place=packed-sticky,P.v_bound=0.5,round_len=360"``:
  comma-separated ``key=value``; ``P.name`` (or ``params.name``) is a policy
  parameter; values are read as TOML values (``360``, ``0.5``, ``true``,
  ``inf``, ``[3600, 7200]``, ``"text"``) and fall back to the bare text;
* a TOML file: top-level keys (and a ``[params]`` / ``[P]`` table) apply to
  every run, each ``[[run]]`` table is one configuration::

      round_len = 360
      [[run]]
      label = "fifo"
      order = "fifo"
      [[run]]
      order = "srtf"
      P.v_bound = 0.5          # same as [run.params] v_bound = 0.5

Unknown keys, unknown policy names and parameters no chosen stage accepts are
errors naming the key and the configuration.

:func:`run_many` runs configurations in parallel processes
(``ProcessPoolExecutor``).  The cluster and the job specs are handed to each
worker once, by the pool's initializer (inherited, not pickled, under the
default ``fork`` start method), and each task sends only its ``RunConfig``;
the worker rebuilds the scheduler from names.  Job-level progress comes back
through a queue.  Results do not depend on the number of processes: each run
is deterministic for its seed.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import queue as _queue
import time as _time
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..core.lifecycle import LifecycleTimes
from ..core.parse import parse_bool
from ..core.queues import QueueTree
from ..core.reservations import Reservation
from ..driver import Stack
from ..perf.assembly import ModelOptionError, trace_options
from ..perf.model import DEFAULT_LOCALITY_PENALTY, ThroughputModel
from ..policies.base import STAGE_DEFAULTS, PolicyError
from ..policies.check import check_names
from ..scheduler import Scheduler
from . import queue_report
from .engine import SimConfig, Simulator
from .metrics import RunResult

ModelBuilder = Callable[[Cluster], ThroughputModel]
#: ``progress(label, done, total)``: ``done`` of ``total`` jobs of run ``label`` have finished.
Progress = Callable[[str, int, int], None]


class ConfigError(PolicyError):
    """A run configuration that cannot be used; the message names the key and the configuration.

    A :class:`~gpuloom.policies.base.PolicyError`, so whatever reports bad policy
    names and parameters to a user reports these too."""


_SIM_FIELDS = {f.name: f for f in dataclasses.fields(SimConfig)}
_ALIASES = {"round": "round_len", "P": "params"}
_TOP_KEYS = ("label", *STAGE_DEFAULTS, "preemptive", "locality_penalty", "params")


@dataclass(slots=True)
class RunConfig:
    """One simulator configuration.  ``sim`` holds the event-loop settings."""

    label: str = ""
    order: str = STAGE_DEFAULTS["order"]
    group: str = STAGE_DEFAULTS["group"]
    size: str = STAGE_DEFAULTS["size"]
    place: str = STAGE_DEFAULTS["place"]
    preemptive: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    locality_penalty: float = DEFAULT_LOCALITY_PENALTY
    sim: SimConfig = field(default_factory=SimConfig)
    queue: str = "none"  # the queue stage (policies/queues.py)
    reserve_depth: int = 0  # reservations for this many waiting jobs (policies/backfill.py); 0: none
    reservations: list[Reservation] = field(default_factory=list)  # an advance reservation calendar

    @property
    def name(self) -> str:
        """The label, or one made from what differs from the defaults (see :func:`auto_label`)."""
        return self.label or auto_label(self)

    @property
    def stack(self) -> Stack:
        """The policy stack this configuration runs (the route ``simulate`` and ``serve`` share)."""
        return Stack(self.order, self.group, self.size, self.place, self.preemptive, dict(self.params),
                     {"locality_penalty": self.locality_penalty}, self.queue, self.reserve_depth,
                     list(self.reservations))

    def scheduler(self, where: str = "", specs: Sequence[JobSpec] = ()) -> Scheduler:
        try:
            check_names(self.stack.names)  # unknown names: "did you mean" and the accepted names
            return self.stack.scheduler(specs)
        except PolicyError as e:
            raise ConfigError(f"{where or f'config {self.name!r}'}: {e}") from None

    def validate(self, where: str = "") -> RunConfig:
        """Check policy names and parameters now (building the scheduler is cheap)."""
        self.scheduler(where)
        return self

    def model(self, cluster: Cluster, specs: Sequence[JobSpec] = ()) -> ThroughputModel:
        """The throughput model for this configuration and trace (:func:`~gpuloom.perf.assembly.build_model`)."""
        try:
            return self.stack.model(cluster, self.sim.seed, specs)
        except ModelOptionError as e:
            raise ConfigError(f"config {self.name!r}: {e}") from None

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _TOP_KEYS}
        d["label"] = self.name
        d["params"] = dict(self.params)
        d.update(dataclasses.asdict(self.sim))
        return d


def auto_label(rc: RunConfig, ref: RunConfig | None = None) -> str:
    """``order`` then every other setting that differs from ``ref``, joined by ``/``."""
    ref = ref or RunConfig()
    parts = [rc.order]
    for stage in ("group", "size", "place", "queue"):
        v = getattr(rc, stage)
        if v != getattr(ref, stage):
            parts.append(v)
    if rc.preemptive != ref.preemptive:
        parts.append("preemptive" if rc.preemptive else "non-preemptive")
    parts += [f"{k}={_show(v)}" for k, v in sorted(rc.params.items()) if ref.params.get(k, _MISSING) != v]
    if rc.locality_penalty != ref.locality_penalty:
        parts.append(f"locality_penalty={_show(rc.locality_penalty)}")
    if rc.reserve_depth != ref.reserve_depth:
        parts.append(f"reserve_depth={rc.reserve_depth}")
    for f in _SIM_FIELDS:
        v = getattr(rc.sim, f)
        if v != getattr(ref.sim, f):
            parts.append(f"{f}={_show(v)}")
    return "/".join(parts)


_MISSING = object()


def _show(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return "{" + ",".join(f"{f.name}={_show(getattr(v, f.name))}" for f in dataclasses.fields(v)) + "}"
    return str(v)


# -- parsing -----------------------------------------------------------------
def _value(text: str) -> Any:
    """A TOML value (number, bool, inf, array, quoted string), else the bare text."""
    text = text.strip()
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _split(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    """Make ``value`` the type of ``default`` (int → float allowed; nothing else converts silently)."""
    if isinstance(default, bool):
        try:
            return parse_bool(value, f"{where}: {key}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if isinstance(default, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if isinstance(default, str):
        if isinstance(value, str) and value:
            return value
        raise ConfigError(f"{where}: {key} must be a non-empty name, got {value!r}")
    return value


def _lifecycle(value: Any, where: str) -> LifecycleTimes | None:
    """``lifecycle = true`` (default times), ``false``, or a table ``{launch = 20, checkpoint = 5, ...}``."""
    if isinstance(value, LifecycleTimes) or value is None:
        return value
    if isinstance(value, bool):
        return LifecycleTimes() if value else None
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(LifecycleTimes)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"{where}: lifecycle: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return LifecycleTimes(**value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
    raise ConfigError(f"{where}: lifecycle must be true, false or a table of times, got {value!r}")


def apply(base: RunConfig, items: Mapping[str, Any], where: str) -> RunConfig:
    """A copy of ``base`` with ``items`` (already-typed or textual values) applied.

    Keys: ``label``, ``order``, ``group``, ``size``, ``place``, ``queue``, ``preemptive``,
    ``locality_penalty``, ``params`` (a table), ``P.name`` / ``params.name``,
    ``round`` (= ``round_len``) and every :class:`SimConfig` field.
    """
    rc = dataclasses.replace(base, params=dict(base.params), sim=dataclasses.replace(base.sim))
    sim_updates: dict[str, Any] = {}
    for raw_key, value in items.items():
        key = _ALIASES.get(raw_key, raw_key)
        head, dot, sub = key.partition(".")
        head = _ALIASES.get(head, head)
        if dot:
            if head != "params" or not sub:
                raise ConfigError(f"{where}: unknown key {raw_key!r} (policy parameters are P.name=value)")
            rc.params[sub] = value
        elif key == "params":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: params must be a table of name = value, got {value!r}")
            rc.params.update(value)
        elif key == "lifecycle":
            sim_updates[key] = _lifecycle(value, where)
        elif key in _SIM_FIELDS:
            sim_updates[key] = _coerce(key, value, _SIM_FIELDS[key].default, where)
        elif key in _TOP_KEYS:
            rc_default = getattr(RunConfig(), key)
            setattr(rc, key, _coerce(key, value, rc_default, where))
        else:
            known = ", ".join([*_TOP_KEYS, "P.<name>", "round", *_SIM_FIELDS])
            raise ConfigError(f"{where}: unknown key {raw_key!r}; known keys: {known}")
    if sim_updates:
        try:
            rc.sim = dataclasses.replace(rc.sim, **sim_updates)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if rc.locality_penalty < 1.0 or not math.isfinite(rc.locality_penalty):
        raise ConfigError(f"{where}: locality_penalty must be a finite number >= 1, got {rc.locality_penalty}")
    return rc


def parse_run_config(text: str, base: RunConfig | None = None) -> RunConfig:
    """Parse ``"order=srtf,place=packed-sticky,P.v_bound=0.5"`` on top of ``base``.

    A bare word with no ``=`` is taken as the order (``-c srtf``).
    """
    where = f"config {text!r}"
    items: dict[str, Any] = {}
    parts = _split(text)
    if not parts:
        raise ConfigError(f"{where}: empty configuration")
    for i, part in enumerate(parts):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq:
            if i == 0 and key:
                items["order"] = key
                continue
            raise ConfigError(f"{where}: {part!r} is not key=value")
        if not key:
            raise ConfigError(f"{where}: {part!r} has no key")
        if key in items:
            raise ConfigError(f"{where}: key {key!r} given twice")
        items[key] = _value(val)
    base = base or RunConfig()
    rc = apply(base, items, where)
    if "label" not in items:
        rc.label = auto_label(rc, base)
    return rc.validate(where)


def load_run_configs(path: str | Path, base: RunConfig | None = None) -> list[RunConfig]:
    """Read a TOML file of ``[[run]]`` tables (top-level keys apply to all runs)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    runs = data.pop("run", None)
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ConfigError(f"{path}: expected one or more [[run]] tables")
    if "label" in data:
        raise ConfigError(f"{path}: top level: label belongs in each [[run]]")
    common = apply(base or RunConfig(), data, f"{path}: top level")
    out = []
    for i, r in enumerate(runs):
        where = f"{path}: run {i + 1}" + (f" ({r['label']!r})" if "label" in r else "")
        rc = apply(common, r, where)
        if "label" not in r:
            rc.label = auto_label(rc, common)
        out.append(rc.validate(where))
    return out


# -- running -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunProgress:
    """One progress report: run ``label`` (with ``seed``) has finished ``done`` of its ``total`` jobs,
    its simulated clock reads ``now``; ``finished`` once the run is over."""

    label: str
    seed: int
    done: int
    total: int
    now: float
    finished: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.label, self.seed


#: ``on_progress(RunProgress)``
OnProgress = Callable[[RunProgress], None]


def run_config(
    rc: RunConfig,
    cluster: Cluster,
    specs: Sequence[JobSpec],
    model_builder: ModelBuilder | None = None,
    progress: Callable[[int, int], None] | None = None,
    tick: Callable[[int, int, float], None] | None = None,
    queues: QueueTree | None = None,
    keep: list[Any] | None = None,
    impossible: Mapping[str, str] | None = None,
) -> RunResult:
    """Run one configuration; the result's ``config`` carries the label and parameters.

    ``progress(done, total)`` and ``tick(done, total, simulated time)`` are called as jobs finish.
    Per-queue data (:mod:`.queue_report`) are recorded into ``result.extra["queues"]``
    when the configuration has a queue stage, or against ``queues`` when given.  ``keep``, a list, is given
    the simulator (a process about to end can hold it rather than free it).  ``impossible``: what
    :func:`~gpuloom.core.fit.impossible_jobs` answered for ``specs`` on ``cluster``, where the caller asked it
    (the simulator asks it otherwise).
    """
    sched = rc.scheduler(specs=specs)  # with the trace's own policy parameters (a PAL trace: a strict queue)
    model = model_builder(cluster) if model_builder is not None else rc.model(cluster, specs)
    try:
        sched.bind(model)  # the factors a stage requires, as the service binds them
    except PolicyError as e:
        raise ConfigError(f"config {rc.name!r}: {e}") from None
    recorder = queue_report.attach(sched, queues)
    sim = Simulator(cluster, specs, sched, model, rc.sim, observers=[recorder] if recorder is not None else (),
                    impossible=impossible)
    if keep is not None:
        keep.append(sim)
    cb = None
    if progress is not None or tick is not None:
        def cb(done: int, total: int) -> None:
            if progress is not None:
                progress(done, total)
            if tick is not None:
                tick(done, total, sim.now)
    result = sim.run(cb)
    if recorder is not None:
        result.extra["queues"] = recorder.finish(sim)
    result.config = {"label": rc.name, **result.config, "params": dict(rc.params),
                     "locality_penalty": rc.locality_penalty}
    if trace_options(specs):  # what the trace's source brought (given options still win)
        result.config["trace_options"] = trace_options(specs)
    return result


# worker-process state, set once per worker by the pool initializer
_W: dict[str, Any] = {}

#: seconds between progress messages a worker sends (its last one is always sent)
WORKER_REPORT_INTERVAL = 0.25


def _init_worker(cluster: Cluster, workloads: Mapping[Any, Sequence[JobSpec]], model_builder: ModelBuilder | None,
                 q: Any, queues: QueueTree | None = None) -> None:
    _W.update(cluster=cluster, workloads=workloads, model_builder=model_builder, queue=q, queues=queues)


def _work(task: tuple[str, int, RunConfig, Any]) -> RunResult:
    label, seed, rc, wkey = task
    q = _W["queue"]
    last = [0.0]

    def tick(done: int, total: int, now: float) -> None:
        t = _time.monotonic()
        if t - last[0] >= WORKER_REPORT_INTERVAL or done >= total:
            last[0] = t
            q.put(RunProgress(label, seed, done, total, now))

    return run_config(rc, _W["cluster"], _W["workloads"][wkey], _W["model_builder"], None,
                      tick if q is not None else None, _W.get("queues"))


def unique_labels(configs: Sequence[RunConfig]) -> list[str]:
    labels = [rc.name for rc in configs]
    dups = sorted(x for x, n in Counter(labels).items() if n > 1)
    if dups:
        raise ConfigError(f"two configurations share the label(s) {', '.join(map(repr, dups))}; give each a label=")
    return labels


def _execute(
    tasks: Sequence[tuple[str, int, RunConfig, Any]],
    cluster: Cluster,
    workloads: Mapping[Any, Sequence[JobSpec]],
    processes: int | None,
    on_progress: OnProgress | None,
    model_builder: ModelBuilder | None,
    poll: Callable[[], None] | None = None,
    queues: QueueTree | None = None,
    ray: bool = False,
) -> list[RunResult]:
    """Run ``(label, seed, config, workload key)`` tasks; results in task order.  ``ray``: as Ray
    tasks on the cluster this process is connected to (:mod:`.ray_sweep`), not in a process pool."""
    if not tasks:
        return []
    if ray:
        from .ray_sweep import execute_on_ray

        return execute_on_ray(tasks, cluster, workloads, on_progress, model_builder, poll, queues)
    n = processes if processes is not None else min(len(tasks), os.cpu_count() or 1)
    if n < 1:
        raise ConfigError(f"processes must be >= 1, got {n}")
    if n == 1 or len(tasks) == 1:
        out = []
        for label, seed, rc, wkey in tasks:
            tick = None
            if on_progress is not None:
                def tick(d: int, t: int, now: float, _l: str = label, _s: int = seed) -> None:
                    on_progress(RunProgress(_l, _s, d, t, now))
            r = run_config(rc, cluster, workloads[wkey], model_builder, None, tick, queues)
            if on_progress is not None:
                on_progress(RunProgress(label, seed, len(r.finished), len(r.jobs), r.end_time, True))
            out.append(r)
        return out
    ctx = mp.get_context()
    q = ctx.Queue() if on_progress is not None else None
    results: dict[int, RunResult] = {}
    last: dict[tuple[str, int], int] = {}
    ended: set[tuple[str, int]] = set()

    def forward(p: RunProgress) -> None:
        # updates from workers arrive late and out of order: forward only forward progress
        if on_progress is None or p.key in ended or p.done < last.get(p.key, -1):
            return
        last[p.key] = p.done
        if p.finished:
            ended.add(p.key)
        on_progress(p)

    with ProcessPoolExecutor(min(n, len(tasks)), mp_context=ctx, initializer=_init_worker,
                             initargs=(cluster, dict(workloads), model_builder, q, queues)) as pool:
        futures: dict[Future[RunResult], int] = {pool.submit(_work, t): i for i, t in enumerate(tasks)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(q, forward)
            for f in done:
                i = futures[f]
                r = results[i] = f.result()
                label, seed, _, _ = tasks[i]
                # a worker's last queued update may still be in flight: report the end here
                forward(RunProgress(label, seed, len(r.finished), len(r.jobs), r.end_time, True))
            if poll is not None:
                poll()
        _drain(q, forward)
    return [results[i] for i in range(len(tasks))]


def run_many(
    configs: Sequence[RunConfig],
    cluster: Cluster,
    specs: Sequence[JobSpec],
    processes: int | None = None,
    progress: Progress | None = None,
    model_builder: ModelBuilder | None = None,
    on_progress: OnProgress | None = None,
    poll: Callable[[], None] | None = None,
    queues: QueueTree | None = None,
    ray: bool = False,
) -> dict[str, RunResult]:
    """Run every configuration on the same cluster and trace; results keyed by label, in input order.

    ``processes``: worker processes (default: one per configuration, at most
    the CPU count); 1 runs everything in this process.  ``progress(label, done,
    total)`` or ``on_progress(RunProgress)`` hear of finished jobs;
    ``poll()`` is called a few times a second while workers run.  ``queues``: a
    queue tree every run is measured against (:func:`run_config`).  ``ray``: one
    Ray task per configuration instead (:mod:`.ray_sweep`; same results).
    """
    labels = unique_labels(configs)
    for rc in configs:
        rc.validate()
    cb = on_progress
    if progress is not None:
        def cb(p: RunProgress) -> None:
            progress(p.label, p.done, p.total)
            if on_progress is not None:
                on_progress(p)
    tasks = [(lb, rc.sim.seed, rc, 0) for lb, rc in zip(labels, configs, strict=True)]
    results = _execute(tasks, cluster, {0: specs}, processes, cb, model_builder, poll, queues, ray)
    return dict(zip(labels, results, strict=True))


def run_seeds(
    configs: Sequence[RunConfig],
    cluster: Cluster,
    seeds: Sequence[int],
    workload: Callable[[int], Sequence[JobSpec]] | Sequence[JobSpec],
    processes: int | None = None,
    on_progress: OnProgress | None = None,
    model_builder: ModelBuilder | None = None,
    poll: Callable[[], None] | None = None,
    queues: QueueTree | None = None,
    ray: bool = False,
) -> dict[str, list[RunResult]]:
    """Every configuration once per seed: ``{label: [result per seed]}``.

    The seed drives everything random in a run: ``SimConfig.seed`` (random
    placement and other random policies), generated model data (PM-scores
    without a ``variability_seed``) and, when ``workload`` is a function of the
    seed, the workload itself (``builtin_workload(seed)``, ``generate(...,
    seed=seed)``).  A fixed ``workload`` (a trace) is shared by every seed.
    """
    labels = unique_labels(configs)
    for rc in configs:
        rc.validate()
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ConfigError(f"seeds must be distinct and at least one, got {list(seeds)}")
    if callable(workload):
        workloads = {s: workload(s) for s in seeds}
    else:
        workloads = {s: workload for s in seeds}
    tasks = [(lb, s, dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, seed=s)), s)
             for lb, rc in zip(labels, configs, strict=True) for s in seeds]
    results = _execute(tasks, cluster, workloads, processes, on_progress, model_builder, poll, queues, ray)
    out: dict[str, list[RunResult]] = {lb: [] for lb in labels}
    for (lb, *_), r in zip(tasks, results, strict=True):
        out[lb].append(r)
    return out


def _drain(q: Any, forward: Callable[[RunProgress], None]) -> None:
    if q is None:
        return
    while True:
        try:
            p = q.get_nowait()
        except _queue.Empty:
            return
        forward(p)
