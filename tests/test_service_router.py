"""The node router sends each launch to the executor of its node."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuloom.runtime.exec.cgroups import CgroupManager
from gpuloom.runtime.exec.executor import LaunchSpec
from gpuloom.runtime.exec.local import LocalExecutor
from gpuloom.runtime.exec.router import NodeRouter, RoutingError


def test_router_routes_by_node_and_merges_polls(tmp_path: Path, cgroup_parent: str) -> None:
    cg = CgroupManager(parent=cgroup_parent)
    a = LocalExecutor("n0", cgroups=cg, run_dir=tmp_path / "a", fold_cores=True)
    b = LocalExecutor("n1", cgroups=cg, run_dir=tmp_path / "b", fold_cores=True)
    r = NodeRouter({"n0": a, "n1": b})
    log = str(tmp_path / "log")
    r.launch(LaunchSpec("1", "sleep 0.3; exit 3", "n1", (0,), (0,), 100, log))
    r.launch(LaunchSpec("2", "sleep 30", "n0", (1,), (0,), 100, log))
    assert set(b.agent.running()) == {"1"} and set(a.agent.running()) == {"2"}
    with pytest.raises(RoutingError, match="node 'n9'"):
        r.launch(LaunchSpec("3", "true", "n9", (0,), (0,), 100, log))
    end = time.monotonic() + 10
    codes: dict[str, int | None] = {}
    while "1" not in codes and time.monotonic() < end:
        codes.update(r.poll())
        time.sleep(0.02)
    assert codes == {"1": 3}
    assert r.alive("2") and not r.alive("1")
    assert r.stop("2", 5.0) is not None and not r.alive("2")
    with pytest.raises(RoutingError, match="job 2"):
        r.stop("2", 1.0)
