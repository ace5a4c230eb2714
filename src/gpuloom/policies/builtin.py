"""Imports every module that registers policies.  Add one name per new module."""

from . import elastic, gavel, group, muri, order, pal, place, queue_fair, queues, size, synergy, synergy_opt, topology  # noqa: F401
