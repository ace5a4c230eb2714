"""How long the scheduling loop lets events gather before a round they trigger.

A submission or a cancel wakes the loop, and the round after it takes every job that arrived
since the one before.  Each round has a fixed cost (it reads the store, plans, commits the new
jobs' states and reasons), paid once however many jobs it takes.  So:

* an event that comes :attr:`Gather.quiet` seconds or more after the last round ended is taken
  :attr:`Gather.least` seconds after that round: a lone job starts at once;
* an event that comes sooner is part of a stream: each such round doubles the gap, up to
  :attr:`Gather.most`, so a flood of submissions pays the round's fixed cost a few times a
  second, not once every few jobs;
* the first event after a quiet moment brings the gap back to :attr:`Gather.least`.
"""

from __future__ import annotations


class Gather:
    """The gap between event-triggered rounds (see the module notes)."""

    def __init__(self, least: float, most: float, quiet: float) -> None:
        if not 0 <= least <= most:
            raise ValueError(f"gather gaps must be 0 <= least <= most, got {least} and {most}")
        self.least = least
        self.most = most
        self.quiet = quiet
        self.gap = least

    def next(self, since_round: float) -> float:
        """The gap (after the last round ended) before the round an event triggers, the event having
        come ``since_round`` seconds after that round ended."""
        if since_round < self.quiet:
            self.gap = min(self.most, max(self.gap * 2, self.least))
        else:
            self.gap = self.least
        return self.gap
