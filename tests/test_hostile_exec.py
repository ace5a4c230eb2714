"""A hostile but authenticated user against the root side of a job launch.

Nothing a user controls (a job's environment, its directory, what it plants in files it can write)
may influence a process that runs as root: the wrapper that records the job's end, the namespace
set-up, ``setpriv``.  Each test plays one attack; those that switch OS accounts need root (they
create and delete their own account) and are skipped otherwise.

The paths a root process opens for a launch, and the test that covers each:

* the job's log (appended by the server)            -> test_records_and_logs_only_in_directories_only_root_writes
* the pid and exit records (created by the server,
  written over in place by the wrapper)             -> the same, and test_a_relative_state_dir_...
* the job's working directory (was root's chdir)    -> test_the_jobs_directories_are_entered_and_made_by_the_job
* the job's own /tmp directory (made, bound over
  /tmp and removed by root)                         -> test_each_job_gets_its_own_tmp_and_dev_shm_...
* /tmp and /dev/shm as mount points, the tools
  (absolute paths on a fixed PATH)                  -> test_a_fake_path_never_runs_as_root
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpuloom.runtime.exec import local, local_launch
from gpuloom.runtime.exec.cgroups import CgroupManager
from gpuloom.runtime.exec.executor import ExecutorError, LaunchSpec, ProcInfo
from gpuloom.runtime.exec.local import DEFAULT_ENV_ALLOW, NodeAgent
from service_util import JOB_PY, job_writable, wait_for

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching OS accounts needs root")
ROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_SIDE_TOOLS = ("mv", "printf", "mkdir", "cat", "sh", "setpriv", "env", "unshare", "mount")


@pytest.fixture(scope="module")
def account() -> Iterator[str]:
    """A fresh unprivileged OS account (root only), deleted afterwards."""
    if not ROOT:
        pytest.skip("creating OS accounts needs root")
    name = f"glh{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    yield name
    subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def agent(tmp_path: Path, cgroup_parent: str) -> Iterator[NodeAgent]:
    a = NodeAgent(CgroupManager(parent=cgroup_parent), tmp_path / "run")
    yield a
    for job in list(a.running()):
        a.stop(job, 1.0)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    """A directory every account may write (outside /tmp, which jobs of other accounts get their own of)."""
    return job_writable(tmp_path)


def launch(agent: NodeAgent, tmp: Path, job: str, command: str, user: str | None, env: dict[str, str] | None = None,
           mem_mb: int = 0, workdir: str | None = None) -> ProcInfo:
    return agent.launch(LaunchSpec(job, command, "", (), (), mem_mb, str(tmp / f"{job}.log"), env or {}, workdir,
                                   user))


def finish(agent: NodeAgent, job: str, timeout: float = 30.0) -> int | None:
    got: dict[str, int | None] = {}
    wait_for(lambda: got.update(agent.poll()) or job in got, timeout, f"{job} to end")
    return got[job]


def output(tmp: Path, job: str) -> str:
    return (tmp / f"{job}.log").read_text()


def wait_ready(tmp: Path, job: str) -> None:
    wait_for(lambda: "ready" in output(tmp, job), 30, f"{job} to start")


def session(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def as_root(p: psutil.Process) -> bool:
    u = p.uids()
    return 0 in (u.real, u.effective, u.saved)


def recorded_euids(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# -- 1. a job's environment reaches no root process ------------------------------------------------------------
HOSTILE = {
    "LD_PRELOAD": "/nonexistent/evil.so", "LD_LIBRARY_PATH": "/nonexistent/lib", "LD_AUDIT": "/nonexistent/audit.so",
    "PATH": f"/nonexistent/bin:{JOB_PATH}", "IFS": "/", "ENV": "/nonexistent/env.sh",
    "BASH_ENV": "/nonexistent/bash_env.sh", "CDPATH": "/nonexistent", "PS4": "$(id >/dev/null)",
    "SHELLOPTS": "xtrace", "GCONV_PATH": "/nonexistent/gconv", "HOME": "/nonexistent/home",
    "LOCPATH": "/nonexistent/locale", "NLSPATH": "/nonexistent/%N", "HOSTALIASES": "/nonexistent/hosts",
    "GLIBC_TUNABLES": "glibc.malloc.check=3", "MALLOC_CHECK_": "3", "TMPDIR": "/nonexistent/tmp",
    "PYTHONPATH": "/nonexistent/py", "PYTHONSTARTUP": "/nonexistent/start.py", "PERL5OPT": "-Mevil",
    "LD_BIND_NOW": "1", "POSIXLY_CORRECT": "1", "PPID": "1", "OPTIND": "7",
}


@needs_root
def test_no_root_process_gets_the_jobs_environment_and_the_job_gets_all_of_it(agent: NodeAgent, tmp_path: Path,
                                                                              account: str, share: Path) -> None:
    env = dict(HOSTILE, LD_DEBUG="statistics", LD_DEBUG_OUTPUT=str(share / "lddebug"))
    show = "".join(f"printf '%s=%s\\n' {k} \"${k}\"; " for k in HOSTILE)
    info = launch(agent, tmp_path, "env1", f"{show}/usr/bin/true; echo ready; exec sleep 30", account, env)
    wait_ready(tmp_path, "env1")
    procs = session(info.pid)
    roots = [p for p in procs if as_root(p)]
    assert roots, "the wrapper runs as root"
    for p in roots:  # the whole environment of a root process is the server's fixed one
        assert p.environ() == ROOT_ENV, (p.cmdline(), p.environ())
    sleeper = next(p for p in procs if p.name() == "sleep")
    assert sleeper.uids().effective != 0 and {k: sleeper.environ().get(k) for k in env} == env
    shown = dict(line.split("=", 1) for line in output(tmp_path, "env1").splitlines() if "=" in line)
    assert {k: shown.get(k) for k in HOSTILE} == HOSTILE
    agent.stop("env1", 1.0)
    made = list(share.glob("lddebug*"))
    assert made and all(f.stat().st_uid != 0 for f in made)  # the loader wrote them for the job, as the job


CANARY = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void canary(void) {
    char b[32];
    int fd = open(CANARY_LOG, O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd >= 0) { int n = snprintf(b, sizeof b, "%d\n", (int)geteuid()); write(fd, b, n); close(fd); }
}
unsigned int la_version(unsigned int v) { return v; }  /* accepted as an LD_AUDIT module too */
"""


def build(share: Path, name: str, log: Path, extra: str = "") -> Path:
    """A shared object whose constructor appends the euid of every process that loads it to ``log``."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found")
    src = share / f"{name}.c"
    src.write_text(CANARY + extra)
    out = share / name
    subprocess.run([gcc, "-shared", "-fPIC", f'-DCANARY_LOG="{log}"', f"-Wl,-soname,{name}", "-o", str(out),
                    str(src)], check=True, capture_output=True)
    os.chmod(out, 0o755)
    return out


@needs_root
@pytest.mark.parametrize("var", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_preloaded_library_never_runs_as_root(agent: NodeAgent, tmp_path: Path, account: str, share: Path,
                                                var: str) -> None:
    log = share / "euids"
    so = build(share, "evil.so", log)
    launch(agent, tmp_path, "pre", "cat /dev/null && echo ran", account, {var: str(so)})
    assert finish(agent, "pre") == 0 and "ran" in output(tmp_path, "pre")
    euids = recorded_euids(log)
    assert euids and "0" not in euids, euids  # the job's own processes loaded it: only they


@needs_root
def test_a_library_path_never_reaches_root(agent: NodeAgent, tmp_path: Path, account: str, share: Path) -> None:
    """LD_LIBRARY_PATH with a library of the name setpriv (run as root to drop) needs: never loaded by root."""
    setpriv = shutil.which("setpriv", path=ROOT_ENV["PATH"])
    if setpriv is None or "libcap-ng.so.0" not in subprocess.run(["ldd", setpriv], capture_output=True,
                                                                  text=True).stdout:
        pytest.skip("setpriv does not load libcap-ng.so.0 here")
    nm = subprocess.run(["nm", "-D", "--undefined-only", setpriv], capture_output=True, text=True)
    stubs = "".join(f"int {w.split()[-1]}(void) {{ return 0; }}\n" for w in nm.stdout.splitlines()
                    if w.split() and w.split()[-1].startswith("capng_"))
    lib = share / "lib"
    lib.mkdir()
    log = share / "euids"
    os.replace(build(share, "libcap-ng.so.0", log, stubs), lib / "libcap-ng.so.0")
    os.chmod(lib, 0o755)
    launch(agent, tmp_path, "llp", "echo ran", account, {"LD_LIBRARY_PATH": str(lib)})
    code = finish(agent, "llp")
    assert "0" not in recorded_euids(log)
    assert code == 0 and "ran" in output(tmp_path, "llp")


@needs_root
def test_a_fake_path_never_runs_as_root(agent: NodeAgent, tmp_path: Path, account: str, share: Path) -> None:
    """PATH with fakes of every tool a launch or its end might call: only the job runs them, as itself."""
    fake, log = share / "bin", share / "path-euids"
    fake.mkdir()
    for name in SERVER_SIDE_TOOLS:
        real = shutil.which(name, path=ROOT_ENV["PATH"]) or "/bin/false"
        (fake / name).write_text(f"#!/bin/sh\n/usr/bin/id -u >> {log}\nexec {real} \"$@\"\n")
        os.chmod(fake / name, 0o755)
    os.chmod(fake, 0o755)
    work = share / "w"
    cmd = f"mkdir -p {work} && cat /dev/null && env true && mv {work} {work}2 && echo ran"
    launch(agent, tmp_path, "path", cmd, account, {"PATH": f"{fake}:{JOB_PATH}"})
    assert finish(agent, "path") == 0 and "ran" in output(tmp_path, "path")
    euids = recorded_euids(log)
    assert len(euids) >= 4 and "0" not in euids, euids  # mkdir, cat, env, mv: the job's, none root's


# -- 4. commands and environments are not visible to other users ----------------------------------------------
@needs_root
def test_no_process_argv_carries_the_command_or_the_environment(agent: NodeAgent, tmp_path: Path,
                                                                 account: str) -> None:
    token = uuid.uuid4().hex
    info = launch(agent, tmp_path, "argv", f"SECRET=cmd-{token}; echo ready; sleep 30", account,
                  {"TOKEN": f"env-{token}"})
    wait_ready(tmp_path, "argv")
    assert len(session(info.pid)) >= 3  # wrapper, job shell, sleep
    seen = []
    for p in psutil.process_iter():
        try:
            line = "\0".join(p.cmdline())
        except psutil.Error:
            continue
        if token in line:
            seen.append((p.pid, line))
    assert seen == []


# -- 5. the server's own PATH and libraries do not reach jobs ----------------------------------------------------
def test_the_servers_path_and_library_path_do_not_reach_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"/server-only/bin:{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/server-only/lib")
    show = "printf '%s\\n' \"$PATH\" \"${LD_LIBRARY_PATH-unset}\""
    agent = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
    launch(agent, tmp_path, "p1", show, None)
    assert finish(agent, "p1") == 0
    assert output(tmp_path, "p1").splitlines() == [JOB_PATH, "unset"]
    launch(agent, tmp_path, "p2", show, None, {"PATH": "/mine/bin:/usr/bin:/bin"})
    assert finish(agent, "p2") == 0
    assert output(tmp_path, "p2").splitlines() == ["/mine/bin:/usr/bin:/bin", "unset"]
    told = NodeAgent(CgroupManager(enabled=False), tmp_path / "run2", env_allow=(*DEFAULT_ENV_ALLOW, "PATH"))
    launch(told, tmp_path, "p3", show, None)  # an operator's --env-allow PATH
    assert finish(told, "p3") == 0
    assert output(tmp_path, "p3").splitlines() == [os.environ["PATH"], "unset"]


# -- 2. records only where root alone writes, never through a link --------------------------------------------------
@needs_root
def test_a_relative_state_dir_never_writes_records_where_the_job_planted_links(
        tmp_path: Path, cgroup_parent: str, account: str, share: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuloom.core.cluster import Cluster
    from gpuloom.runtime.exec.identity import Identities
    from gpuloom.runtime.exec.router import local_executor
    from gpuloom.runtime.service.config import ServiceConfig
    from gpuloom.runtime.service.service import Service
    from gpuloom.runtime.state.store import Store
    from gpuloom.scheduler import Scheduler

    here = tmp_path / "srv"
    here.mkdir()
    monkeypatch.chdir(here)  # `gpuloom serve --state-dir st` started here
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    work = share / "work"
    planted = work / "st" / "run" / "node-0"  # where a relative run dir resolves from the job's directory
    planted.mkdir(parents=True)
    for name in ("1.pid", "1.exit", "1.exit.tmp"):
        (planted / name).symlink_to(victim)
    subprocess.run(["chown", "-R", "-h", f"{account}:", str(work)], check=True)  # as an earlier job left them
    cluster = Cluster.homogeneous(1, 1)
    store = Store(f"sqlite:///{here / 'st.db'}")
    svc = Service(store, cluster, local_executor(cluster, "st/run", True, cgroup_parent), Scheduler.from_names(),
                  ServiceConfig("st",
                  round_s=1000.0, grace_s=5.0, identities=Identities({"alice": account})))
    try:
        jid = svc.submit({"name": "j", "command": "echo done", "gpus": 1, "workdir": str(work)}, "alice")

        def ended() -> bool:
            svc.round()
            return store.get_job(jid).state in ("finished", "failed")  # type: ignore[union-attr]

        wait_for(ended, 30, "the job to end")
        row = store.get_job(jid)
        assert row is not None and (row.state, row.exit_code) == ("finished", 0)
        assert victim.read_text() == "precious\n"
        assert (here / "st" / "run" / "node-0" / f"{jid}.exit").read_text().split() == ["0", "@1"]  # (launch 1)
        assert all((planted / n).is_symlink() for n in ("1.pid", "1.exit", "1.exit.tmp"))
        assert svc.state_dir == here / "st" and svc.guard.job_dir.is_absolute()
    finally:
        svc.shutdown()
        store.close()
        shutil.rmtree(svc.guard.job_dir, ignore_errors=True)


@needs_root
def test_records_and_logs_only_in_directories_only_root_writes(agent: NodeAgent, tmp_path: Path, account: str,
                                                              share: Path, cgroup_parent: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # without a run dir the records go beside the log: in a directory the job can write, the job would plant a
    # link to the victim there while it runs, for root to write its exit code through at the end
    loose = NodeAgent(CgroupManager(parent=cgroup_parent))
    log = share / "j.log"
    plant = f"ln -s {victim} {log}.exit.tmp; ln -sf {victim} {log}.exit; echo planted"
    try:
        loose.launch(LaunchSpec("j", plant, "", (), (), 0, str(log), {}, None, account))
        finish(loose, "j")
    except ExecutorError as e:
        assert "writable by other accounts" in str(e)
    assert victim.read_text() == "precious\n"
    # the log itself: a link (or a hard link, a FIFO) where it goes is never opened
    os.symlink(victim, tmp_path / "k.log")
    with pytest.raises(ExecutorError, match="launch failed"):
        launch(agent, tmp_path, "k", "echo into-the-victim", account)
    assert victim.read_text() == "precious\n"
    # stale links in the run dir are replaced by records of our own
    run = tmp_path / "run"
    for name in ("m.exit", "m.pid", "m.exit.tmp"):
        (run / name).symlink_to(victim)
    launch(agent, tmp_path, "m", "exit 5", account)
    assert finish(agent, "m") == 5
    assert victim.read_text() == "precious\n" and (run / "m.exit").read_text().split() == ["5"]
    assert not (run / "m.exit").is_symlink() and stat.S_IMODE((run / "m.exit").stat().st_mode) == 0o600


@needs_root
def test_the_jobs_directories_are_entered_and_made_by_the_job(agent: NodeAgent, tmp_path: Path, account: str,
                                                               share: Path) -> None:
    """A directory root may enter but the job may not: the job runs in / (its account has no home) and says so."""
    closed = share / "root-only"
    closed.mkdir(mode=0o700)
    launch(agent, tmp_path, "wd", "pwd", account, workdir=str(closed))
    assert finish(agent, "wd") == 0
    assert output(tmp_path, "wd").splitlines() == [f"gpuloom: no directory {closed} on this node; running in /", "/"]
    launch(agent, tmp_path, "ck", "echo ran", account, {"GPULOOM_CHECKPOINT_DIR": str(closed / "ck")})
    assert finish(agent, "ck") == 126 and not (closed / "ck").exists()  # made by the job: refused to it


# -- 6. private /tmp and /dev/shm ------------------------------------------------------------------------------
@needs_root
def test_each_job_gets_its_own_tmp_and_dev_shm_removed_at_its_end(agent: NodeAgent, tmp_path: Path,
                                                                   account: str) -> None:
    token = uuid.uuid4().hex[:12]
    keep = tmp_path / "keep"  # a directory a job links to from its /tmp: removing the job's /tmp must not follow
    keep.mkdir(mode=0o755)
    (keep / "file").write_text("kept\n")
    try:
        launch(agent, tmp_path, "a", f"echo a > /tmp/{token}; echo a > /dev/shm/{token}; ln -s {keep} /tmp/link; "
                                     "echo ready; sleep 30", account)
        wait_ready(tmp_path, "a")
        assert not os.path.lexists(f"/tmp/{token}") and not os.path.lexists(f"/dev/shm/{token}")
        launch(agent, tmp_path, "b", f"ls -A /tmp /dev/shm; stat -c '%U %a' /tmp /dev/shm; cat /tmp/{token}", account)
        assert finish(agent, "b") != 0  # b cannot see a's file
        lines = output(tmp_path, "b").splitlines()
        assert lines[:5] == ["/dev/shm:", "", "/tmp:", f"{account} 700", f"{account} 700"], lines
        agent.stop("a", 2.0)
        assert (keep / "file").read_text() == "kept\n"
        assert [p for p in (tmp_path / "run").iterdir() if p.is_dir()] == []  # the jobs' /tmp directories are gone
    finally:
        for p in (f"/tmp/{token}", f"/dev/shm/{token}"):
            if os.path.lexists(p):
                os.unlink(p)


@needs_root
def test_dev_shm_is_sized_and_charged_to_the_jobs_memory_limit(agent: NodeAgent, tmp_path: Path,
                                                               account: str) -> None:
    if not agent.cgroups.support.memory:
        pytest.skip(f"no writable memory cgroup: {agent.cgroups.support.reason}")
    token = uuid.uuid4().hex[:12]
    try:
        launch(agent, tmp_path, "df", "df -P -k /dev/shm | tail -1", account, mem_mb=64)
        assert finish(agent, "df") == 0
        assert output(tmp_path, "df").split()[1] == str(64 * 10**6 // 1024)  # KiB: the memory limit
        hog = f"{JOB_PY} -c 'x = bytearray(60 * 10**6); x[::4096] = bytes(len(x) // 4096); print(\"survived\")'"
        launch(agent, tmp_path, "shm", f"head -c 60000000 /dev/zero > /dev/shm/{token} && echo written && {hog}",
               account, mem_mb=100)
        assert finish(agent, "shm") == 137  # 60 MB in /dev/shm + 60 MB of its own > 100 MB: the OOM killer
        assert "written" in output(tmp_path, "shm") and "survived" not in output(tmp_path, "shm")
        assert not os.path.lexists(f"/dev/shm/{token}")
    finally:
        if os.path.lexists(f"/dev/shm/{token}"):
            os.unlink(f"/dev/shm/{token}")


@needs_root
def test_without_mount_namespaces_jobs_share_tmp_and_it_is_said_once(tmp_path: Path, account: str, cgroup_parent: str,
                                                                     caplog: pytest.LogCaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_launch, "_warned_shared_tmp", False)  # the flag _namespaces sets
    agent = NodeAgent(CgroupManager(parent=cgroup_parent), tmp_path / "run")
    agent.tools["unshare"] = None  # as on a machine without it
    shared = NodeAgent(CgroupManager(parent=cgroup_parent), tmp_path / "run2", private_tmp=False)  # --shared-tmp
    token = uuid.uuid4().hex[:12]
    try:
        with caplog.at_level(logging.WARNING, logger="gpuloom.service"):
            for ag, job in ((agent, "s1"), (agent, "s2"), (shared, "s3")):
                launch(ag, tmp_path, job, f"echo {job} >> /tmp/{token}", account)
                assert finish(ag, job) == 0
        assert Path(f"/tmp/{token}").read_text().split() == ["s1", "s2", "s3"]
        warned = [r.getMessage() for r in caplog.records if "/dev/shm" in r.getMessage()]
        assert len(warned) == 1 and "not found" in warned[0]
    finally:
        if os.path.lexists(f"/tmp/{token}"):
            os.unlink(f"/tmp/{token}")


# -- the API refuses what the job's shell could not set ------------------------------------------------------------
@pytest.mark.parametrize("name", ["A-B", "1X", "X Y", "", "A=B", "Ä", "X\nY"])
def test_environment_names_must_be_shell_names(name: str) -> None:
    from pydantic import ValidationError

    from gpuloom.runtime.api.app import JobSubmit

    with pytest.raises(ValidationError, match="environment variable name"):
        JobSubmit.model_validate({"command": "true", "gpus": 1, "env": {name: "x"}})
    assert JobSubmit.model_validate({"command": "true", "gpus": 1, "env": {"_Ok_1": "x"}}).env == {"_Ok_1": "x"}


def test_a_launch_outside_the_api_is_held_to_the_same_names(tmp_path: Path) -> None:
    agent = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
    with pytest.raises(ExecutorError, match="'A-B' is not a shell name"):
        launch(agent, tmp_path, "n", "true", None, {"A-B": "x"})


def test_placeholders_read_as_no_record_yet(tmp_path: Path) -> None:
    agent = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")
    info = launch(agent, tmp_path, "r", "echo ready; sleep 30", None)
    try:
        wait_ready(tmp_path, "r")
        blank = " " * (local.RECORD_ROOM - 1) + "\n"
        assert Path(info.exit_path).read_text() == blank  # made at launch, room for the code
        assert local.read_exit_record(info.exit_path) is None and agent.exit_time(info) is None
        assert Path(agent.pid_path(info.exit_path)).read_text().split() == [str(info.pid)]
        later = NodeAgent(CgroupManager(enabled=False), tmp_path / "run")  # a restarted service
        assert [(o.job_id, o.pid) for o in later.orphans()] == [("r", info.pid)]
        assert agent.stop("r", 30.0) == 143  # (the grace is a bound: it returns at the exit)
        # (its exit record marked as a stop's)
        assert Path(info.exit_path).read_text().split() == ["143", "!"] and agent.exit_time(info) is not None
    finally:
        if agent.alive("r"):
            agent.stop("r", 0.5)


def test_relative_paths_are_made_absolute_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuloom.cli.service import state_dir_path

    monkeypatch.chdir(tmp_path)
    assert state_dir_path(Path("st")) == tmp_path / "st"
    agent = NodeAgent(CgroupManager(enabled=False), "run")
    assert agent.run_dir == tmp_path / "run"
    monkeypatch.chdir("/")
    info = agent.launch(LaunchSpec("x", "exit 3", "", (), (), 0, str(tmp_path / "x.log")))
    assert finish(agent, "x") == 3 and info.exit_path == str(tmp_path / "run" / "x.exit")


@needs_root
def test_serve_refuses_checkpoint_places_its_jobs_would_not_see(tmp_path: Path) -> None:
    import sys

    for args in (["--job-dir", str(tmp_path / "jobs")], ["--checkpoint-root", "/dev/shm/ck"]):
        r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--state-dir", str(tmp_path / "st"), "--port",
                            "0", "--cluster", "1x1", *args], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, COLUMNS="400"))  # one line, not wrapped in a box
        assert r.returncode == 2 and "each job gets its own of" in " ".join(r.stderr.split()), r.stderr
