"""A file-backed stand-in for ``pynvml``, for machines without GPUs (tests, demos).

:func:`gpuloom.runtime.exec.gpustats.load_nvml` returns this module instead of ``pynvml`` when
the environment variable ``GPULOOM_FAKE_NVML`` names a JSON file::

    {"gpus": [{"name": "NVIDIA A100-SXM4-40GB", "util": 87, "mem_used_mb": 30000,
               "mem_total_mb": 40960, "power_w": 250.5, "temp_c": 61}, ...]}

The file is read again on every device handle asked for, so a test (or a person) drives the
readings by rewriting it.  ``power_w`` or ``temp_c`` left out (or null) read as "not supported",
as NVML says on boards without those sensors.  The functions are those of ``pynvml`` that
gpuloom calls, with the same names, arguments and return shapes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

ENV = "GPULOOM_FAKE_NVML"
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    """As ``pynvml.NVMLError``."""


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


@dataclass(frozen=True)
class _Util:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Mem:
    total: int
    used: int
    free: int


def _gpus() -> list[dict[str, Any]]:
    path = os.environ.get(ENV)
    if not path:
        raise NVMLError(f"{ENV} is not set")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise NVMLError(f"{ENV}={path}: {e}") from None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise NVMLError(f"{ENV}={path}: expected {{\"gpus\": [{{...}}, ...]}}")
    return gpus


def nvmlInit() -> None:  # noqa: N802 - pynvml's names from here on
    _gpus()


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(i: int) -> dict[str, Any]:  # noqa: N802
    gpus = _gpus()
    if not 0 <= i < len(gpus):
        raise NVMLError(f"no GPU {i} (there are {len(gpus)})")
    return {"index": i, **gpus[i]}


def nvmlDeviceGetName(h: dict[str, Any]) -> str:  # noqa: N802
    return str(h.get("name", "Fake GPU"))


def nvmlDeviceGetUUID(h: dict[str, Any]) -> str:  # noqa: N802
    return str(h.get("uuid", f"GPU-fake-{h['index']}"))


def nvmlDeviceGetUtilizationRates(h: dict[str, Any]) -> _Util:  # noqa: N802
    return _Util(int(h.get("util", 0)), int(h.get("mem_util", 0)))


def nvmlDeviceGetMemoryInfo(h: dict[str, Any]) -> _Mem:  # noqa: N802
    total = int(float(h.get("mem_total_mb", 0)) * 2**20)
    used = int(float(h.get("mem_used_mb", 0)) * 2**20)
    return _Mem(total, used, max(0, total - used))


def _sensor(h: dict[str, Any], key: str) -> float:
    v = h.get(key)
    if v is None:
        raise NVMLError_NotSupported(f"GPU {h['index']}: {key} not supported")
    return float(v)


def nvmlDeviceGetPowerUsage(h: dict[str, Any]) -> int:  # noqa: N802
    return int(round(_sensor(h, "power_w") * 1000))  # milliwatts, as NVML


def nvmlDeviceGetTemperature(h: dict[str, Any], sensor: int) -> int:  # noqa: N802
    return int(_sensor(h, "temp_c"))
