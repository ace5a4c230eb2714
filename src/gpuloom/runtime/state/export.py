"""The service's history as a trace: what ran here, replayable in the simulator without the service.

:func:`export_trace` turns the store's finished jobs (their specs, the
``allocations`` they held and their events) and their logs' ``GPULOOM_PROGRESS``
lines into rows of gpuloom's own JSONL trace format (``sim/traces/own.py``;
``gpuloom history --as-trace FILE`` writes them), one per job:

* ``id`` (the service's job id), ``arrival`` (seconds after the first exported
  submission), ``gpus``, ``cpus``, ``mem_mb`` (as asked; absent = GPU-proportional),
  ``model``, ``user``;
* ``iterations``: the work the job did (its last progress line), and
  ``iter_time``: seconds per iteration at its *reference* allocation - its GPUs
  on one node, GPU-proportional cores and memory, alone - so that
  ``iterations x iter_time`` is its work in the simulator's units
  (:mod:`gpuloom.core.job`).  Measured (see "Speeds" below);
* ``attrs``:

  - ``allocations``: every allocation it held: ``start``/``end`` (seconds on
    the trace's clock), ``gpus``, ``cpus``, ``mem_mb``, ``group`` (co-runners'
    ids), ``opened_by``, and what was measured in it: ``iters``, ``it_s``
    (iterations per second from its progress lines), ``launch_s`` (launch to
    first progress line);
  - ``profile``: a CPU/memory profile record (:mod:`gpuloom.perf.profile_record`):
    the one the service stored for its model, the one it was submitted with, or
    one made from the throughput it measured alone on its requested GPUs at
    two or more core counts or memory sizes (``source: "measured"``);
  - ``throughput``: its scaling curve ``{gpus: it/s}`` where it ran alone at two
    or more GPU counts (GPU-proportional cores), the table
    :mod:`gpuloom.perf.scaling` reads;
  - ``launch_time``, ``checkpoint_time``: its mean measured launch (to the first
    progress line) and stop (SIGTERM to exit) times, which the simulator's
    lifecycle honours per job (``core/lifecycle.py: LifecycleTimes``); a job
    never stopped gets the export's mean stop time;
  - what the job asked for that policies read (``resource_times``,
    ``iteration_time``, ``batch_size``, ``priority``, ``min_gpus``);
  - the outcome, for comparison with a replay: ``name``, ``submit`` (ISO),
    ``jct_s`` (submission to end), ``wait_s`` (to first start),
    ``preemptions``.

Speeds.  A job's reference speed comes from the allocations it held alone on
its requested GPUs, first match wins: their iteration-weighted rate where they
had GPU-proportional cores and memory; their rates brought to the
proportional point through its profile (``rate x profile(proportional) /
profile(held)``: the model's sensitivity factor then gives back the measured
rate at the cores it held); their plain rate.  A job that only ever shared GPUs
gets its shared rates over what the model says sharing and its cores cost it
there (:func:`shared_references`: ``interleave_model=shared``, the way the
service runs groups), where its and its co-runners' ``resource_times`` allow;
else its iterations over the seconds it ran (an underestimate: its co-runners
slowed it down).  ``attrs["reference"]`` says which: ``measured``, ``profile``,
``alone``, ``model``, ``running`` (or ``held``: progress lines without times).
Co-running jobs' rates are kept in ``allocations``; the model's interleaving
factor explains them from ``resource_times``.

``exit_s`` is the time from the job's last progress line to its end as the
service recorded it (the process exiting and the service noticing).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.cluster import Cluster
from ...core.lifecycle import JobState
from ...perf.profile_record import OK, is_record, profile_from_record, record_from_points
from ...perf.sensitivity import SensitivityError
from ..exec.progress import Point, ProgressTail
from .history import iso
from .specs import profile_key
from .store import JobRow, Store

#: spec fields policies read, carried into the trace's attrs as they were submitted
CARRIED = ("resource_times", "iteration_time", "batch_size", "priority", "min_gpus", "throughput", "gpu_type")
#: allocations opened by these events start a process (a launch time can be measured)
LAUNCHES = ("launch", "resume", "move", "resize")


def span_rate(points: Sequence[Point], start: float, end: float) -> tuple[float | None, int, float, float | None]:
    """(it/s, iterations, seconds measured, first point's time) of the progress points in [start, end]."""
    pts = [p for p in points if start <= p.t <= end]
    if not pts:
        return None, 0, 0.0, None
    # a restart from an older checkpoint drops iter: measure the last segment only
    k = max((i for i in range(1, len(pts)) if pts[i].iter < pts[i - 1].iter), default=0)
    seg = pts[k:]
    dt = seg[-1].t - seg[0].t
    n = seg[-1].iter - seg[0].iter
    return (n / dt if dt > 0 and len(seg) > 1 else None), n, dt, pts[0].t


def _part_sums(alloc: Mapping[str, Any]) -> tuple[int, int, int, tuple[str, ...]]:
    parts = alloc.get("parts", [])
    return (sum(len(p.get("gpus", ())) for p in parts), sum(int(p.get("cpus", 0)) for p in parts),
            sum(int(p.get("mem_mb", 0)) for p in parts), tuple(str(p["node"]) for p in parts))


def _proportional(cluster: Cluster | None, nodes: tuple[str, ...], gpus: int) -> tuple[int, int] | None:
    if cluster is None or len(nodes) != 1:
        return None
    try:
        return cluster.proportional(cluster.node_index(nodes[0]), gpus)
    except (KeyError, ValueError, IndexError):
        return None


def _stop_times(events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Seconds from each SIGTERM (entry to checkpointing/stopping) to the job's standby after it."""
    out, t0 = [], None
    for e in events:
        k = e["kind"]
        if k in (JobState.CHECKPOINTING.value, JobState.STOPPING.value) and t0 is None:
            t0 = e["time"]
        elif t0 is not None and (k == "preempt" or k.startswith("stop-for-")):
            out.append(e["time"] - t0)
            t0 = None
    return out


def _mean(xs: Iterable[float]) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(v) / len(v) if v else None


#: an allocation a job held alone: GPUs, cores, MB, it/s, iterations, its GPU-proportional (cores, MB) if known
Solo = tuple[int, int, int, float, int, tuple[int, int] | None]


def reference_rate(solo: Sequence[Solo], gpus: int, profile: Mapping[str, Any] | None, key: str,
                   cluster: Cluster | None) -> tuple[float | None, str]:
    """(It/s at the reference allocation from the job's solo allocations, how: ``measured``, ``profile`` or
    ``alone``; see "Speeds" in the module notes)."""
    mine = [x for x in solo if x[0] == gpus]
    if not mine:
        return None, ""

    def wmean(xs: Sequence[tuple[float, int]]) -> float:
        w = sum(max(1, n) for _, n in xs)
        return sum(v * max(1, n) for v, n in xs) / w

    at_ref = [(x[3], x[4]) for x in mine if x[5] is not None and (x[1], x[2]) == x[5]]
    if at_ref:
        return wmean(at_ref), "measured"
    prof = None
    if profile is not None:
        try:
            prof = profile_from_record(key, profile)
        except SensitivityError:
            prof = None
    if prof is not None:
        scaled = []
        for g, c, m, r, n, prop in mine:
            if prop is None and cluster is not None and len(cluster.nodes) == 1:
                prop = cluster.proportional(0, g)
            here = prof.throughput_at(c, m, g)
            if prop is not None and here > 0:
                scaled.append((r * prof.throughput_at(prop[0], prop[1], g) / here, n))
        if scaled:
            return wmean(scaled), "profile"
    return wmean([(x[3], x[4]) for x in mine]), "alone"


def shared_references(rows: list[dict[str, Any]], cluster: Cluster | None) -> None:
    """Jobs that only ever shared GPUs: their reference speed from their shared allocations, through the model.

    Each measured rate is divided by the speed the throughput model gives the job
    there (its profile for the cores it held, ``interleave_model=shared`` for its
    co-runners, as the service runs them), where the co-runners are exported
    too and the job has stage profiles; ``attrs["reference"]`` becomes ``model``.
    """
    todo = [r for r in rows if r["attrs"].get("reference") == "running"]
    if not todo or cluster is None:
        return
    from ...core.job import Job, JobSpec
    from ...core.plan import Allocation, Part
    from ...perf.assembly import build_model

    specs: dict[str, JobSpec] = {}
    for r in rows:
        a = r["attrs"]
        prof = None
        if is_record(a.get("profile")):
            try:
                prof = profile_from_record(r["id"], a["profile"])
            except SensitivityError:
                prof = None
        specs[r["id"]] = JobSpec.from_iterations(
            r["id"], r["arrival"], r["gpus"], r["iterations"], r["iter_time"], profile=prof,
            attrs={k: a[k] for k in ("resource_times", "iteration_time") if a.get(k) is not None})
    model = build_model(cluster, {"interleave_model": "shared"}, list(specs.values()))
    jobs = {k: Job(v) for k, v in specs.items()}
    model.bind(jobs)
    for r in todo:
        acc = []
        for a in r["attrs"]["allocations"]:
            if not a.get("it_s") or len(a["nodes"]) != 1 or any(str(g) not in jobs for g in a["group"]):
                continue
            try:
                node = cluster.node_index(a["nodes"][0])
                alloc = Allocation(r["id"], (Part(node, tuple(range(a["gpus"])), a["cpus"], a["mem_mb"]),),
                                   tuple(str(g) for g in a["group"]))
                f = model.speed(jobs[r["id"]], alloc)
            except (KeyError, ValueError):  # an unknown node, a co-runner without a stage profile
                continue
            if f > 0:
                acc.append((a["it_s"] / f, max(1, int(a.get("iters") or 0))))
        if acc:
            ref = sum(v * w for v, w in acc) / sum(w for _, w in acc)
            r["iter_time"] = 1.0 / ref
            r["attrs"]["reference"] = "model"


def job_row(row: JobRow, spans: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
            points: Sequence[Point], origin: float, cluster: Cluster | None = None,
            stored_profile: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """One trace row (see the module notes); None for a job that reported no progress."""
    spec = row.spec
    gpus = int(spec["gpus"])
    iters = row.progress if row.progress is not None else (points[-1].iter if points else None)
    if not iters or iters <= 0:
        return None
    allocs: list[dict[str, Any]] = []
    solo: list[Solo] = []
    launches: list[float] = []
    run_s = 0.0
    end_wall = row.end_time
    for s in spans:
        end = s["end_time"] if s["end_time"] is not None else end_wall
        if end is None:
            continue
        g, c, m, nodes = _part_sums(s["alloc"])
        group = [str(x) for x in s["alloc"].get("group", [])]
        rate, n, dt, first = span_rate(points, s["start_time"], end)
        launch = None
        if s["opened_by"] in LAUNCHES and first is not None:
            launch = max(0.0, first - s["start_time"])
            launches.append(launch)
        run_s += dt
        a: dict[str, Any] = {"start": round(s["start_time"] - origin, 3), "end": round(end - origin, 3), "gpus": g,
                             "cpus": c, "mem_mb": m, "nodes": list(nodes), "group": group,
                             "opened_by": s["opened_by"], "iters": n,
                             "it_s": None if rate is None else round(rate, 6),
                             "launch_s": None if launch is None else round(launch, 3)}
        allocs.append(a)
        if rate is not None and rate > 0 and not group:
            solo.append((g, c, m, rate, n, _proportional(cluster, nodes, g)))

    profile: Mapping[str, Any] | None = None
    if stored_profile is not None and stored_profile.get("status") == OK:
        profile = stored_profile
    elif is_record(spec.get("profile")):
        profile = spec["profile"]
    else:
        at_size = [(c, m, r) for g, c, m, r, _, _ in solo if g == gpus]
        if len({(c, m) for c, m, _ in at_size}) >= 2:
            props = {p for g, _, _, _, _, p in solo if g == gpus and p is not None}
            profile = record_from_points(gpus, at_size, next(iter(props)) if len(props) == 1 else None)

    ref, how = reference_rate(solo, gpus, profile, profile_key(spec), cluster)
    if ref is None and run_s > 0:  # it only ever shared GPUs: its iterations over the seconds it ran
        ref, how = iters / run_s, "running"
    if ref is None and row.held_time > 0:  # progress lines without t=: the seconds it held resources
        ref, how = iters / row.held_time, "held"
    if ref is None or not ref > 0:
        return None

    attrs: dict[str, Any] = {"name": row.name, "submit": iso(row.submit_time),
                             "jct_s": None if row.end_time is None else round(row.end_time - row.submit_time, 3),
                             "wait_s": None if row.first_start is None else round(row.first_start - row.submit_time, 3),
                             "preemptions": row.preemptions, "reference": how, "allocations": allocs}
    for k in CARRIED:
        if spec.get(k) is not None:
            attrs[k] = spec[k]
    counts: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for g, c, m, r, n, p in solo:
        if p is not None and (c, m) == p:
            counts[g].append((r, max(1, n)))
    if len(counts) >= 2 and "throughput" not in attrs:
        attrs["throughput"] = {str(g): round(sum(r * w for r, w in v) / sum(w for _, w in v), 6)
                               for g, v in sorted(counts.items())}
    if profile is not None:
        attrs["profile"] = dict(profile)
    if row.end_time is not None and points:
        attrs["exit_s"] = round(max(0.0, row.end_time - points[-1].t), 3)
    lt = _mean(launches)
    if lt is not None:
        attrs["launch_time"] = round(lt, 3)
    st = _mean(_stop_times(events))
    if st is not None:
        attrs["checkpoint_time"], attrs["stop_time"] = round(st, 3), 0.0  # SIGTERM to exit, all of it
    out: dict[str, Any] = {"id": str(row.id), "arrival": round(max(0.0, row.submit_time - origin), 3), "gpus": gpus,
                           "iterations": int(iters), "iter_time": 1.0 / ref}
    for k in ("model",):
        if spec.get(k):
            out[k] = str(spec[k])
    if row.user:
        out["user"] = row.user
    for k in ("cpus", "mem_mb"):
        if spec.get(k) is not None:
            out[k] = int(spec[k])
    out["attrs"] = attrs
    return out


def export_trace(store: Store, log_dir: str | Path, cluster: Cluster | None = None, user: str | None = None,
                 since: float | None = None, until: float | None = None,
                 job_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The finished jobs that match, as trace rows in submission order (see the module notes).

    ``since``/``until`` (wall seconds) keep the jobs active in that window, as ``gpuloom history`` does.
    """
    rows = store.list_jobs([JobState.FINISHED.value], user=user, since=since, until=until)
    if job_ids is not None:
        keep = set(job_ids)
        rows = [r for r in rows if r.id in keep]
    if not rows:
        return []
    rows.sort(key=lambda r: (r.submit_time, r.id))
    ids = [r.id for r in rows]
    spans: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for s in store.allocations(ids if len(ids) < 500 else None):
        spans[s["job_id"]].append(s)
    events: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for e in store.events(None):
        if e["job_id"] is not None:
            events[e["job_id"]].append(e)
    origin = rows[0].submit_time
    profiles: dict[str, Mapping[str, Any] | None] = {}
    out = []
    for r in rows:
        key = profile_key(r.spec)
        if key not in profiles:
            profiles[key] = store.get_profile(key)
        tail = ProgressTail(Path(log_dir) / f"{r.id}.log")
        tail.read()
        rec = job_row(r, spans[r.id], events[r.id], tail.points, origin, cluster, profiles[key])
        if rec is not None:
            out.append(rec)
    shared_references(out, cluster)
    # jobs never stopped here get the export's mean stop time (a replay may stop them)
    mean_stop = _mean(x["attrs"]["checkpoint_time"] for x in out if "checkpoint_time" in x["attrs"])
    mean_launch = _mean(x["attrs"]["launch_time"] for x in out if "launch_time" in x["attrs"])
    for x in out:
        if mean_stop is not None and "checkpoint_time" not in x["attrs"]:
            x["attrs"]["checkpoint_time"], x["attrs"]["stop_time"] = round(mean_stop, 3), 0.0
        if mean_launch is not None:
            x["attrs"].setdefault("launch_time", round(mean_launch, 3))
    return out
