"""Imports every module that registers policies.  Add one line per new module."""

from . import (  # noqa: F401
    elastic,
    group,
    order,
    pal,  # noqa: F401
    place,
    size,
    topology,  # noqa: F401
)
