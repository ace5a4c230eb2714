"""GPU telemetry through NVML: utilisation, memory, power and temperature of this machine's GPUs.

A :class:`GpuSampler` reads every GPU every ``period_s`` seconds on a thread of its own (never on
the scheduling loop) and keeps the latest :class:`GpuReading` per NVML index; the executor of the
node hands them out (:meth:`.executor.Executor.gpu_readings`: the local executor's own sampler,
each Ray agent's) and the service attributes them to the jobs holding the GPUs
(:mod:`..service.gputel`).

NVML is ``pynvml`` (``nvidia-ml-py``), or the file-backed fake :mod:`.fakenvml` when
``GPULOOM_FAKE_NVML`` names its file.  Where NVML cannot start (no driver, no library) nothing is
sampled: that is logged once at INFO, and :meth:`GpuSampler.readings` stays empty.  A sensor a
board lacks (power, temperature) reads as None.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from types import ModuleType

from . import fakenvml

log = logging.getLogger(__name__)
SAMPLE_S = 2.0


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one time (``time``: wall seconds)."""

    time: float
    util: float  # percent of the last sample period a kernel ran (NVML's utilization.gpu)
    mem_used_mb: float  # MiB, as nvidia-smi shows them
    mem_total_mb: float
    power_w: float | None
    temp_c: float | None


def load_nvml() -> ModuleType | None:
    """The NVML module: the fake when ``GPULOOM_FAKE_NVML`` is set, else ``pynvml``; None without either."""
    if os.environ.get(fakenvml.ENV):
        return fakenvml
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def read_all(nvml: ModuleType, now: float) -> dict[int, GpuReading]:
    """Every GPU's reading now (NVML already initialised)."""
    out: dict[int, GpuReading] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        power: float | None
        temp: float | None
        try:
            power = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nvml.NVMLError:
            power = None
        try:
            temp = float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        except nvml.NVMLError:
            temp = None
        out[i] = GpuReading(now, float(util.gpu), mem.used / 2**20, mem.total / 2**20, power, temp)
    return out


class GpuSampler:
    """Samples this machine's GPUs every ``period_s`` on a daemon thread, started by the first
    :meth:`readings`; :meth:`close` stops it."""

    def __init__(self, period_s: float = SAMPLE_S) -> None:
        self.period_s = period_s
        self._latest: dict[int, GpuReading] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available: bool | None = None  # None until NVML was tried

    def readings(self) -> dict[int, GpuReading]:
        """The latest reading of each GPU (NVML index); empty where NVML is absent or before the first sample."""
        if self._thread is None and not self._stop.is_set():
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="gpuloom-nvml", daemon=True)
                    self._thread.start()
        with self._lock:
            return dict(self._latest)

    def _run(self) -> None:
        nvml = load_nvml()
        try:
            if nvml is None:
                raise RuntimeError("the nvidia-ml-py package is not installed")
            nvml.nvmlInit()
        except Exception as e:  # no driver, no library: said once, nothing sampled
            self.available = False
            log.info("NVML unavailable (%s): no GPU telemetry on this node", e)
            return
        self.available = True
        failed = False
        try:
            while not self._stop.is_set():
                try:
                    got = read_all(nvml, time.time())
                    failed = False
                except Exception as e:  # a GPU fallen off the bus, the fake's file rewritten midway
                    if not failed:
                        log.warning("NVML sample failed: %s", e)
                    failed, got = True, {}
                with self._lock:
                    self._latest = got
                self._stop.wait(self.period_s)
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass

    def close(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout=5)
