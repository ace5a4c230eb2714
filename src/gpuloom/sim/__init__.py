"""The trace-driven simulator: event loop, trace readers, generators, metrics, reports."""

from .engine import SimConfig, SimulationError, Simulator, simulate
from .metrics import JobRecord, RunResult, TimeSeries

__all__ = ["JobRecord", "RunResult", "SimConfig", "SimulationError", "Simulator", "TimeSeries", "simulate"]
