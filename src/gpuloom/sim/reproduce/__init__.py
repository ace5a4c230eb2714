"""``gpuloom reproduce``: each source's headline experiment, published figures beside gpuloom's.

=========  ============================================================  =====================
name       experiment                                                    published figure
=========  ============================================================  =====================
muri       a Muri trace on 8x8: SRTF, SRSF, Muri-S, Tiresias, Muri-L     Muri Fig. 9 and 10
synergy    TUNE vs GPU-proportional, 128 GPUs, jobs 4,000-4,999          Synergy abstract
pal        PM-First and PAL vs Packed-Sticky, 8 Sia-Philly workloads     PAL Sec. V-B
fsched     F-scheduling vs static partitions, thesis scenario            thesis (direction)
gavel      LAS agnostic vs aware, 36 V100 + 36 P100 + 36 K80, 3 rates    Gavel Fig. 8
=========  ============================================================  =====================

Each module's docstring states its setting, its presets (``paper``,
``artifact``) and where gpuloom differs.  Results are :class:`Result` objects
(rows of published vs gpuloom over seeds); :func:`run` (or :func:`write`) also writes a JSON
file, a bar chart per experiment and ``reproduce.md``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import fsched, gavel, muri, pal, synergy
from .common import PRESETS, ReproduceError, Result, Row, data_dir, plot, table

EXPERIMENTS: dict[str, Callable[..., Result]] = {
    "muri": muri.run, "synergy": synergy.run, "pal": pal.run, "fsched": fsched.run, "gavel": gavel.run,
}
#: seeds by default where randomness enters (workload draws, PM-score draws)
DEFAULT_SEEDS = {"muri": 1, "synergy": 3, "pal": 3, "fsched": 1, "gavel": 1}
#: experiments with randomness whose default is one seed (Gavel's published runs are seed 0): --seeds applies
SEEDED = frozenset({"gavel"})
#: experiments whose source measures a window of jobs by arrival: ``measure`` (--measure-jobs) replaces it
WINDOWED = frozenset({"synergy", "gavel"})


def run(names: str | list[str], data: str | Path | None = None, preset: str = "paper", seeds: int | None = None,
        out: str | Path | None = None, limit: int | None = None, measure: tuple[int, int] | None = None,
        trace: str | Path | None = None) -> list[Result]:
    """Run experiments by name (``all`` = every one); write ``reproduce.json`` and plots to ``out``.
    ``measure``: the jobs (A, B) by arrival whose figures count, for the experiments of :data:`WINDOWED`;
    ``trace``: Muri's trace for ``muri`` (:func:`muri.trace_path`); only with ``muri``."""
    if isinstance(names, str):
        names = list(EXPERIMENTS) if names == "all" else [names]
    for n in names:
        if n not in EXPERIMENTS:
            raise ReproduceError(f"unknown experiment {n!r}; choose from {', '.join(EXPERIMENTS)} or all")
    if measure is not None:
        from ..window import WindowError, check_window

        try:
            check_window(measure, None)
        except WindowError as e:
            raise ReproduceError(str(e)) from None
        other = [n for n in names if n not in WINDOWED]
        if other:
            raise ReproduceError(f"--measure-jobs applies to {' and '.join(sorted(WINDOWED))} (their sources measure "
                                 f"a window of jobs), not to {', '.join(other)}")
    if preset not in PRESETS:
        raise ReproduceError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if trace is not None and names != ["muri"]:
        raise ReproduceError("--trace applies to muri only")
    d = data_dir(data)
    results = []
    for n in names:
        t0 = time.perf_counter()
        s = seeds if seeds is not None else DEFAULT_SEEDS[n]
        kw: dict[str, Any] = {"window": measure} if measure is not None else {}
        if trace is not None:
            kw["trace"] = trace
        res = EXPERIMENTS[n](d, preset, s if DEFAULT_SEEDS[n] > 1 or n in SEEDED else 1, limit, **kw)
        res.wall_s = time.perf_counter() - t0
        results.append(res)
    if out is not None:
        write(results, out)
    return results


def write(results: list[Result], out: str | Path) -> Path:
    """``reproduce.json``, a bar chart per experiment and ``reproduce.md`` (the table, the charts) in ``out``;
    returns the path of ``reproduce.md``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reproduce.json").write_text(json.dumps([r.as_dict() for r in results], indent=2))
    charts = [p for p in (plot(r, folder) for r in results) if p is not None]
    md = ["# gpuloom reproduce: published figures beside gpuloom's", "", "```", table(results).rstrip(), "```", ""]
    md += [f"![{p.stem}]({p.name})" for p in charts]
    path = folder / "reproduce.md"
    path.write_text("\n".join(md) + "\n")
    return path


__all__ = ["WINDOWED", "EXPERIMENTS", "PRESETS", "ReproduceError", "Result", "Row", "data_dir", "run", "table", "write"]
