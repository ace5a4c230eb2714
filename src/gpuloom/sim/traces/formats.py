"""The registry of trace formats (:data:`FORMATS`): each reader registers itself in its module.

A reader is a function ``read(path, **options) -> Trace`` (or a list of
:class:`~gpuloom.core.job.JobSpec`, which :func:`~.detect.read_trace` sorts by arrival).  Outside
readers come by the ``gpuloom.traces`` entry points or as ``--format module:function``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.registry import Registry, RegistryError
from .fields import Trace


def _reader(obj: Any, where: str) -> Callable[..., Trace | list[Any]]:
    if not callable(obj) or isinstance(obj, type):
        raise RegistryError(f"{where}: a trace reader is a function read(path, **options), got {obj!r}")
    return obj


FORMATS: Registry[Callable[..., Trace | list[Any]]] = Registry(
    "trace format", home=__package__, group="gpuloom.traces", check=_reader, outside="module:function")
