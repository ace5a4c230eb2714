"""Queue trees made from a trace: one queue per virtual cluster, quotas from demand or from a VC config.

Philly's virtual clusters (``attrs["queue"]``, from its ``cluster`` column)
become flat queues.  Their guaranteed GPUs split the cluster:

A job's queue is its ``attrs["queue"]``, else its user's name, else
``default`` (so a trace without queues shares the cluster between users).

* :func:`demand_quotas`: in proportion to each queue's GPU demand in the trace
  (GPU-seconds asked for), as an operator sizing quotas from history would;
* :func:`config_quotas`: in proportion to another cluster's VC sizes, e.g.
  Venus' VC configuration (``helios/venus_vc_config_from_Lucid.csv``: VC name,
  nodes): the largest VC's share goes to the queue with the largest demand,
  the second to the second, and so on (the two traces share no VC names).

Guarantees are whole GPUs summing to the cluster (largest remainders); each
queue's weight is its guaranteed share (at least 1/1000, so a queue with no
guarantee still borrows); limits are unset unless ``limit_factor`` caps each
queue at that multiple of its guarantee.  :func:`quota_spec` reads the
``--queues`` forms ``demand`` and ``config:FILE``.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..core.job import JobSpec
from ..core.queues import Queue, QueueError, QueueTree, Quota


def queue_demand(specs: Sequence[JobSpec], attr: str = "queue") -> dict[str, float]:
    """GPU-seconds each queue's jobs ask for (jobs without ``attrs[attr]`` count under ``default``)."""
    out: dict[str, float] = {}
    for s in specs:
        q = str((s.attrs or {}).get(attr) or s.user or "default")
        out[q] = out.get(q, 0.0) + s.gpus * s.duration
    return out


def split(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Whole shares of ``total`` in proportion to ``weights`` (largest remainders; ties by name)."""
    s = sum(weights.values())
    if s <= 0 or total < 0:
        raise QueueError("cannot split quotas: no demand")
    raw = {k: total * w / s for k, w in weights.items()}
    out = {k: int(v) for k, v in raw.items()}
    left = total - sum(out.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def tree_from_shares(guarantees: Mapping[str, int], total: int, limit_factor: float | None = None,
                     order: Sequence[str] | None = None, specs: Sequence[JobSpec] = ()) -> QueueTree:
    """Flat queues with these GPU guarantees, weights = guaranteed share, limits = ``limit_factor`` × guarantee.

    With ``specs``, a job that names no queue finds the one :func:`queue_demand` counted it under: its
    user's (as the user's default queue), else ``default``."""
    names = list(order or sorted(guarantees))
    qs = []
    for n in names:
        g = guarantees.get(n, 0)
        lim = None if limit_factor is None else max(1.0, g * limit_factor)
        qs.append(Queue(n, None, Quota(gpus=g), Quota(gpus=lim), max(g / max(total, 1), 1e-3)))
    users = {s.user: s.user for s in specs if not (s.attrs or {}).get("queue") and s.user and s.user in names}
    default = "default" if "default" in names else None
    return QueueTree(qs, default, users)


def demand_quotas(specs: Sequence[JobSpec], total_gpus: int, limit_factor: float | None = None) -> QueueTree:
    """One queue per queue name in the trace; guarantees in proportion to GPU demand."""
    d = queue_demand(specs)
    return tree_from_shares(split(total_gpus, d), total_gpus, limit_factor, sorted(d, key=lambda k: -d[k]), specs)


def read_vc_config(path: str | Path) -> dict[str, float]:
    """A VC configuration CSV: a VC name column and a size column (Venus': ``,num``); errors name the line."""
    p = Path(path)
    try:
        rows = list(csv.reader(p.read_text().splitlines()))
    except OSError as e:
        raise QueueError(f"{p}: cannot read: {e.strerror}") from None
    out: dict[str, float] = {}
    for k, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2:
            raise QueueError(f"{p}:{k}: expected a VC name and a size, got {row!r}")
        try:
            size = float(row[1])
        except ValueError:
            raise QueueError(f"{p}:{k}: size must be a number, got {row[1]!r}") from None
        if size < 0:
            raise QueueError(f"{p}:{k}: size must be >= 0, got {size}")
        out[row[0].strip()] = size
    if not out:
        raise QueueError(f"{p}: no VCs")
    return out


def config_quotas(specs: Sequence[JobSpec], total_gpus: int, sizes: Mapping[str, float],
                  limit_factor: float | None = None) -> tuple[QueueTree, dict[str, str]]:
    """Guarantees in proportion to another cluster's VC sizes, matched by rank of demand.

    Returns the tree and the match (queue -> VC).  Queues beyond the number of
    VCs get no guarantee; VCs beyond the number of queues are left out.
    """
    d = queue_demand(specs)
    queues = sorted(d, key=lambda k: (-d[k], k))
    vcs = sorted(sizes, key=lambda k: (-sizes[k], k))
    match = dict(zip(queues, vcs, strict=False))
    g = split(total_gpus, {q: sizes[v] for q, v in match.items()})
    return tree_from_shares({q: g.get(q, 0) for q in queues}, total_gpus, limit_factor, queues, specs), match


def quota_spec(spec: str, specs: Sequence[JobSpec], total_gpus: int) -> QueueTree | str:
    """``--queues``: ``demand``, ``config:FILE`` (a VC configuration CSV), or a TOML file (returned as is)."""
    if spec == "demand":
        return demand_quotas(specs, total_gpus)
    if spec.startswith("config:"):
        return config_quotas(specs, total_gpus, read_vc_config(spec.removeprefix("config:")))[0]
    return spec
