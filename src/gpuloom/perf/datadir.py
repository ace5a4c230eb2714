"""Where the measured data lives (traces, Synergy's profiles, PAL's variability runs, Muri's testbed trace).

gpuloom does not ship the published data sets; they sit in a folder laid out
like ``shared/data`` (see its README).  Every command and the tests find it
the same way (:func:`data_dir`), from any working directory:

1. ``$GPULOOM_DATA``, when set (and nothing else: a set variable that names no
   folder is an error, not a fallback);
2. ``../shared/data`` beside the checkout the current directory is in (the
   nearest folder, from the current one up, holding a ``pyproject.toml`` or
   ``.git``), and beside the current directory itself;
3. ``../shared/data`` beside the checkout the gpuloom package was loaded from
   (an editable install used from anywhere).

A command's own ``--data DIR`` comes before all of these.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "GPULOOM_DATA"
_PACKAGE = Path(__file__).resolve()  # src/gpuloom/perf/datadir.py in a checkout


class DataDirError(FileNotFoundError):
    """No data folder: the message says where gpuloom looked."""


def _checkout(start: Path) -> Path | None:
    """The nearest folder from ``start`` up holding a ``pyproject.toml`` or ``.git``."""
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file() or (d / ".git").exists():
            return d
    return None


def candidates(cwd: Path | None = None, package: Path | None = None, env: str | None = None) -> list[Path]:
    """The folders :func:`data_dir` tries, in order (``env`` is ``$GPULOOM_DATA`` unless given)."""
    env = os.environ.get(ENV) if env is None else env
    if env:
        return [Path(env)]
    cwd = Path.cwd() if cwd is None else cwd
    package = _PACKAGE if package is None else package
    out: list[Path] = []
    here = _checkout(cwd)
    if here is not None:
        out.append(here.parent / "shared" / "data")
    out.append(cwd.parent / "shared" / "data")
    # the checkout the package was loaded from: <checkout>/src/gpuloom/perf/datadir.py
    if len(package.parents) > 4 and (package.parents[3] / "pyproject.toml").is_file():
        out.append(package.parents[4] / "shared" / "data")
    unique: list[Path] = []
    for p in out:
        if p.resolve() not in {q.resolve() for q in unique}:
            unique.append(p)
    return unique


def data_dir(cwd: Path | None = None, package: Path | None = None, env: str | None = None) -> Path | None:
    """The first existing folder of :func:`candidates`, or ``None``."""
    for p in candidates(cwd, package, env):
        if p.is_dir():
            return p
    return None


def describe_search(cwd: Path | None = None, package: Path | None = None, env: str | None = None) -> str:
    """Where gpuloom looks, for messages: ``$GPULOOM_DATA (not set), then A, B``."""
    env = os.environ.get(ENV) if env is None else env
    if env:
        return f"${ENV}={env}"
    return f"${ENV} (not set), then " + ", ".join(str(p) for p in candidates(cwd, package, env))


def require_data_dir(given: str | Path | None = None, hint: str = "--data DIR", cwd: Path | None = None,
                     package: Path | None = None, env: str | None = None) -> Path:
    """``given`` (a command's ``--data``) when set, else :func:`data_dir`; :class:`DataDirError` naming
    every folder tried when there is none (``hint``: the command's own way to name the folder)."""
    if given:
        p = Path(given)
        if not p.is_dir():
            raise DataDirError(f"--data {p}: no such folder")
        return p
    found = data_dir(cwd, package, env)
    if found is not None:
        return found
    env = os.environ.get(ENV) if env is None else env
    if env:
        raise DataDirError(f"${ENV}={env} is not a folder (unset it to look beside the checkout)")
    raise DataDirError(f"no data folder (the shared data: muri/, synergy/, pal/, sia/, ...): looked in "
                       f"{describe_search(cwd, package, env)}; set {ENV}=DIR or give {hint}")
