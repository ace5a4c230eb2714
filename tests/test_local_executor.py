"""LocalExecutor: real processes, checked from inside (GPUs, cores, memory limit), stop, poll, adopt."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.runtime.exec.cgroups import CgroupManager, format_cpus
from gpuloom.runtime.exec.executor import LaunchSpec, ProcInfo
from gpuloom.runtime.exec.local import ExecutorError, LocalExecutor, read_exit_record

SRC = str(Path(__file__).resolve().parents[1] / "src")
PY = shlex.quote(sys.executable)
CORES = sorted(os.sched_getaffinity(0))

PROBE = (
    "import json, os\n"
    "from gpuloom.runtime.exec.cgroups import memory_limit_of, process_cgroups\n"
    "print('PROBE ' + json.dumps({'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'),"
    " 'cpus': sorted(os.sched_getaffinity(0)), 'mem': memory_limit_of(),"
    " 'cg': process_cgroups(), 'resume': os.environ.get('GPULOOM_RESUME'),"
    " 'omp': os.environ.get('OMP_NUM_THREADS'), 'sid': os.getsid(0) }))\n"
)


def jid() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def ex() -> Iterator[LocalExecutor]:
    e = LocalExecutor("local")
    yield e
    for job in list(e.agent.running()):
        e.stop(job, 0.2)


def spec(job: str, command: str, tmp: Path, gpus=(), cpus=(), mem_mb=0, env=None) -> LaunchSpec:
    return LaunchSpec(job, command, "local", tuple(gpus), tuple(cpus), mem_mb, str(tmp / f"{job}.log"),
                      env={"PYTHONPATH": SRC, **(env or {})})


def wait_done(e: LocalExecutor, job: str, timeout: float = 10.0) -> dict[str, int | None]:
    deadline = time.monotonic() + timeout
    got: dict[str, int | None] = {}
    while time.monotonic() < deadline:
        got.update(e.poll())
        if job in got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{job} did not end within {timeout}s")


@pytest.fixture()
def go(tmp_path: Path) -> Iterator[Path]:
    """A file a test's job waits for before it ends (so that it runs until the test has adopted it), made after
    the test whatever happened: no job outlives its test."""
    p = tmp_path / "go"
    yield p
    p.touch()


def wait_gone(info: ProcInfo, timeout: float = 30.0) -> None:
    """Wait until ``info``'s process has ended (a zombie counts) and its exit record is written."""
    import psutil

    def gone() -> bool:
        try:
            return psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + timeout
    while not (gone() and read_exit_record(info.exit_path) is not None):
        assert time.monotonic() < deadline, f"{info.job_id} did not end within {timeout}s"
        time.sleep(0.02)


def probe(tmp: Path, job: str) -> dict:
    for line in (tmp / f"{job}.log").read_text().splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    raise AssertionError((tmp / f"{job}.log").read_text())


def probe_cmd(tmp: Path) -> str:
    (tmp / "probe.py").write_text(PROBE)
    return f"{PY} {shlex.quote(str(tmp / 'probe.py'))}"


def test_process_gets_its_gpus_cores_and_memory_limit(ex: LocalExecutor, tmp_path: Path) -> None:
    job = jid()
    cpus = CORES[-1:]
    ex.launch(spec(job, probe_cmd(tmp_path), tmp_path, gpus=(3, 1), cpus=cpus, mem_mb=200, env={"GPULOOM_RESUME": "1"}))
    assert wait_done(ex, job) == {job: 0}
    p = probe(tmp_path, job)
    assert p["cvd"] == "3,1"
    assert p["cpus"] == cpus
    assert p["resume"] == "1" and p["omp"] == "1"
    if ex.cgroup_mode != "none" and ex.agent.cgroups.support.memory:
        assert p["mem"] == 200 * 10**6 // 4096 * 4096  # MB of 10^6 bytes, in whole pages
        key = "memory" if ex.cgroup_mode == "v1" else ""
        assert p["cg"][key].endswith(f"/gpuloom/{job}")
    # the job's cgroup is removed once its end has been seen
    assert all(not d.exists() for d in ex.agent.cgroups.job(job).paths())
    assert (tmp_path / f"{job}.log").read_text().startswith("PROBE ")  # the log is the job's output only


def test_no_gpus_means_empty_visible_devices_and_own_session(ex: LocalExecutor, tmp_path: Path) -> None:
    job = jid()
    info = ex.launch(spec(job, probe_cmd(tmp_path), tmp_path, cpus=CORES))
    assert info.node == "local" and info.exit_path.endswith(".log.exit")
    wait_done(ex, job)
    p = probe(tmp_path, job)
    assert p["cvd"] == ""
    assert p["sid"] == info.pid and p["sid"] != os.getsid(0)
    assert p["cpus"] == CORES


def test_affinity_only_mode_still_pins(tmp_path: Path) -> None:
    e = LocalExecutor("local", cgroups=CgroupManager(enabled=False))
    job = jid()
    e.launch(spec(job, probe_cmd(tmp_path), tmp_path, cpus=CORES[:1], mem_mb=100))
    wait_done(e, job)
    p = probe(tmp_path, job)
    assert p["cpus"] == CORES[:1]
    assert not any(path.endswith(f"/gpuloom/{job}") for path in p["cg"].values())


def test_exit_codes_and_exit_record(ex: LocalExecutor, tmp_path: Path) -> None:
    a, b = jid(), jid()
    ia = ex.launch(spec(a, "echo hello; exit 3", tmp_path))
    ib = ex.launch(spec(b, "true", tmp_path))
    got = wait_done(ex, a)
    got.update(wait_done(ex, b) if b not in got else {})
    assert got == {a: 3, b: 0}
    assert read_exit_record(ia.exit_path) == 3 and read_exit_record(ib.exit_path) == 0
    assert "hello" in Path(ia.log_path).read_text()
    assert ex.poll() == {}  # reported once


def test_stop_gives_grace_then_kills(ex: LocalExecutor, tmp_path: Path) -> None:
    polite, stubborn = jid(), jid()
    ex.launch(spec(polite, "trap 'echo saving; exit 0' TERM; echo ready; sleep 30 & wait", tmp_path))
    ex.launch(spec(stubborn, "trap '' TERM; echo ready; sleep 30", tmp_path))
    for j in (polite, stubborn):  # wait until the traps are installed
        while "ready" not in (tmp_path / f"{j}.log").read_text():
            time.sleep(0.02)
    assert ex.stop(polite, 5.0) == 0
    assert "saving" in (tmp_path / f"{polite}.log").read_text()
    t = time.monotonic()
    assert ex.stop(stubborn, 0.3) == 137
    assert time.monotonic() - t >= 0.3
    assert not ex.alive(polite) and not ex.alive(stubborn)
    assert ex.poll() == {}
    with pytest.raises(ExecutorError, match="not running here"):
        ex.stop(polite, 1.0)


def test_a_stopped_command_list_does_not_go_on(ex: LocalExecutor, tmp_path: Path) -> None:
    job = jid()
    handler = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('ready', flush=True); time.sleep(30)"
    ex.launch(spec(job, f"{PY} -c {shlex.quote(handler)}; echo NEXT-RAN", tmp_path))
    while "ready" not in (tmp_path / f"{job}.log").read_text():
        time.sleep(0.02)
    assert ex.stop(job, 5.0) == 7  # the job's own handler ran and its code is reported
    assert "NEXT-RAN" not in (tmp_path / f"{job}.log").read_text()


def test_memory_limit_is_enforced(ex: LocalExecutor, tmp_path: Path) -> None:
    if not ex.agent.cgroups.support.memory:
        pytest.skip(f"no writable memory cgroup: {ex.agent.cgroups.support.reason}")
    job = jid()
    hog = f"{PY} -c 'x = bytearray(400 * 2**20); x[::4096] = bytes(len(x[::4096])); print(\"survived\")'"
    ex.launch(spec(job, hog, tmp_path, mem_mb=64))
    assert wait_done(ex, job) == {job: 137}
    assert "survived" not in (tmp_path / f"{job}.log").read_text()


def test_stragglers_outside_the_process_group_are_killed_via_cgroup(ex: LocalExecutor, tmp_path: Path) -> None:
    if ex.cgroup_mode == "none":
        pytest.skip("needs cgroups to find processes that left the job's session")
    job = jid()
    pidfile = tmp_path / "escapee.pid"
    ex.launch(spec(job, f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' & sleep 30", tmp_path))
    while not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(0.02)
    escapee = int(pidfile.read_text())
    assert os.getpgid(escapee) != os.getpgid(0)
    ex.stop(job, 0.1)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and Path(f"/proc/{escapee}").exists():
        if "Z" in Path(f"/proc/{escapee}/stat").read_text().split()[2]:
            break
        time.sleep(0.02)
    assert not Path(f"/proc/{escapee}").exists() or Path(f"/proc/{escapee}/stat").read_text().split()[2] == "Z"


def test_bad_launches_are_refused(ex: LocalExecutor, tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match="node 'other' is not served here"):
        ex.launch(LaunchSpec("x", "true", "other", (), (), 0, str(tmp_path / "x.log")))
    with pytest.raises(ExecutorError, match=r"CPU core\(s\) \[9999\] do not exist"):
        ex.launch(spec("x", "true", tmp_path, cpus=(9999,)))
    job = jid()
    ex.launch(spec(job, "sleep 30", tmp_path))
    with pytest.raises(ExecutorError, match="already running"):
        ex.launch(spec(job, "sleep 30", tmp_path))


def test_adopt_after_restart(tmp_path: Path, go: Path) -> None:
    first = LocalExecutor("local")
    job, done = jid(), jid()
    info = first.launch(spec(job, f"until [ -e {go} ]; do sleep 0.02; done; exit 7", tmp_path, cpus=CORES[:1],
                             mem_mb=100))
    finished = first.launch(spec(done, "exit 0", tmp_path))
    wait_gone(finished)
    # "restart": a new executor knows only the stored ProcInfo records
    second = LocalExecutor("local")
    assert second.adopt(info)
    assert second.alive(job)
    forged = ProcInfo(job + "x", "local", info.pid, info.start_time + 5.0, info.log_path, info.exit_path)
    assert not second.adopt(forged)  # same pid, different creation time: not our process
    assert not second.adopt(finished)  # already gone: requeue or mark done from its exit record
    assert second.exit_code(finished) == 0
    go.touch()
    assert wait_done(second, job) == {job: 7}  # not our child: end seen by liveness, code from the record
    assert not second.alive(job)
    first.poll()


def test_stop_an_adopted_process(tmp_path: Path) -> None:
    first = LocalExecutor("local")
    job = jid()
    info = first.launch(spec(job, "trap 'exit 0' TERM; echo ready; sleep 30 & wait", tmp_path))
    while "ready" not in Path(info.log_path).read_text():
        time.sleep(0.02)
    second = LocalExecutor("local")
    assert second.adopt(info)
    assert second.stop(job, 5.0) == 0
    assert first.poll() == {job: 0}


def test_run_dir_exit_records_found_from_the_job_id_alone(tmp_path: Path, go: Path) -> None:
    run = tmp_path / "run"
    first = LocalExecutor("local", run_dir=run)
    live, gone = jid(), jid()
    info = first.launch(spec(live, f"until [ -e {go} ]; do sleep 0.02; done; exit 4", tmp_path))
    ended = first.launch(spec(gone, "exit 9", tmp_path))
    assert info.exit_path == str(run / f"{live}.exit")
    wait_gone(ended)
    second = LocalExecutor("local", run_dir=run)
    bare = ProcInfo(live, "local", info.pid, info.start_time)  # what a store that keeps only pid + start time has
    assert second.adopt(bare)
    assert not second.adopt(ProcInfo(gone, "local", ended.pid, ended.start_time))
    assert second.exit_code(ProcInfo(gone, "local", ended.pid, ended.start_time)) == 9
    go.touch()
    assert wait_done(second, live) == {live: 4}
    first.poll()


def test_fold_cores_maps_a_declared_inventory_onto_this_machine(tmp_path: Path) -> None:
    e = LocalExecutor("local", fold_cores=True)
    job = jid()
    n = len(CORES)
    e.launch(spec(job, probe_cmd(tmp_path), tmp_path, cpus=(n + 1, 2 * n + 1) if n > 1 else (3,)))
    wait_done(e, job)
    assert probe(tmp_path, job)["cpus"] == [CORES[1 % n]]


def test_repin_moves_every_process_and_thread(ex: LocalExecutor, tmp_path: Path) -> None:
    if len(CORES) < 2:
        pytest.skip("needs 2 cores")
    job = jid()
    threads = "import threading, time; [threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]; print('ready', flush=True); time.sleep(30)"
    info = ex.launch(spec(job, f"{PY} -c {shlex.quote(threads)} & wait", tmp_path, cpus=CORES[:2]))
    while "ready" not in (tmp_path / f"{job}.log").read_text():
        time.sleep(0.02)

    def affinities() -> set[tuple[int, ...]]:
        import psutil

        procs = [psutil.Process(info.pid), *psutil.Process(info.pid).children(recursive=True)]
        return {tuple(sorted(os.sched_getaffinity(int(t)))) for p in procs for t in os.listdir(f"/proc/{p.pid}/task")}

    assert affinities() == {tuple(CORES[:2])}
    assert ex.repin(job, (CORES[1],)) >= 3  # wrapper, inner shell, python (and its threads)
    assert affinities() == {(CORES[1],)}
    ex.repin(job, tuple(CORES[:2]))
    assert affinities() == {tuple(CORES[:2])}
    cg = ex.agent.cgroups.job(job)
    if "cpuset" in cg.dirs:
        assert (cg.dirs["cpuset"] / "cpuset.cpus").read_text().strip() == format_cpus(CORES[:2])
    with pytest.raises(ExecutorError, match="do not exist"):
        ex.repin(job, (9999,))


def test_stops_of_several_jobs_run_in_parallel(ex: LocalExecutor, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    jobs = [jid() for _ in range(3)]
    for j in jobs:
        ex.launch(spec(j, "trap '' TERM; echo ready; sleep 30", tmp_path))
    for j in jobs:
        while "ready" not in (tmp_path / f"{j}.log").read_text():
            time.sleep(0.02)
    t = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        codes = list(pool.map(lambda j: ex.stop(j, 0.5), jobs))
    assert codes == [137, 137, 137]
    assert time.monotonic() - t < 1.4  # three grace periods of 0.5 s overlap
    assert ex.poll() == {}


def test_several_node_names_on_one_machine(tmp_path: Path) -> None:
    e = LocalExecutor(["node-0", "node-1"])
    a, b = jid(), jid()
    ia = e.launch(LaunchSpec(a, "echo $GPULOOM_MEM_MB", "node-0", (0,), (), 300, str(tmp_path / "a.log")))
    ib = e.launch(LaunchSpec(b, "true", "node-1", (0,), (), 0, str(tmp_path / "b.log")))
    assert (ia.node, ib.node) == ("node-0", "node-1")
    with pytest.raises(ExecutorError, match="node 'node-2' is not served here"):
        e.launch(LaunchSpec(jid(), "true", "node-2", (), (), 0, str(tmp_path / "c.log")))
    wait_done(e, a)
    assert (tmp_path / "a.log").read_text().splitlines()[-1] == "300"
    with pytest.raises(ExecutorError, match="at least one"):
        LocalExecutor([])


def test_jobs_survive_a_killed_service_and_are_adopted(tmp_path: Path, go: Path) -> None:
    import dataclasses
    import signal
    import subprocess

    run = tmp_path / "run"
    job = jid()
    log = tmp_path / "job.log"
    sleepy = Path(__file__).resolve().parents[1] / "examples" / "sleepy_train.py"
    # (after its 40 steps the job waits for the test to have adopted it)
    command = f"{sys.executable} {sleepy} --steps 40 --step-s 0.02 && until [ -e {go} ]; do sleep 0.02; done"
    service = (
        "import dataclasses, json, sys, time\n"
        "from gpuloom.runtime.exec.executor import LaunchSpec\n"
        "from gpuloom.runtime.exec.local import LocalExecutor\n"
        f"ex = LocalExecutor('local', run_dir={str(run)!r})\n"
        f"info = ex.launch(LaunchSpec({job!r}, {command!r}, 'local',"
        f" (0,), (), 100, {str(log)!r}))\n"
        "print(json.dumps(dataclasses.asdict(info)), flush=True)\n"
        "time.sleep(60)\n"
    )
    svc = subprocess.Popen([sys.executable, "-c", service], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": SRC})
    try:
        info = ProcInfo(**json.loads(svc.stdout.readline()))
        while "iter=3 " not in log.read_text():
            time.sleep(0.02)
    finally:
        svc.send_signal(signal.SIGKILL)  # the service dies without a word
        svc.wait()
    ex = LocalExecutor("local", run_dir=run)
    assert ex.adopt(dataclasses.replace(info, exit_path="", log_path=""))  # found from pid, start time, job id
    go.touch()
    assert wait_done(ex, job, 20.0) == {job: 0}
    assert "done steps=40" in log.read_text()
