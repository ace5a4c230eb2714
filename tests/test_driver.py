"""The driver layer: one owner of jobs and plans for both faces, with a backend per face.

Hand-checked scenarios on a recording backend (no simulator, no service):
co-runners regrouped at a completion, a launch that fails alone, a launch the
backend defers, lifecycle steps per action; and the routes from options to a
run (qualified parameters, model flags on every command, requirements).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec, JobStatus
from gpuloom.core.lifecycle import IllegalTransition, JobState
from gpuloom.core.plan import Action, ActionKind, Allocation, Part, PlanError
from gpuloom.driver import Driver, LaunchFailed, Stack, Step, lifecycle_steps
from gpuloom.perf.assembly import FLAG_OPTIONS, build_model
from gpuloom.policies.base import PolicyError
from gpuloom.scheduler import RequirementError, Scheduler

S = JobState


class Recorder:
    """A backend that records what the driver asks for; ``fail``/``defer`` name jobs to refuse."""

    def __init__(self, fail: Sequence[str] = (), defer: Sequence[str] = ()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail, self.defer = set(fail), set(defer)

    def stop(self, driver: Driver, steps: Sequence[Step], now: float) -> None:
        for st in steps:
            st.job.lifecycle.walk(st.stop, now)  # type: ignore[union-attr]
            self.calls.append(("stop", st.job.id))

    def launch(self, driver: Driver, step: Step, now: float) -> bool:
        self.calls.append(("launch", step.job.id))
        if step.job.id in self.fail:
            raise LaunchFailed("no such command")
        if step.job.id in self.defer:
            return False
        step.job.lifecycle.walk(step.start, now)  # type: ignore[union-attr]
        return True

    def regrouped(self, driver: Driver, job: Job, now: float) -> None:
        self.calls.append(("regroup", job.id))

    def progressed(self, driver: Driver, job: Job, now: float) -> None:
        pass


def _driver(cluster: Cluster, backend: Recorder, group: str = "none") -> Driver:
    sched = Scheduler.from_names("fifo", group, "proportional", "packed-sticky")
    return Driver(cluster, sched, build_model(cluster, {"interleave_overhead": "none"}), backend,
                  np.random.default_rng(0))


def test_a_completion_regroups_co_runners_at_their_new_speed() -> None:
    # two 1-GPU jobs with complementary stages share GPU 0 (Muri) at the interleaving model's speed;
    # when one finishes, the other keeps the GPU alone, at 1.0, advanced at the shared speed until then
    cl = Cluster.homogeneous(1, 1)
    rec = Recorder()
    drv = _driver(cl, rec, group="muri")
    a = drv.admit(Job(JobSpec("a", 0, 1, 100.0, attrs={"resource_times": [0, 0.1, 0.3, 0]})), 0.0)
    b = drv.admit(Job(JobSpec("b", 0, 1, 100.0, attrs={"resource_times": [0, 0.3, 0.1, 0]})), 0.0)
    drv.round(0.0)
    assert a.alloc.group == ("b",) and b.alloc.group == ("a",)
    shared = b.speed
    assert 0.5 <= shared < 1.0 and drv.used[0] == 1  # one GPU, counted once
    drv.finish(a, 10.0)
    assert a.status is JobStatus.FINISHED and a.lifecycle.state is S.FINISHED
    assert b.alloc.group == () and b.speed == 1.0 and ("regroup", "b") in rec.calls
    assert b.remaining == pytest.approx(100.0 - 10.0 * shared)  # advanced at the old speed first
    assert drv.used == [1, b.alloc.cpus, b.alloc.mem_mb] and drv.free.free_gpus == 0


def test_a_failed_launch_fails_that_job_alone() -> None:
    cl = Cluster.homogeneous(1, 4)
    drv = _driver(cl, Recorder(fail=["b"]))
    jobs = [drv.admit(Job(JobSpec(x, 0, 1, 50.0)), 0.0) for x in "abc"]
    failed = drv.apply(drv.plan(0.0)[1], 0.0)
    assert [j.id for j in failed] == ["b"] and jobs[1].lifecycle.state is S.FAILED
    assert "no such command" in jobs[1].extra["failure"]
    assert set(drv.current) == {"a", "c"} and drv.free.free_gpus == 2 and "b" not in drv.jobs


def test_a_deferred_launch_is_rolled_back_and_planned_again() -> None:
    cl = Cluster.homogeneous(1, 2)
    drv = _driver(cl, Recorder(defer=["a"]))
    a = drv.admit(Job(JobSpec("a", 0, 1, 50.0)), 0.0)
    drv.round(0.0)
    assert a.alloc is None and not drv.current and drv.free.free_gpus == 2
    assert a.lifecycle.state is S.WAITING_FOR_INITIAL_RESOURCE
    drv.backend.defer.clear()  # type: ignore[attr-defined]
    drv.round(1.0)
    assert a.alloc is not None and a.lifecycle.state is S.RUNNING_PROTECTED


def test_a_view_keeps_the_jobs_it_was_made_with() -> None:
    # a view reads the driver's jobs without copying them (ActiveJobs), and is frozen into a
    # list before a job is admitted or ends, or another view is made, while it is still held
    drv = _driver(Cluster.homogeneous(1, 4), Recorder())
    a, b = (drv.admit(Job(JobSpec(x, 0, 1, 50.0)), 0.0) for x in "ab")
    held = drv.view(0.0).jobs
    assert list(held) == [a, b] and len(held) == 2 and held[1] is b and held[:1] == [a]
    c = drv.admit(Job(JobSpec("c", 0, 1, 50.0)), 0.0)
    drv.finish(a, 1.0, S.CANCELLED)
    assert list(held) == [a, b] and len(held) == 2  # as it was
    later = drv.view(1.0).jobs
    assert list(later) == [b, c]
    again = drv.view(1.0).jobs  # a new view freezes the one before
    drv.finish(b, 2.0, S.CANCELLED)
    assert list(later) == [b, c] and list(again) == [b, c] and list(drv.view(2.0).jobs) == [c]


def test_the_active_jobs_and_allocations_are_compacted_between_rounds() -> None:
    # jobs end mostly at the oldest end of the active jobs; once either dict has lost more than half
    # of what it holds, the next round replaces it with a compact copy (the same entries in the same
    # order; replaced, not rebuilt in place, so that the service's lock-free readers never see one
    # half rebuilt), binds the model's factors to the new jobs, and a view still held keeps its jobs
    drv = _driver(Cluster.homogeneous(2, 4), Recorder())
    jobs_d, current_d = drv.jobs, drv.current
    jobs = [drv.admit(Job(JobSpec(f"j{i}", 0, 1, 50.0), i), 0.0) for i in range(40)]
    drv.round(0.0)
    assert list(current_d) == [f"j{i}" for i in range(8)]  # 8 GPUs: the first 8 run
    held = drv.view(0.0).jobs
    for j in jobs[:30]:
        drv.finish(j, 1.0, S.CANCELLED)
    assert drv._deleted == [30, 8] and drv.jobs is jobs_d and drv.current is current_d
    drv.round(2.0)
    assert drv._deleted == [0, 0]  # both replaced, before the round's starts
    assert drv.jobs is not jobs_d and drv.current is not current_d
    assert list(drv.jobs) == [f"j{i}" for i in range(30, 40)] == list(jobs_d)
    assert list(drv.current) == [f"j{i}" for i in range(30, 38)] and not current_d
    assert all(f._lookup.__self__ is drv.jobs for f in drv.model.factors if hasattr(f, "_lookup"))
    assert any(hasattr(f, "_lookup") for f in drv.model.factors)
    assert list(held) == jobs
    drv.check_state()


class _Holds:
    """A listener that records every allocation change it is told of."""

    def __init__(self, driver: Driver | None = None) -> None:
        self.calls: list[tuple[str, tuple | None, tuple | None]] = []
        self.driver = driver
        self.idle: set[str] = set()  # every job the driver's tally counted as waiting when told of a change

    def on_admit(self, job: Job) -> None:
        pass

    def on_hold(self, job: Job, old: Allocation | None, new: Allocation | None) -> None:
        self.calls.append((job.id, None if old is None else old.group, None if new is None else new.group))
        if self.driver is not None:
            self.idle.update(self.driver.tally.idle)

    def on_end(self, job: Job) -> None:
        pass


@pytest.mark.parametrize("regroup_first", [False, True])
def test_a_regroup_on_the_same_gpus_keeps_them_held(regroup_first: bool) -> None:
    # a and b share GPU 0, c runs alone on GPU 1; then b stops, c moves in with a (a regroups on the
    # same parts) and d starts on GPU 1.  a's GPU, cores and memory stay held through the round, in
    # either order of the two changes: the state is what the allocations give, a's entry moves to the
    # end of current where it takes its new group, and a listener hears a let go and take again
    cl = Cluster.homogeneous(1, 2, 8, 8000)
    rec = Recorder()
    drv = _driver(cl, rec, group="muri")
    holds = _Holds(drv)
    drv.listeners.append(holds)
    prof = {"resource_times": [0, 0.1, 0.3, 0]}
    a, b, c, d = (drv.admit(Job(JobSpec(x, 0, 1, 100.0, attrs=prof)), 0.0) for x in "abcd")

    def on(jid: str, gpu: int, group: tuple[str, ...]) -> Allocation:
        return Allocation(jid, (Part(0, (gpu,), 2, 1000),), group)

    start = ActionKind.START
    drv.apply([Action(start, "a", None, on("a", 0, ("b",))), Action(start, "b", None, on("b", 0, ("a",))),
               Action(start, "c", None, on("c", 1, ()))], 0.0)
    assert list(drv.current) == ["a", "b", "c"] and drv.used == [2, 6, 3000]
    old_a, old_c = a.alloc, c.alloc
    assert old_a is not None and old_c is not None and b.alloc is not None
    holds.calls.clear()
    holds.idle.clear()
    changes = [Action(ActionKind.MOVE, "c", old_c, on("c", 0, ("a",))),
               Action(ActionKind.REGROUP, "a", old_a, Allocation("a", old_a.parts, ("c",)))]
    if regroup_first:
        changes.reverse()
    actions = [Action(ActionKind.STOP, "b", b.alloc, None), *changes, Action(start, "d", None, on("d", 1, ()))]
    assert drv.apply(actions, 10.0) == []
    drv.check_state()  # free GPUs, cores, memory, holders and GPUs used: what current gives
    assert drv.used == [2, 6, 3000] and drv.free.free_gpus == 0 and drv.holders == {0: {"a", "c"}, 1: {"d"}}
    assert list(drv.current) == ["a", "c", "d"] if regroup_first else ["c", "a", "d"]
    assert a.alloc is drv.current["a"] and a.alloc.group == ("c",) and a.speed == c.speed < 1.0
    assert ("regroup", "a") in rec.calls and a.preemptions == 0 and a.migrations == 0 and c.migrations == 1
    assert set(drv.tally.idle) == {"b"} and drv.tally.waiting == {b.shape: 1}
    # a and c held something before and after: never counted as waiting in between; d until it started
    assert holds.idle == {"b", "d"}
    let_go = [x for x in holds.calls if x[2] is None]
    take = [x for x in holds.calls if x[1] is None]
    assert let_go == ([("b", ("a",), None), ("a", ("b",), None), ("c", (), None)] if regroup_first
                      else [("b", ("a",), None), ("c", (), None), ("a", ("b",), None)])
    assert take == ([("a", None, ("c",)), ("c", None, ("a",))] if regroup_first
                    else [("c", None, ("a",)), ("a", None, ("c",))]) + [("d", None, ())]


def test_an_illegal_end_changes_nothing() -> None:
    # the lifecycle refuses the end before the driver lets go of anything; a legal end then frees the
    # job's GPUs without ever counting it as waiting
    drv = _driver(Cluster.homogeneous(1, 4), Recorder())
    a = drv.admit(Job(JobSpec("a", 0, 2, 50.0), 0), 0.0)
    b = drv.admit(Job(JobSpec("b", 0, 4, 50.0), 1), 0.0)
    drv.round(0.0)
    assert a.alloc is not None and b.alloc is None
    with pytest.raises(IllegalTransition):
        drv.finish(a, 1.0, S.WAITING_FOR_INITIAL_RESOURCE)
    drv.check_state()
    assert a.alloc is not None and "a" in drv.jobs and drv.free.free_gpus == 2 and a.finish is None
    drv.finish(a, 2.0)
    drv.check_state()
    assert "a" not in drv.jobs and drv.free.free_gpus == 4 and drv.tally.waiting == {(4, None, None): 1}
    assert drv.tally.demand == 4 and a.lifecycle.state is S.FINISHED and a.finish == 2.0


@pytest.mark.parametrize("drift", ["waiting", "idle", "demand", "unkeyed", "index_order"])
def test_the_whole_check_finds_a_tally_that_drifted(drift: str) -> None:
    # the shortcuts of a long queue's round read the driver's tally; the whole state check counts it
    # afresh from the active jobs and must notice any field gone astray
    drv = _driver(Cluster.homogeneous(1, 4), Recorder())
    index = (0, 1, 3, 2) if drift == "index_order" else (0, 1, 2, 3)  # (d admitted before c, by index)
    for i, x, g in zip(index, "abcd", (2, 2, 4, 1), strict=True):
        drv.admit(Job(JobSpec(x, 0, g, 50.0), i), 0.0)
    drv.round(0.0)  # a and b run; c (4 GPUs) and d wait behind it
    drv.check_state()
    t = drv.tally
    assert t.waiting == {(4, None, None): 1, (1, None, None): 1} and set(t.idle) == {"c", "d"}
    assert (t.demand, t.unkeyed, t.index_order) == (9, 0, drift != "index_order")
    if drift == "waiting":
        t.waiting[(1, None, None)] = 2
    elif drift == "idle":
        t.idle.pop("d")
    elif drift == "demand":
        t.demand -= 1
    elif drift == "unkeyed":
        t.unkeyed = 1
    else:  # (the flag may fall to False alone, once earlier jobs left: only True is checked)
        t.index_order = True
    with pytest.raises(PlanError, match="tally"):
        drv.check_state()


@pytest.mark.parametrize("state,kind,stop,start", [
    (S.WAITING_FOR_INITIAL_RESOURCE, ActionKind.START, None, (S.STANDBY, S.LAUNCHING, S.RUNNING_PROTECTED)),
    (S.RUNNING, ActionKind.STOP, (S.CHECKPOINTING, S.STOPPING, S.STANDBY), ()),
    (S.RUNNING_PROTECTED, ActionKind.MOVE, (S.RUNNING, S.CHECKPOINTING, S.STOPPING, S.STANDBY),
     (S.LAUNCHING, S.RUNNING_PROTECTED)),
    (S.LAUNCHING, ActionKind.RESIZE, (S.STOPPING, S.STANDBY), (S.LAUNCHING, S.RUNNING_PROTECTED)),
])
def test_each_action_walks_its_lifecycle_steps(state: JobState, kind: ActionKind, stop: tuple | None,
                                               start: tuple) -> None:
    j = Job(JobSpec("x", 0, 1, 10.0))
    j.arrive(0.0, protect_factor=100.0, state=state)
    assert lifecycle_steps(j, kind, 0.0) == (stop, start)


def test_an_action_sees_protection_that_expired_before_it() -> None:
    j = Job(JobSpec("x", 0, 1, 10.0))
    lc = j.arrive(0.0, protect_factor=2.0)
    lc.walk([S.STANDBY, S.LAUNCHING], 0.0)
    lc.to(S.RUNNING_PROTECTED, 5.0)  # launch took 5 s: protected until 15
    assert lifecycle_steps(j, ActionKind.STOP, 20.0)[0] == (S.CHECKPOINTING, S.STOPPING, S.STANDBY)
    assert lc.history[-1] == (15.0, S.RUNNING)  # recorded when it happened


# -- from options to a run ------------------------------------------------------------------
def test_parameters_route_to_stages_bare_or_qualified() -> None:
    s = Scheduler.from_names("fifo", "none", "tune", "packed-sticky", params={"threshold": 0.2, "backfill": False})
    assert s.size.threshold == 0.2 and s.place.backfill is False
    s = Scheduler.from_names("fifo", "none", "tune", "pal", params={"size.threshold": 0.3, "place.priority": "queue"})
    assert s.size.threshold == 0.3 and s.place.priority == "queue"
    # a shared parameter reaches both stages that declare it shared
    s = Scheduler.from_names("fifo", "none", "static", "static", params={"slot": 2})
    assert s.size.slot == 2 and s.place.slot == 2


def test_bad_parameters_are_named_with_what_is_accepted() -> None:
    with pytest.raises(PolicyError, match=r"'treshold' is not taken .*threshold.*did you mean 'threshold'"):
        Scheduler.from_names("fifo", "none", "tune", params={"treshold": 0.2})
    with pytest.raises(PolicyError, match=r"'size.backfill': size policy 'tune' takes .*profiles, threshold"):
        Scheduler.from_names("fifo", "none", "tune", params={"size.backfill": False})
    with pytest.raises(PolicyError, match=r"unknown stage 'sise'"):
        Scheduler.from_names(params={"sise.threshold": 0.1})


def test_requirements_are_enforced_when_bound() -> None:
    cl = Cluster.homogeneous(1, 4)
    with pytest.raises(RequirementError, match=r"place policy 'topo-pack' needs the 'topology' factor.*--topology"):
        Stack(place="topo-pack").build(cl)
    with pytest.raises(RequirementError, match=r"size policy 'tune' needs the 'sensitivity' factor.*--profiles"):
        Stack(size="tune").build(cl)
    sched, model = Stack(size="elastic").build(cl)  # a factor with a default is added
    assert model.get("scaling") is not None and sched.size.name == "elastic"


@pytest.mark.parametrize("command", ["simulate", "compare", "serve"])
def test_every_declared_model_flag_reaches_every_command(command: str) -> None:
    from typer.testing import CliRunner

    from gpuloom.cli import app

    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    for opt in FLAG_OPTIONS:
        assert opt.cli in out, f"{command} lacks {opt.cli}"


def _arrived(shapes: Sequence[tuple[str, int, str]]) -> list[Job]:
    out = []
    for i, (jid, g, model) in enumerate(shapes):
        j = Job(JobSpec(jid, float(i), g, 100.0, model=model), i)
        j.arrive(float(i))
        out.append(j)
    return out


def test_pal_priority_holds_under_a_synergy_sizer(make_view) -> None:  # noqa: ANN001
    from gpuloom.perf.sensitivity import add_sensitivity
    from gpuloom.perf.variability import PMScores, add_variability

    cl = Cluster.homogeneous(1, 4, 12, 64_000)
    m = add_sensitivity(build_model(cl))
    add_variability(m, PMScores(np.array([[0.9] * 4, [0.9] * 4, [1.3] * 4, [1.3] * 4])))  # GPUs 0, 1 fast
    jobs = _arrived([("bert", 2, "bert"), ("resnet", 2, "resnet50")])  # FIFO: the class-B job first
    got = {}
    for priority in ("queue", "class"):
        s = Scheduler.from_names("fifo", "none", "tune", "pal", params={"priority": priority})
        s.bind(m)
        got[priority] = s.schedule(make_view(jobs=jobs, cluster=cl, model=m)).plan.allocations["resnet"].gpu_ids
    # in queue order the BERT job takes the fast GPUs; PAL's class priority gives them to ResNet (class A)
    assert got == {"queue": (2, 3), "class": (0, 1)}


def test_a_strict_queue_holds_under_a_synergy_sizer(make_view) -> None:  # noqa: ANN001
    cl = Cluster.homogeneous(1, 4, 12, 64_000)
    jobs = _arrived([("run", 1, ""), ("big", 4, ""), ("small", 1, "")])
    cur = {"run": Allocation("run", (Part(0, (0,), 3, 16_000),))}
    placed = {}
    for size in ("tune", "greedy", "opt"):
        for backfill in (True, False):
            s = Scheduler.from_names("fifo", "none", size, "packed-sticky", params={"backfill": backfill})
            view = make_view(jobs=jobs, cluster=cl, current=cur)
            placed[size, backfill] = set(s.schedule(view).plan.allocations)
    for size in ("tune", "greedy", "opt"):
        assert placed[size, True] == {"run", "small"}  # the 1-GPU job passes the 4-GPU one
        assert placed[size, False] == {"run"}  # a strict queue: nothing passes a job that does not fit


def test_a_round_says_why_each_waiting_job_waits(make_view) -> None:  # noqa: ANN001
    cl = Cluster.homogeneous(2, 2, 6, 32_000)
    # fifo: a (2 GPUs) and b (1) run; c (2) finds 1 GPU free -> Resources; d (1) would fit the last GPU
    # but only on a strict queue is it held behind c -> Priority; e (1) never gets a look in either
    jobs = _arrived([("a", 2, ""), ("b", 1, ""), ("c", 2, ""), ("d", 1, ""), ("e", 1, "")])
    s = Scheduler.from_names("fifo", "none", "proportional", "packed-sticky")
    rnd = s.schedule(make_view(jobs=jobs, cluster=cl))
    assert set(rnd.plan.allocations) == {"a", "b", "d"} and rnd.reasons == {"c": "Resources", "e": "Resources"}
    strict = Scheduler.from_names("fifo", "none", "proportional", "packed-sticky", params={"backfill": False})
    rnd = strict.schedule(make_view(jobs=jobs, cluster=cl))
    assert set(rnd.plan.allocations) == {"a", "b"}
    assert rnd.reasons == {"c": "Resources", "d": "Priority", "e": "Priority"}
    # two 1-GPU holes on two nodes: a 2-GPU job that must stay on one node waits for Placement
    frag = _arrived([("x", 1, ""), ("y", 1, ""), ("z", 2, "")])
    cur = {"x": Allocation("x", (Part(0, (0,), 3, 16_000),)), "y": Allocation("y", (Part(1, (2,), 3, 16_000),))}
    rnd = s.schedule(make_view(jobs=frag, cluster=cl, current=cur))
    assert "z" not in rnd.plan.allocations and rnd.reasons == {"z": "Placement"}
