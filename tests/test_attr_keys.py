"""Readers that look for a key of their own in every job's ``attrs`` skip their pass where none holds it, as
gathered once by :func:`gpuloom.core.job.attr_keys_known` (the throughput model's construction)."""

from __future__ import annotations

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec, attr_keys_known, may_hold
from gpuloom.perf.assembly import build_model, trace_profiles
from gpuloom.perf.gputype import from_jobs, trace_speeds_file


def specs(**attrs: object) -> list[JobSpec]:
    return [JobSpec("a", 0.0, 1, 10.0), JobSpec("b", 1.0, 1, 10.0, attrs={"queue": "q"}),
            JobSpec("c", 2.0, 2, 10.0, attrs={"queue": "q", **attrs})]


def test_may_hold_within_and_without() -> None:
    s, other = specs(), specs()
    assert may_hold(s, "queue") and may_hold(s, "gpu_speeds_file")  # (nothing known: look)
    with attr_keys_known(s):
        assert may_hold(s, "queue") and not may_hold(s, "gpu_speeds_file") and not may_hold(s, "type_speeds")
        assert may_hold(other, "gpu_speeds_file")  # (another sequence: look)
        with attr_keys_known(other):  # (the innermost is known: the outer one's readers look again)
            assert not may_hold(other, "gpu_speeds_file") and may_hold(s, "gpu_speeds_file")
        assert not may_hold(s, "gpu_speeds_file")
    assert may_hold(s, "gpu_speeds_file")
    empty: list[JobSpec] = []
    with attr_keys_known(empty):
        assert not may_hold(empty, "queue")


def test_the_readers_answer_as_they_look() -> None:
    plain, typed = specs(), specs(type_speeds={"v100": 1.0, "k80": 0.5}, profiles_file="p.csv",
                                  gpu_speeds_file="s.csv")
    for s in (plain, typed):
        looked = (trace_profiles(s), trace_speeds_file(s), from_jobs(s))
        with attr_keys_known(s):
            known = (trace_profiles(s), trace_speeds_file(s), from_jobs(s))
        assert [type(x) for x in known] == [type(x) for x in looked]
        assert known[:2] == looked[:2]
        assert (known[2] and known[2].rates) == (looked[2] and looked[2].rates)
    assert trace_profiles(plain) is None and from_jobs(plain) is None
    with attr_keys_known(typed):
        assert (trace_profiles(typed), trace_speeds_file(typed)) == ("p.csv", "s.csv")
        assert list(from_jobs(typed).rates.values()) == [{"v100": 1.0, "k80": 0.5}]


def test_the_model_has_the_jobs_own_speeds() -> None:
    cl = Cluster.homogeneous(2, 4, 24, 100_000)
    assert "gpu_type" not in [f.name for f in build_model(cl, specs=specs()).factors]
    model = build_model(cl, specs=specs(type_speeds={"v100": 1.0}))
    assert "gpu_type" in [f.name for f in model.factors]


def test_jobs_that_never_fit_by_shape_within() -> None:
    from gpuloom.core.fit import impossible_jobs

    cl = Cluster.homogeneous(2, 4, 24, 100_000)
    s = [JobSpec("a", 0.0, 8, 10.0), JobSpec("b", 0.0, 1, 10.0, cpus=100, attrs={"queue": "q"}),
         JobSpec("c", 1.0, 16, 10.0), JobSpec("d", 2.0, 2, 10.0), JobSpec("e", 3.0, 16, 10.0, attrs={"x": 1}),
         JobSpec("f", 3.0, 1, 10.0, cpus=100)]
    looked = impossible_jobs(s, cl)
    assert list(looked) == ["b", "c", "e", "f"]
    with attr_keys_known(s):
        assert not may_hold(s, "gpu_type")
        known = impossible_jobs(s, cl)
    assert list(known.items()) == list(looked.items())
    typed = [*s, JobSpec("g", 4.0, 1, 10.0, attrs={"gpu_type": "h100"})]
    with attr_keys_known(typed):
        assert list(impossible_jobs(typed, cl).items()) == [*looked.items(), ("g", impossible_jobs(typed[-1:], cl)["g"])]
    assert impossible_jobs(s[3:4], cl) == {}
