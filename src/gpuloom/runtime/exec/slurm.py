"""The executor of a Slurm cluster: gpuloom decides, Slurm's daemons run the jobs.

``gpuloom serve --slurm`` runs the service in front of an existing Slurm
cluster (tested against Slurm 22.05).  Everything goes through Slurm's own
commands (``sbatch``, ``scontrol``, ``scancel``), run by the service's account,
which must be root or a Slurm operator able to submit as other users (see
docs/slurm.md).

Nodes
-----
:class:`SlurmInventory` reads ``scontrol show node`` (at most once a second):
every node with GPU gres (``Gres=gpu:...``) in the chosen partition whose state
is up (``IDLE``, ``MIXED``, ``ALLOCATED``, ``COMPLETING``, without ``DRAIN``,
``FAIL``, ``MAINT``, ``REBOOT``, ``POWER*`` flags or the ``*`` of a node that
does not respond) is a node of the service's cluster: its GPUs, cores
(``CPUTot``), memory (``RealMemory``, in Slurm's unit, which jobs are given in
too).  A node that goes down or is drained is *lost*: its jobs are requeued
held in Slurm (SIGTERM, then Slurm's ``KillWait``, then SIGKILL) and gpuloom
resumes them elsewhere after the fence.  When no node is left up, the
inventory is kept as it was: running jobs run on, and launches onto a node
that is not up are refused (the job stays queued) until one is back.

GPUs
----
Where the node declares one gres Type per device (``gpu:g0:1,gpu:g1:1,...``
from ``gres.conf`` lines in index order), a launch asks for exactly the plan's
GPUs (``--gres=gpu:g1:1,gpu:g3:1``) and Slurm's ``CUDA_VISIBLE_DEVICES`` is the
plan's indices.  Otherwise it asks for a count (``--gres=gpu:2``) and Slurm
picks which.  GPUs that jobs submitted to Slurm directly hold are read from
``scontrol show job -d`` (``GRES=gpu:g1:1(IDX:1)``): a launch onto one of them
is refused (:class:`~.executor.NodeUnavailable`: the job stays queued), never
overlaid; so is one that would not fit in the cores and memory (their
``TRES=``) such jobs leave on the node.

Jobs
----
One Slurm batch job per executor id, named ``gpuloom:<service>:<id>``, its
output appended (``--open-mode=append``) to the job's log, run as the job's
account (``sbatch --uid``, root only), with its cores (``--cpus-per-task``),
memory (``--mem``), node (``--nodelist``) and GPUs.  The command and its
environment are in the batch script (read by ``sbatch`` from its stdin, never
in argv); the script waits for the command on SIGTERM so its checkpoint handler
runs.  A launch returns once Slurm has the job (the round never waits for its
start); :meth:`~SlurmExecutor.poll` follows the start.  A :class:`~.executor.ProcInfo` records the Slurm job id as ``pid`` and
its submit time as ``start_time`` (a restarted service adopts the job only if
both match: ids restart when Slurm's state is lost).

**Stop**: ``scancel --signal=TERM --full``, up to the grace period for the job
to checkpoint and exit, then ``scontrol requeuehold`` (which kills what is
left).  The job stays in Slurm, held; a relaunch of the same executor id on
the same node and GPUs with the same command updates its cores and memory,
sets ``StartTime=now`` (a plain requeue waits 121 s) and releases it: the same
Slurm job id, ``SLURM_RESTART_COUNT`` counting the resumes
(``GPULOOM_RESUME=1`` from it).  The release waits (in poll) until a second has passed
since the requeue: slurmd refuses, by whole seconds, launch credentials as old
as a requeue's (the job would fail at once with ``already killed``).  Slurm 22.05 piles gres Types up when a held
job is re-pinned to other GPUs, so a relaunch elsewhere cancels the held job
and submits a new one.  Held jobs not relaunched within ``hold_s`` are
cancelled.

**srun** (``launcher="srun"``): the job is instead an allocation with one
step, started by an ``srun`` the service runs (in its own session, as the
job's account) for the job's whole run.  slurmctld places an allocation in the
request itself, where a batch job waits for its scheduling loop's next pass
(up to a second); the job ends with its step and its exit code, and is read
back as a batch job is.  It cannot be requeued: a stop ends it, a resume is a
new job.

**Exits**: a clean one from the exit record the batch script writes next to
its output (seen before Slurm's teardown ends); others from ``scontrol show
job``: ``ExitCode=code:signal`` (a signal ``n`` reads ``128 + n``), and the
state names the reason (``OUT_OF_MEMORY``,
``TIMEOUT``, ``NODE_FAIL``, a ``CANCELLED`` by someone else).  Slurm keeps a
finished job for ``MinJobAge`` (300 s by default); a job that ended longer ago
while the service was down is read from ``sacct`` where accounting is on, else
its code is unknown.  While ``slurmctld`` does not answer, nothing is reported
and launches are deferred (the jobs keep running under ``slurmd``).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...core.cluster import Cluster, ClusterError, Node
from .executor import Executor, ExecutorError, InventoryChange, LaunchSpec, NodeUnavailable, ProcInfo, free_port
from .identity import lookup, owned_dir, private_dir
from .logmirror import append_to, mirror_offset, set_mirror_offset
from .slurm_plan import ForeignJobs, Held

log = logging.getLogger("gpuloom.service")

#: states of a job that has ended (its ExitCode is final)
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
#: states of a job whose processes run (or are being set up or torn down)
LIVE = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
                  "RESIZING"})
UP = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
NOT_UP_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED",
                          "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN",
                          "NOT_RESPONDING", "FUTURE", "INVALID_REG", "DOWN", "UNKNOWN"})
REASONS = {"OUT_OF_MEMORY": "killed by the OOM killer (Slurm: OUT_OF_MEMORY)",
           "TIMEOUT": "reached its Slurm time limit (TIMEOUT)",
           "NODE_FAIL": "its node failed (Slurm: NODE_FAIL)",
           "BOOT_FAIL": "its node failed to boot (Slurm: BOOT_FAIL)",
           "DEADLINE": "passed its Slurm deadline (DEADLINE)",
           "PREEMPTED": "preempted by Slurm (PREEMPTED)",
           "CANCELLED": "cancelled in Slurm (scancel), not by gpuloom"}
#: how long after a requeue a held job may be released again (see :meth:`SlurmExecutor.launch`)
REVOKE_S = 1.1
#: how long a job whose batch script wrote its exit may stay running in Slurm before it is cancelled
ENDED_GRACE_S = 5.0
_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SRUN_JOB = re.compile(r"srun: (?:jobid (\d+):|job (\d+) queued)")
_GRES_IDX = re.compile(r"gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")


class SlurmError(ExecutorError):
    """A Slurm command that failed; the message has the command and what it said."""


def parse_records(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol --oneliner show job|node`` (one a line, ``Key=Value`` words), first of each key.

    A word without ``=`` belongs to the value before it (a node's ``Reason=Not responding [..]``)."""
    out = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        rec: dict[str, str] = {}
        last = None
        for word in line.split():
            k, eq, v = word.partition("=")
            if eq and k and (k.replace("/", "").replace(":", "").replace("_", "").isalnum()):
                if k in rec:  # -d repeats some keys (the allocated GRES): keep both, the second as k+"#2"
                    k = k + "#2"
                    if k in rec:
                        last = None
                        continue
                rec[k] = v
                last = k
            elif last is not None:
                rec[last] += " " + word
        out.append(rec)
    return out


def gres_gpus(gres: str) -> list[tuple[str, int]]:
    """A node's ``Gres=`` as (type, count) per GPU entry, in order (type ``""`` when untyped)."""
    out = []
    for item in gres.split(","):
        item = item.split("(", 1)[0]
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        try:
            count = int(parts[-1])
            typ = parts[1] if len(parts) == 3 else ""
        except ValueError:  # gpu:a100 (count 1)
            count, typ = 1, parts[1]
        out.append((typ, count))
    return out


def gres_indices(gres: str) -> list[int]:
    """GPU indices in a job's or node's allocated ``GRES=gpu:g1:1(IDX:1),gpu:2(IDX:0,2-3)``."""
    out: list[int] = []
    for m in _GRES_IDX.finditer(gres):
        if int(m.group(1)) == 0:
            continue
        for r in m.group(2).split(","):
            if r in ("", "N/A"):
                continue
            a, _, b = r.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    return sorted(out)


def tres(s: str) -> tuple[int, int]:
    """(cores, memory in MB) of a job's ``TRES=cpu=2,mem=300M,node=1,billing=2``."""
    cpus = mem = 0
    for item in s.split(","):
        k, _, v = item.partition("=")
        try:
            if k == "cpu":
                cpus = int(v)
            elif k == "mem" and v:
                scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}.get(v[-1].upper())
                mem = int(float(v[:-1]) * scale) if scale is not None else int(v)
        except ValueError:
            continue
    return cpus, mem


def exit_of(code: str) -> int | None:
    """Shell-style exit of a Slurm ``ExitCode=code:signal`` (``128 + signal`` when a signal ended it)."""
    try:
        a, _, b = code.partition(":")
        rc, sig = int(a), int(b or 0)
    except ValueError:
        return None
    return 128 + sig if sig else rc


def node_state_ok(state: str) -> bool:
    """Whether a node of ``State=`` (``IDLE``, ``MIXED+DRAIN``, ``IDLE*``) may get jobs."""
    if "*" in state or "~" in state or "#" in state or "!" in state or "%" in state:
        return False
    words = state.upper().split("+")
    return words[0] in UP and not (set(words[1:]) & NOT_UP_FLAGS)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    gpus: int
    cpus: int
    mem_mb: int
    gpu_type: str
    types: tuple[str, ...]  # one gres Type per device, in index order; () when not declared so
    up: bool
    partitions: tuple[str, ...]
    addr: str = ""  # NodeAddr: where other nodes reach it

    def as_node(self) -> Node:
        return Node(self.name, self.gpus, self.cpus, self.mem_mb, self.gpu_type)


def slurm_node(rec: Mapping[str, str]) -> SlurmNode | None:
    """A :class:`SlurmNode` of one ``scontrol show node`` record, or None if it declares no GPU."""
    gpus = gres_gpus(rec.get("Gres", "") if rec.get("Gres") not in (None, "(null)") else "")
    n = sum(c for _, c in gpus)
    if n < 1:
        return None
    types = tuple(t for t, _ in gpus) if all(c == 1 and t for t, c in gpus) and len({t for t, _ in gpus}) == n else ()
    kinds = {t for t, _ in gpus}
    gpu_type = next(iter(kinds)) if len(kinds) == 1 and "" not in kinds and not types else "generic"
    cpus = int(rec.get("CPUEfctv") or rec.get("CPUTot") or 0)
    return SlurmNode(rec["NodeName"], n, cpus, int(rec.get("RealMemory") or 0), gpu_type, types,
                     node_state_ok(rec.get("State", "")), tuple(p for p in rec.get("Partitions", "").split(",") if p),
                     rec.get("NodeAddr", rec["NodeName"]))


def read_output(path: str, offset: int, most: int = 16 << 20, warned: set[str] | None = None) -> bytes | None:
    """Up to ``most`` bytes from ``offset`` of a job's output file, which its account owns and could replace:
    only a regular file with one name, owned by the owner of its directory, is read (never through a link,
    so a job cannot have the service copy another file into its log); None otherwise.  ``warned``: paths
    already logged as refused (each is logged once, not at every poll)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.stat(os.path.dirname(path)).st_uid:
            if warned is None or path not in warned:
                log.warning("%s: not a plain file of its directory's owner: not copied", path)
                if warned is not None:
                    warned.add(path)
            return None
        return os.pread(fd, most, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def _unlink(path: str | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return ""


def _time(s: str | None) -> float:
    """Seconds since the epoch of a Slurm time (``2026-11-28T19:31:42``, local time); 0 if not a time."""
    try:
        return datetime.fromisoformat(str(s)).timestamp()
    except ValueError:
        return 0.0


#: what each placing command adds: before the common options, after them
_MODES = {"sbatch": (["--parsable"], ["--requeue"]), "srun": (["-v"], ["--input=none"]),
          "step": (["-v"], ["--input=none", "--exact"]), "salloc": (["--no-shell"], [])}


def slurm_argv(mode: str, *, name: str, node: str, cpus: int, mem_mb: int, gres: str | None,
               partition: str | None = None, workdir: str | None = None, out: str | None = None,
               account: tuple[int, int] | None = None, jobid: int | None = None) -> list[str]:
    """The argv (without the script) of the command that places one job on ``node``: ``sbatch`` (a batch
    job), ``srun`` (a new allocation and its step), ``step`` (``srun`` of a step in allocation ``jobid``:
    no partition, ``--exact`` so it holds only its own cores and memory) or ``salloc`` (an allocation
    that runs nothing).  ``account``: (uid, gid) to run as (root only); ``out``: the output, appended."""
    if mode not in _MODES or (mode == "step") != (jobid is not None):
        raise ValueError(f"slurm_argv: mode {mode!r} with jobid {jobid!r}")
    first, last = _MODES[mode]
    argv = ["srun" if mode == "step" else mode, *first]
    if jobid is not None:
        argv.append(f"--jobid={jobid}")
    argv += [f"--job-name={name}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}", f"--mem={max(1, mem_mb)}",
             f"--nodelist={node}"]
    if mode != "salloc":
        argv += [f"--chdir={workdir or '/'}", "--export=NONE"]
    if out is not None:
        argv += [f"--output={out}", f"--error={out}", "--open-mode=append"]
    argv += last
    if gres is not None:
        argv.append(f"--gres={gres}")
    if partition and mode != "step":
        argv.append(f"--partition={partition}")
    if account is not None:  # --uid alone leaves the job the submitter's group (root's): the account's group too
        argv += [f"--uid={account[0]}", f"--gid={account[1]}"]
    return argv


def run_as(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) a job of ``user`` is submitted as, or None to submit as the service's own account."""
    if user is None:
        return None
    acc = lookup(user)
    return (acc.uid, acc.gid) if os.geteuid() != 0 or acc.uid != 0 else None


@dataclass(slots=True)
class _Held:
    """A job stopped by gpuloom and requeued held in Slurm, kept for a relaunch."""

    slurm_id: int
    key: tuple[Any, ...]  # what a relaunch must match to reuse it
    since: float  # monotonic
    wall: float = 0.0  # when it was requeued (time.time())


class SlurmExecutor(Executor):
    """Runs each job as a Slurm batch job (see the module notes).

    ``prefix``: job names are ``<prefix>:<executor id>`` (one per service).
    ``partition``: where jobs go (None: Slurm's default).  ``env``: the
    environment of Slurm's commands (``SLURM_CONF`` for a cluster not in
    ``/etc/slurm``).  ``start_wait_s``: how long a launched job may stay
    pending in Slurm (a launch returns once ``sbatch`` has it; the round does
    not wait for the start) before it is cancelled and reported ended.
    ``out_dir``: where Slurm writes jobs' output, on a file system the nodes
    share, one directory per account (owned by it), copied into each job's log
    as it grows (None: Slurm writes the job's log itself, which the job's
    account must then be able to reach); there each batch script also writes
    its exit code, so a clean exit is seen before Slurm's teardown ends.
    ``launcher``: ``sbatch`` (a batch job) or ``srun`` (an allocation with one
    step, which slurmctld places in the request itself rather than at its
    scheduling loop's next pass; see :meth:`_srun`; needs ``out_dir``).
    """

    def __init__(self, prefix: str, partition: str | None = None, grace_s: float = 10.0,
                 env: Mapping[str, str] | None = None, hold_s: float = 600.0, start_wait_s: float = 60.0,
                 poll_every_s: float = 0.2, timeout_s: float = 30.0, out_dir: str | None = None,
                 launcher: str = "sbatch") -> None:
        if launcher not in ("sbatch", "srun", "steps"):
            raise ExecutorError(f"Slurm launcher {launcher!r}: sbatch, srun or steps (SlurmStepsExecutor)")
        if launcher != "sbatch" and out_dir is None:
            raise ExecutorError("the srun launcher needs an output directory (out_dir): srun writes there as the job's account")
        self.launcher = launcher
        #: Slurm job id -> its srun process, srun's stderr (service-private) and the job's script (reaped at poll)
        self._sruns: dict[int, tuple[subprocess.Popen[bytes], str, str]] = {}
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", prefix):
            raise ExecutorError(f"Slurm job name prefix {prefix!r}: letters, digits, '_', '.', '-' only")
        self.prefix = prefix
        self.partition = partition
        self.grace_s = float(grace_s)
        self.env = dict(env if env is not None else os.environ)
        self.hold_s = float(hold_s)
        self.start_wait_s = float(start_wait_s)
        self.poll_every_s = float(poll_every_s)
        self.timeout_s = float(timeout_s)
        self._bin: dict[str, str] = {}
        self.nodes: dict[str, SlurmNode] = {}  # every GPU node Slurm reports (usable or not), by name
        self.procs: dict[str, ProcInfo] = {}
        self.held: dict[str, _Held] = {}
        self.exits: dict[str, int | None] = {}
        self.reasons: dict[str, str] = {}
        self._keys: dict[str, tuple[Any, ...]] = {}  # executor id -> its launch's key (for a relaunch)
        self._stopping: set[str] = set()  # executor ids a stop (a worker thread) is carrying out: poll leaves them
        self.jobs: dict[int, dict[str, str]] = {}  # Slurm's jobs at the last read
        self._read_at = -1e9
        self.out_dir = str(private_dir(out_dir, 0o711)) if out_dir is not None else None
        self.outputs: dict[str, str] = {}  # executor id -> where Slurm writes its output (out_dir)
        self._starting: dict[str, float] = {}  # executor id -> by when (monotonic) Slurm must have started it
        self._release_at: dict[str, float] = {}  # executor id -> when (time.time()) its held job may be released
        self._exit_files: dict[str, str] = {}  # executor id -> where its batch script writes its exit (out_dir)
        self._ended: dict[int, float] = {}  # Slurm ids reported ended by their exit file -> when (monotonic)
        self._warned: set[str] = set()  # jobs' files refused (read_output), logged once each
        #: plan hooks the service adds to its scheduler: the plan leaves what direct jobs hold alone
        self.plan_hooks = (ForeignJobs(self.foreign_use),)

    # -- Slurm's commands ---------------------------------------------------------------------
    def _which(self, name: str) -> str:
        if name not in self._bin:
            path = self.env.get("PATH", os.defpath) + ":/usr/bin:/usr/sbin:/bin:/sbin"
            found = shutil.which(name, path=path)
            if found is None:
                raise SlurmError(f"{name}: not found (install Slurm's client commands)")
            self._bin[name] = found
        return self._bin[name]

    def cmd(self, *argv: str, stdin: str | None = None, ok: Sequence[str] = (), timeout_s: float | None = None) -> str:
        """Run a Slurm command; its stdout.  SlurmError when it fails, unless its stderr has one of ``ok``, or
        gives no answer within ``timeout_s`` (default: the executor's ``timeout_s``)."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        try:
            r = subprocess.run([self._which(argv[0]), *argv[1:]], input=stdin, capture_output=True, text=True,
                               env=self.env, timeout=wait, cwd="/")
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv[:3])}: no answer within {wait:g} s") from None
        if r.returncode != 0 and not any(s in r.stderr for s in ok):
            raise SlurmError(f"{' '.join(argv[:4])}: {r.stderr.strip() or f'exit {r.returncode}'}"[:500])
        return r.stdout

    def read_jobs(self) -> dict[int, dict[str, str]]:
        """Every job slurmctld holds (``scontrol show job -d``), by id; also kept in ``self.jobs``."""
        out = self.cmd("scontrol", "--oneliner", "show", "job", "-d")
        self.jobs = {int(r["JobId"]): r for r in parse_records(out) if r.get("JobId", "").isdigit()}
        self._read_at = time.monotonic()
        return self.jobs

    def read_nodes(self) -> dict[str, SlurmNode]:
        out = self.cmd("scontrol", "--oneliner", "show", "node")
        nodes = {}
        for rec in parse_records(out):
            n = slurm_node(rec) if "NodeName" in rec else None
            if n is not None and (self.partition is None or self.partition in n.partitions):
                nodes[n.name] = n
        self.nodes = nodes
        return nodes

    def _read_node(self, name: str) -> SlurmNode | None:
        """One node as Slurm has it now (also kept in ``self.nodes``), or None if it is not a GPU node here."""
        recs = parse_records(self.cmd("scontrol", "--oneliner", "show", "node", name, ok=("not found",)))
        n = slurm_node(recs[0]) if recs and "NodeName" in recs[0] else None
        if n is None or (self.partition is not None and self.partition not in n.partitions):
            self.nodes.pop(name, None)
            return None
        self.nodes[name] = n
        return n

    def job_name(self, eid: str) -> str:
        return f"{self.prefix}:{eid}"

    def _eid_of(self, rec: Mapping[str, str]) -> str | None:
        name = rec.get("JobName", "")
        return name[len(self.prefix) + 1:] if name.startswith(self.prefix + ":") else None

    # -- launch -------------------------------------------------------------------------------
    def _gres(self, node: SlurmNode, gpus: Sequence[int]) -> str | None:
        if not gpus:
            return None
        if node.types:
            bad = [g for g in gpus if not 0 <= g < len(node.types)]
            if bad:
                raise ExecutorError(f"GPU index(es) {bad} not on Slurm node {node.name} ({node.gpus} GPUs)")
            return ",".join(f"gpu:{node.types[g]}:1" for g in sorted(gpus))
        return f"gpu:{len(gpus)}"

    def _mine(self) -> set[int]:
        """Slurm ids of this executor's jobs (running or held)."""
        return {p.pid for p in self.procs.values()} | {h.slurm_id for h in self.held.values()}

    def _foreign_gpus(self, node: str) -> set[int]:
        """GPU indices of ``node`` held by jobs that are not this executor's (submitted to Slurm directly)."""
        mine = self._mine()
        out: set[int] = set()
        for jid, rec in self.jobs.items():  # (one of ours reported ended by its exit file may still be completing)
            if jid in mine or jid in self._ended or rec.get("JobState") not in LIVE or rec.get("NodeList") != node:
                continue
            out.update(gres_indices(rec.get("GRES", "")))
        return out

    def foreign_use(self) -> dict[str, Held]:
        """What running jobs that are not this executor's (submitted to Slurm directly) hold on each node,
        as of the last read of Slurm's jobs (the plan hook :class:`~.slurm_plan.ForeignJobs` subtracts it)."""
        mine = self._mine()
        out: dict[str, Held] = {}
        for jid, rec in self.jobs.items():
            node = rec.get("NodeList", "")
            if jid in mine or jid in self._ended or rec.get("JobState") not in LIVE or node not in self.nodes:
                continue
            c, m = tres(rec.get("TRES", ""))
            h = out.get(node)
            gpus = frozenset(gres_indices(rec.get("GRES", "")))
            out[node] = Held(gpus, c, m) if h is None else Held(h.gpus | gpus, h.cpus + c, h.mem_mb + m)
        return out

    def _held_on(self, node: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """(cores, MB) that jobs on ``node`` hold: (submitted to Slurm directly, this executor's running ones).
        Ours reported ended by their exit file are left out: their teardown frees them."""
        mine = self._mine()
        other, ours = [0, 0], [0, 0]
        for jid, rec in self.jobs.items():
            if rec.get("JobState") not in LIVE or rec.get("NodeList") != node or jid in self._ended:
                continue
            c, m = tres(rec.get("TRES", ""))
            side = ours if jid in mine else other
            side[0] += c
            side[1] += m
        return (other[0], other[1]), (ours[0], ours[1])

    def script(self, spec: LaunchSpec, exit_dir: str | None = None, mem_mb: int = 0) -> str:
        """The batch script: the job's environment, then its command, waited for through SIGTERM; then,
        with ``exit_dir``, its exit code written to ``<exit_dir>/<id>.<Slurm job id>.exit`` (seen by the
        next poll, before Slurm has torn the job down).  ``mem_mb``: the job's memory where Slurm sets
        no ``SLURM_MEM_PER_NODE`` (a step)."""
        env = dict(spec.env)
        bad = [k for k in env if not _NAME_OK.match(k)]
        if bad:
            raise ExecutorError(f"job {spec.job_id}: environment names must be shell names: {bad[:3]}")
        resume = env.pop("GPULOOM_RESUME", None) == "1"
        attempt = int(env.pop("GPULOOM_ATTEMPT", "1") or 1)
        lines = ["#!/bin/sh", f"# gpuloom job {spec.job_id}", "unset GPULOOM_RESUME"]
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", GPULOOM_JOB_ID=env.get("GPULOOM_JOB_ID", spec.job_id))
        lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
        # what Slurm decides at each start: cores, memory, restarts (a requeued job resumes)
        lines += [
            'r=${SLURM_RESTART_COUNT:-0}',
            f'export GPULOOM_ATTEMPT=$(({attempt} + r))',
            f'if [ "$r" -gt 0 ] || [ {int(resume)} = 1 ]; then export GPULOOM_RESUME=1; fi',
            'export GPULOOM_CPUS="${SLURM_CPUS_ON_NODE:-1}" OMP_NUM_THREADS="${SLURM_CPUS_ON_NODE:-1}"',
            f'export GPULOOM_MEM_MB="${{SLURM_MEM_PER_NODE:-{int(mem_mb)}}}" CUDA_VISIBLE_DEVICES="${{CUDA_VISIBLE_DEVICES-}}"',
            'trap \'t=1\' TERM',
            f"/bin/sh -c {shlex.quote(spec.command)} &",
            'c=$!',
            'while :; do wait "$c"; rc=$?; kill -0 "$c" 2>/dev/null || break; done',
        ]
        if exit_dir is not None:
            f = shlex.quote(f"{exit_dir}/{spec.job_id}.") + '"$SLURM_JOB_ID".exit'
            lines.append(f'echo "$rc" > {f}.tmp && mv -f {f}.tmp {f}')
        lines += ['exit "$rc"', ""]
        return "\n".join(lines)

    def _check_launch(self, spec: LaunchSpec) -> tuple[SlurmNode, str | None, int]:
        """The node (read now), gres and cores of a launch; NodeUnavailable where Slurm has no room for it."""
        try:  # read now: a node drained a moment ago refuses the launch (the job stays queued)
            node = self._read_node(spec.node)
        except SlurmError as e:
            raise NodeUnavailable(f"job {spec.job_id}: {e}") from None
        if node is None or not node.up:
            raise NodeUnavailable(f"job {spec.job_id}: Slurm node {spec.node!r} is not up now")
        try:  # what poll read a moment ago will do: a job started since then cannot be overlaid (Slurm keeps
            if time.monotonic() - self._read_at > 1.0:  # ours pending: poll gives up on it)
                self.read_jobs()
        except SlurmError as e:
            raise NodeUnavailable(f"job {spec.job_id}: {e}") from None
        taken = self._foreign_gpus(spec.node) & set(spec.gpus)
        if taken:
            raise NodeUnavailable(f"job {spec.job_id}: GPU(s) {sorted(taken)} of {spec.node} are held by jobs "
                                  "submitted to Slurm directly")
        gres = self._gres(node, spec.gpus)
        cpus = max(1, len(spec.cpus))
        (oc, om), (mc, mm) = self._held_on(spec.node)
        if (oc or om) and (oc + mc + cpus > node.cpus or om + mm + spec.mem_mb > node.mem_mb):
            raise NodeUnavailable(f"job {spec.job_id}: {spec.node} has {node.cpus - oc - mc} core(s) and "
                                  f"{node.mem_mb - om - mm} MB free (jobs submitted to Slurm directly hold {oc} and "
                                  f"{om} MB), it needs {cpus} and {spec.mem_mb} MB")
        return node, gres, cpus

    def _key(self, spec: LaunchSpec) -> tuple[Any, ...]:
        env = {k: v for k, v in spec.env.items() if k not in ("GPULOOM_RESUME", "GPULOOM_ATTEMPT")}
        return (spec.node, tuple(sorted(spec.gpus)), spec.command, tuple(sorted(env.items())), spec.workdir,
                spec.user, spec.log_path)

    def launch(self, spec: LaunchSpec) -> ProcInfo:
        node, gres, cpus = self._check_launch(spec)
        held = self.held.pop(spec.job_id, None)
        sid = None
        if held is not None:
            try:  # read now: what a poll or the stop read last may predate the requeue (not yet PENDING there)
                rec = self._job(held.slurm_id)
            except SlurmError:
                rec = None
            if held.key == self._key(spec) and rec is not None and rec.get("JobState") == "PENDING":
                try:
                    self.cmd("scontrol", "update", f"JobId={held.slurm_id}", f"NumCPUs={cpus}",
                             f"CPUsPerTask={cpus}", f"MinMemoryNode={max(1, spec.mem_mb)}", "StartTime=now")
                    sid = held.slurm_id
                except SlurmError as e:
                    log.warning("job %s: cannot resume Slurm job %d (%s): submitting a new one", spec.job_id,
                                held.slurm_id, e)
            if sid is None:
                self._cancel(held.slurm_id)
        out = self._output(spec)
        exit_file = None if out == spec.log_path else f"{os.path.dirname(out)}/{spec.job_id}.%j.exit"
        if sid is not None and held is not None:
            _unlink(exit_file.replace("%j", str(sid)) if exit_file else None)  # the stopped run's
            # the requeue revoked the job's launch credentials issued up to its second (slurmd compares
            # whole seconds): a launch within that second is refused ("already killed") and fails; a release
            # due later is left to poll (the round does not wait)
            if time.time() >= held.wall + REVOKE_S:
                self._release(spec.job_id, sid)
            else:
                self._release_at[spec.job_id] = held.wall + REVOKE_S
        else:
            sid = self._srun(spec, gres, cpus, out) if self.launcher == "srun" else self._submit(spec, gres, cpus, out)
        # not waited for: poll follows it (cancelled, and reported ended, if Slurm does not start it in time)
        rec = self._job(sid)
        if rec is None:
            raise SlurmError(f"job {spec.job_id}: Slurm job {sid} is gone at once after its launch")
        info = ProcInfo(spec.job_id, spec.node, sid, _time(rec.get("SubmitTime")), spec.log_path, "")
        self.procs[spec.job_id] = info
        self._keys[spec.job_id] = self._key(spec)
        self._starting[spec.job_id] = time.monotonic() + self.start_wait_s + (
            max(0.0, self._release_at.get(spec.job_id, 0.0) - time.time()))
        if out != spec.log_path:
            self.outputs[spec.job_id] = out.replace("%j", str(sid))
        if exit_file is not None:
            self._exit_files[spec.job_id] = exit_file.replace("%j", str(sid))
        return info

    def _release(self, eid: str, sid: int) -> None:
        """Release a held job updated for its relaunch; one that cannot be is cancelled and reported ended."""
        try:
            self.cmd("scontrol", "release", str(sid))
        except SlurmError as e:
            self._cancel(sid)
            self.exits[eid] = None
            self.reasons[eid] = f"Slurm job {sid} could not be released: {e}"

    def _output(self, spec: LaunchSpec) -> str:
        """Where Slurm writes the job's output: its log, or a file of its account's in ``out_dir``, one per
        Slurm job (``%j``: its id; a requeued job appends to its own)."""
        if self.out_dir is None:
            return spec.log_path
        try:
            d = owned_dir(os.path.join(self.out_dir, spec.user or "_server"), lookup(spec.user) if spec.user else None)
        except (OSError, ValueError) as e:  # IdentityError is a ValueError
            raise ExecutorError(f"job {spec.job_id}: cannot make its Slurm output directory: {e}") from None
        return str(d / f"{spec.job_id}.%j.log")

    def mirror(self, eids: Sequence[str], final: bool = False) -> None:
        """Append what is new in Slurm's output of ``eids`` to their logs (whole lines unless ``final``)."""
        for eid in eids:
            remote, p = self.outputs.get(eid), self.procs.get(eid)
            if remote is None or p is None:
                continue
            off = mirror_offset(p.log_path, "slurm", remote)
            data = read_output(remote, off, warned=self._warned)
            if data is None:
                continue
            if not final:
                data = data[:data.rfind(b"\n") + 1]
            if data:
                append_to(p.log_path, data)
                set_mirror_offset(p.log_path, "slurm", remote, off + len(data))

    def _write_script(self, spec: LaunchSpec, out: str) -> tuple[str, str]:
        """Write the job's script for srun next to its output ``out``; (a tag naming this launch, the path)."""
        d = os.path.dirname(out)
        tag = f"{spec.job_id}.{time.time_ns()}"
        script = f"{d}/{tag}.sh"
        acc = lookup(spec.user) if spec.user is not None else None
        try:  # the script has the job's environment: its account's only (the directory is the account's)
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
            with os.fdopen(fd, "w") as f:
                f.write(self.script(spec, d, spec.mem_mb))
                if acc is not None:
                    os.fchown(f.fileno(), acc.uid, acc.gid)
        except OSError as e:
            raise ExecutorError(f"job {spec.job_id}: cannot write its script for srun: {e}") from None
        return tag, script

    def _srun(self, spec: LaunchSpec, gres: str | None, cpus: int, out: str) -> int:
        """Start the job as an allocation with one step: ``srun`` (run by the service, in its own session,
        as the job's account with ``--uid``/``--gid``) asks for the allocation, which slurmctld places in
        the request itself when the node has room (a batch job waits for its scheduling loop, up to a
        second), then runs the script as its step; the job ends with the step, with its exit code.  srun
        writes the output (as the account, to ``out``) and stays until the job ends; its Slurm job id is
        read from its ``-v`` line ``jobid N:`` (or ``job N queued``)."""
        tag, script = self._write_script(spec, out)
        err = f"{self.out_dir}/.srun-{tag}.err"  # the service's own (srun's messages, the job id)
        argv = slurm_argv("srun", name=self.job_name(spec.job_id), node=spec.node, cpus=cpus, mem_mb=spec.mem_mb,
                          gres=gres, partition=self.partition, workdir=spec.workdir, out=out,
                          account=run_as(spec.user))
        argv = [self._which("srun"), *argv[1:], script]
        with open(err, "wb") as ef:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=ef, env=self.env,
                                 cwd="/", start_new_session=True)
        end = time.monotonic() + self.timeout_s
        while True:
            text = _read_text(err)
            m = _SRUN_JOB.search(text)
            if m is not None:
                sid = int(m.group(1) or m.group(2))
                self._sruns[sid] = (p, err, script)
                return sid
            if p.poll() is not None or time.monotonic() > end:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                _unlink(err)
                _unlink(script)
                why = " ".join(ln for ln in text.splitlines() if "error" in ln)[:300] or f"srun exited {p.returncode}"
                if "Unable to contact slurm controller" in text or "Socket timed out" in text:
                    raise NodeUnavailable(f"job {spec.job_id}: {why}")
                raise SlurmError(f"job {spec.job_id}: srun gave no job id: {why}")
            time.sleep(0.01)

    def _reap_sruns(self) -> None:
        """Collect the srun processes whose job has ended, and their files."""
        for sid, (p, err, script) in list(self._sruns.items()):
            if p.poll() is not None:
                del self._sruns[sid]
                _unlink(err)
                _unlink(script)

    def _submit(self, spec: LaunchSpec, gres: str | None, cpus: int, out: str) -> int:
        exit_dir = os.path.dirname(out) if out != spec.log_path else None
        argv = slurm_argv("sbatch", name=self.job_name(spec.job_id), node=spec.node, cpus=cpus, mem_mb=spec.mem_mb,
                          gres=gres, partition=self.partition, workdir=spec.workdir, out=out,
                          account=run_as(spec.user))
        try:
            out = self.cmd(*argv, stdin=self.script(spec, exit_dir))
        except SlurmError as e:
            if "Unable to contact slurm controller" in str(e) or "no answer" in str(e):
                raise NodeUnavailable(f"job {spec.job_id}: {e}") from None
            raise
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise SlurmError(f"job {spec.job_id}: sbatch gave no job id: {out.strip()[:200]!r}") from None

    def _job(self, sid: int) -> dict[str, str] | None:
        out = self.cmd("scontrol", "--oneliner", "show", "job", "-d", str(sid), ok=("Invalid job id",))
        recs = parse_records(out)
        if recs:
            self.jobs[sid] = recs[0]
            return recs[0]
        self.jobs.pop(sid, None)
        return None

    def _cancel(self, sid: int) -> None:
        try:
            self.cmd("scancel", str(sid), ok=("Invalid job id", "already completing or completed"))
        except SlurmError as e:
            log.warning("cannot cancel Slurm job %d: %s", sid, e)

    # -- stop ---------------------------------------------------------------------------------
    def stop(self, job_id: str, grace_s: float) -> int | None:
        p = self.procs.get(job_id)
        if p is None:
            raise ExecutorError(f"job {job_id}: not running through this executor")
        if job_id in self.exits:  # it ended on its own; not yet polled
            self._forget(job_id)
            return self.exits.pop(job_id)
        self._stopping.add(job_id)
        try:
            return self._stop(job_id, p.pid, grace_s)
        finally:
            self._stopping.discard(job_id)

    def _stop(self, job_id: str, sid: int, grace_s: float) -> int | None:
        if job_id in self._starting and (self._job(sid) or {}).get("JobState") == "PENDING":
            self._cancel(sid)  # not started: nothing ran, nothing to resume
            self._keys.pop(job_id, None)
            self._forget(job_id)
            return None
        end = time.monotonic() + grace_s
        rec: dict[str, str] | None = {"JobState": "RUNNING"}
        sent = -1e9
        # COMPLETING: its batch script has exited (its code is final) and Slurm is tearing the rest down
        while rec is not None and rec.get("JobState") in LIVE - {"COMPLETING"} and time.monotonic() < end:
            if time.monotonic() - sent >= 1.0:  # again each second: a job whose batch step is still starting
                sent = time.monotonic()         # on its node drops the signal
                # --full: the batch script too; an srun job (BatchFlag=0) has none, and --full signals nothing there
                full = ["--full"] if (self.jobs.get(sid) or {}).get("BatchFlag", "1") != "0" else []
                self.cmd("scancel", "--signal=TERM", *full, str(sid), ok=("Invalid job id", "completing or completed"))
            else:
                time.sleep(0.1)
            rec = self._job(sid)
        code = None
        if rec is not None and (rec.get("JobState") in ENDED or rec.get("JobState") == "COMPLETING"):
            code = exit_of(rec.get("ExitCode", ""))
        elif rec is not None:
            code = 137  # still running after the grace period: requeuehold kills it
        if code == 0 or rec is None:  # its work is done (or Slurm forgot it): nothing to resume
            self._keys.pop(job_id, None)
            self._forget(job_id)
            return code
        try:  # kept held for a relaunch (same Slurm id); cancelled if none comes
            self.cmd("scontrol", "requeuehold", str(sid))
            self.held[job_id] = _Held(sid, self._keys.pop(job_id, ()), time.monotonic(), time.time())
        except SlurmError as e:
            log.info("job %s: Slurm job %d not kept for a relaunch (%s)", job_id, sid, e)
            self._keys.pop(job_id, None)
            self._cancel(sid)
        self._forget(job_id)
        return code

    def _forget(self, eid: str) -> None:
        self.mirror([eid], final=True)
        out = self.outputs.get(eid)
        if self.launcher != "sbatch" and out is not None:  # srun's files of its launches, an earlier service's too
            live = {f for _, err, script in self._sruns.values() for f in (err, script)}
            for d, pat in ((os.path.dirname(out), rf"{re.escape(eid)}\.\d+\.sh"),
                           (str(self.out_dir), rf"\.srun-{re.escape(eid)}\.\d+\.err")):
                try:
                    names = os.listdir(d)
                except OSError:
                    continue
                for f in (f"{d}/{n}" for n in names if re.fullmatch(pat, n)):
                    if f not in live:
                        _unlink(f)
        self._warned.difference_update([self.outputs.get(eid, ""), self._exit_files.get(eid, "")])
        self.procs.pop(eid, None)
        self.outputs.pop(eid, None)
        self._starting.pop(eid, None)
        self._release_at.pop(eid, None)
        _unlink(self._exit_files.pop(eid, None))

    # -- observe ------------------------------------------------------------------------------
    def poll(self) -> dict[str, int | None]:
        for eid, due in list(self._release_at.items()):  # resumes whose release had to wait (see launch)
            if time.time() >= due:
                del self._release_at[eid]
                if eid in self.procs:
                    self._release(eid, self.procs[eid].pid)
        self._reap_sruns()
        self._read_exit_files()
        if time.monotonic() - self._read_at >= self.poll_every_s:
            try:
                self.read_jobs()
            except SlurmError as e:  # slurmctld restarting: nothing is known to have ended
                log.warning("cannot read Slurm's jobs: %s", e)
                return {}
            self._check_starting()
            self._check_ended()
            for eid, p in list(self.procs.items()):
                if eid in self.exits or eid in self._stopping:
                    continue
                rec = self.jobs.get(p.pid)
                if rec is None:
                    self.exits[eid] = self._sacct(p.pid)
                    continue
                state = rec.get("JobState", "")
                if state in ENDED:  # (not at COMPLETING: its GPUs are not free before the teardown ends)
                    code = exit_of(rec.get("ExitCode", ""))
                    if state == "OUT_OF_MEMORY" and code == 0:
                        code = 137
                    self.exits[eid] = code
                    if state in REASONS:
                        self.reasons[eid] = REASONS[state]
                elif state == "PENDING" and eid not in self._starting and p.node in self.nodes and self.nodes[p.node].up:
                    # requeued by someone else (scontrol requeue): held, and ended here
                    self.cmd("scontrol", "hold", str(p.pid), ok=("already",))
                    self.held[eid] = _Held(p.pid, self._keys.get(eid, ()), time.monotonic())
                    self.exits[eid] = None
                    self.reasons[eid] = f"requeued in Slurm, not by gpuloom (Reason={rec.get('Reason', '?')})"
            self._find_held()
            self._expire_held()
            self.mirror([e for e in self.outputs if e not in self.exits])
        out = {x: self.exits.pop(x) for x in list(self.exits) if x in self.procs}
        for x in out:
            remote = self.outputs.get(x)
            self._forget(x)
            self._keys.pop(x, None)
            if remote is not None:  # copied whole into the job's log
                try:
                    os.unlink(remote)
                except OSError:
                    pass
        return out

    def _read_exit_files(self) -> None:
        """Exits the batch scripts wrote, seen before Slurm's teardown ends: code 0 only (a failure waits
        for Slurm's state, which names its reason: OOM, time limit)."""
        for eid, path in self._exit_files.items():
            p = self.procs.get(eid)
            if p is None or eid in self.exits or eid in self._stopping or eid in self._release_at:
                continue
            if read_output(path, 0, 64, self._warned) == b"0\n":
                self.exits[eid] = 0
                self._starting.pop(eid, None)
                self._ended[p.pid] = time.monotonic()

    def _check_starting(self) -> None:
        """Launches Slurm has not started yet: one still pending after ``start_wait_s`` is cancelled and
        reported ended (its GPUs are held by something the plan does not know)."""
        for eid, by in list(self._starting.items()):
            p = self.procs.get(eid)
            rec = self.jobs.get(p.pid) if p is not None else None
            if p is None or rec is None or rec.get("JobState") != "PENDING":
                del self._starting[eid]
            elif (eid not in self._release_at and time.monotonic() > by and eid not in self.exits
                  and (p.node not in self.nodes or self.nodes[p.node].up)):  # (on a lost node: evict's)
                del self._starting[eid]
                self._cancel(p.pid)
                self.exits[eid] = None
                self.reasons[eid] = (f"Slurm did not start its job {p.pid} within {self.start_wait_s:g} s "
                                     f"(Reason={rec.get('Reason', '?')}): cancelled")

    def _check_ended(self) -> None:
        """A job reported ended by its exit file must end in Slurm too: cancelled if it runs on."""
        for sid, t in list(self._ended.items()):
            state = self.jobs.get(sid, {}).get("JobState")
            if state is None or state in ENDED:
                del self._ended[sid]
            elif state != "COMPLETING" and time.monotonic() - t > ENDED_GRACE_S:
                log.warning("Slurm job %d wrote its exit but runs on: cancelled", sid)
                del self._ended[sid]
                self._cancel(sid)

    def _find_held(self) -> None:
        """Held jobs of this service's that an earlier incarnation left: cancelled when their time is up."""
        known = {h.slurm_id for h in self.held.values()} | {p.pid for p in self.procs.values()}
        for sid, rec in self.jobs.items():
            eid = self._eid_of(rec)
            if eid is None or sid in known or "held" not in rec.get("Reason", "").lower() or eid in self._stopping:
                continue
            if eid in self.held:  # an older one for the same id: only the latest can be resumed
                self._cancel(sid)
            else:
                self.held[eid] = _Held(sid, (), time.monotonic(), time.time())

    def _expire_held(self) -> None:
        now = time.monotonic()
        for eid, h in list(self.held.items()):
            if now - h.since > self.hold_s:
                del self.held[eid]
                self._cancel(h.slurm_id)

    def _sacct(self, sid: int) -> int | None:
        """The exit of a job slurmctld no longer holds, from accounting (None where it is off)."""
        try:
            out = self.cmd("sacct", "-n", "-P", "-X", "-j", str(sid), "-o", "State,ExitCode")
        except SlurmError:
            return None
        for line in out.splitlines():
            _, _, code = line.partition("|")
            return exit_of(code)
        return None

    def adopt(self, info: ProcInfo) -> bool:
        cur = self.procs.get(info.job_id)
        if cur is not None and cur.pid == info.pid:
            return True
        rec = self._job(info.pid)
        if rec is None or self._eid_of(rec) != info.job_id or abs(_time(rec.get("SubmitTime")) - info.start_time) > 1:
            return False
        pending = rec.get("JobState") == "PENDING" and "held" not in rec.get("Reason", "").lower()
        if rec.get("JobState") not in LIVE and not pending:
            return False
        self.procs[info.job_id] = info
        if pending:  # launched, not started yet
            self._starting[info.job_id] = time.monotonic() + self.start_wait_s
        out = rec.get("StdOut", "") or self._srun_output(info.job_id, info.pid, rec)
        if self.out_dir is not None and out.startswith(self.out_dir + "/"):
            self.outputs[info.job_id] = out
            self._exit_files[info.job_id] = f"{os.path.dirname(out)}/{info.job_id}.{info.pid}.exit"
        return True

    def _srun_output(self, eid: str, sid: int, rec: Mapping[str, str]) -> str:
        """Where srun writes a job's output (Slurm records none for an srun job): its account's directory,
        or the service's own ``_server`` one; "" if neither has it."""
        if self.out_dir is None:
            return ""
        for d in (rec.get("UserId", "").split("(")[0], "_server"):
            path = f"{self.out_dir}/{d}/{eid}.{sid}.log"
            if d and os.path.isfile(path):
                return path
        return ""

    def exit_code(self, info: ProcInfo) -> int | None:
        rec = self._job(info.pid)
        if rec is None:
            return self._sacct(info.pid)
        if self._eid_of(rec) != info.job_id or rec.get("JobState") not in ENDED:
            return None
        return exit_of(rec.get("ExitCode", ""))

    def exit_time(self, info: ProcInfo) -> float | None:
        rec = self._job(info.pid)
        if rec is None or rec.get("JobState") not in ENDED:
            return None
        t = _time(rec.get("EndTime"))
        return t or None

    def alive(self, job_id: str) -> bool:
        p = self.procs.get(job_id)
        if p is None:
            return False
        rec = self._job(p.pid)
        return rec is not None and (rec.get("JobState") in LIVE or
                                    (job_id in self._starting and rec.get("JobState") == "PENDING"))

    def end_reason(self, job_id: str) -> str | None:
        return self.reasons.pop(job_id, None)

    def orphans(self) -> list[ProcInfo]:
        """Running Slurm jobs with this service's names that no record holds (a launch not recorded)."""
        try:
            self.read_jobs()
        except SlurmError as e:
            log.warning("cannot look for unrecorded Slurm jobs: %s", e)
            return []
        known = {p.pid for p in self.procs.values()}
        out = []
        for sid, rec in self.jobs.items():
            eid = self._eid_of(rec)
            pending = rec.get("JobState") == "PENDING" and "held" not in rec.get("Reason", "").lower()
            if eid is not None and sid not in known and (rec.get("JobState") in LIVE or pending):
                out.append(ProcInfo(eid, rec.get("NodeList", ""), sid, _time(rec.get("SubmitTime")),
                                    rec.get("StdOut", ""), ""))
        return out

    def evict(self, node: str) -> list[str]:
        """Requeue held this executor's jobs on ``node`` (lost: drained or down) and forget them."""
        gone = [e for e, p in self.procs.items() if p.node == node]
        for e in gone:
            p = self.procs[e]
            self._forget(e)
            self.exits.pop(e, None)
            try:
                self.cmd("scontrol", "requeuehold", str(p.pid), ok=("Invalid job id",))
                self.held[e] = _Held(p.pid, (), time.monotonic())  # not reused: cancelled on expiry
            except SlurmError as err:
                log.warning("job %s: cannot requeue Slurm job %d off node %s: %s", e, p.pid, node, err)
                self._cancel(p.pid)
        return gone

    def rendezvous(self, node: str) -> tuple[str, int]:
        """Rank 0's node address (Slurm's ``NodeAddr``) and a port free on this machine (not checked there)."""
        n = self.nodes.get(node)
        if n is None:
            raise ExecutorError(f"node {node!r} is not a Slurm node with GPUs")
        return n.addr, free_port()

    def cluster(self) -> Cluster:
        up = [n.as_node() for n in sorted(self.nodes.values(), key=lambda n: n.name) if n.up]
        if not up:
            raise ClusterError("the Slurm cluster has no node with GPUs up"
                               + (f" in partition {self.partition}" if self.partition else "")
                               + " (declare them as gres: Gres=gpu:... in slurm.conf)")
        return Cluster(tuple(up))


class SlurmInventory:
    """The service's inventory source on Slurm (:class:`~.inventory.InventorySource`): the nodes
    that are up, re-read at most every ``every_s`` seconds; a node that goes down or is drained is
    lost (its jobs are requeued held and resumed elsewhere after ``fence_s``)."""

    def __init__(self, executor: SlurmExecutor, every_s: float = 1.0, fence_s: float | None = None) -> None:
        self.executor = executor
        self.every_s = float(every_s)
        self.fence_s = executor.grace_s + 1.0 if fence_s is None else float(fence_s)
        self._last = 0.0
        executor.read_nodes()
        self.current = executor.cluster()
        self.usable = {n.name for n in self.current.nodes}

    def poll(self) -> InventoryChange | None:
        t = time.monotonic()
        if t - self._last < self.every_s:
            return None
        self._last = t
        ex = self.executor
        nodes = ex.read_nodes()
        usable = {name for name, n in nodes.items() if n.up}
        before = {n.name: n for n in self.current.nodes}
        changed = {name for name in usable & set(before) if nodes[name].as_node() != before[name]}
        if usable == self.usable and not changed:
            return None
        lost = (self.usable - usable) | changed
        try:
            new = ex.cluster()
        except ClusterError as e:  # no node left: keep the inventory (its jobs run on; launches are refused)
            log.error("%s", e)
            return None
        for name in sorted(lost):
            moved = ex.evict(name)
            log.warning("Slurm node %s is %s: %d job(s) requeued off it", name,
                        "gone" if name not in nodes else "no longer up", len(moved))
        self.usable = usable
        self.current = new
        return InventoryChange(new, frozenset(lost), self.fence_s)
