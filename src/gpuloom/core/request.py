"""A job as a user asks for it, typed: :class:`JobRequest`, and :func:`parse_request`, which reads one.

Both faces meet here.  The service's submissions (the API's JSON, ``gpuloom
submit``'s flags and spec files) become a ``JobRequest``, or directly its stored
form, in the units the service keeps (time limit in seconds, memory in MB of
10^6 bytes, the GPU type apart from the count); :meth:`JobRequest.to_job_spec` (:func:`stored_job_spec` for a stored
one) makes the same :class:`~gpuloom.core.job.JobSpec` a trace row makes.  :meth:`JobRequest.stored`
is the JSON form the store keeps (the keys it has always had), and
:meth:`JobRequest.from_stored` reads it back, old rows included: keys the
service adds (``array_limit``, ``depends_on``) ride along in ``extra``.

:func:`parse_request` reads what users write (``gpus: v100:2``, ``mem: 8G``,
``time_limit: 60`` = 60 minutes) and names the field of any error.  Bounds
that protect the server (text lengths, environment names) stay in the API's
schema, which checks them before converting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .job import JobSpec
from .units import GPU_TYPE_RE, parse_gres, parse_mem, parse_time_limit


class RequestError(ValueError):
    """A job request that cannot be read; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message if message.startswith(f"{field}:") else f"{field}: {message}")
        self.field = field


#: request fields passed to policies as ``JobSpec.attrs`` (priority, Muri stage times, elastic curves,
#: the queue, the GPU type asked for, the reservation to run in)
POLICY_ATTRS = ("priority", "batch_size", "throughput", "min_gpus", "resource_times", "iteration_time", "queue",
                "gpu_type", "reservation")


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job request in the service's units: ``time_limit`` in seconds, ``mem_mb`` in MB of 10^6 bytes."""

    command: str
    gpus: int = 1
    name: str = "job"
    gpu_type: str | None = None  # "v100", or alternatives "a100|h100"
    cpus: int | None = None
    mem_mb: int | None = None
    time_limit: float | None = None
    priority: int | None = None
    queue: str | None = None
    reservation: str | None = None  # run only inside this advance reservation
    array: str | None = None  # "0-9%2"
    dependency: str | None = None  # "afterok:5"
    env: Mapping[str, str] | None = None
    workdir: str | None = None
    model: str | None = None
    profile: bool | Mapping[str, Any] | None = None  # ask for / opt out of profiling, or an inline record
    checkpoint_dir: str | None = None
    user: str | None = None  # admin only: on behalf of another user
    batch_size: int | None = None
    throughput: Mapping[str, float] | Sequence[float] | None = None  # elastic sizing's curve, it/s
    min_gpus: int | None = None
    resource_times: Sequence[float] | None = None  # Muri's stage times, s/iteration
    iteration_time: float | None = None
    iterations: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # stored keys the service adds

    def stored(self) -> dict[str, Any]:
        """The store's JSON form: every set field by its name (``mem_mb``, seconds), then ``extra``."""
        out = {f: getattr(self, f) for f in _FIELDS if getattr(self, f) is not None}
        for k in ("env", "throughput", "profile"):  # (plain JSON containers)
            if isinstance(out.get(k), Mapping):
                out[k] = dict(out[k])
        if out.get("resource_times") is not None:
            out["resource_times"] = list(out["resource_times"])
        if isinstance(out.get("throughput"), Sequence):
            out["throughput"] = list(out["throughput"])
        out.update(self.extra)
        return out

    @classmethod
    def from_stored(cls, spec: Mapping[str, Any]) -> JobRequest:
        """The request a stored spec (:meth:`stored`, or a row written before this class) records."""
        if not isinstance(spec, Mapping):
            raise RequestError("spec", f"expected a mapping of job fields, got {type(spec).__name__}")
        known = {k: v for k, v in spec.items() if k in _FIELD_SET}
        extra = {k: v for k, v in spec.items() if k not in _FIELD_SET and k != "extra"}
        known.setdefault("command", "")
        return cls(**known, extra=extra)

    def to_job_spec(self, id: str, arrival: float, user: str = "", default_duration: float = 3600.0,
                    profile: Any = None) -> JobSpec:
        """The scheduler's view (:func:`stored_job_spec` of :meth:`stored`)."""
        return stored_job_spec(self.stored(), id, arrival, user, default_duration, profile)


_FIELDS = tuple(f.name for f in fields(JobRequest) if f.name != "extra")
_FIELD_SET = frozenset(_FIELDS)
#: what users write, by field: the spec files' and the API's keys (``mem`` in units, not ``mem_mb``)
USER_FIELDS = tuple("mem" if f == "mem_mb" else f for f in _FIELDS)


def stored_job_spec(s: Mapping[str, Any], id: str, arrival: float, user: str = "", default_duration: float = 3600.0,
                    profile: Any = None) -> JobSpec:
    """The :class:`JobSpec` the scheduler sees for a request in its stored form: the work estimate is
    ``iterations x iteration_time`` when both are given, else the time limit, else ``default_duration``;
    :data:`POLICY_ATTRS` that are set become its ``attrs``.  The service's mirror reads its rows with it."""
    kw: dict[str, Any] = {"model": str(s.get("model") or ""), "user": user, "cpus": s.get("cpus"),
                          "mem_mb": s.get("mem_mb"), "profile": profile,
                          "attrs": {k: s[k] for k in POLICY_ATTRS if s.get(k) is not None}}
    iters, it = s.get("iterations"), s.get("iteration_time")
    if iters and it:
        return JobSpec.from_iterations(id, arrival, int(s["gpus"]), int(iters), float(it), **kw)
    return JobSpec(id, arrival, int(s["gpus"]), float(s.get("time_limit") or default_duration), **kw)


def parse_request(data: Mapping[str, Any]) -> JobRequest:
    """A :class:`JobRequest` from what a user writes (a spec file, the API's JSON, ``submit``'s flags):
    ``gpus`` a count or ``TYPE:COUNT``, ``mem`` a size (``8G``) or MB, ``time_limit`` by Slurm's rule (a
    bare number is minutes).  Raises :class:`RequestError` naming the first field that is wrong."""
    from .registry import did_you_mean

    if not isinstance(data, Mapping):
        raise RequestError("spec", f"expected a mapping of job fields (name, command, gpus, ...), "
                                   f"got {type(data).__name__}")
    for k in data:
        if k not in USER_FIELDS:
            raise RequestError(str(k)[:40], f"not a job field{did_you_mean(str(k), USER_FIELDS)}")
    kw: dict[str, Any] = {}
    for k in ("command", "name"):
        if k in data:
            kw[k] = _text(data[k], k)
    if "command" not in kw:
        raise RequestError("command", "missing: the command to run")
    gpu_type = None
    if "gpus" in data:
        try:
            gpu_type, kw["gpus"] = parse_gres(data["gpus"], "gpus")
        except ValueError as e:
            raise RequestError("gpus", str(e)) from None
        if kw["gpus"] < 1:
            raise RequestError("gpus", f"must be >= 1, got {kw['gpus']}")
    if data.get("gpu_type") is not None:
        t = _text(data["gpu_type"], "gpu_type")
        if not GPU_TYPE_RE.match(t):
            raise RequestError("gpu_type", f"a GPU type (v100, a100, ...) or several joined by |, got {t[:40]!r}")
        if gpu_type not in (None, t):
            raise RequestError("gpu_type", f"gpus {gpu_type}:{kw['gpus']} and gpu_type {t!r} disagree")
        gpu_type = t
    kw["gpu_type"] = gpu_type
    for k, lo in (("cpus", 1), ("batch_size", 1), ("min_gpus", 1), ("iterations", 1), ("priority", None)):
        if data.get(k) is not None:
            kw[k] = _int(data[k], k, lo)
    if data.get("mem") is not None:
        try:
            kw["mem_mb"] = parse_mem(data["mem"], "mem")
        except ValueError as e:
            raise RequestError("mem", str(e)) from None
    if data.get("time_limit") is not None:
        try:
            kw["time_limit"] = parse_time_limit(data["time_limit"], "time_limit")
        except ValueError as e:
            raise RequestError("time_limit", str(e)) from None
    for k in ("queue", "reservation", "array", "dependency", "workdir", "model", "checkpoint_dir", "user"):
        if data.get(k) is not None:
            kw[k] = _text(data[k], k)
    if data.get("env") is not None:
        env = data["env"]
        if not isinstance(env, Mapping) or not all(isinstance(a, str) and isinstance(b, str) for a, b in env.items()):
            raise RequestError("env", "expected a mapping of NAME: text")
        kw["env"] = dict(env)
    if data.get("iteration_time") is not None:
        kw["iteration_time"] = _positive(data["iteration_time"], "iteration_time")
    if data.get("resource_times") is not None:
        rt = data["resource_times"]
        if not isinstance(rt, Sequence) or isinstance(rt, str) or not rt:
            raise RequestError("resource_times", "expected a list of seconds per iteration, one per stage")
        kw["resource_times"] = [_number(x, "resource_times", 0.0) for x in rt]
    if data.get("throughput") is not None:
        kw["throughput"] = _curve(data["throughput"])
    if data.get("profile") is not None:
        if not isinstance(data["profile"], bool | Mapping):
            raise RequestError("profile", "expected true, false or a profile record")
        kw["profile"] = data["profile"]
    return JobRequest(**kw)


def _text(v: Any, k: str) -> str:
    if not isinstance(v, str) or not v:
        raise RequestError(k, f"expected text, got {_show(v)}")
    return v


def _int(v: Any, k: str, lo: int | None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(k, f"expected a whole number, got {_show(v)}")
    if lo is not None and v < lo:
        raise RequestError(k, f"must be >= {lo}, got {v}")
    return v


def _number(v: Any, k: str, lo: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
        raise RequestError(k, f"expected a finite number >= {lo:g}, got {_show(v)}")
    return float(v)


def _positive(v: Any, k: str) -> float:
    x = _number(v, k, 0.0)
    if x == 0:
        raise RequestError(k, "must be > 0")
    return x


def _curve(v: Any) -> dict[str, float] | list[float]:
    if isinstance(v, Mapping):
        out = {}
        for g, x in v.items():
            if not (isinstance(g, str | int) and str(g).isascii() and str(g).isdigit() and int(g) >= 1):
                raise RequestError("throughput", f"keys are GPU counts (1, 2, ...), got {_show(g)}")
            out[str(g)] = _number(x, "throughput", 0.0)
        return out
    if isinstance(v, Sequence) and not isinstance(v, str):
        return [_number(x, "throughput", 0.0) for x in v]
    raise RequestError("throughput", f"expected a list or a mapping of GPU count to it/s, got {_show(v)}")


def _show(v: Any) -> str:
    return repr(v)[:40] if isinstance(v, str | int | float | bool) or v is None else type(v).__name__
