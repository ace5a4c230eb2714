"""Hostile jobs against the isolation of a node: fork bombs (pids cgroup) and other jobs' GPUs (devices cgroup).

Real cgroups where this machine has them writable (root, v1 here), skipped with the reason otherwise; the
v2 and no-cgroup paths are checked on directories laid out like those mounts.  GPUs are stood in for by
character device files with NVIDIA's major number (195) made with ``mknod``: with no driver behind them an
open the devices cgroup allows fails with ENXIO, one it denies with EPERM.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster, Node
from gpuloom.runtime.exec import cgroups
from gpuloom.runtime.exec.cgroups import CgroupError, CgroupManager, JobCgroup, cgroup_name, device_number
from gpuloom.runtime.exec.discovery import (
    DiscoveryError,
    GpuInfo,
    discover_gpu_devices,
    gpu_device_files,
    proc_minors,
    with_minors,
)
from gpuloom.runtime.exec.executor import ExecutorError, LaunchSpec
from gpuloom.runtime.exec.local import LocalExecutor
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import JOB_PY, REPO, job_writable, wait_for

ROOT = os.geteuid() == 0
PIDS_REASON = "hit its limit of {} processes: forks and new threads beyond it failed"

# forks sleepers until a fork fails (EAGAIN: the pids limit) or `attempts` are made; on a failure it says so,
# leaves `marker`, holds its processes until `release` appears (at most 20 s; "-": not at all), and exits 1
BOMB = """\
import os, sys, time
marker, release, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = 0
try:
    for _ in range(attempts):
        if os.fork() == 0:
            try:
                os.execv("/bin/sleep", ["sleep", "20"])
            finally:
                os._exit(127)
        n += 1
except BlockingIOError as e:
    print(f"forked {n}, then: {e.strerror}", flush=True)
    open(marker, "w").close()
    end = time.time() + 20
    while release != "-" and not os.path.exists(release) and time.time() < end:
        time.sleep(0.05)
    sys.exit(1)
print(f"forked {n}", flush=True)
"""

# waits for the bomb's marker (at most 15 s), then forks 20 short processes of its own and releases the bomb
NEIGHBOUR = """\
import os, subprocess, sys, time
marker, release = sys.argv[1], sys.argv[2]
end = time.time() + 15
while not os.path.exists(marker) and time.time() < end:
    time.sleep(0.05)
procs = [subprocess.Popen(["/bin/sleep", "0.2"]) for _ in range(20)]
ok = sum(p.wait() == 0 for p in procs)
print("bomb full" if os.path.exists(marker) else "bomb not full", "forked", ok, flush=True)
open(release, "w").close()
"""

# opens each path given and says how it went (errno names), then tries to widen its own device rules
# and to leave its devices cgroup
OPENER = """\
import errno, os, sys
allow, root_procs, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
out = [os.environ.get("CUDA_VISIBLE_DEVICES", "unset")]
for p in paths:
    try:
        os.close(os.open(p, os.O_RDWR))
        out.append("open")
    except OSError as e:
        out.append(errno.errorcode[e.errno])
for f, text in ((allow, "c 195:0 rwm"), (root_procs, str(os.getpid()))):
    try:
        with open(f, "w") as fh:
            fh.write(text)
        out.append("wrote")
    except OSError as e:
        out.append(errno.errorcode[e.errno])
print(*out, flush=True)
"""


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A directory job accounts may read and write, holding the job scripts."""
    d = job_writable(tmp_path)
    for name, text in (("bomb.py", BOMB), ("neighbour.py", NEIGHBOUR), ("opener.py", OPENER)):
        (d / name).write_text(text)
        os.chmod(d / name, 0o644)
    return d


def real_manager(parent: str, need: str, **kw: object) -> CgroupManager:
    m = CgroupManager(parent=parent, **kw)  # type: ignore[arg-type]
    if not getattr(m.support, need):
        pytest.skip(f"no writable {need} cgroup here ({m.mode}): {m.support.reason}")
    return m


def wait_poll(ex: LocalExecutor, job: str, timeout: float = 30.0) -> int | None:
    got: dict[str, int | None] = {}

    def ended() -> bool:
        got.update(ex.poll())
        return job in got

    wait_for(ended, timeout, f"{job} to end")
    return got[job]


# -- pids: fork bombs ------------------------------------------------------------------------------
def test_fork_bomb_fails_alone_with_its_reason_while_a_neighbour_finishes(tmp_path: Path, cgroup_parent: str,
                                                                          shared: Path) -> None:
    """Through the service: the bomb's forks fail at its limit while a neighbour's forks succeed, the bomb
    fails naming the limit, the neighbour finishes, and nothing of the bomb is left."""
    limit = 40
    cluster = Cluster.homogeneous(1, 2)
    ex = local_executor(cluster, tmp_path / "state" / "run", True, cgroup_parent, pids_max=limit)
    mgr = ex.agent.cgroups  # type: ignore[attr-defined]
    if not mgr.support.pids:
        pytest.skip(f"no writable pids cgroup here ({mgr.mode}): {mgr.support.reason}")
    store = Store(f"sqlite:///{tmp_path / 'state' / 'db.sqlite'}")
    svc = Service(store, cluster, ex, Scheduler.from_names(),
                  ServiceConfig(tmp_path / "state", round_s=1000.0, grace_s=2.0))
    marker, release = shared / "full", shared / "release"
    try:
        bomb = svc.submit({"command": f"{JOB_PY} {shared / 'bomb.py'} {marker} {release} 300", "gpus": 1}, "alice")
        calm = svc.submit({"command": f"{JOB_PY} {shared / 'neighbour.py'} {marker} {release}", "gpus": 1}, "bob")
        svc.round()
        wait_for(marker.exists, 20, "the bomb to reach its limit")
        pids_dir = mgr.job(str(bomb)).dirs["pids"]  # a one-part job's executor id is its own
        assert (pids_dir / "pids.current").read_text().strip() == str(limit)  # held at its limit, not beyond
        assert subprocess.run(["/bin/true"]).returncode == 0  # the machine still forks

        def ended() -> bool:
            svc.round()
            return {store.get_job(j).state for j in (bomb, calm)} <= {"finished", "failed"}  # type: ignore[union-attr]

        wait_for(ended, 40, "both jobs to end")
        b, c = store.get_job(bomb), store.get_job(calm)
        assert b is not None and c is not None
        assert (b.state, b.exit_code) == ("failed", 1), b
        assert (b.reason or "").endswith(f"ended with code 1: {PIDS_REASON.format(limit)}"), b.reason
        assert (c.state, c.exit_code, c.reason) == ("finished", 0, None), c
        assert "bomb full forked 20" in svc.log_path(calm).read_text()
        forked = svc.log_path(bomb).read_text()
        assert "then: Resource temporarily unavailable" in forked and int(forked.split()[1].rstrip(",")) < limit
        assert not pids_dir.exists()  # removed with the job: its sleepers were killed
    finally:
        svc.terminate_all()
        svc.shutdown()
        store.close()


def test_a_real_fork_bomb_is_contained_and_cleaned_up(tmp_path: Path, cgroup_parent: str, shared: Path) -> None:
    """``while True: os.fork()`` (every process forks until a fork fails): the job fails naming its limit
    and every process of it is gone.  A bounded bomb proves the limit holds first."""
    limit = 32
    mgr = real_manager(cgroup_parent, "pids", pids_max=limit)
    ex = LocalExecutor("local", cgroups=mgr)
    log = tmp_path / "probe.log"
    probe = f"{JOB_PY} {shared / 'bomb.py'} {shared / 'full'} - 200"
    ex.launch(LaunchSpec("probe", probe, "local", (), (), 0, str(log)))
    assert wait_poll(ex, "probe") == 1, log.read_text()  # on a machine without the limit: stop here
    assert ex.end_reason("probe") == PIDS_REASON.format(limit)
    job = f"bomb-{uuid.uuid4().hex[:6]}"
    code = "import os\nwhile True:\n    os.fork()"
    try:
        ex.launch(LaunchSpec(job, f"{JOB_PY} -c '{code}' 2>/dev/null", "local", (), (), 0, str(tmp_path / "b.log")))
        # 1 (the bomb's own failed fork), or 2: the wrapper's exit recorder forks `mv`, which leftovers
        # holding the limit can refuse (dash exits 2 on "Cannot fork")
        assert wait_poll(ex, job) in (1, 2)
        assert ex.end_reason(job) == PIDS_REASON.format(limit)
        assert all(not d.exists() for d in mgr.job(job).paths())  # rmdir succeeds only once no task is left
    finally:
        assert mgr.job(job).remove(timeout_s=10.0)


def test_pids_max_is_written_as_configured(cgroup_parent: str) -> None:
    mgr = real_manager(cgroup_parent, "pids", pids_max=77)
    job = f"t-{uuid.uuid4().hex[:6]}"
    cg = mgr.create(job, (), 0)
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert (cg.dirs["pids"] / "pids.max").read_text() == "77\n"
        cg.enter(p.pid)
        assert cgroups.process_cgroups(p.pid)["pids"] == f"/{cgroup_parent}/{cgroup_name(job)}"
        assert (cg.dirs["pids"] / "pids.current").read_text() == "1\n"
        mgr.pids_max = 0  # none: the same cgroup reused without a limit
        mgr.create(job, (), 0)
        assert (cg.dirs["pids"] / "pids.max").read_text() == "max\n"
        assert cg.pids_limit_hit() == 0
    finally:
        assert cg.remove()
        p.wait()
    assert CgroupManager(parent=cgroup_parent).pids_max == 4096
    with pytest.raises(CgroupError, match=r"pids_max must be an integer >= 0 \(0: no limit\), got -1"):
        CgroupManager(parent=cgroup_parent, pids_max=-1)


def test_pids_limit_hit_reads_pids_events(tmp_path: Path) -> None:
    support = cgroups.CgroupSupport(1, str(tmp_path), False, False, pids=True)
    cg = JobCgroup(support, "j", {"pids": tmp_path})
    for events, limit, hit in (("max 0\n", "64\n", 0), ("max 3\n", "64\n", 64), ("max 3\n", "max\n", 0)):
        (tmp_path / "pids.events").write_text(events)
        (tmp_path / "pids.max").write_text(limit)
        assert cg.pids_limit_hit() == hit, (events, limit)
    assert JobCgroup(support, "j", {}).pids_limit_hit() == 0


# -- devices: other jobs' GPUs ---------------------------------------------------------------------
@pytest.fixture
def fake_gpus(shared: Path) -> list[str]:
    """Device files of four GPUs (195:0..3) and a control device (195:255), openable by anyone as far as
    file permissions go."""
    if not ROOT:
        pytest.skip("mknod needs root")
    d = shared / "dev"
    d.mkdir()
    os.chmod(d, 0o755)
    paths = []
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidia2", 2), ("nvidia3", 3), ("nvidiactl", 255)):
        os.mknod(d / name, 0o666 | 0o020000, os.makedev(195, minor))
        os.chmod(d / name, 0o666)
        paths.append(str(d / name))
    return paths


@pytest.fixture
def account() -> Iterator[str]:
    name = f"gl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    yield name
    subprocess.run(["userdel", name], capture_output=True)


def test_a_job_opens_only_its_own_gpus_even_without_cuda_visible_devices(
        tmp_path: Path, cgroup_parent: str, shared: Path, fake_gpus: list[str], account: str) -> None:
    mgr = real_manager(cgroup_parent, "devices")
    ex = LocalExecutor("local", cgroups=mgr, gpu_devices=fake_gpus[:4])
    allow = Path(mgr.root) / "devices" / cgroup_parent / "{job}" / "devices.allow"
    root_procs = Path(mgr.root) / "devices" / "cgroup.procs"
    targets = " ".join([*fake_gpus, "/dev/null"])
    # each job: its GPUs -> what opening nvidia0..3, nvidiactl, /dev/null gives
    for gpus, opens in (((1,), "EPERM ENXIO EPERM EPERM"), ((0, 3), "ENXIO EPERM EPERM ENXIO"),
                        ((), "EPERM EPERM EPERM EPERM")):
        job = f"g-{uuid.uuid4().hex[:6]}"
        log = tmp_path / f"{job}.log"
        cmd = (f"unset CUDA_VISIBLE_DEVICES; {JOB_PY} {shared / 'opener.py'} "
               f"{str(allow).format(job=job)} {root_procs} {targets}")
        ex.launch(LaunchSpec(job, cmd, "local", gpus, (), 0, str(log), user=account))
        assert wait_poll(ex, job) == 0, log.read_text()
        # the control device and everything else stay allowed; the job cannot widen its rules nor leave
        assert log.read_text() == f"unset {opens} ENXIO open EACCES EACCES\n", gpus
        assert not (Path(mgr.root) / "devices" / cgroup_parent / job).exists()  # removed with the job


# opens each path given, then tries to take a hidden one back (unmount it, bind the real file over it)
HIDDEN_OPENER = """\
import errno, os, subprocess, sys
out = [os.environ.get("CUDA_VISIBLE_DEVICES", "unset")]
for p in sys.argv[1:]:
    try:
        os.close(os.open(p, os.O_RDWR))
        out.append("open")
    except OSError as e:
        out.append(errno.errorcode[e.errno])
for cmd in (["umount", sys.argv[2]], ["mount", "--bind", sys.argv[1], sys.argv[2]]):
    out.append("undone" if subprocess.run(cmd, capture_output=True).returncode == 0 else "refused")
print(*out, flush=True)
"""


@pytest.mark.parametrize("private_tmp", [True, False])
def test_without_a_devices_cgroup_other_gpus_are_hidden_in_the_jobs_mount_namespace(
        tmp_path: Path, shared: Path, fake_gpus: list[str], account: str, private_tmp: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    """cgroup v2 (no eBPF) or no cgroups: a job of another account finds the other GPUs' device files covered
    by a root-owned file of mode 0 in its own mount namespace (EACCES, even with CUDA_VISIBLE_DEVICES unset),
    and cannot uncover them; its own GPUs' files, the control device and the machine's files are untouched.
    The same with --shared-tmp (a namespace for the masks alone)."""
    from gpuloom.runtime.exec.local_launch import MASK_NAME, gpu_isolation, mount_namespaces, root_tool

    tools = root_tool("unshare"), root_tool("mount")
    if mount_namespaces(*tools) is not None:
        pytest.skip("no mount namespaces here")
    # what `gpuloom inventory` says and the executor goes by
    assert [gpu_isolation(True, *tools), gpu_isolation(False, *tools), gpu_isolation(False, None, None)] == [
        "cgroup", "namespace", "none"]
    cgroups._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gpuloom.runtime.exec.cgroups"):
        ex = LocalExecutor("local", cgroups=CgroupManager(enabled=False), gpu_devices=fake_gpus[:4],
                           run_dir=tmp_path / "run", private_tmp=private_tmp)
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()] == [
        "GPU device files are not denied by a cgroup (no writable devices cgroup (cgroups disabled by "
        "configuration)): each job of another account gets the other GPUs' device files hidden in its own mount "
        "namespace; jobs of the server's own account are kept to their GPUs by CUDA_VISIBLE_DEVICES alone"]
    (shared / "hidden.py").write_text(HIDDEN_OPENER)
    targets = " ".join([*fake_gpus, "/dev/null"])
    # each job: its GPUs -> what opening nvidia0..3 gives (no driver behind the files: ENXIO when reached)
    for gpus, opens in (((1,), "EACCES ENXIO EACCES EACCES"), ((0, 3), "ENXIO EACCES EACCES ENXIO"),
                        ((), "EACCES EACCES EACCES EACCES")):
        job = f"h-{uuid.uuid4().hex[:6]}"
        log = tmp_path / f"{job}.log"
        ex.launch(LaunchSpec(job, f"unset CUDA_VISIBLE_DEVICES; {JOB_PY} {shared / 'hidden.py'} {targets}",
                             "local", gpus, (), 0, str(log), user=account))
        assert wait_poll(ex, job) == 0, log.read_text()
        assert log.read_text() == f"unset {opens} ENXIO open refused refused\n", gpus
    mask = tmp_path / "run" / MASK_NAME
    assert (mask.stat().st_uid, mask.stat().st_size, mask.stat().st_mode & 0o7777) == (0, 0, 0)
    for f in fake_gpus:  # the machine's device files are as they were
        with pytest.raises(OSError) as e:
            os.open(f, os.O_RDWR)
        assert e.value.errno == errno.ENXIO and os.stat(f).st_mode & 0o777 == 0o666
    # a job of the server's own account gets no namespace (it could undo one): CUDA_VISIBLE_DEVICES only
    log = tmp_path / "own.log"
    ex.launch(LaunchSpec("own", f"{JOB_PY} {shared / 'hidden.py'} {fake_gpus[0]} {fake_gpus[1]}", "local", (1,), (), 0,
                         str(log)))
    assert wait_poll(ex, "own") == 0, log.read_text()
    assert log.read_text().split()[:3] == ["1", "ENXIO", "ENXIO"]


def test_a_reused_cgroup_follows_the_new_gpus(cgroup_parent: str, fake_gpus: list[str]) -> None:
    """A job relaunched on other GPUs in its existing cgroup: its old GPU is denied, its new one allowed."""
    mgr = real_manager(cgroup_parent, "devices")
    numbers = mgr.gpu_devices(fake_gpus[:4])
    assert numbers == ((195, 0), (195, 1), (195, 2), (195, 3))
    job = f"r-{uuid.uuid4().hex[:6]}"
    mgr.create(job, (), 0, (1,), numbers)
    cg = mgr.create(job, (), 0, (2,), numbers)
    probe = "import errno, os, sys\nfor p in sys.argv[1:]:\n    try:\n        os.open(p, os.O_RDWR)\n" \
            "    except OSError as e:\n        print(errno.errorcode[e.errno], end=' ')\n"
    try:
        out = subprocess.run([sys.executable, "-c", probe, *fake_gpus[:4]], capture_output=True, text=True,
                             preexec_fn=cg.enter, check=True).stdout
        assert out == "EPERM EPERM ENXIO EPERM "
    finally:
        assert cg.remove()
    with pytest.raises(CgroupError, match=r"job x: GPU\(s\) \[4\] have no device file \(this node has 4\)"):
        mgr.create("x", (), 0, (0, 4), numbers)


def test_gpu_device_files_are_checked_when_the_executor_starts(tmp_path: Path) -> None:
    m = CgroupManager(enabled=False)
    (tmp_path / "plain").write_text("")
    with pytest.raises(CgroupError, match=f"GPU device file {tmp_path}/plain is not a character device"):
        m.gpu_devices(["/dev/null", str(tmp_path / "plain")])
    with pytest.raises(CgroupError, match=f"GPU device file {tmp_path}/none: No such file or directory"):
        LocalExecutor("local", cgroups=m, gpu_devices=[str(tmp_path / "none")])
    assert device_number("/dev/null") == (1, 3)
    two_sizes = Cluster((Node("n0", 2, 2, 1000), Node("n1", 4, 2, 1000)))
    with pytest.raises(ExecutorError, match="2 GPU device files given, one per GPU of a node, but node n1 has 4$"):
        local_executor(two_sizes, tmp_path, gpu_devices=["/dev/null", "/dev/zero"])


def test_v2_limits_pids_and_says_devices_are_not_isolated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory laid out like a cgroup2 mount (this machine runs v1): the pids controller is delegated
    and ``pids.max`` written; device isolation is reported off, with why, once."""
    root = tmp_path
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.procs").write_text("")
    (root / "gpuloom").mkdir()
    for d in (root, root / "gpuloom"):  # memory and cpuset delegated already: only pids is written
        (d / "cgroup.subtree_control").write_text("cpuset memory\n")
    for f, text in (("cgroup.procs", ""), ("cpuset.cpus", "0-3\n"), ("cpuset.mems.effective", "0\n")):
        (root / "gpuloom" / f).write_text(text)
    cgroups._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gpuloom.runtime.exec.cgroups"):
        m = CgroupManager(root=str(root), pids_max=100)
        numbers = m.gpu_devices(["/dev/null", "/dev/zero"])
        m.gpu_devices(["/dev/null", "/dev/zero"])
    s = m.support
    assert (m.mode, s.memory, s.cpuset, s.pids, s.devices) == ("v2", True, True, True, False)
    assert s.reason == cgroups.V2_DEVICES
    assert [(d / "cgroup.subtree_control").read_text() for d in (root, root / "gpuloom")] == ["+pids"] * 2
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"GPU device files are not isolated ({cgroups.V2_DEVICES}): jobs are kept to their GPUs "
                      "by CUDA_VISIBLE_DEVICES alone, which a job can unset"]
    cg = m.create("j", (1,), 0, (0,), numbers)
    assert set(cg.dirs) == {"memory", "cpuset", "pids"} and cg.paths() == [root / "gpuloom" / "j"]
    assert (root / "gpuloom" / "j" / "pids.max").read_text() == "100\n"
    assert not (root / "gpuloom" / "j" / "devices.deny").exists()


def test_v1_without_pids_and_devices_hierarchies_degrades(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A v1 layout with memory and pids hierarchies only: memory and pids limits, no cpuset, no device
    isolation, each said once."""
    for c in ("memory", "pids"):
        (tmp_path / c / "gpuloom").mkdir(parents=True)
        for d in (tmp_path / c, tmp_path / c / "gpuloom"):
            (d / "cgroup.procs").write_text("")
    cgroups._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gpuloom.runtime.exec.cgroups"):
        m = CgroupManager(root=str(tmp_path))
        numbers = m.gpu_devices(["/dev/null"])
    s = m.support
    assert (m.mode, s.memory, s.cpuset, s.pids, s.devices) == ("v1", True, False, True, False)
    assert s.reason == f"no cpuset hierarchy at {tmp_path}/cpuset; no devices hierarchy at {tmp_path}/devices"
    assert any(f"GPU device files are not isolated (no writable devices cgroup ({s.reason}))" in r.getMessage()
               for r in caplog.records)
    cg = m.create("j", (), 50, (0,), numbers)
    assert set(cg.dirs) == {"memory", "pids"}
    assert (tmp_path / "pids" / "gpuloom" / "j" / "pids.max").read_text() == "4096\n"
    assert (tmp_path / "memory" / "gpuloom" / "j" / "memory.limit_in_bytes").read_text() == f"{50 * 10**6}\n"


def test_no_cgroups_reports_every_limit_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cgroups._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gpuloom.runtime.exec.cgroups"):
        m = CgroupManager(root=str(tmp_path))
        m.gpu_devices(["/dev/null"])
    s = m.support
    assert (m.mode, s.memory, s.cpuset, s.pids, s.devices) == ("none", False, False, False, False)
    assert [r.getMessage() for r in caplog.records] == [
        f"cgroups unavailable (no cgroup v1 or v2 hierarchy under {tmp_path}): jobs are pinned by CPU affinity "
        "only, memory is not limited",
        f"GPU device files are not isolated (no writable devices cgroup (no cgroup v1 or v2 hierarchy under "
        f"{tmp_path})): jobs are kept to their GPUs by CUDA_VISIBLE_DEVICES alone, which a job can unset"]


# -- discovery of the device files and the serve options -------------------------------------------------
def test_device_files_come_from_minor_numbers_not_indices(tmp_path: Path) -> None:
    for bus, minor in (("0000:07:00.0", 2), ("0000:0f:00.0", 0)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: A100\nIRQ: 40\nDevice Minor: \t {minor}\n")
    assert proc_minors(tmp_path) == {"0000:07:00.0": 2, "0000:0f:00.0": 0}
    assert proc_minors(tmp_path / "absent") == {}
    # NVML's bus ids have an 8-digit domain and capitals; the GPU NVML gave a minor for keeps it
    gpus = [GpuInfo(0, "A100", pci_bus_id="00000000:07:00.0"), GpuInfo(1, "A100", pci_bus_id="00000000:0F:00.0"),
            GpuInfo(2, "A100", pci_bus_id="00000000:10:00.0", minor=5)]
    filled = with_minors(gpus, tmp_path)
    assert [g.minor for g in filled] == [2, 0, 5]
    assert gpu_device_files(filled) == ("/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia5")
    assert gpu_device_files([*filled[:2], GpuInfo(2, "A100")]) == ()  # one unknown: none isolated
    (tmp_path / "0000:07:00.0" / "information").write_text("Device Minor: two\n")
    with pytest.raises(DiscoveryError, match="0000:07:00.0/information: Device Minor is not a number: 'two'"):
        proc_minors(tmp_path)
    assert discover_gpu_devices(use_nvml=False, smi="no-such-nvidia-smi") == ()


def test_serve_refuses_gpu_device_files_that_do_not_fit(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for devices, msg in (("/dev/null,/dev/zero", "2 GPU device files given, one per GPU of a node, but node"),
                         ("nvidia0", "give auto, none or absolute device file paths, got 'nvidia0'"),
                         (str(tmp_path), "is not a character device")):
        r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--gpus", "1",
                            "--state-dir", str(tmp_path / "st"), "--gpu-devices", devices],
                           env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 2 and msg in " ".join(r.stderr.split()), (devices, r.stderr)
