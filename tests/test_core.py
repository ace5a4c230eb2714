"""Core data: clusters, jobs, plans, diffs and the plan invariants."""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
from typing import Any

import pytest

from gpuloom.core import (
    ActionKind,
    Allocation,
    Cluster,
    ClusterError,
    JobError,
    JobSpec,
    Part,
    Plan,
    PlanError,
    check_plan,
    diff,
    load_cluster_file,
    parse_cluster,
)


def test_homogeneous_cluster_ids_and_defaults() -> None:
    c = parse_cluster("3x4")
    assert c.num_nodes == 3 and c.num_gpus == 12
    assert list(c.node_gpus(1)) == [4, 5, 6, 7]
    assert c.local_index(6) == 2 and int(c.gpu_node[6]) == 1
    assert c.nodes[0].cpus == 12 and c.nodes[0].mem_mb == 256_000
    assert c.proportional(0, 2) == (6, 128_000)


def test_cluster_file_toml_and_yaml(tmp_path) -> None:
    t = tmp_path / "c.toml"
    t.write_text('[[nodes]]\ncount = 2\ngpus = 8\ncpus = 24\nmem_gb = 500\nname = "big"\n'
                 '[[nodes]]\ngpus = 4\ncpus = 16\nmem_mb = 1000\n')
    c = load_cluster_file(t)
    assert [n.name for n in c.nodes] == ["big-0", "big-1", "g1-0"]
    assert c.num_gpus == 20 and c.nodes[2].mem_mb == 1000 and c.nodes[0].mem_mb == 500_000
    y = tmp_path / "c.yaml"
    y.write_text("nodes:\n  - {count: 1, gpus: 2, cpus: 4, mem_gb: 8}\n")
    assert parse_cluster(str(y)).num_gpus == 2


def test_cluster_errors_name_the_problem(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[nodes]]\ncount = 1\ncpus = 4\n")
    with pytest.raises(ClusterError, match=r"nodes\[0\].*'gpus'"):
        load_cluster_file(bad)
    bad.write_text("[[nodes]]\ngpus = 1\ncolor = 'red'\n")
    with pytest.raises(ClusterError, match="unknown field.*color"):
        load_cluster_file(bad)
    with pytest.raises(ClusterError, match="16y4"):
        parse_cluster("16y4")
    with pytest.raises(ClusterError):
        parse_cluster("0x4")


def test_jobspec_validation() -> None:
    with pytest.raises(JobError, match="j1: gpus"):
        JobSpec("j1", 0, 0, 10)
    with pytest.raises(JobError, match="j2: duration"):
        JobSpec("j2", 0, 1, 0)
    with pytest.raises(JobError, match="arrival"):
        JobSpec("j3", -1, 1, 5)
    s = JobSpec.from_iterations("j4", 5, 2, iterations=100, iter_time=0.5)
    assert s.duration == 50 and s.iterations == 100


def test_jobspecs_from_columns_are_the_specs_the_constructor_makes() -> None:
    attrs = [{"queue": "a"}, {}, {"queue": "b", "x": 1}]
    specs = JobSpec.from_columns(["j0", "j1", "j2"], [0, 2.5, 1e9], [1, 8, 3], [10, 0.5, 7.25], attrs)
    assert specs == [JobSpec("j0", 0, 1, 10, attrs=attrs[0]), JobSpec("j1", 2.5, 8, 0.5, attrs=attrs[1]),
                     JobSpec("j2", 1e9, 3, 7.25, attrs=attrs[2])]
    assert [s.attrs for s in specs] == attrs and specs[1].attrs is attrs[1]
    assert (specs[2].model, specs[2].iterations, specs[2].iter_time, specs[2].user, specs[2].cpus, specs[2].mem_mb,
            specs[2].profile) == ("", None, None, "", None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs[0].gpus = 2  # type: ignore[misc]
    assert JobSpec.from_columns([], [], [], [], []) == []


@pytest.mark.parametrize(("column", "value", "error"), [
    (0, "", "job id must not be empty"), (1, -1.0, "job j1: arrival must be a finite time >= 0, got -1.0"),
    (1, math.nan, "job j1: arrival must be"), (1, math.inf, "job j1: arrival must be"),
    (2, 0, "job j1: gpus must be >= 1, got 0"), (3, 0.0, "job j1: duration must be > 0, got 0.0"),
    (3, math.inf, "job j1: duration must be > 0, got inf"), (3, math.nan, "job j1: duration must be > 0, got nan")])
def test_jobspecs_from_columns_refuse_what_the_constructor_refuses(column: int, value: object, error: str) -> None:
    columns: list[list[Any]] = [["j0", "j1", "j2"], [0.0, 1.0, 2.0], [1, 1, 1], [5.0, 5.0, 5.0], [{}, {}, {}]]
    columns[column][1] = value
    with pytest.raises(JobError, match=f"^{re.escape(error)}"):
        JobSpec.from_columns(*columns)
    with pytest.raises(ValueError, match="columns of 3, 3, 3, 3 and 2 specs"):
        JobSpec.from_columns(*columns[:4], [{}, {}])


def _alloc(jid: str, node: int, gpus: tuple[int, ...], cpus: int = 1, mem: int = 10, group: tuple[str, ...] = ()) -> Allocation:
    return Allocation(jid, (Part(node, gpus, cpus, mem),), group)


def test_an_allocation_is_frozen_and_totals_its_parts() -> None:
    # (its __init__ is written by hand: the same fields, set as a frozen dataclass sets them)
    parts = (Part(0, (1, 2), 6, 100), Part(1, (9,), 3, 50))
    a = Allocation("j", parts, ("k",), (3, None, None, "j"))
    assert (a.job_id, a.parts, a.group, a.key) == ("j", parts, ("k",), (3, None, None, "j"))
    assert (a.num_gpus, a.cpus, a.mem_mb) == (3, 9, 150) and a.gpu_ids == (1, 2, 9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.cpus = 1  # type: ignore[misc]
    assert a == Allocation("j", parts, ("k",)) and hash(a) == hash(Allocation("j", parts, ("k",)))  # (key ignored)
    b = dataclasses.replace(a, parts=parts[:1], group=())
    assert (b.num_gpus, b.cpus, b.mem_mb, b.key, b.group) == (2, 6, 100, a.key, ())
    assert pickle.loads(pickle.dumps(a)) == a and Allocation("j", parts).key == ()
    assert repr(Allocation("j", parts[:1])) == ("Allocation(job_id='j', parts=(Part(node=0, gpus=(1, 2), cpus=6, "
                                                "mem_mb=100),), group=())")
    # a part too (its __init__ is written by hand as well)
    p = parts[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.node = 1  # type: ignore[misc]
    assert p == Part(0, (1, 2), 6, 100) and hash(p) == hash(Part(0, (1, 2), 6, 100)) and p != parts[1]
    assert dataclasses.replace(p, cpus=2) == Part(0, (1, 2), 2, 100) and pickle.loads(pickle.dumps(p)) == p
    assert Part(node=1, gpus=(9,), cpus=3, mem_mb=50) == parts[1]
    # and an action
    from gpuloom.core.plan import Action, ActionKind

    act = Action(ActionKind.MOVE, "j", a, b)
    assert (act.kind, act.job_id, act.old, act.new) == (ActionKind.MOVE, "j", a, b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        act.new = None  # type: ignore[misc]
    assert act == Action(kind=ActionKind.MOVE, job_id="j", old=a, new=b) and hash(act) == hash(Action("move", "j", a, b))
    assert dataclasses.replace(act, new=None).new is None and pickle.loads(pickle.dumps(act)) == act
    assert repr(Action(ActionKind.STOP, "j", None, None)) == "Action(kind=<ActionKind.STOP: 'stop'>, job_id='j', old=None, new=None)"


def test_check_plan_catches_double_booking_and_overcommit() -> None:
    c = Cluster.homogeneous(2, 2, cpus_per_node=4, mem_mb_per_node=100)
    ok = Plan()
    ok.add(_alloc("a", 0, (0, 1)))
    ok.add(_alloc("b", 1, (2,)))
    check_plan(ok, c, {"a": 2, "b": 1})
    with pytest.raises(PlanError, match="gang"):
        check_plan(ok, c, {"a": 2, "b": 2})
    double = Plan({"a": _alloc("a", 0, (0,)), "b": _alloc("b", 0, (0,))})
    with pytest.raises(PlanError, match="given twice|different GPU sets"):
        check_plan(double, c)
    grouped = Plan({"a": _alloc("a", 0, (0,), group=("b",)), "b": _alloc("b", 0, (0,), group=("a",))})
    check_plan(grouped, c)
    wrong_node = Plan({"a": _alloc("a", 1, (0,))})
    with pytest.raises(PlanError, match="not on node"):
        check_plan(wrong_node, c)
    cpu = Plan({"a": _alloc("a", 0, (0,), cpus=3), "b": _alloc("b", 0, (1,), cpus=2)})
    with pytest.raises(PlanError, match="5 cores given, has 4"):
        check_plan(cpu, c)
    with pytest.raises(PlanError, match="twice"):
        ok.add(_alloc("a", 1, (3,)))


def test_diff_classifies_actions() -> None:
    cur = {
        "stay": _alloc("stay", 0, (0,)),
        "gone": _alloc("gone", 0, (1,)),
        "moved": _alloc("moved", 1, (2,)),
        "grown": _alloc("grown", 1, (3,)),
        "cpu": _alloc("cpu", 2, (4,)),
        "regroup": _alloc("regroup", 2, (5,)),
    }
    plan = Plan({
        "stay": cur["stay"],
        "moved": _alloc("moved", 1, (3,)),
        "grown": Allocation("grown", (Part(1, (2, 3), 1, 10),)),
        "cpu": _alloc("cpu", 2, (4,), cpus=2),
        "regroup": _alloc("regroup", 2, (5,), group=("x",)),
        "new": _alloc("new", 0, (1,)),
    })
    acts = {a.job_id: a.kind for a in diff(cur, plan)}
    assert acts == {
        "gone": ActionKind.STOP, "moved": ActionKind.MOVE, "grown": ActionKind.RESIZE,
        "cpu": ActionKind.RESIZE, "regroup": ActionKind.REGROUP, "new": ActionKind.START,
    }
    # equal parts in new objects, other co-runners: a regroup; the same GPUs and totals with the cores
    # split otherwise between the nodes: a regroup too; the same parts in another order: a resize
    two = (Part(0, (0,), 1, 10), Part(1, (2,), 3, 10))
    cur2 = {"same": Allocation("same", two, ("x",)), "split": Allocation("split", two),
            "swapped": Allocation("swapped", two)}
    plan2 = Plan({"same": Allocation("same", tuple(Part(p.node, p.gpus, p.cpus, p.mem_mb) for p in two)),
                  "split": Allocation("split", (Part(0, (0,), 3, 10), Part(1, (2,), 1, 10))),
                  "swapped": Allocation("swapped", two[::-1])})
    assert [(a.job_id, a.kind) for a in diff(cur2, plan2)] == [
        ("same", ActionKind.REGROUP), ("split", ActionKind.REGROUP), ("swapped", ActionKind.RESIZE)]
    assert diff(cur, plan)[0].kind is ActionKind.STOP  # stops first


def test_changes_lists_what_a_plan_takes_out_and_puts_in() -> None:
    from gpuloom.core.plan import changes

    cur = {"stay": _alloc("stay", 0, (0,)), "gone": _alloc("gone", 0, (1,)), "moved": _alloc("moved", 1, (2,))}
    # any plan: compared allocation by allocation (an equal copy counts as replaced: taking it out and putting
    # it back in frees and takes the same resources)
    plan = Plan({"stay": cur["stay"], "moved": _alloc("moved", 1, (3,)), "new": _alloc("new", 0, (1,))})
    assert changes(cur, plan) == (["gone", "moved"], ["moved", "new"])
    assert changes(cur, Plan({**cur, "moved": _alloc("moved", 1, (2,))})) == (["moved"], ["moved"])
    # an extending plan: its own lists, the order it made its changes in
    ext = Plan.extending(cur)
    ext.add(_alloc("new", 0, (1,)))
    ext.remove("gone")
    ext.remove("moved")
    ext.add(_alloc("moved", 1, (3,)))
    assert changes(cur, ext) == (["gone", "moved"], ["new", "moved"])
