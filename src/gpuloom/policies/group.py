"""Grouping policies: which jobs share one set of GPUs.  ``none`` = every job alone."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.job import Job
from .base import GroupPolicy, View, register


@register("group", "none")
class NoGrouping(GroupPolicy):
    merges = False
    def group(self, ordered: Sequence[Job], view: View) -> list[tuple[Job, ...]]:
        return [(j,) for j in ordered]
