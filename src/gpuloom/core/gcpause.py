"""Python's cyclic garbage collector paused while a run builds a large heap of plain objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """The cyclic collector off inside.  A simulation (or a command around one) allocates millions of small
    objects and makes no reference cycles: the collector would only rescan them again and again, and reference
    counting frees them.  Turned on again after (if it was on) with what was made inside moved to the oldest
    generation (``freeze``, ``enable``, ``unfreeze``): turned on as it is, its first allocation would scan every
    one of them.  A host process that froze objects of its own keeps them frozen: the collector is then just
    turned on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.enable()
            gc.unfreeze()
        elif collecting:
            gc.enable()
