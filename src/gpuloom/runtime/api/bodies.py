"""What the job and token endpoints accept: the request bodies (Pydantic models), every field bounded.

``JobSubmit`` is a job spec as submitted (``POST /jobs``; ``gpuloom submit`` files have the same keys),
``TokenCreate`` the body of ``POST /tokens``.  Unknown or malformed fields get a 422 naming the field;
the bounds are in :mod:`.limits`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...core.request import JobRequest
from ..service.deps import parse_array, parse_dependency
from ..state.specs import parse_mem, parse_time_limit
from .limits import (
    MAX_COMMAND,
    MAX_CURVE_POINTS,
    MAX_ENV_NAME,
    MAX_ENV_TOTAL,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_NAME,
    MAX_PATH,
    check_text,
)
from .queues import QUEUE_RE

USER_RE = r"^[A-Za-z0-9_.@-]{1,64}$"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MIN_MEM_MB = 16  # the smallest memory a job may ask for (a limit below it is a typo, and unenforceable)


def _walk(v: Any, where: str, depth: int = 0, count: list[int] | None = None) -> None:
    """Free-form JSON (``profile``): bounded depth and size, no NUL bytes, finite numbers."""
    count = count if count is not None else [0]
    count[0] += 1
    if depth > 6 or count[0] > 1000:
        raise ValueError(f"{where} is too deep or too large")
    if isinstance(v, str):
        check_text(v, where)
        if len(v) > MAX_PATH:
            raise ValueError(f"{where}: strings of at most {MAX_PATH} characters")
    elif isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{where}: numbers must be finite")
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk(k, where, depth + 1, count)
            _walk(x, where, depth + 1, count)
    elif isinstance(v, list):
        for x in v:
            _walk(x, where, depth + 1, count)


class JobSubmit(BaseModel):
    """A job spec as submitted (YAML/JSON ``gpuloom submit`` files have the same keys).

    Every field is bounded (:mod:`.limits`); numbers are strict (``true`` is not 1) and finite."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("job", min_length=1, max_length=MAX_NAME)
    command: str = Field(min_length=1, max_length=MAX_COMMAND)
    gpus: int = Field(ge=1, le=100_000, strict=True)
    cpus: int | None = Field(None, ge=1, le=1_000_000, strict=True)
    mem: int | float | str | None = None  # "8G" (10^9 bytes), "8Gi" (2^30), "512M", or MB (10^6 bytes)
    model: str | None = Field(None, max_length=MAX_NAME)
    profile: bool | dict[str, Any] | None = None  # true/false: ask for / opt out of profiling
    checkpoint_dir: str | None = Field(None, max_length=MAX_PATH)
    time_limit: float | str | None = None  # Slurm's: minutes (60, "60"), 1:30:00, 2-00:00:00, 90s, 2h
    user: str | None = Field(None, pattern=USER_RE)
    env: dict[str, str] | None = Field(None, max_length=MAX_ENV_VARS)
    workdir: str | None = Field(None, max_length=MAX_PATH)
    priority: int | None = Field(None, ge=-(10**9), le=10**9, strict=True)
    batch_size: int | None = Field(None, ge=1, le=10**9, strict=True)
    # scaling curve f(gpus) in it/s (elastic sizing)
    throughput: dict[str, Finite] | list[Finite] | None = Field(None, max_length=MAX_CURVE_POINTS)
    min_gpus: int | None = Field(None, ge=1, le=100_000, strict=True)
    resource_times: list[Finite] | None = Field(None, min_length=1, max_length=8)  # s/iteration per stage (Muri)
    iteration_time: Finite | None = Field(None, gt=0)  # seconds per iteration (Muri)
    iterations: int | None = Field(None, ge=1, le=10**12, strict=True)  # with iteration_time: the work estimate

    queue: str | None = Field(None, pattern=QUEUE_RE)  # else the user's default queue (runtime/service/queues.py)
    reservation: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # run only inside it
    gpu_type: str | None = Field(None, max_length=520)  # "v100", "a100|h100"; also gpus: "v100:2" (Slurm's gres)
    array: str | None = Field(None, max_length=200)  # job array: "0-9", "1,3,5-7", "0-15:4", "0-9%2"
    dependency: str | None = Field(None, max_length=2000)  # "afterok:5", "afterany:5:6,afterok:7_2"

    @model_validator(mode="before")
    @classmethod
    def _gres(cls, data: Any) -> Any:
        """``gpus: v100:2`` (or ``gpu:v100:2``) is ``gpus: 2, gpu_type: v100`` (anything else is left to the
        field's own check, which names it)."""
        if isinstance(data, dict) and isinstance(data.get("gpus"), str):
            from ..state.specs import parse_gres

            try:
                t, n = parse_gres(data["gpus"])
            except ValueError:
                return data
            data = {**data, "gpus": n}
            if t is not None:
                if data.get("gpu_type") not in (None, t):
                    raise ValueError(f"gpus {t}:{n} and gpu_type {data['gpu_type']!r} disagree")
                data["gpu_type"] = t
        return data

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if isinstance(v, str):  # (not a count, nor TYPE:COUNT: _gres left it)
            raise ValueError(f"expected a GPU count or TYPE:COUNT (e.g. 2, v100:2, gpu:v100:2), got {v[:40]!r}")
        return v

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | None) -> str | None:
        from ..state.specs import GPU_TYPE_RE

        if v is not None and not GPU_TYPE_RE.match(v):
            raise ValueError(f"gpu_type: a GPU type (v100, a100, ...) or several joined by |, got {v[:40]!r}")
        return v

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            parse_array(v)
        return v

    @field_validator("dependency")
    @classmethod
    def _dependency(cls, v: str | None) -> str | None:
        if v is not None:
            parse_dependency(v)
        return v

    @field_validator("name", "command", "model", "checkpoint_dir", "workdir", "array", "dependency")
    @classmethod
    def _text(cls, v: str | None, info: Any) -> str | None:
        return v if v is None else check_text(v, info.field_name)

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _walk(v, "profile")
            from ...perf.profile_record import is_record, profile_from_record

            if is_record(v):  # an inline profile record: the sizers will read it
                try:
                    if profile_from_record("profile", v) is None:
                        raise ValueError("an inline profile needs status ok (or none)")
                except ValueError as e:  # SensitivityError
                    raise ValueError(str(e)) from None
        return v

    @field_validator("resource_times")
    @classmethod
    def _stages(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(not (x >= 0) for x in v):
            raise ValueError("resource_times must be >= 0 seconds per iteration")
        return v

    @field_validator("throughput")
    @classmethod
    def _curve(cls, v: Any) -> Any:
        vals = v.values() if isinstance(v, dict) else (v or [])
        if any(not (x >= 0) for x in vals):
            raise ValueError("throughput values must be >= 0 iterations/s")
        if isinstance(v, dict):
            for k in v:
                if not (k.isascii() and k.isdigit() and 1 <= int(k) <= 100_000):
                    raise ValueError(f"throughput keys are GPU counts (1, 2, ...), got {k[:20]!r}")
        return v

    @field_validator("mem", mode="before")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        if v is None:
            return None
        mb = parse_mem(v, "mem")
        if mb < MIN_MEM_MB:
            raise ValueError(f"mem: at least {MIN_MEM_MB} MB, got {str(v)[:40]!r}")
        return mb

    @field_validator("time_limit", mode="before")
    @classmethod
    def _tl(cls, v: Any) -> Any:
        return None if v is None else parse_time_limit(v, "time_limit")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        total = 0
        for k, x in v.items():
            if len(k) > MAX_ENV_NAME or k.startswith("GPULOOM_") or k == "CUDA_VISIBLE_DEVICES":
                raise ValueError(f"environment variable name {k[:40]!r} is not allowed")
            if not ENV_NAME_RE.match(k):  # the job's shell sets it: a shell name
                raise ValueError(f"environment variable name {k[:40]!r} is not allowed: letters, digits and _, "
                                 "not starting with a digit")
            check_text(x, f"env {k}")
            if len(x) > MAX_ENV_VALUE:
                raise ValueError(f"env {k}: values of at most {MAX_ENV_VALUE} characters")
            total += len(k) + len(x)
        if total > MAX_ENV_TOTAL:
            raise ValueError(f"env: at most {MAX_ENV_TOTAL} characters in all")
        return v

    @field_validator("checkpoint_dir", "workdir")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and not os.path.isabs(v):
            raise ValueError(f"must be an absolute path, got {v[:80]!r}")
        return v

    def to_spec(self) -> dict[str, Any]:
        """The fields as checked above in the stored form of :class:`~gpuloom.core.request.JobRequest`
        (seconds, MB): what a submission stores, made directly."""
        d = self.model_dump(exclude_none=True)
        if "mem" in d:
            d["mem_mb"] = d.pop("mem")
        return d

    def to_request(self) -> JobRequest:
        """The typed request (:mod:`gpuloom.core.request`) these fields make."""
        return JobRequest.from_stored(self.to_spec())


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(pattern=USER_RE)
    admin: bool = Field(False, strict=True)
    expires: float | str | None = None  # from now: 30d, 12h, 1:00:00, 90s; a bare number is minutes (as time limits)

    @field_validator("expires", mode="before")
    @classmethod
    def _exp(cls, v: Any) -> Any:
        return None if v is None else parse_time_limit(v, "expires")
