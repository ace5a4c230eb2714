"""Where the measured data lives (PAL's variability runs, Synergy's profiles, traces).

gpuloom does not ship the published data sets; they sit in a folder laid out
like ``shared/data`` (see its README).  :func:`data_dir` finds it the way the
tests do, so a command that works in the test suite works at the shell:

1. ``$GPULOOM_DATA``, when set (an error if it is not a folder);
2. ``../shared/data`` relative to the current directory (a clone with the data
   beside it, commands run from the clone's root, as the docs show);
3. ``../shared/data`` beside the source checkout this package was loaded from
   (an editable install used from elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "GPULOOM_DATA"


def candidates() -> list[Path]:
    """The folders :func:`data_dir` tries, in order."""
    env = os.environ.get(ENV)
    if env:
        return [Path(env)]
    here = Path(__file__).resolve()
    out = [Path.cwd().parent / "shared" / "data"]
    if len(here.parents) > 3 and (here.parents[3] / "pyproject.toml").exists():  # src/gpuloom/perf/datadir.py
        out.append(here.parents[4] / "shared" / "data")
    return out


def data_dir() -> Path | None:
    """The first existing folder of :func:`candidates`, or ``None``."""
    for p in candidates():
        if p.is_dir():
            return p
    return None


def describe_search() -> str:
    """How to point gpuloom at the data, for error messages."""
    return f"${ENV}, or ../shared/data beside the checkout"
