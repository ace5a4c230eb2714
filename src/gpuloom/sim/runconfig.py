"""Named simulator configurations, and running several of them on one trace.

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
from ..driver import Stack
from ..perf.assembly import ModelOptionError
from ..perf.model import DEFAULT_LOCALITY_PENALTY, ThroughputModel
from ..policies.base import PolicyError
from ..scheduler import Scheduler
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
_STAGE_DEFAULTS = {"order": "fifo", "group": "none", "size": "proportional", "place": "packed-sticky"}
_ALIASES = {"round": "round_len", "P": "params"}
_TOP_KEYS = ("label", *_STAGE_DEFAULTS, "preemptive", "locality_penalty", "params")


@dataclass(slots=True)
class RunConfig:
    """One simulator configuration.  ``sim`` holds the event-loop settings."""

    label: str = ""
    order: str = "fifo"
    group: str = "none"
    size: str = "proportional"
    place: str = "packed-sticky"
    preemptive: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    locality_penalty: float = DEFAULT_LOCALITY_PENALTY
    sim: SimConfig = field(default_factory=SimConfig)

    @property
    def name(self) -> str:
        """The label, or one made from what differs from the defaults (see :func:`auto_label`)."""
        return self.label or auto_label(self)

    @property
    def stack(self) -> Stack:
        """The policy stack this configuration runs (the route ``simulate`` and ``serve`` share)."""
        return Stack(self.order, self.group, self.size, self.place, self.preemptive, dict(self.params),
                     {"locality_penalty": self.locality_penalty})

    def scheduler(self, where: str = "") -> Scheduler:
        try:
            return self.stack.scheduler()
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
    for stage in ("group", "size", "place"):
        v = getattr(rc, stage)
        if v != getattr(ref, stage):
            parts.append(v)
    if rc.preemptive != ref.preemptive:
        parts.append("preemptive" if rc.preemptive else "non-preemptive")
    parts += [f"{k}={_show(v)}" for k, v in sorted(rc.params.items()) if ref.params.get(k, _MISSING) != v]
    if rc.locality_penalty != ref.locality_penalty:
        parts.append(f"locality_penalty={_show(rc.locality_penalty)}")
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

    Keys: ``label``, ``order``, ``group``, ``size``, ``place``, ``preemptive``,
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
def run_config(
    rc: RunConfig,
    cluster: Cluster,
    specs: Sequence[JobSpec],
    model_builder: ModelBuilder | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run one configuration; the result's ``config`` carries the label and parameters."""
    sched = rc.scheduler()
    model = model_builder(cluster) if model_builder is not None else rc.model(cluster, specs)
    try:
        sched.bind(model)  # the factors a stage requires, as the service binds them
    except PolicyError as e:
        raise ConfigError(f"config {rc.name!r}: {e}") from None
    result = Simulator(cluster, specs, sched, model, rc.sim).run(progress)
    result.config = {"label": rc.name, **result.config, "params": dict(rc.params),
                     "locality_penalty": rc.locality_penalty}
    return result


# worker-process state, set once per worker by the pool initializer
_W: dict[str, Any] = {}


def _init_worker(cluster: Cluster, specs: Sequence[JobSpec], model_builder: ModelBuilder | None,
                 q: Any) -> None:
    _W.update(cluster=cluster, specs=specs, model_builder=model_builder, queue=q)


def _work(rc: RunConfig) -> RunResult:
    q = _W["queue"]
    name = rc.name

    def report(done: int, total: int) -> None:
        q.put((name, done, total))

    return run_config(rc, _W["cluster"], _W["specs"], _W["model_builder"], report if q is not None else None)


def unique_labels(configs: Sequence[RunConfig]) -> list[str]:
    labels = [rc.name for rc in configs]
    dups = sorted(x for x, n in Counter(labels).items() if n > 1)
    if dups:
        raise ConfigError(f"two configurations share the label(s) {', '.join(map(repr, dups))}; give each a label=")
    return labels


def run_many(
    configs: Sequence[RunConfig],
    cluster: Cluster,
    specs: Sequence[JobSpec],
    processes: int | None = None,
    progress: Progress | None = None,
    model_builder: ModelBuilder | None = None,
    ray: bool = False,
) -> dict[str, RunResult]:
    """Run every configuration on the same cluster and trace; results keyed by label, in input order.

    ``processes``: worker processes (default: one per configuration, at most
    the CPU count); 1 runs everything in this process.  ``ray``: one Ray task
    per configuration on the cluster this process is connected to
    (:mod:`.ray_sweep`; ``processes`` is then unused).
    """
    if ray:
        from .ray_sweep import run_many_ray

        return run_many_ray(configs, cluster, specs, progress, model_builder)
    labels = unique_labels(configs)
    for rc in configs:
        rc.validate()
    if not configs:
        return {}
    n = processes if processes is not None else min(len(configs), os.cpu_count() or 1)
    if n < 1:
        raise ConfigError(f"processes must be >= 1, got {n}")
    if n == 1 or len(configs) == 1:
        out = {}
        for label, rc in zip(labels, configs, strict=True):
            cb = (lambda d, t, _l=label: progress(_l, d, t)) if progress is not None else None
            out[label] = run_config(rc, cluster, specs, model_builder, cb)
        return out
    if progress is not None:
        # updates from workers arrive late and out of order: forward only forward progress
        user = progress
        last: dict[str, int] = {}

        def progress(label: str, done: int, total: int) -> None:
            if done >= last.get(label, -1):
                last[label] = done
                user(label, done, total)

    ctx = mp.get_context()
    q = ctx.Queue() if progress is not None else None
    results: dict[str, RunResult] = {}
    with ProcessPoolExecutor(min(n, len(configs)), mp_context=ctx, initializer=_init_worker,
                             initargs=(cluster, list(specs), model_builder, q)) as pool:
        futures: dict[Future[RunResult], str] = {pool.submit(_work, rc): lb for lb, rc in zip(labels, configs,
                                                                                               strict=True)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(q, progress)
            for f in done:
                r = results[futures[f]] = f.result()
                if progress is not None:
                    # a worker's last queued update may still be in flight: report the end here
                    progress(futures[f], len(r.finished), len(r.jobs))
        _drain(q, progress)
    return {lb: results[lb] for lb in labels}


def _drain(q: Any, progress: Progress | None) -> None:
    if q is None or progress is None:
        return
    while True:
        try:
            label, d, t = q.get_nowait()
        except _queue.Empty:
            return
        progress(label, d, t)
