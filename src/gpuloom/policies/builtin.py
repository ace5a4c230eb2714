"""Imports every module that registers policies.  Add one line per new module."""

from . import elastic, group, muri, order, place, size  # noqa: F401
