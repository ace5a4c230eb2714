"""The contract every policy and trace reader keeps, as checks a plugin's own tests call.

.. code-block:: python

    from gpuloom.sim.contract import check_policy, check_trace_reader

    def test_my_order() -> None:
        check_policy("order", "fewest-gpus")  # a registered name, or "mylab.orders:FewestGpus"

    def test_my_reader() -> None:
        check_trace_reader("mylab", "jobs.txt")

gpuloom's own tests run the same checks on every built-in policy and format
(``tests/test_contracts.py``).  A broken promise raises ``AssertionError`` saying which.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cluster import Cluster
from ..core.job import Job, JobSpec
from ..core.plan import Allocation, check_plan
from ..perf.assembly import build_model
from ..perf.model import ThroughputModel
from ..perf.sensitivity import add_sensitivity
from ..policies import base as pb
from ..scheduler import RequirementError, Scheduler
from .traces import read_trace

#: stages that need a partner to make sense (static slots size and place together), and their parameters
PARTNER = {("size", "static"): {"place": "static"}, ("place", "static"): {"size": "static"}}
PARAMS: dict[str, dict[str, Any]] = {"static": {"slot": 1}}


def small_jobs() -> list[Job]:
    """Six arrived jobs of 1-4 GPUs whose specs carry what every built-in policy may read (Muri stage
    times, a scaling curve, a model name)."""
    shapes = [(1, 300.0, [0.0, 0.1, 0.3, 0.0]), (2, 200.0, [0.0, 0.3, 0.1, 0.0]), (4, 500.0, [0.0, 0.2, 0.2, 0.1]),
              (1, 100.0, [0.1, 0.3, 0.1, 0.0]), (2, 50.0, [0.0, 0.1, 0.4, 0.0]), (3, 400.0, [0.0, 0.2, 0.2, 0.0])]
    out = []
    for i, (g, d, rt) in enumerate(shapes):
        spec = JobSpec(f"j{i}", float(i), g, d, model="resnet50",
                       attrs={"resource_times": rt, "throughput": {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.0}})
        j = Job(spec, i)
        j.arrive(spec.arrival)
        out.append(j)
    return out


def small_view(jobs: Sequence[Job] | None = None, current: Mapping[str, Allocation] | None = None,
               cluster: Cluster | None = None, model: ThroughputModel | None = None, now: float = 10.0,
               seed: int = 0) -> pb.View:
    """A policy's view of a small case: by default a 2x4 cluster (12 cores, 64 GB per node), the model
    ``simulate`` builds (plus an empty sensitivity catalogue) and :func:`small_jobs`; ``current``
    maps job id -> allocation, which those jobs hold."""
    cl = cluster or Cluster.homogeneous(2, 4, 12, 64_000)
    js = list(jobs) if jobs is not None else small_jobs()
    by_id = {j.id: j for j in js}
    cur = dict(current or {})
    for jid, a in cur.items():
        by_id[jid].alloc = a
    m = model if model is not None else add_sensitivity(build_model(cl))
    m.bind(by_id)
    return pb.View(now, cl, js, cur, m, np.random.default_rng(seed), 1, free=pb.FreeState.of(cl, cur))


def check_stage(stage: str, name: str, params: Mapping[str, Any] | None = None) -> None:
    """What ``stage`` promises, on :func:`small_view`: an order is a deterministic permutation of the
    active jobs; a grouping covers every job once in units of equal GPUs; a sizer answers every unit
    (with the job's GPUs when ``fixed_gpus``); a placement gives whole gangs and books no GPU twice."""
    view = small_view()
    params = dict(params if params is not None else PARAMS.get(name, {}))
    pol = pb.make(stage, name, params)
    ids = sorted(j.id for j in view.jobs)
    if stage == "order":
        out = pol.order(view.jobs, view)
        assert sorted(j.id for j in out) == ids, f"order {name!r}: not a permutation of the active jobs"
        again = [j.id for j in pol.order(view.jobs, view)]
        assert again == [j.id for j in out], f"order {name!r}: two calls on one view differ"
        if pol.keyed:
            keyed = sorted(view.jobs, key=lambda j: pol.sort_key(j, view))
            assert [j.id for j in keyed] == [j.id for j in out], f"order {name!r}: keyed, but not by sort_key"
    elif stage == "group":
        units = pol.group(view.jobs, view)
        assert sorted(j.id for u in units for j in u) == ids, f"group {name!r}: a job missing or twice"
        assert all(len({j.spec.gpus for j in u}) == 1 for u in units), f"group {name!r}: a unit of unequal GPUs"
        if not pol.merges:
            assert [u[0].id for u in units] == [j.id for j in view.jobs] and all(len(u) == 1 for u in units), \
                f"group {name!r}: declares merges = False but merged or reordered jobs"
    elif stage == "size":
        Scheduler(pb.make("order", pb.STAGE_DEFAULTS["order"]), pb.make("group", pb.STAGE_DEFAULTS["group"]), pol,
                  pb.make("place", pb.STAGE_DEFAULTS["place"])).bind(view.model)
        units = [(j,) for j in view.jobs]
        reqs = pol.size(units, view)
        assert len(reqs) == len(units), f"size {name!r}: {len(reqs)} requests for {len(units)} units"
        for r, u in zip(reqs, units, strict=True):
            assert r.jobs == u and r.gpus >= 1, f"size {name!r}: a request does not answer its unit"
            if pol.fixed_gpus:
                assert r.gpus == u[0].spec.gpus, f"size {name!r}: declares fixed_gpus but resized {u[0].id}"
    elif stage == "place":
        slot = params.get("slot")
        reqs = [pb.Request((j,), slot or j.spec.gpus) for j in view.jobs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PAL without PM-scores says so
            plan = pol.place(reqs, view)
        check_plan(plan, view.cluster, {r.job.id: r.gpus for r in reqs})
        assert set(plan.allocations) <= set(ids), f"place {name!r}: placed a job that is not active"
        assert plan.allocations, f"place {name!r}: placed nothing on an empty cluster"


def check_round(stage: str, name: str, params: Mapping[str, Any] | None = None) -> None:
    """A round with policy ``name`` in ``stage`` (the others at their ``STAGE_DEFAULTS``) passes the
    scheduler's round check, and the stages' declarations are plain values."""
    chosen = {**pb.STAGE_DEFAULTS, stage: name}
    chosen.update(PARTNER.get((stage, name), {}))
    given = dict(params) if params is not None else {
        k: v for n in chosen.values() for k, v in PARAMS.get(n, {}).items()}
    sched = Scheduler.from_names(chosen["order"], chosen["group"], chosen["size"], chosen["place"], params=given,
                                 queue=chosen.get("queue", "none"))
    view = small_view()
    missing = [f for st in sched.stages for f, make in st.requires_factors.items()
               if make is None and view.model.get(f) is None]
    if missing:  # a factor with no default that the view's model lacks (node topologies): refused up front
        try:
            sched.bind(view.model)
        except RequirementError:
            return
        raise AssertionError(f"{stage} {name!r}: binding without the {missing} factor was not refused")
    sched.bind(view.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rnd = sched.schedule(view)
    sched.check(rnd, view)
    for st in sched.stages:
        assert isinstance(st, pb.Stage) and st.stage in pb.STAGES and st.name, f"{st!r}: no stage or name"
        assert isinstance(st.dynamic, bool) and isinstance(st.needs_profiles, bool), f"{st.name}: flags not bools"
        assert isinstance(st.stats(), dict) and all(callable(h) for h in st.plan_hooks()), f"{st.name}: stats/hooks"


def check_policy(stage: str, name: str, params: Mapping[str, Any] | None = None) -> None:
    """:func:`check_stage` and :func:`check_round` for one policy (a name, or ``module:Class``)."""
    check_stage(stage, name, params)
    check_round(stage, name, params)


def check_trace_reader(fmt: str, path: str | Path, **opts: Any) -> list[JobSpec]:
    """Read ``path`` as format ``fmt`` (a name, or ``module:function``) and check the jobs: some, sorted
    by arrival, ids unique, at least one GPU, positive work, no arrival before 0; reading again gives
    the same.  Returns the jobs."""
    trace = read_trace(path, fmt, **opts)
    jobs = trace.jobs
    assert jobs, f"format {fmt!r}: no jobs in {path}"
    assert all(isinstance(j, JobSpec) for j in jobs), f"format {fmt!r}: not JobSpec"
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs), f"format {fmt!r}: not sorted by arrival"
    assert len({j.id for j in jobs}) == len(jobs), f"format {fmt!r}: a job id twice"
    for j in jobs:
        assert j.gpus >= 1 and j.duration > 0 and j.arrival >= 0, f"format {fmt!r}: job {j.id} {j}"
    assert read_trace(path, fmt, **opts).jobs == jobs, f"format {fmt!r}: two reads differ"
    return jobs
