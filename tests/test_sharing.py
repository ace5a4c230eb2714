"""Jobs sharing GPUs as processes (perf/sharing.py): max-min fair turns on GPU and network, own cores."""

from __future__ import annotations

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.assembly import ModelOptionError, build_model
from gpuloom.perf.profile_record import profile_from_record, record_from_function
from gpuloom.perf.sharing import SharedInterleaveFactor, exclusive_stages, fair_slowdowns

CL = Cluster.homogeneous(1, 1, 4, 4000)


def spec(jid: str, stages: tuple[float, float, float], profile: bool = False) -> JobSpec:
    kw = {}
    if profile:  # the CPU stage quoted at 4 cores, slower on fewer (sleepy_train --cpu-ref 4)
        rec = record_from_function(1, range(1, 5), [4000], lambda c, m: 1 / (stages[0] * 4 / c + stages[1]))
        kw["profile"] = profile_from_record(jid, rec)
    return JobSpec.from_iterations(jid, 0.0, 1, 100, sum(stages), attrs={"resource_times": list(stages)}, **kw)


def speeds(specs: list[JobSpec], cpus: int, **opts: object) -> list[float]:
    """Each job's speed sharing the one GPU with the others, ``cpus`` cores each."""
    model = build_model(CL, {"interleave_model": "shared", **opts}, specs)
    jobs = {s.id: Job(s) for s in specs}
    model.bind(jobs)
    out = []
    for s in specs:
        group = tuple(o.id for o in specs if o.id != s.id)
        out.append(model.speed(jobs[s.id], Allocation(s.id, (Part(0, (0,), cpus, 1000),), group)))
    return out


def test_fair_slowdowns_fill_resources_progressively() -> None:
    assert fair_slowdowns([]) == []
    assert fair_slowdowns([[1.0], [1.0]]) == [0.5, 0.5]  # two GPU-bound twins
    assert fair_slowdowns([[0.5], [0.5]]) == [1.0, 1.0]  # they fit in each other's gaps
    assert fair_slowdowns([[0.96], [0.12]]) == pytest.approx([1 / 1.08, 1 / 1.08])
    # resource 0 fills at 2/3 for jobs 0 and 1; job 2 (resource 1 only) goes on to its speed alone
    assert fair_slowdowns([[0.9, 0.0], [0.6, 0.2], [0.0, 0.5]]) == pytest.approx([2 / 3, 2 / 3, 1.0])
    assert exclusive_stages(3) == (1, 2) and exclusive_stages(4) == (2, 3) and exclusive_stages(1) == (0,)


def test_shared_gpus_cost_turns_on_gpu_and_network_only() -> None:
    twins = [spec("a", (0.0, 0.2, 0.0)), spec("b", (0.0, 0.2, 0.0))]
    assert speeds(twins, 2) == pytest.approx([0.5, 0.5])
    halves = [spec("a", (0.1, 0.1, 0.0)), spec("b", (0.1, 0.1, 0.0))]
    assert speeds(halves, 2) == pytest.approx([1.0, 1.0])  # data loading overlaps: each on its own cores
    # Muri's lock-step model (the default) charges the shared data loading and Muri's measured overhead
    model = build_model(CL, {}, halves)
    jobs = {s.id: Job(s) for s in halves}
    model.bind(jobs)
    assert model.speed(jobs["a"], Allocation("a", (Part(0, (0,), 2, 1000),), ("b",))) == pytest.approx(1.015 / 1.33)
    # an interference factor lengthens the exclusive stages: twins at 0.3 s of GPU each -> 0.6 s per iteration
    assert speeds(twins, 2, interleave_overhead=1.5) == pytest.approx([1 / 3, 1 / 3])


def test_fewer_cores_widen_the_gaps_the_others_fill() -> None:
    # a: 0.1 s loading at 4 cores, 0.2 s on 2 -> alone 0.3 s (sensitivity 2/3), the GPU busy a third of it;
    # b: 0.1 + 0.1 s, the GPU busy half of it: together 5/6 of the GPU: no turns lost
    a, b = spec("a", (0.1, 0.1, 0.0), profile=True), spec("b", (0.1, 0.1, 0.0))
    assert speeds([a, b], 2) == pytest.approx([2 / 3, 1.0])
    # three GPU-heavy jobs: 0.3 s on the GPU of 0.35 s each -> the GPU is 2.57x oversubscribed
    heavy = [spec(x, (0.05, 0.3, 0.0)) for x in "xyz"]
    assert speeds(heavy, 1) == pytest.approx([0.35 / 0.9] * 3)


def test_the_option_is_checked_and_the_factor_reads_the_others() -> None:
    with pytest.raises(ModelOptionError, match="interleave_model.*expected muri .* or shared"):
        build_model(CL, {"interleave_model": "fast"})
    m = build_model(CL, {"interleave_model": "shared"})
    f = m.get("interleave")
    assert isinstance(f, SharedInterleaveFactor) and f.solo is not None and f.overhead == {}


def test_the_interleave_choices_parse_and_name_each_choice_with_its_meaning() -> None:
    from gpuloom.perf.assembly import _interleave_model, _interleave_profiles

    assert _interleave_model(" Shared ") == "shared" and _interleave_profiles("RAW") == "raw"
    with pytest.raises(ValueError) as e:
        _interleave_profiles("cooked")
    assert str(e.value) == ("expected normalised (stage times summing to the iteration time) or raw (as the trace "
                            "gives them, as Muri's simulator uses them), got 'cooked'")
    with pytest.raises(ValueError) as e:
        _interleave_model(3)
    assert str(e.value) == ("expected muri (lock-step groups, Muri's executor) or shared (processes sharing GPUs, "
                            "each on its own cores), got 3")
