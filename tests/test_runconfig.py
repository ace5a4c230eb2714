"""Run configurations: parsing, errors, and parallel runs equal to sequential ones."""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import simulate
from gpuloom.sim.runconfig import (
    ConfigError,
    RunConfig,
    load_run_configs,
    parse_run_config,
    run_config,
    run_many,
)

SPECS = [JobSpec("a", 0, 1, 100), JobSpec("b", 0, 1, 50), JobSpec("c", 10, 1, 20)]


def workload(n: int = 120, seed: int = 7) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(200.0, n))
    return [
        JobSpec(f"j{i}", float(t), int(g), float(d), model=str(m), attrs={"batch_size": 32})
        for i, (t, g, d, m) in enumerate(zip(arrivals, rng.choice([1, 1, 2, 4, 8], n), rng.lognormal(7, 1.2, n),
                                             rng.choice(["resnet50", "bert", "gpt2"], n), strict=True))
    ]


def test_parse_string_types_and_aliases() -> None:
    rc = parse_run_config("order=2d-las, place=random-sticky, round=360, restart_overhead=0, preemptive=false,"
                          "P.thresholds=[3600, 7200], seed=3, max_time=inf, locality_penalty=2")
    assert (rc.order, rc.place, rc.preemptive, rc.locality_penalty) == ("2d-las", "random-sticky", False, 2.0)
    assert rc.sim.round_len == 360.0 and isinstance(rc.sim.round_len, float)
    assert rc.sim.restart_overhead == 0.0 and rc.sim.seed == 3 and rc.sim.max_time == math.inf
    assert rc.params == {"thresholds": [3600, 7200]}
    assert rc.label == ("2d-las/random-sticky/non-preemptive/thresholds=[3600, 7200]/locality_penalty=2/"
                        "round_len=360/restart_overhead=0/seed=3")
    assert parse_run_config("2d-las").order == "2d-las"
    assert parse_run_config("order=fifo,label=base line").label == "base line"


def test_parse_on_top_of_a_base() -> None:
    base = parse_run_config("order=fifo,round_len=360,restart_overhead=5")
    rc = parse_run_config("order=tiresias,params.thresholds=[100, 200]", base=RunConfig(sim=base.sim))
    assert rc.sim.round_len == 360 and rc.sim.restart_overhead == 5
    assert rc.params == {"thresholds": [100, 200]} and rc.label == "tiresias/thresholds=[100, 200]"
    assert rc.scheduler().order.thresholds == [100.0, 200.0]
    rc = parse_run_config("order=srtf", base=RunConfig(sim=base.sim))
    assert rc.label == "srtf"  # only what differs from the base is in the label


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("order=fifo,foo=1", "config 'order=fifo,foo=1': unknown key 'foo'"),
        ("order=nope", "config 'order=nope': unknown order policy 'nope'"),
        ("order=fifo,place=tetris", "unknown place policy 'tetris'"),
        ("order=fifo,P.zzz=1", "config 'order=fifo,P.zzz=1': parameter 'zzz' is not accepted by order=fifo"),
        ("order=fifo,Q.x=1", "unknown key 'Q.x'"),
        ("round_len=-1", "config 'round_len=-1': round length must be > 0"),
        ("round_len=abc", "round_len must be a number, got 'abc'"),
        ("seed=1.5", "seed must be an integer"),
        ("order=fifo,preemptive=maybe", "preemptive must be true or false"),
        ("order=fifo,order=sjf", "key 'order' given twice"),
        ("order=fifo,srtf", "'srtf' is not key=value"),
        ("order=fifo,=3", "'=3' has no key"),
        ("", "empty configuration"),
        ("locality_penalty=0.5", "locality_penalty must be a finite number >= 1"),
        ("order=fifo,params=3", "params must be a table"),
        ("order=2d-las,P.thresholds=[5, 1]", "thresholds must be positive and increasing"),
    ],
)
def test_parse_errors_name_key_and_config(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_run_config(text)
    assert message in str(e.value)


def test_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "runs.toml"
    p.write_text(
        'round_len = 10\nrestart_overhead = 0\n\n'
        '[[run]]\nlabel = "first in"\norder = "fifo"\n\n'
        '[[run]]\norder = "srtf"\nplace = "packed-non-sticky"\n\n'
        '[[run]]\norder = "fifo"\npreemptive = false\nseed = 4\n'
    )
    runs = load_run_configs(p)
    assert [r.label for r in runs] == ["first in", "srtf/packed-non-sticky", "fifo/non-preemptive/seed=4"]
    assert all(r.sim.round_len == 10 and r.sim.restart_overhead == 0 for r in runs)
    res = run_many(runs[:2], Cluster.homogeneous(1, 1), SPECS, processes=1)
    assert [j.jct for j in res["first in"].jobs] == [100, 150, 160]
    assert [j.jct for j in res["srtf/packed-non-sticky"].jobs] == [170, 70, 20]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[run]]\norder = "fifo"\n[[run]]\norder = "fifo"\nbogus = 1\n', "run 2: unknown key 'bogus'"),
        ('[[run]]\nlabel = "x"\norder = "lasx"\n', "run 1 ('x'): unknown order policy 'lasx'"),
        ('order = "fifo"\n', "expected one or more [[run]] tables"),
        ('label = "x"\n[[run]]\norder = "fifo"\n', "top level: label belongs in each [[run]]"),
        ('round_len = "long"\n[[run]]\norder = "fifo"\n', "top level: round_len must be a number"),
        ("[[run]\norder = 1\n", "runs.toml"),
    ],
)
def test_toml_errors(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "runs.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_run_configs(p)
    assert message in str(e.value) and str(p) in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_run_configs(tmp_path / "nope.toml")


def test_run_config_hand_checked_and_recorded() -> None:
    rc = parse_run_config("order=srtf,round=10,restart_overhead=0")
    res = run_config(rc, Cluster.homogeneous(1, 1), SPECS)
    assert [j.jct for j in res.jobs] == [170, 70, 20]
    assert res.config["label"] == res.label == "srtf/round_len=10/restart_overhead=0"
    assert res.config["round_len"] == 10 and res.config["order"] == "srtf" and res.config["params"] == {}


def test_locality_penalty_reaches_the_model() -> None:
    # one 2-GPU job on two 1-GPU nodes must span them: duration 100 runs 100 * penalty
    specs = [JobSpec("w", 0, 2, 100)]
    cluster = Cluster.homogeneous(2, 1)
    for text, jct in (("order=fifo", 170), ("order=fifo,locality_penalty=2", 200)):
        res = run_config(parse_run_config(text + ",restart_overhead=0"), cluster, specs)
        assert res.jobs[0].jct == pytest.approx(jct)


def test_specs_and_cluster_pickle() -> None:
    specs, cluster = workload(5), Cluster.homogeneous(3, 4)
    s2, c2 = pickle.loads(pickle.dumps((specs, cluster)))
    assert s2 == specs and c2.nodes == cluster.nodes and c2.num_gpus == 12
    assert c2.gpu_node.tolist() == cluster.gpu_node.tolist()


def test_run_many_parallel_equals_sequential() -> None:
    specs, cluster = workload(), Cluster.homogeneous(4, 4)
    configs = [parse_run_config(t) for t in
               ("order=fifo", "order=srtf,round=120", "order=las,place=random-sticky,seed=5")]
    seen: dict[str, tuple[int, int]] = {}
    par = run_many(configs, cluster, specs, processes=2, progress=lambda lb, d, t: seen.__setitem__(lb, (d, t)))
    seq = run_many(configs, cluster, specs, processes=1)
    assert list(par) == list(seq) == ["fifo", "srtf/round_len=120", "las/random-sticky/seed=5"]
    assert seen == {lb: (len(specs), len(specs)) for lb in par}
    for lb in par:
        assert par[lb].jobs == seq[lb].jobs
        assert par[lb].series == seq[lb].series
        assert par[lb].config == seq[lb].config
        s1, s2 = par[lb].summary(), seq[lb].summary()
        s1.pop("wall_time_s"), s2.pop("wall_time_s")
        assert s1 == s2
    # and equal to the one-call API
    direct = simulate(cluster, specs, order="srtf", round_len=120)
    assert [j.jct for j in direct.jobs] == [j.jct for j in par["srtf/round_len=120"].jobs]
    assert par["fifo"].summary()["mean_jct"] != par["srtf/round_len=120"].summary()["mean_jct"]


def test_run_many_rejects_duplicate_labels_and_bad_configs() -> None:
    with pytest.raises(ConfigError, match="share the label"):
        run_many([parse_run_config("fifo"), parse_run_config("order=fifo")], Cluster.homogeneous(1, 1), SPECS)
    with pytest.raises(ConfigError, match="unknown order policy 'zz'"):
        run_many([RunConfig(order="zz")], Cluster.homogeneous(1, 1), SPECS)
    assert run_many([], Cluster.homogeneous(1, 1), SPECS) == {}


def test_lifecycle_table() -> None:
    # launch 20 s before progress: a 0-120, b starts at 120 -> 190, c at 190 -> 230
    rc = parse_run_config("order=fifo,round=10,lifecycle={launch=20, checkpoint=5}")
    assert rc.sim.lifecycle is not None and (rc.sim.lifecycle.launch, rc.sim.lifecycle.stop) == (20, 2.0)
    res = run_config(rc, Cluster.homogeneous(1, 1), SPECS)
    assert [j.jct for j in res.jobs] == [120, 190, 220]
    assert res.jobs[1].phases == {"queued": 120, "launching": 20, "running": 50}
    assert parse_run_config("lifecycle=true").sim.lifecycle is not None
    assert parse_run_config("lifecycle=false").sim.lifecycle is None
    for text, msg in (("lifecycle=3", "must be true, false or a table"),
                      ("lifecycle={foo=1}", "lifecycle: unknown key(s) foo"),
                      ("lifecycle={launch=-1}", "launch must be a finite number >= 0")):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            parse_run_config(text)
