"""Slurm's commands as the executor runs them, and what they report: the jobs and nodes slurmctld holds,
which jobs are this executor's, and what jobs submitted to Slurm directly hold on each node."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.cluster import Cluster, ClusterError
from .executor import Executor, ExecutorError, ProcInfo, free_port
from .identity import private_dir
from .slurm_parse import LIVE, SlurmNode, gres_indices, parse_records, slurm_node, tres
from .slurm_plan import ForeignJobs, Held

log = logging.getLogger("gpuloom.service")


class SlurmError(ExecutorError):
    """A Slurm command that failed; the message has the command and what it said."""


@dataclass(slots=True)
class _Held:
    """A job stopped by gpuloom and requeued held in Slurm, kept for a relaunch."""

    slurm_id: int
    key: tuple[Any, ...]  # what a relaunch must match to reuse it
    since: float  # monotonic
    wall: float = 0.0  # when it was requeued (time.time())


class SlurmClient(Executor):
    """The state of a Slurm executor (its arguments: :class:`~.slurm.SlurmExecutor`) and its reads of
    Slurm; :class:`~.slurm_launch.SlurmLauncher` adds launches, :class:`~.slurm.SlurmExecutor` the rest."""

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
        #: Slurm ids of this executor's jobs it has let go (ended, stopped) -> executor id, while Slurm may still
        #: hold them (tearing down): like direct jobs, their GPUs are not free, but a refusal names them
        self._leaving: dict[int, str] = {}
        self._warned: set[str] = set()  # jobs' files refused (read_output), logged once each
        self._copying: dict[str, str] = {}  # ended jobs' outputs (out_dir) -> their logs, until copied whole
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
        self._leaving = {s: e for s, e in self._leaving.items() if self.jobs.get(s, {}).get("JobState") in LIVE}
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

    def _mine(self) -> set[int]:
        """Slurm ids of this executor's jobs (running or held)."""
        return {p.pid for p in self.procs.values()} | {h.slurm_id for h in self.held.values()}

    def _others_on(self, node: str) -> list[tuple[int, set[int]]]:
        """(Slurm id, GPU indices) of the live jobs on ``node`` that are not this executor's running or held
        ones: submitted to Slurm directly, or ours let go and still ending (``_leaving``).  One of ours reported
        ended by its exit file may still be completing: its teardown frees it, so it is left out."""
        mine = self._mine()
        return [(jid, set(gres_indices(rec.get("GRES", "")))) for jid, rec in sorted(self.jobs.items())
                if jid not in mine and jid not in self._ended and rec.get("JobState") in LIVE
                and rec.get("NodeList") == node]

    def _foreign_gpus(self, node: str) -> set[int]:
        """GPU indices of ``node`` held by jobs that are not this executor's (submitted to Slurm directly)."""
        return set().union(*(gpus for _, gpus in self._others_on(node)))

    def holders(self, node: str, gpus: set[int]) -> str:
        """Who holds ``gpus`` of ``node`` that are not free for this executor's launch (for its refusal)."""
        ours, direct = [], False
        for jid, held in self._others_on(node):
            if not gpus & held:
                continue
            if jid in self._leaving:
                ours.append(f"Slurm job {jid} (gpuloom's {self._leaving[jid]}, ended or stopped, still ending in Slurm)")
            else:
                direct = True
        return " and ".join(ours + (["jobs submitted to Slurm directly"] if direct or not ours else []))

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
