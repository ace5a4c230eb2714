"""Real cgroups on this machine (skipped, with the reason, where they are not writable)."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuloom.runtime.exec import cgroups
from gpuloom.runtime.exec.cgroups import (
    CgroupManager,
    cgroup_name,
    detect,
    format_cpus,
    memory_limit_of,
    parse_cpus,
    process_cgroups,
)


def test_cpu_list_format_roundtrip() -> None:
    assert format_cpus((0, 1, 2, 5)) == "0-2,5"
    assert format_cpus([7, 3, 4]) == "3-4,7"
    assert format_cpus(()) == ""
    assert parse_cpus("0-2,5\n") == (0, 1, 2, 5)
    assert parse_cpus("") == ()
    assert parse_cpus(format_cpus((1, 3, 4, 5, 9))) == (1, 3, 4, 5, 9)


def test_cgroup_name_is_one_safe_path_component() -> None:
    assert cgroup_name("job-12.a_b") == "job-12.a_b"
    assert cgroup_name("alice/../x y") == "alice_.._x_y"
    assert cgroup_name("..") == "job___"
    assert "/" not in cgroup_name("a/b/c")


def test_no_cgroup_filesystem_degrades_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cgroups._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gpuloom.runtime.exec.cgroups"):
        a = CgroupManager(root=str(tmp_path))
        b = CgroupManager(root=str(tmp_path))
    assert a.mode == b.mode == "none"
    assert a.support.version == 0 and "no cgroup v1 or v2 hierarchy" in a.support.reason
    warnings = [r for r in caplog.records if "CPU affinity only" in r.getMessage()]
    assert len(warnings) == 1
    assert a.job("x").paths() == []


def test_disabled_manager_has_no_dirs() -> None:
    m = CgroupManager(enabled=False)
    assert m.mode == "none" and m.job("j").dirs == {}


@pytest.fixture()
def manager() -> CgroupManager:
    m = CgroupManager()
    s = m.support
    if not (s.memory and s.cpuset):
        pytest.skip(f"cgroups not writable here ({s.mode}): {s.reason}")
    return m


def _job() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_detects_this_machine(manager: CgroupManager) -> None:
    s = detect()
    assert s.version in (1, 2)
    assert "memory" in s.controllers and "cpuset" in s.controllers
    assert s.mode == f"v{s.version}"


def test_create_sets_limits_and_remove_deletes(manager: CgroupManager) -> None:
    job = _job()
    cg = manager.create(job, (0,), 128)
    try:
        # no devices cgroup without GPU device files to deny
        assert set(cg.dirs) == {"memory", "cpuset"} | ({"pids"} if manager.support.pids else set())
        if manager.support.pids:
            assert (cg.dirs["pids"] / "pids.max").read_text() == "4096\n"
        for d in cg.paths():
            assert d.is_dir() and d.name == job
        limit = cg.memory_limit_file()
        assert limit is not None and int(limit.read_text()) == 128 * 10**6
        assert (cg.dirs["cpuset"] / "cpuset.cpus").read_text().strip() == "0"
        if manager.support.version == 1:
            assert (cg.dirs["cpuset"] / "cpuset.mems").read_text().strip() != ""
            memsw = cg.dirs["memory"] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                assert int(memsw.read_text()) == 128 * 10**6
        # reuse with other limits (a job relaunched on a new allocation), both directions
        manager.create(job, tuple(sorted(os.sched_getaffinity(0))), 512)
        assert int(limit.read_text()) == 512 * 10**6
        manager.create(job, (0,), 64)
        assert int(limit.read_text()) == 64 * 10**6
    finally:
        assert cg.remove()
    assert all(not d.exists() for d in cg.paths())


def test_process_moved_in_sees_limits_and_stragglers_are_killed(manager: CgroupManager) -> None:
    job = _job()
    cg = manager.create(job, (0,), 96)
    p = subprocess.Popen(["sleep", "30"])
    try:
        cg.enter(p.pid)
        where = process_cgroups(p.pid)
        key = "memory" if manager.support.version == 1 else ""
        assert where[key].endswith(f"/{manager.parent}/{job}")
        assert memory_limit_of(p.pid) == 96 * 10**6 // 4096 * 4096  # whole pages (v1 rounds down)
        assert os.sched_getaffinity(p.pid) == {0}
        assert cg.pids() == {p.pid}
        assert cg.remove()  # kills the straggler, then removes the directories
        assert p.wait(timeout=5) == -9
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_v2_hierarchy_without_memory_and_cpuset_controllers() -> None:
    unified = Path(cgroups.DEFAULT_ROOT) / "unified"
    if not (unified / "cgroup.controllers").exists():
        pytest.skip("no hybrid cgroup2 mount beside cgroup v1 here")
    ctrls = (unified / "cgroup.controllers").read_text().split()
    if "memory" in ctrls or "cpuset" in ctrls:
        pytest.skip("the unified hierarchy here has memory/cpuset")
    s = detect(str(unified))
    assert s.version == 2 and s.mode == "none"
    assert "controller memory not available" in s.reason or "gpuloom" in s.reason


def test_v2_files_written(tmp_path: Path) -> None:
    """What a v2 job cgroup gets, checked on a directory laid out like a cgroup2 mount (this machine
    runs v1, so the kernel side of v2 is not exercised here): controllers delegated through
    ``cgroup.subtree_control`` of the root and of ``gpuloom/``, then the limits."""
    root = tmp_path
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    (root / "gpuloom").mkdir()
    for f, text in (("cgroup.procs", ""), ("cgroup.subtree_control", ""), ("cpuset.cpus", ""),
                    ("cpuset.mems.effective", "0\n")):
        (root / "gpuloom" / f).write_text(text)
    m = CgroupManager(root=str(root))
    assert m.mode == "v2" and m.support.memory and m.support.cpuset, m.support.reason
    cg = m.create("job/7", (2, 3, 4, 6), 1500)
    d = root / "gpuloom" / "job_7"
    assert cg.paths() == [d]
    assert (d / "memory.max").read_text() == f"{1500 * 10**6}\n"
    assert (d / "cpuset.cpus").read_text() == "2-4,6\n"
    assert (d / "cpuset.mems").read_text() == "0\n"
    assert cg.memory_limit_file() == d / "memory.max"
    m.create("job/7", (), 0)
    assert (d / "memory.max").read_text() == "max\n"
