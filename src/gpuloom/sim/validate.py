"""Validating the simulator against the real service: the workload, its simulation, the errors.

``gpuloom validate`` (:mod:`gpuloom.cli.validate`) runs one workload through a
real ``gpuloom serve`` on a declared fake-GPU cluster and through the
simulator, under the same policy stacks.  This module is the simulator's half
and the comparison; the service's half (a server, real processes) is in
:mod:`gpuloom.cli.testbed`.

The workload (:func:`scale_workload`).  A time-scaled slice of a real trace:
``n`` consecutive jobs from ``start``; GPUs divided by ``gpu_div`` (Muri's
8-GPU jobs on a 1x4 cluster become 1-GPU jobs) and capped at a node; every
iteration time scaled so the slice's median iteration takes ``step_s``; work
(iterations x iteration time) scaled so the median job runs ``median_s``
alone, clipped to ``[lo_s, hi_s]``; arrivals spread over ``span_s``.  Each
job is a :class:`TestbedJob`: three stages per iteration (Muri's stage
profile, :func:`~gpuloom.perf.interleave.stage_profile`, scaled): CPU (data
loading), GPU, network.  The real job is ``examples/sleepy_train.py
--stages CPU,GPU,NET --cpu-ref R --gpu-lock-dir DIR`` (:meth:`TestbedJob.command`):

* its CPU stage is quoted at its GPU-proportional cores and saturates at
  ``cpu_ref`` cores (twice the proportional share for jobs whose data loading
  is at least 40 % of an iteration, the proportional share otherwise): fewer
  cores slow it down, more help only CPU-bound jobs - so sizing matters;
* GPU and network stages hold per-GPU locks: jobs sharing GPUs take turns on
  each, their CPU stages overlap - so grouping matters.

The simulator gets the same job (:meth:`TestbedJob.spec`): ``iterations`` and
the solo iteration time at the reference allocation, the stage times
(``resource_times``, what Muri's interleaving factor reads) and the CPU profile
as a record (:func:`TestbedJob.profile_record`: ``1 / (CPU R / min(c, R) + GPU
+ NET)`` at every core count), which the sensitivity factor and the Synergy
sizers read.

The comparison (:func:`compare`): per job, relative JCT error ``|sim - real| /
real`` (median and p95), mean JCT, makespan and GPU utilisation on both sides.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..core.lifecycle import LifecycleTimes
from ..driver import Stack
from ..perf.interleave import stage_profile
from ..perf.profile_record import profile_from_record, record_from_function
from .engine import SimConfig, Simulator
from .metrics import RunResult

#: the three stacks of the validation table: label -> (order, group, size, place)
STACKS: dict[str, Stack] = {
    "fifo/proportional/packed": Stack("fifo", "none", "proportional", "packed-sticky"),
    "srtf/tune": Stack("srtf", "none", "tune", "packed-sticky"),
    # the service runs a group's members as processes on their own cores: perf/sharing.py
    "srsf+muri": Stack("srsf", "muri", "proportional", "packed-sticky", params={"interleave_model": "shared"}),
}
CPU_BOUND_SHARE = 0.4  # a job whose data loading is at least this share of an iteration gains from more cores


@dataclass(frozen=True, slots=True)
class TestbedJob:
    """One job of a validation workload (see the module notes); times in seconds."""

    __test__ = False  # not a pytest class, despite its name
    id: str
    arrival: float
    gpus: int
    iterations: int
    stages: tuple[float, float, float]  # CPU, GPU, network per iteration at the reference allocation
    prop_cpus: int  # its GPU-proportional cores (the reference)
    cpu_ref: int  # cores its CPU stage saturates at
    model: str = ""

    @property
    def iter_time(self) -> float:
        """Seconds per iteration alone at the reference allocation."""
        return float(sum(self.stages))

    @property
    def work(self) -> float:
        return self.iterations * self.iter_time

    def step_time(self, cores: float) -> float:
        """Seconds per iteration alone on ``cores`` cores (its requested GPUs)."""
        cpu = self.stages[0] * self.prop_cpus / max(1e-9, min(float(cores), float(self.cpu_ref)))
        return cpu + self.stages[1] + self.stages[2]

    def profile_record(self, cluster: Cluster) -> dict[str, Any]:
        """Its CPU sensitivity as a profile record (every core count of a node; memory does not matter)."""
        node = max(cluster.nodes, key=lambda n: n.gpus)
        return record_from_function(self.gpus, range(1, node.cpus + 1), [node.mem_mb],
                                    lambda c, m: 1.0 / self.step_time(c), "sleepy_train")

    def spec(self, cluster: Cluster, arrival: float | None = None, attrs: Mapping[str, Any] | None = None) -> JobSpec:
        """The simulator's job; ``attrs`` adds to (or overrides) its attributes (e.g. lifecycle times)."""
        rec = self.profile_record(cluster)
        a: dict[str, Any] = {"resource_times": list(self.stages), "iteration_time": self.iter_time, "profile": rec}
        a.update(attrs or {})
        return JobSpec.from_iterations(self.id, self.arrival if arrival is None else arrival, self.gpus,
                                       self.iterations, self.iter_time, model=self.model,
                                       profile=profile_from_record(f"job {self.id}", rec), attrs=a)

    def command(self, python: str, script: str, lock_dir: str) -> str:
        """The real job: ``sleepy_train.py`` with its stages (the CPU stage quoted at ``cpu_ref`` cores)."""
        cpu_q = self.stages[0] * self.prop_cpus / self.cpu_ref
        st = ",".join(f"{x:.6f}" for x in (cpu_q, self.stages[1], self.stages[2]))
        return (f"{shlex.quote(python)} {shlex.quote(script)} --steps {self.iterations} --stages {st} "
                f"--cpu-ref {self.cpu_ref} --gpu-lock-dir {shlex.quote(lock_dir)}")

    def submit_body(self, cluster: Cluster, python: str, script: str, lock_dir: str) -> dict[str, Any]:
        """What the testbed POSTs to ``/jobs`` for this job: the command and what the scheduler may know."""
        return {"name": f"v{self.id}", "command": self.command(python, script, lock_dir), "gpus": self.gpus,
                "model": self.model or None, "iterations": self.iterations, "iteration_time": self.iter_time,
                "resource_times": list(self.stages), "profile": self.profile_record(cluster)}


def scale_workload(specs: Sequence[JobSpec], cluster: Cluster, n: int = 30, start: int = 0, gpu_div: int = 8,
                   step_s: float = 0.25, median_s: float = 30.0, lo_s: float = 8.0, hi_s: float = 120.0,
                   span_s: float = 120.0) -> list[TestbedJob]:
    """A time-scaled slice of a trace as testbed jobs (see the module notes)."""
    jobs = sorted(specs, key=lambda s: s.arrival)[start:start + n]
    if not jobs:
        raise ValueError(f"the trace has no jobs from index {start} ({len(specs)} jobs)")
    node = max(cluster.nodes, key=lambda x: x.gpus)
    its = [s.attrs.get("iteration_time") or s.iter_time or 1.0 for s in jobs]
    k = step_s / float(np.median(its))
    dmed = float(np.median([s.duration for s in jobs]))
    a0, a1 = jobs[0].arrival, jobs[-1].arrival
    out = []
    for s, it in zip(jobs, its, strict=True):
        g = min(node.gpus, max(1, s.gpus // gpu_div))
        rt = s.attrs.get("resource_times")
        prof = stage_profile(rt, it) if rt is not None else (0.5 * it, 0.5 * it, 0.0)
        stages = (prof[0] * k, prof[1] * k, prof[2] * k if len(prof) > 2 else 0.0)
        work = min(hi_s, max(lo_s, median_s * s.duration / dmed))
        prop = cluster.proportional(cluster.nodes.index(node), g)[0]
        ref = prop * 2 if stages[0] >= CPU_BOUND_SHARE * sum(stages) else prop
        out.append(TestbedJob(
            str(s.id), round((s.arrival - a0) * span_s / (a1 - a0), 3) if a1 > a0 else 0.0, g,
            max(3, round(work / sum(stages))), (round(stages[0], 6), round(stages[1], 6), round(stages[2], 6)),
            prop, max(1, min(node.cpus, ref)), s.model))
    return out


# -- the simulator's side ---------------------------------------------------------------------
@dataclass(slots=True)
class SimSetup:
    """How the simulator is run for a comparison: round length, event rounds, lifecycle times."""

    round_s: float = 5.0
    lifecycle: LifecycleTimes = field(default_factory=lambda: LifecycleTimes(0.0, 0.0, 0.0, 3.0))
    starts_wait_for_stops: bool = True  # as the service does


def simulate(specs: Sequence[JobSpec], cluster: Cluster, stack: Stack, setup: SimSetup) -> RunResult:
    """Run ``specs`` under ``stack`` the way the service runs rounds: on a timer and at every arrival and
    completion, a round's launches once its stops are done."""
    sched, model = stack.build(cluster, specs=specs)
    cfg = SimConfig(round_len=setup.round_s, reschedule_on_arrival=True, reschedule_on_completion=True,
                    lifecycle=setup.lifecycle, starts_wait_for_stops=setup.starts_wait_for_stops)
    return Simulator(cluster, specs, sched, model, cfg).run()


def with_attrs(specs: Sequence[JobSpec], per_job: Mapping[str, Mapping[str, Any]]) -> list[JobSpec]:
    """``specs`` with extra attrs per job id (e.g. measured ``launch_time``)."""
    return [replace(s, attrs={**s.attrs, **per_job.get(s.id, {})}) for s in specs]


# -- the comparison ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one job on one side: arrival and end (seconds on that side's clock)."""

    arrival: float
    end: float

    @property
    def jct(self) -> float:
        return self.end - self.arrival


def outcomes_of(result: RunResult) -> dict[str, Outcome]:
    return {j.id: Outcome(j.arrival, j.finish) for j in result.jobs if j.finish is not None}


def gpu_util(spans: Sequence[tuple[float, float, Sequence[Any]]], gpus: int, t0: float, t1: float) -> float:
    """Time-weighted share of ``gpus`` held over [t0, t1]: spans ``(start, end, gpu ids)``, a GPU shared counts once."""
    if t1 <= t0 or gpus <= 0:
        return 0.0
    ev: list[tuple[float, int, Any]] = []
    for a, b, ids in spans:
        a, b = max(a, t0), min(b, t1)
        if b > a:
            ev += [(a, 1, g) for g in ids] + [(b, -1, g) for g in ids]
    ev.sort(key=lambda e: (e[0], e[1]))
    held: dict[Any, int] = {}
    busy, last, area = 0, t0, 0.0
    for t, d, g in ev:
        area += busy * (t - last)
        last = t
        before = held.get(g, 0)
        held[g] = before + d
        if before == 0 and d > 0:
            busy += 1
        elif before + d == 0 and d < 0:
            busy -= 1
    area += busy * (t1 - last)
    return area / (gpus * (t1 - t0))


def compare(real: Mapping[str, Outcome], sim: Mapping[str, Outcome], real_util: float | None = None,
            sim_util: float | None = None) -> dict[str, Any]:
    """Errors of ``sim`` against ``real`` over the jobs both finished (see the module notes)."""
    ids = sorted(set(real) & set(sim), key=lambda x: (real[x].arrival, x))
    if not ids:
        raise ValueError("no job finished on both sides")
    rj = np.array([real[i].jct for i in ids])
    sj = np.array([sim[i].jct for i in ids])
    rel = np.abs(sj - rj) / np.maximum(rj, 1e-9)

    def span(o: Mapping[str, Outcome]) -> float:
        return max(o[i].end for i in ids) - min(o[i].arrival for i in ids)

    out: dict[str, Any] = {
        "jobs": len(ids), "missing": sorted(set(real) ^ set(sim)),
        "jct_err_median": float(np.median(rel)), "jct_err_p95": float(np.percentile(rel, 95)),
        "mean_jct_real": float(rj.mean()), "mean_jct_sim": float(sj.mean()),
        "mean_jct_err": float((sj.mean() - rj.mean()) / rj.mean()),
        "makespan_real": span(real), "makespan_sim": span(sim),
    }
    out["makespan_err"] = (out["makespan_sim"] - out["makespan_real"]) / out["makespan_real"]
    if real_util is not None and sim_util is not None:
        out.update(util_real=real_util, util_sim=sim_util, util_err=sim_util - real_util)
    out["per_job"] = {i: {"real": round(float(r), 3), "sim": round(float(s), 3)} for i, r, s in zip(ids, rj, sj,
                                                                                                    strict=True)}
    return out


def fmt_pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"


def table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of comparisons by stack (the validation table)."""
    head = ("| stack | jobs | JCT err median | JCT err p95 | mean JCT real / sim (err) | makespan real / sim (err) "
            "| GPU util real / sim |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for label, c in rows.items():
        util = (f"{100 * c['util_real']:.0f}% / {100 * c['util_sim']:.0f}%" if "util_real" in c else "-")
        lines.append(f"| {label} | {c['jobs']} | {100 * c['jct_err_median']:.1f}% | {100 * c['jct_err_p95']:.1f}% "
                     f"| {c['mean_jct_real']:.1f} / {c['mean_jct_sim']:.1f} s ({fmt_pct(c['mean_jct_err'])}) "
                     f"| {c['makespan_real']:.1f} / {c['makespan_sim']:.1f} s ({fmt_pct(c['makespan_err'])}) | {util} |")
    return head + "\n".join(lines) + "\n"


# -- calibration from what the service measured -------------------------------------------------
def lifecycle_attrs(row: Mapping[str, Any]) -> dict[str, float]:
    """Per-job lifecycle times from an exported trace row (:mod:`gpuloom.runtime.state.export`).

    The launch time is the measured launch (to the first progress line) plus the
    job's exit lag (last progress line to the end the service recorded), spread
    over its launches: the simulator has no exit step, and both hold resources
    without progress.  The stop is the measured SIGTERM-to-exit time."""
    a = row.get("attrs", {})
    launches = sum(1 for x in a.get("allocations", []) if x.get("launch_s") is not None) or 1
    out: dict[str, float] = {}
    if a.get("launch_time") is not None:
        out["launch_time"] = float(a["launch_time"]) + float(a.get("exit_s") or 0.0) / launches
    if a.get("checkpoint_time") is not None:
        out["checkpoint_time"] = float(a["checkpoint_time"])
        out["stop_time"] = float(a.get("stop_time") or 0.0)
    return out


def speed_errors(rows: Sequence[Mapping[str, Any]], specs: Mapping[str, JobSpec], cluster: Cluster, stack: Stack,
                 ids: Mapping[str, str]) -> dict[str, list[float]]:
    """Measured / predicted it/s - 1 of every allocation the service measured, by kind.

    ``rows``: exported trace rows; ``specs``: the simulator's jobs by workload id;
    ``ids``: service id -> workload id.  Kinds: ``solo`` (alone, GPU-proportional
    cores), ``cores`` (alone, other cores), ``shared`` (with co-runners).
    """
    from ..core.job import Job
    from ..core.plan import Allocation, Part

    model = stack.model(cluster, specs=list(specs.values()))
    jobs = {k: Job(s) for k, s in specs.items()}
    model.bind(jobs)
    out: dict[str, list[float]] = {"solo": [], "cores": [], "shared": []}
    for r in rows:
        wid = ids.get(str(r["id"]))
        if wid is None or wid not in jobs:
            continue
        job = jobs[wid]
        for a in r["attrs"].get("allocations", []):
            if not a.get("it_s") or a.get("iters", 0) < 3:
                continue
            group = tuple(ids.get(str(x), str(x)) for x in a.get("group", []))
            alloc = Allocation(wid, (Part(0, tuple(range(a["gpus"])), a["cpus"], a["mem_mb"]),), group)
            pred = model.speed(job, alloc) / job.spec.iter_time if job.spec.iter_time else 0.0
            if pred <= 0:
                continue
            prop = cluster.proportional(0, a["gpus"])
            kind = "shared" if group else ("solo" if (a["cpus"], a["mem_mb"]) == prop else "cores")
            out[kind].append(a["it_s"] / pred - 1.0)
    return out
