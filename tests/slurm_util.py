"""A real one-node Slurm (Debian's ``slurm-wlm`` and ``munge``) started by the tests, on this machine.

``munged`` with a key made here, ``slurmctld -D`` and ``slurmd -D`` with a ``slurm.conf`` and
``gres.conf`` written here: one node (``NODE``) declaring ``GPUS`` GPUs as gres over fake device
files (character devices with the numbers of ``/dev/null``), one gres Type per device (``g0`` ...)
so that a job's GPU indices can be pinned, ``select/cons_tres`` with ``CR_Core_Memory``, ``batch_sched_delay=0`` (as docs/slurm.md
recommends), no cgroups (``proctrack/linuxproc``, ``task/none``).  Every file lives in one temporary directory
(the device files in ``/dev``, named after it); :meth:`SlurmCluster.stop` ends each daemon and
removes all of it, and runs even when a test fails.  Tests skip, saying why, where the binaries
are missing or not running as root (device files, ``SlurmUser=root``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gpuloom.runtime.exec.executor import LaunchSpec
    from gpuloom.runtime.exec.slurm_steps import SlurmStepsExecutor

NODE = "gpn0"
GPUS = 4
CPUS = 8
MEM_MB = 8000
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")


def missing() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    gone = [b for b in BINARIES if shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if gone:
        return f"Slurm not installed (no {', '.join(gone)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "a test Slurm needs root (device files, SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    assert found is not None, name
    return found


class SlurmCluster:
    """The daemons and files of one test Slurm; ``env`` makes its client commands find it."""

    def __init__(self, root: Path, node: str = NODE, gpus: int = GPUS, cpus: int = CPUS, mem_mb: int = MEM_MB,
                 conf: Sequence[str] = ()) -> None:
        self.root = root
        self.extra_conf = tuple(conf)  # slurm.conf lines that replace the settings of the same names
        self.node = node
        self.gpus = gpus
        self.cpus = cpus
        self.mem_mb = mem_mb
        self.tag = uuid.uuid4().hex[:6]
        self.devices = [f"/dev/gpuloom-test-{self.tag}-gpu{i}" for i in range(gpus)]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- set-up --------------------------------------------------------------------------------
    def write(self) -> None:
        r = self.root
        r.chmod(0o755)  # job accounts reach their batch scripts in the spool
        for d in ("munge", "state", "spool", "log"):
            # (munged's socket: every account reaches it, as srun --uid needs and every site has it)
            (r / d).mkdir(mode=0o755 if d in ("spool", "munge") else 0o700, parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for dev in self.devices:
            os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's numbers
        ctl_port, d_port = _free_port(), _free_port()
        settings = [
            "ClusterName=gpuloomtest",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            # a job is otherwise started at most once per 3 s (slurmctld's default batch_sched_delay), on both sides
            "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SlurmdParameters=config_overrides",  # declare more cores and memory than this machine has
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "GresTypes=gpu",
        ]
        names = {line.partition("=")[0] for line in self.extra_conf}
        self.conf.write_text("\n".join([
            *(line for line in settings if line.partition("=")[0] not in names), *self.extra_conf,
            f"NodeName={self.node} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={self.cpus} "
            f"RealMemory={self.mem_mb} Gres={','.join(f'gpu:g{i}:1' for i in range(self.gpus))} State=UNKNOWN",
            f"PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        (r / "gres.conf").write_text("".join(f"NodeName={self.node} Name=gpu Type=g{i} File={dev}\n"
                                             for i, dev in enumerate(self.devices)))
        self.conf.chmod(0o644)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        out.close()

    def start(self, timeout: float = 60.0) -> None:
        self.write()
        r = self.root
        self._spawn("munged", [_which("munged"), "-F", "--force", f"--key-file={r / 'munge' / 'munge.key'}",
                               f"--socket={self.munge_socket}", f"--pid-file={r / 'munge' / 'munged.pid'}",
                               f"--seed-file={r / 'munge' / 'munged.seed'}", f"--log-file={r / 'log' / 'munged.log'}"])
        wait_until(self.munge_socket.exists, 10.0, "munged's socket")
        self.start_ctld()
        self.start_slurmd()
        wait_until(lambda: "IDLE" in self.scontrol("show", "node", self.node).upper(), timeout,
                   f"node {self.node} to be idle", self.logs)

    def start_ctld(self) -> None:
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])
        wait_until(lambda: self.run("scontrol", "ping", check=False).returncode == 0, 30.0, "slurmctld", self.logs)

    def start_slurmd(self) -> None:
        self._spawn("slurmd", [_which("slurmd"), "-D", "-N", self.node])

    def stop_daemon(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    # -- commands ------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_which(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", "--oneliner", *args).stdout

    def job(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job -d``'s fields of one job (the first of each key)."""
        out = self.scontrol("show", "job", "-d", str(job_id))
        fields: dict[str, str] = {}
        for tok in out.split():
            k, eq, v = tok.partition("=")
            if eq and k not in fields:
                fields[k] = v
        return fields

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        self.run("scancel", "--user=root", check=False)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace")
            out.append(f"== {f.name}\n{text[-3000:]}")
        return "\n".join(out)

    # -- tear-down -----------------------------------------------------------------------------
    def stop(self) -> None:
        if "slurmctld" in self.procs:
            try:
                self.cancel_all()
            except Exception:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            # killed after 2 s: nothing here needs their state, and slurmd waits on SIGTERM for its jobs'
            # teardown (an allocation Slurm keeps COMPLETING after a slurmctld restart kept it 20 s)
            self.stop_daemon(name, timeout=2.0)
        self._kill_leftovers()
        for dev in self.devices:
            try:
                os.unlink(dev)
            except FileNotFoundError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """slurmstepd processes of jobs (their own sessions) still running from this Slurm's spool."""
        import psutil

        spool = str(self.root)
        # twice: a slurmstepd slurmd was forking as it died shows only after; and a slurmstepd that has set its
        # title ("slurmstepd: [1.0]") may show neither the spool nor SLURM_CONF, but holds slurmd's log open
        for n in range(2):
            if n:
                time.sleep(0.5)
            for p in psutil.process_iter(["name", "cmdline", "environ"]):
                try:
                    ours = spool in " ".join(p.info["cmdline"] or []) or \
                        (p.info["environ"] or {}).get("SLURM_CONF") == str(self.conf)
                    if not ours and (p.info["name"] or "").startswith("slurmstepd"):
                        ours = any(f.path.startswith(spool) for f in p.open_files())
                    if ours and p.pid != os.getpid():
                        p.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass


def wait_until(fn: Any, timeout: float, what: str, why: Any = None) -> Any:
    """Poll ``fn`` until it returns something true; fail naming ``what`` (and ``why()``) after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = fn()
        except (subprocess.SubprocessError, OSError):
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{why()}" if why else ""))
        time.sleep(0.1)


def slurm_cluster(conf: Sequence[str] = ()) -> Generator[SlurmCluster, None, None]:
    """Start a test Slurm in a fresh temporary directory (skip where it cannot run); stop it after.  ``conf``:
    slurm.conf lines replacing the settings they name."""
    why = missing()
    if why is not None:
        pytest.skip(why)
    # the tests' jobs run as the service's default job account: made here, not left to whichever test's server
    # happens to start first (on a fresh machine a test launching as it before any server did found no account)
    from gpuloom.runtime.exec.identity import ensure_account

    ensure_account("gpuloom")
    c = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpuloom-slurm-")), conf=conf)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session", name="slurm")
def slurm_fixture() -> Iterator[SlurmCluster]:
    """One test Slurm for the whole session (tests that restart or drain something put it back)."""
    yield from slurm_cluster()


@pytest.fixture(name="own_slurm")
def own_slurm_fixture() -> Iterator[Callable[..., SlurmCluster]]:
    """``own_slurm(*conf)`` -> a started test Slurm of the test's own (``conf``: slurm.conf lines replacing the
    settings they name), stopped after the test: nothing waits for its jobs to end (such as an allocation Slurm
    keeps COMPLETING until a retried message gets through)."""
    started: list[Generator[SlurmCluster, None, None]] = []

    def make(*conf: str) -> SlurmCluster:
        it = slurm_cluster(conf)
        c = next(it)
        started.append(it)
        return c

    yield make
    for it in started:
        it.close()  # (runs slurm_cluster's finally: SlurmCluster.stop)


# -- gpuloom serve --slurm ------------------------------------------------------------------------------
@pytest.fixture(name="slurm_jobs_cancelled")
def slurm_jobs_cancelled_fixture(slurm: SlurmCluster) -> Iterator[None]:
    """Cancel every job left in the test Slurm after the test (requested before ``server``, so this runs
    once the test's servers have stopped and launch nothing more)."""
    yield
    slurm.cancel_all()


@pytest.fixture(name="serve_slurm")
def serve_slurm_fixture(slurm: SlurmCluster, slurm_jobs_cancelled: None, server: Any, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> Any:
    """``serve_slurm(*args)`` -> a started ``gpuloom serve --slurm all`` (jobs as the default job account), made
    by conftest's ``server`` (which stops it after the test); then the test Slurm's jobs are cancelled."""
    from service_util import job_writable

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    jobs = job_writable(tmp_path)

    def make(*args: str) -> Any:
        return server("--slurm", "all", "--round", "0.2", "--job-dir", str(jobs), *args)

    return make


# -- the steps executor (--executor slurm-steps) ----------------------------------------------------
def fresh_steps_prefix() -> str:
    return f"glsteps{uuid.uuid4().hex[:6]}"


def steps_executor(slurm: SlurmCluster, tmp_path: Path) -> SlurmStepsExecutor:
    """A steps executor whose output goes under a directory the job account reaches; its names are the test's
    own (``glsteps<hex>``), so it never takes up another test's allocations on a shared test Slurm."""
    from gpuloom.runtime.exec.slurm_steps import SlurmStepsExecutor
    from service_util import job_writable

    e = SlurmStepsExecutor(fresh_steps_prefix(), grace_s=5.0, env=slurm.env,
                           out_dir=str(job_writable(tmp_path) / "out"), linger_s=1.0)
    e.read_nodes()
    return e


def step_spec(eid: str, command: str, log: Path, gpus: tuple[int, ...], user: str | None = "gpuloom", cpus: int = 2,
              mem: int = 300, attempt: int = 0, **env: str) -> LaunchSpec:
    """Launch ``attempt`` of ``command`` on the test node's ``gpus``, as ``user``, with ``cpus`` cores and
    ``mem`` MB."""
    from gpuloom.runtime.exec.executor import LaunchSpec

    return LaunchSpec(eid, command, NODE, gpus, tuple(range(cpus)), mem, str(log), env, None, user, attempt)


def preempt_short_over_long(s: Any, slurm: SlurmCluster) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """A long 4-GPU job (30 steps) runs; a short 2-GPU one (3 steps) is submitted and, under ``--order sjf``,
    preempts it; both are waited for.  -> (short's row, long's row, long's log, short's log), after checking
    that each ran each of its steps once, the long one preempted and resumed once on the same GPUs.  The long
    job ends only once the short one has (``STEPPER_HOLD``): on a loaded machine its 1.5 s of steps could end
    before the service may preempt it (a job just launched is protected for a few times its launch time)."""
    from service_util import STEPPER, job, ledger, start_records, stepper_cmd, submit, wait_for

    go = STEPPER.parent / f"{uuid.uuid4().hex[:8]}-short-done"  # (where the job's account sees it)
    with s.client() as c:
        long_id = submit(c, name="long", command=f"STEPPER_HOLD={go} {stepper_cmd(30, 0.05)}", gpus=4,
                         time_limit="600s")
        wait_for(lambda: "GPULOOM_PROGRESS iter=3" in c.get(f"/jobs/{long_id}/logs").text, 60, "long job progress")
        short_id = submit(c, name="short", command=stepper_cmd(3, 0.05), gpus=2, time_limit="60s")
        # (the short job needs 2 of the 4 GPUs the long one holds: it ends only after the long one was stopped)
        rows = {short_id: wait_for(lambda: (x := job(c, short_id))["state"] in ("finished", "failed") and x, 90,
                                   "the short job")}
        go.touch()
        rows[long_id] = wait_for(lambda: (x := job(c, long_id))["state"] in ("finished", "failed") and x, 90,
                                 "the long job")
        log = c.get(f"/jobs/{long_id}/logs").text
        short_log = c.get(f"/jobs/{short_id}/logs").text
    short, long = rows[short_id], rows[long_id]
    assert short["exit_code"] == 0 and ledger(short["checkpoint_dir"]) == [0, 1, 2]
    assert (long["exit_code"], long["progress"], long["preemptions"], long["resume_count"]) == (0, 30, 1, 1), \
        log[-300:] + slurm.scontrol("show", "job") + (s.state_dir / "serve.out").read_text()[-3000:]
    assert [(r["resume"], r["cvd"]) for r in start_records(log)] == [(None, "0,1,2,3"), ("1", "0,1,2,3")]
    assert ledger(long["checkpoint_dir"]) == list(range(30))  # no step lost or repeated
    return short, long, log, short_log


def slurm_ids(s: Any, jid: int) -> list[int]:
    """The Slurm job id of each launch of gpuloom job ``jid`` (from its launch events)."""
    with s.client() as c:
        return [e["detail"]["pids"][0] for e in c.get(f"/jobs/{jid}/events").json()
                if e["kind"] in ("launch", "preempt", "move", "resize") and "pids" in e["detail"]]
