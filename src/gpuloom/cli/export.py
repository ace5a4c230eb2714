"""Writing the service's history as a trace (``gpuloom history --as-trace FILE``).

The rows come from the service (``GET /history/trace``, :mod:`gpuloom.runtime.state.export`);
this module writes them as gpuloom's JSONL trace format and reads the file back with
the simulator's reader (:func:`gpuloom.sim.traces.own.read_jsonl`), so what it writes is
known to replay.  Beside it goes the cluster the jobs ran on (``GET /nodes``) as a
cluster file (``FILE`` with the suffix ``.cluster.toml``), so the pair replays
without the service: ``gpuloom simulate --trace FILE --cluster FILE.cluster.toml``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from .common import console, err_console


def cluster_path(trace: Path) -> Path:
    """``week.jsonl`` -> ``week.cluster.toml``."""
    return trace.with_name(trace.stem + ".cluster.toml")


def cluster_toml(nodes: Sequence[Mapping[str, Any]]) -> str:
    """A cluster file (``[[nodes]]`` groups of identical nodes) for nodes as ``GET /nodes`` lists them."""
    groups: list[tuple[tuple[int, int, int, str], int]] = []
    for n in nodes:
        key = (int(n["gpus"]), int(n["cpus"]), int(n["mem_mb"]), str(n.get("gpu_type") or "generic"))
        if groups and groups[-1][0] == key:
            groups[-1] = (key, groups[-1][1] + 1)
        else:
            groups.append((key, 1))
    out = ["# the cluster the exported jobs ran on (gpuloom history --as-trace)"]
    for (g, c, m, t), count in groups:
        out += ["", "[[nodes]]", f"count = {count}", f"gpus = {g}", f"cpus = {c}", f"mem_mb = {m}",
                f"gpu_type = {json.dumps(t)}"]
    return "\n".join(out) + "\n"


def write_trace(rows: Sequence[dict[str, Any]], path: Path, as_json: bool = False,
                nodes: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Write trace rows as JSONL to ``path`` (atomically), check the simulator reads them, and the cluster beside."""
    from ..core.cluster import load_cluster_file
    from ..sim.traces.own import read_jsonl

    if not rows:
        err_console.print(f"no finished job matches: {path} not written", highlight=False)
        raise typer.Exit(1)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    try:
        trace = read_jsonl(tmp)
    except Exception:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    cfile = None
    if nodes:
        cfile = cluster_path(path)
        cfile.write_text(cluster_toml(nodes))
        load_cluster_file(cfile)  # what was written reads back
    jobs = trace.jobs
    summary = {"file": str(path), "cluster": None if cfile is None else str(cfile), "jobs": len(jobs),
               "gpu_hours": round(sum(j.gpus * j.duration for j in jobs) / 3600.0, 4),
               "span_s": round(max((j.arrival for j in jobs), default=0.0), 3)}
    if as_json:
        console.print_json(json.dumps(summary))
        return
    replay = f"gpuloom simulate --trace {path}" + (f" --cluster {cfile}" if cfile is not None else "")
    console.print(f"wrote {len(jobs)} finished jobs to {path}" + (f" and their cluster to {cfile}" if cfile else "")
                  + f"\nreplay: {replay}", highlight=False, soft_wrap=True)
