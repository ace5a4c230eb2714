"""Per-queue metrics of a simulation: JCT, queueing delay, share received vs guaranteed, violations.

A :class:`QueueRecorder` is a :class:`~gpuloom.sim.engine.Simulator` observer:
after every round and completion it records the GPUs each queue holds (a job
counts its GPUs divided among its group's members, as the queue stage counts
them); after every round also the GPUs its waiting jobs ask for.  From those:

* **share** = GPUs held / GPUs in the cluster, over time;
* **deficit** = what a queue is owed but does not hold:
  ``max(0, min(guarantee, held + waiting) - held)`` GPUs; its time integral
  (GPU-hours) and the fraction of time it was at least one GPU are the
  guarantee's shortfall (zero under a queue stage honouring guarantees, except
  while placement cannot fit a waiting job);
* **over limit**: GPU-hours and rounds a queue held more than its limit (the
  queue stage's invariant says none).

The recorder reports against the queue stage's own tree, or against any tree
it is given (so a run without queues, global FIFO, is measured against the
same quotas).  :func:`queue_rows` joins this with each job's JCT and queueing
delay; :func:`write_queue_report` writes ``queues.csv``, ``queue_series.csv``
and ``queue_share.png`` (each queue's GPU share over time, its guarantee
dashed).  :func:`attach` is how :func:`~gpuloom.sim.runconfig.run_config`
adds a recorder to a run; the data travel in ``RunResult.extra["queues"]``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.job import Job
from ..core.queues import QueueTree

if TYPE_CHECKING:
    from rich.table import Table

    from .engine import Simulator
    from .metrics import RunResult

QUEUE_COLUMNS = (
    "queue", "guarantee", "limit", "weight", "jobs", "completed", "mean_jct", "p95_jct", "mean_queueing_delay",
    "guaranteed_share", "mean_share", "deficit_gpu_h", "short_time", "over_limit_gpu_h", "limit_violations",
)


class QueueRecorder:
    """Observer recording each leaf queue's GPUs held, and its deficit (see the module notes).

    It reads no pending reasons (``reads_reasons``), and keeps its totals from the driver's changes
    (:class:`~gpuloom.driver.Listener`, attached when the simulator is built): an event costs
    O(changes since the last one), not a pass over the running and waiting jobs; only the queues they touch
    are worked out again, and an event that touches none records nothing."""

    reads_reasons = False

    def __init__(self, tree: QueueTree | None = None, policy: Any = None) -> None:
        if tree is None and policy is None:
            raise ValueError("a queue recorder needs a tree or a queue stage")
        self.tree = tree
        self.policy = policy
        self.names: list[str] = []
        self.t: list[float] = []
        self.held: list[list[float]] = []
        self.deficit: list[list[float]] = []
        self.limit_violations: dict[str, int] = {}
        self._leaf: dict[str, str] = {}
        self._job_col: dict[str, int] = {}  # each job's column (queue_of's name in _col: names are only appended)
        self._tree_seen: QueueTree | None = None
        self._col: dict[str, int] = {}
        self._guarantee: list[float] = []
        self._limit: list[float] = []
        self._held: list[float] = []  # per column: GPUs held now
        self._demand: list[float] = []  # per column: GPUs the active jobs ask for
        self._asked: list[float] = []  # per column: GPUs the running jobs ask for
        self._waiting_now: list[float] = []  # per column: GPUs its waiting jobs asked for at the last round
        # per column, the last point's GPUs held and deficit; the columns changed since (their point, over-limit
        # state), those whose waiting GPUs to read again at the next round, and those over their limit
        self._row: list[float] = []
        self._deficit: list[float] = []
        self._dirty: set[int] = set()
        self._waited: set[int] = set()
        self._over: set[int] = set()
        # the driver's changes not counted yet: allocations (counted at every event), admissions and ends
        # (counted at rounds, when the queue stage's own tree knows every active job's queue)
        self._changes: list[tuple[Job, Any, Any]] = []
        self._comings: list[tuple[Job, int]] = []

    # the driver's changes (Listener) -----------------------------------------------------------
    def attach(self, sim: Simulator) -> None:
        """Follow ``sim``'s driver (the simulator calls this when it is built)."""
        sim.driver.listeners.append(self)

    def on_admit(self, job: Job) -> None:
        self._comings.append((job, 1))

    def on_hold(self, job: Job, old: Any, new: Any) -> None:
        self._changes.append((job, old, new))

    def on_end(self, job: Job) -> None:
        self._comings.append((job, -1))

    def _current_tree(self) -> QueueTree | None:
        return self.tree if self.tree is not None else self.policy.tree

    def queue_of(self, job: Job) -> str:
        q = self._leaf.get(job.id)
        if q is None:
            if self.tree is not None:
                q = self.tree.queues[self.tree.leaf_of(job.id, job.spec.attrs, job.spec.user)].name
            else:
                q = self.policy.queue_of(job)
            self._leaf[job.id] = q
        return q

    def __call__(self, sim: Simulator, event: str) -> None:
        tree = self.tree if self.tree is not None else self.policy.tree  # (_current_tree, inline: every event)
        if tree is None:
            return
        if tree is not self._tree_seen:  # (a queue stage's own tree grows as queue names appear)
            self._tree_seen = tree
            for i in tree.leaves:
                name = tree.queues[i].name
                if name not in self.names:
                    self.names.append(name)
            self._col = {n: k for k, n in enumerate(self.names)}
            self._guarantee = [tree.guarantee[tree.index[n]][0] if n in tree.index else 0.0 for n in self.names]
            self._limit = [tree.limit[tree.index[n]][0] if n in tree.index else math.inf for n in self.names]
            grow = len(self.names) - len(self._held)
            self._held += [0.0] * grow
            self._demand += [0.0] * grow
            self._asked += [0.0] * grow
            self._waiting_now += [0.0] * grow
            self._row += [0.0] * grow
            self._deficit += [0.0] * grow
            self._dirty.update(range(len(self.names)))  # (guarantees and limits read again)
        col, job_col, held, asked, dirty = self._col, self._job_col, self._held, self._asked, self._dirty
        # what runs: the allocations that changed since the last event (starts, ends, moves, regroups)
        for job, old, new in self._changes:
            k = job_col.get(job.id)
            if k is None:
                k = job_col[job.id] = col[self.queue_of(job)]
            dirty.add(k)
            if old is not None:
                held[k] -= old.num_gpus / (1 + len(old.group))
                if new is None:
                    asked[k] -= job.spec.gpus
            if new is not None:
                held[k] += new.num_gpus / (1 + len(new.group))
                if old is None:
                    asked[k] += job.spec.gpus
        self._changes.clear()
        waiting, row, deficit, g = self._waiting_now, self._row, self._deficit, self._guarantee
        if event == "round":
            # what is asked for: the GPUs of every active job, kept from arrivals and ends
            comings, demand, waited = self._comings, self._demand, self._waited
            gone = {job.id for job, sign in comings if sign < 0}
            came = {job.id for job, sign in comings if sign > 0}
            for job, sign in comings:
                if job.id in gone and job.id in came:
                    continue  # (came and went between two rounds: never counted)
                k = job_col.get(job.id)
                if k is None:
                    k = job_col[job.id] = col[self.queue_of(job)]
                demand[k] += sign * job.spec.gpus
                waited.add(k)
            comings.clear()
            # what waits, read at rounds only: where what is asked for or what runs changed since the last one
            waited |= dirty
            # (max(0.0, x) and min(a, b) written out, with the same results: builtin min and max cost about a
            # thousand instructions a call in Python 3.11; a whole number needs no rounding)
            for k in waited:
                x = demand[k] - asked[k]
                waiting[k] = x if x > 0.0 else 0.0
            dirty |= waited
            waited.clear()
        # the columns whose GPUs held or waiting changed: their point, and whether they are over their limit
        if dirty:
            limit, over = self._limit, self._over
            for k in dirty:
                x = held[k]
                # (sums of fractions: no -0.0 or 1e-16 left over)
                h = row[k] = (x if x.is_integer() else round(x, 9)) + 0.0
                m = h + waiting[k]
                gk = g[k]
                x = (m if m < gk else gk) - h
                deficit[k] = x if x > 0.0 else 0.0
                if held[k] > limit[k] + 1e-6:
                    over.add(k)
                else:
                    over.discard(k)
            if event != "round":
                self._waited |= dirty  # (what runs changed: what waits is read again at the next round)
        if event == "round" and self._over:
            for k in sorted(self._over):
                n = self.names[k]
                self.limit_violations[n] = self.limit_violations.get(n, 0) + 1
        if not dirty and self.t:
            return  # (nothing changed since the last point)
        dirty.clear()
        t = sim.now
        if self.t and self.t[-1] == t:
            self.held[-1], self.deficit[-1] = list(row), list(deficit)
        elif not self.t or self.held[-1] != row or self.deficit[-1] != deficit:
            self.t.append(t)
            self.held.append(list(row))
            self.deficit.append(list(deficit))

    def finish(self, sim: Simulator) -> dict[str, Any]:
        """The recorded data (plain values: they travel back from worker processes)."""
        tree = self._current_tree()
        job_queue = {}
        for j in sim.jobs:
            try:
                job_queue[j.id] = self.queue_of(j)
            except ValueError:
                continue
        n = len(self.names)
        info = {}
        if tree is not None:
            for name in self.names:
                i = tree.index.get(name)
                if i is not None:
                    info[name] = {"guarantee": tree.guarantee[i][0], "limit": tree.limit[i][0],
                                  "weight": tree.weight[i]}
        return {
            "names": list(self.names),
            "queues": info,
            "t": list(self.t),
            "held": [r if len(r) == n else r + [0.0] * (n - len(r)) for r in self.held],
            "deficit": [r if len(r) == n else r + [0.0] * (n - len(r)) for r in self.deficit],
            "limit_violations": dict(self.limit_violations),
            "job_queue": job_queue,
        }


def attach(sched: Any, tree: QueueTree | None = None) -> QueueRecorder | None:
    """A recorder for a run: against ``tree`` if given, else the scheduler's queue stage (None without one)."""
    if tree is not None:
        return QueueRecorder(tree)
    q = getattr(sched, "queue", None)
    if q is not None and q.enabled:
        return QueueRecorder(None, q)
    return None


# -- metrics ---------------------------------------------------------------------------------------
def _mean(t: np.ndarray, v: np.ndarray, start: float, end: float) -> float:
    """Time-weighted mean of a piecewise-constant series over [start, end] (0 before its first point)."""
    if end <= start or len(t) == 0:
        return 0.0
    edges = np.clip(np.append(t, end), start, end)
    return float((v * np.diff(edges)).sum() / (end - start))


def queue_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per queue (:data:`QUEUE_COLUMNS`); empty when the run recorded no queues."""
    d = result.extra.get("queues")
    if not d:
        return []
    names = d["names"]
    t = np.asarray(d["t"], dtype=float)
    held = np.asarray(d["held"], dtype=float).reshape(len(t), len(names))
    deficit = np.asarray(d["deficit"], dtype=float).reshape(len(t), len(names))
    start = min((j.arrival for j in result.jobs), default=0.0)
    end = result.span_end
    gpus = max(result.cluster_gpus, 1)
    by_queue: dict[str, list[Any]] = {n: [] for n in names}
    for j in result.jobs:
        q = d["job_queue"].get(j.id)
        if q in by_queue:
            by_queue[q].append(j)
    rows = []
    for k, name in enumerate(names):
        info = d["queues"].get(name, {})
        jobs = by_queue[name]
        jcts = [j.jct for j in jobs if j.jct is not None]
        delays = [j.queueing_delay for j in jobs if j.queueing_delay is not None]
        lim = info.get("limit", math.inf)
        over = np.maximum(held[:, k] - lim, 0.0) if math.isfinite(lim) else np.zeros(len(t))
        span_h = (end - start) / 3600.0
        rows.append({
            "queue": name,
            "guarantee": info.get("guarantee", 0.0),
            "limit": lim,
            "weight": info.get("weight", 1.0),
            "jobs": len(jobs),
            "completed": len(jcts),
            "mean_jct": float(np.mean(jcts)) if jcts else math.nan,
            "p95_jct": float(np.percentile(jcts, 95)) if jcts else math.nan,
            "mean_queueing_delay": float(np.mean(delays)) if delays else math.nan,
            "guaranteed_share": info.get("guarantee", 0.0) / gpus,
            "mean_share": _mean(t, held[:, k], start, end) / gpus,
            "deficit_gpu_h": _mean(t, deficit[:, k], start, end) * span_h,
            "short_time": _mean(t, (deficit[:, k] >= 1 - 1e-9).astype(float), start, end),
            "over_limit_gpu_h": _mean(t, over, start, end) * span_h,
            "limit_violations": d["limit_violations"].get(name, 0),
        })
    return rows


def write_queue_report(result: RunResult, out_dir: str | Path, plot: bool = True) -> list[Path]:
    """``queues.csv``, ``queue_series.csv`` and (``plot``) ``queue_share.png`` in ``out_dir``."""
    rows = queue_rows(result)
    if not rows:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "queues.csv", out / "queue_series.csv"]
    with open(paths[0], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(QUEUE_COLUMNS)
        for r in rows:
            w.writerow([csv_cell(r[c]) for c in QUEUE_COLUMNS])
    d = result.extra["queues"]
    with open(paths[1], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", *(f"held:{n}" for n in d["names"]), *(f"deficit:{n}" for n in d["names"])])
        for t, h, df in zip(d["t"], d["held"], d["deficit"], strict=True):
            w.writerow([csv_cell(t), *map(csv_cell, h), *map(csv_cell, df)])
    if plot:
        paths.append(plot_queue_share(result, out / "queue_share.png"))
    return paths


def csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else ("inf" if math.isinf(v) else repr(v))
    return str(v)


def plot_queue_share(result: RunResult, path: str | Path, max_queues: int = 16) -> Path:
    """Each queue's GPU share over time (time-binned mean with its min-max band), guarantee dashed.

    Small multiples, largest guarantees first; beyond ``max_queues`` the rest are left out (named in the title).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .plots import binned_series

    d = result.extra["queues"]
    names = d["names"]
    info = d["queues"]
    order = sorted(range(len(names)), key=lambda k: (-info.get(names[k], {}).get("guarantee", 0.0), names[k]))
    shown = order[:max_queues]
    cols = 2 if len(shown) > 4 else 1
    rows = math.ceil(len(shown) / cols)
    fig = Figure(figsize=(8 * cols / 1.3, 1.6 * rows + 0.9), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    t = np.asarray(d["t"], dtype=float)
    held = np.asarray(d["held"], dtype=float).reshape(len(t), len(names))
    end = result.span_end
    gpus = max(result.cluster_gpus, 1)
    span = end - (t[0] if len(t) else 0.0)
    scale, unit = (3600.0, "h") if span >= 36_000 else ((60.0, "min") if span >= 600 else (1.0, "s"))
    for ax, k in zip(axes, shown, strict=False):
        e, m, lo, hi = binned_series(t, held[:, k] / gpus, end, 600)
        if len(m):
            x = e / scale
            ax.plot(x, np.append(m, m[-1]), drawstyle="steps-post", lw=1.0)
            if lo is not m:
                ax.fill_between(x, np.append(lo, lo[-1]), np.append(hi, hi[-1]), step="post", alpha=0.25, lw=0)
        g = info.get(names[k], {}).get("guarantee", 0.0) / gpus
        ax.axhline(g, ls="--", lw=1.0, color="black")
        ax.set_ylabel(names[k], fontsize=7)
        ax.tick_params(labelsize=7)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    for ax in axes[-cols:]:
        ax.set_xlabel(f"time ({unit})", fontsize=8)
    more = f" ({len(names) - len(shown)} more not shown)" if len(names) > len(shown) else ""
    fig.suptitle(f"GPU share per queue (dashed: guarantee): {result.label}{more}", fontsize=9)
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.5 / (1.6 * rows + 0.9), bottom=0.6 / (1.6 * rows + 0.9),
                        hspace=0.25, wspace=0.2)
    p = Path(path)
    fig.savefig(p)
    return p


def queue_table(results: Mapping[str, RunResult]) -> Table:
    """A rich table: one row per queue (and run, for several), times in hours."""
    from rich.table import Table

    several = len(results) > 1
    t = Table(title="per queue: mean JCT and queueing delay, GPU share vs quota, GPU-hours owed but not held",
              box=None)
    for c in (["queue", "run"] if several else ["queue"]):
        t.add_column(c)
    cols = (("guarantee", "quota"), ("jobs", "jobs"), ("completed", "done"), ("mean_jct", "JCT"),
            ("mean_queueing_delay", "wait"), ("mean_share", "share"), ("guaranteed_share", "quota %"),
            ("deficit_gpu_h", "short GPU-h"), ("limit_violations", "over"))
    for _, title in cols:
        t.add_column(title, justify="right")
    for label, res in results.items():
        for r in queue_rows(res):
            head = [r["queue"], label] if several else [r["queue"]]
            t.add_row(*head, *(_fmt(c, r[c]) for c, _ in cols))
    return t


def _fmt(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if col == "guarantee":
        return f"{v:g}"
    if col.endswith("_jct") or col.endswith("delay"):
        return f"{v / 3600:,.2f} h"
    if col.endswith("share") or col == "short_time":
        return f"{v:.1%}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)
