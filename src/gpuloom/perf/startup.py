"""Muri's start-up overheads: seconds a job loses each time its scheduler re-plans it.

Muri's simulator (``run_sim.py``, ``overhead_dict``) charges every running job
its model's start-up time, measured per GPU count, at every scheduling event
(an arrival or a completion), whether or not the job was moved: the job makes
no progress for that long after the event.  A group's member pays the sum of
its members' times.  Models missing from the table cost
:data:`DEFAULT_STARTUP` seconds.  :attr:`gpuloom.sim.engine.SimConfig.event_overhead`
applies it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.job import JobSpec

#: GPU count -> model -> seconds (Muri's ``overhead_dict``)
MURI_STARTUP: dict[int, dict[str, float]] = {
    1: {"vgg16": 7, "vgg19": 7, "resnet18": 4, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 38, "dqn": 5},
    2: {"vgg16": 7, "vgg19": 7, "resnet18": 5, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 5},
    4: {"vgg16": 8, "vgg19": 8, "resnet18": 5, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 6},
    8: {"vgg16": 9, "vgg19": 9, "resnet18": 7, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 46, "dqn": 6},
    16: {"vgg16": 9, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 7, "bert": 10, "gpt2": 10, "a2c": 46,
         "dqn": 8},
    32: {"vgg16": 10, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 8, "bert": 10, "gpt2": 10, "a2c": 46,
         "dqn": 8},
}
#: seconds for a model (or GPU count) the table does not list
DEFAULT_STARTUP = 10.0
#: names :func:`event_overhead` accepts besides a number of seconds
EVENT_OVERHEADS = ("none", "muri")


def muri_startup(spec: JobSpec, gpus: int | None = None) -> float:
    """``spec``'s start-up seconds on ``gpus`` GPUs (default: its own count), from :data:`MURI_STARTUP`."""
    row = MURI_STARTUP.get(spec.gpus if gpus is None else gpus)
    if row is None or not spec.model:
        return DEFAULT_STARTUP
    return float(row.get(spec.model, DEFAULT_STARTUP))


def event_overhead(value: str | float) -> Callable[[JobSpec, int], float] | None:
    """The per-event charge named by ``value``: ``none`` (None), ``muri`` (:func:`muri_startup`),
    or a number of seconds for every job; a function of (member's spec, the group's GPU count)."""
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "none":
            return None
        if v == "muri":
            return muri_startup
        try:
            secs = float(v)
        except ValueError:
            raise ValueError(f"event_overhead must be one of {', '.join(EVENT_OVERHEADS)} or seconds, "
                             f"got {value!r}") from None
    else:
        secs = float(value)
    if not secs >= 0 or secs == float("inf"):
        raise ValueError(f"event_overhead must be finite seconds >= 0, got {value!r}")
    if secs == 0:
        return None
    return lambda spec, gpus: secs


__all__ = ["DEFAULT_STARTUP", "EVENT_OVERHEADS", "MURI_STARTUP", "event_overhead", "muri_startup"]
