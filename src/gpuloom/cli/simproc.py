"""The process of ``gpuloom simulate``: its cyclic garbage collector off while it runs, and the child processes
it starts, ended with it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.gcpause import cycle_collection_paused

if TYPE_CHECKING:
    from ..sim.background import Background


def no_cycle_collection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run the command with Python's cyclic garbage collector off, as the simulation itself runs
    (:meth:`~gpuloom.sim.engine.Simulator.run`): loading a trace and writing a run's results build hundreds
    of thousands of plain objects and no reference cycles but a plot's figures, and the collector would
    rescan them all every few thousand allocations.  Reference counting frees the rest; the collector is
    turned on again after as :func:`~gpuloom.core.gcpause.cycle_collection_paused` says."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with cycle_collection_paused():
            return fn(*args, **kw)

    return wrapper


#: child processes the running command started (:func:`ends_children` ends those it did not collect)
_CHILDREN: list[Background[Any, Any]] = []


def ends_children(fn: Callable[..., Any]) -> Callable[..., Any]:
    """End (kill and reap) the child processes the command started and did not collect, however it ends:
    an error, an early exit, an interrupt."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        mark = len(_CHILDREN)
        try:
            return fn(*args, **kw)
        finally:
            while len(_CHILDREN) > mark:
                _CHILDREN.pop().cancel()

    return wrapper


def _child(what: str, fn: Callable[[Any], Any], prepare: Callable[[], object] | None = None,
           take: Callable[[Any], object] | None = None) -> Background[Any, Any]:
    """A child process forked now (:class:`~gpuloom.sim.background.Background`), ended with the command."""
    from ..sim.background import Background

    child: Background[Any, Any] = Background(what, fn, prepare, take=take)
    _CHILDREN.append(child)
    return child
