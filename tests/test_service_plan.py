"""The simulator and the service make the same plan for the same cluster and queue.

Both use ``Scheduler.from_names``; the simulator's jobs come from JobSpecs, the
service's from its store (submitted specs, time limit = duration).  The
service really carries its plan out (real ``sleep`` processes through the
process executor) and what it runs afterwards is compared with the simulator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.core.plan import Allocation
from gpuloom.perf.assembly import build_model
from gpuloom.runtime.router import local_executor
from gpuloom.runtime.service import HOLDING, Service
from gpuloom.runtime.store import Store
from gpuloom.scheduler import Scheduler
from gpuloom.sim.engine import SimConfig, Simulator
from service_util import own_cgroup_parent


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    yield from own_cgroup_parent()

# (gpus, duration): first wave at t=0, second wave at t=1
WAVE1 = [(2, 500.0), (4, 100.0), (1, 300.0), (3, 50.0), (2, 200.0)]
WAVE2 = [(1, 10.0), (4, 20.0)]
# Muri stage times (s per iteration: storage, CPU, GPU, network), alternating bottlenecks
STAGES = ([0.05, 0.3, 0.1, 0.05], [0.05, 0.1, 0.3, 0.05])


def stages(i: int) -> list[float]:
    return STAGES[i % 2]


def sim_plans(cluster: Cluster, order: str, place: str, group: str = "none") -> list[dict[str, Allocation]]:
    specs = [JobSpec(str(i + 1), 0.0, g, d, attrs={"resource_times": stages(i)}) for i, (g, d) in enumerate(WAVE1)]
    specs += [JobSpec(str(len(WAVE1) + i + 1), 1.0, g, d, attrs={"resource_times": stages(len(WAVE1) + i)})
              for i, (g, d) in enumerate(WAVE2)]
    plans: dict[float, dict[str, Allocation]] = {}

    def observe(sim: Simulator, what: str) -> None:
        if what == "round":  # the last round at each instant
            plans[sim.now] = dict(sim.current)

    sched = Scheduler.from_names(order, group, "proportional", place)
    cfg = SimConfig(round_len=1000.0, reschedule_on_arrival=True, max_time=1.5)
    # the same throughput model the service builds (as `simulate` does)
    Simulator(cluster, specs, sched, build_model(cluster), config=cfg, observers=[observe]).run()
    assert sorted(plans) == [0.0, 1.0]
    return [plans[0.0], plans[1.0]]


@pytest.mark.parametrize(
    "order,place,group",
    [("fifo", "packed-sticky", "none"), ("sjf", "packed-sticky", "none"), ("sjf", "packed-non-sticky", "none"),
     ("fifo", "random-sticky", "none"), ("sjf", "random-sticky", "none"), ("fifo", "packed-non-sticky", "none"),
     ("fifo", "packed-sticky", "muri")],
)
def test_simulator_and_service_make_the_same_plan(
    tmp_path: Path, order: str, place: str, group: str, cgroup_parent: str
) -> None:
    cluster = Cluster.homogeneous(2, 4)
    expected = sim_plans(cluster, order, place, group)
    assert len(expected) == 2
    if group == "muri":  # jobs really share GPUs in this scenario
        assert any(a.group for a in expected[0].values())

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    svc = Service(store, cluster, local_executor(cluster, tmp_path / "run", True, cgroup_parent),
                  Scheduler.from_names(order, group, "proportional", place), tmp_path, round_s=1000.0, grace_s=0.0)
    try:
        got = []
        k = 0
        for wave in (WAVE1, WAVE2):
            for g, d in wave:
                svc.submit({"name": "j", "command": "sleep 60", "gpus": g, "time_limit": d,
                            "resource_times": stages(k)}, "alice")
                k += 1
            svc.round()
            got.append(dict(svc.current))
            # what the store says runs is what was planned
            running = {str(r.id) for r in store.list_jobs(HOLDING)}
            assert running == set(svc.current)
        assert got == expected
        assert any(len(p) for p in expected)
    finally:
        svc.terminate_all()
        store.close()
