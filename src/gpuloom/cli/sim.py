"""``gpuloom simulate`` and ``gpuloom compare`` (being written)."""

from __future__ import annotations

from . import app


@app.command()
def simulate() -> None:
    """Run one configuration on a trace (placeholder until the CLI lands)."""
    raise SystemExit("not yet")
