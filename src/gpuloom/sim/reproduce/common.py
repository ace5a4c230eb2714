"""What every reproduction returns: rows of published vs gpuloom figures, with their sources."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PRESETS = ("paper", "artifact")


class ReproduceError(ValueError):
    """A reproduction that cannot run (missing data, bad preset)."""


@dataclass
class Row:
    """One figure: ``published`` (None where the source states only a direction) and ours over seeds."""

    setting: str
    metric: str
    unit: str
    published: float | None
    source: str  # table / figure / section of the published figure
    values: list[float] = field(default_factory=list)  # gpuloom, one per seed
    other: float | None = None  # the source's own simulator run here on the same input (Result.other_label)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def spread(self) -> float | None:
        """Standard deviation over seeds (None for one deterministic run)."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(mean=self.mean, spread=self.spread)
        return d


@dataclass
class Result:
    name: str
    preset: str
    title: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    seeds: int = 1
    wall_s: float = 0.0
    other_label: str = ""  # a column for Row.other (e.g. "Gavel's simulator"); none when empty

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "preset": self.preset, "title": self.title, "seeds": self.seeds,
                "wall_s": self.wall_s, "notes": self.notes, "rows": [r.as_dict() for r in self.rows]}


def data_dir(data: str | Path | None) -> Path:
    """``--data``, else the data folder :func:`gpuloom.perf.datadir.data_dir` finds (``$GPULOOM_DATA``,
    else ``../shared/data`` beside the checkout); a :class:`ReproduceError` saying where it looked."""
    from ...perf.datadir import DataDirError, require_data_dir

    try:
        return require_data_dir(data)
    except DataDirError as e:
        raise ReproduceError(str(e)) from None


def need(path: Path) -> Path:
    if not path.exists():
        raise ReproduceError(f"missing input {path}")
    return path


def fmt(v: float | None, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "%":
        return f"{v:.1f} %"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3f}"


def table(results: Sequence[Result]) -> str:
    """Plain-text side-by-side table of every result."""
    lines = []
    for res in results:
        seeds = f", {res.seeds} seeds (mean ± sd)" if res.seeds > 1 else ""
        lines.append(f"== {res.title} [preset {res.preset}{seeds}; {res.wall_s:.1f} s]")
        w = max([len(r.setting) for r in res.rows] + [7])
        m = max([len(r.metric) + len(r.unit) + 3 for r in res.rows] + [6])
        o = res.other_label
        ow = max(len(o), 10)
        other = f"  {o:>{ow}}" if o else ""
        lines.append(f"{'setting':<{w}}  {'metric':<{m}}  {'published':>12}{other}  {'gpuloom':>18}  source")
        for r in res.rows:
            ours = fmt(r.mean, r.unit)
            if r.spread is not None:
                ours += f" ± {fmt(r.spread, r.unit).replace(' %', '')}"
            metric = f"{r.metric} ({r.unit})" if r.unit else r.metric
            theirs = f"  {fmt(r.other, r.unit):>{ow}}" if o else ""
            lines.append(f"{r.setting:<{w}}  {metric:<{m}}  {fmt(r.published, r.unit):>12}{theirs}  {ours:>18}"
                         f"  {r.source}")
        for n in res.notes:
            lines.append(f"  note: {n}")
        lines.append("")
    return "\n".join(lines)


def plot(res: Result, folder: Path) -> Path | None:
    """Bars of published vs gpuloom (error bars over seeds) per row; PNG in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res.rows if not math.isnan(r.mean)]
    if not rows:
        return None
    units = sorted({r.unit for r in rows})
    fig, axes = plt.subplots(len(units), 1, figsize=(max(6, 0.9 * len(rows)), 3.2 * len(units)), squeeze=False)
    for ax, unit in zip(axes[:, 0], units, strict=True):
        rs = [r for r in rows if r.unit == unit]
        x = range(len(rs))
        pub = [r.published if r.published is not None else math.nan for r in rs]
        if res.other_label:  # three bars: published, the source's simulator, gpuloom
            oth = [r.other if r.other is not None else math.nan for r in rs]
            ax.bar([i - 0.27 for i in x], pub, 0.27, label="published", color="#999999")
            ax.bar(list(x), oth, 0.27, label=res.other_label, color="#c9a227")
            ax.bar([i + 0.27 for i in x], [r.mean for r in rs], 0.27, label="gpuloom", color="#3b6ea5",
                   yerr=[r.spread or 0.0 for r in rs], capsize=3)
        else:
            ax.bar([i - 0.2 for i in x], pub, 0.4, label="published", color="#999999")
            ax.bar([i + 0.2 for i in x], [r.mean for r in rs], 0.4, label="gpuloom", color="#3b6ea5",
                   yerr=[r.spread or 0.0 for r in rs], capsize=3)
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{r.setting}\n{r.metric}" for r in rs], fontsize=7)
        ax.set_ylabel(unit or "value")
        ax.legend(fontsize=8)
    fig.suptitle(f"{res.title} ({res.preset})", fontsize=10)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"reproduce_{res.name}_{res.preset}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
