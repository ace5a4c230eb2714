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
both match: ids restart when Slurm's state is lost).  Its ``Comment`` names the
launch (``gpuloom:attempt=N``, set again at a held job's release), and a stop
adds ``:stopped`` before its first signal: a restarted service finds the job of
a launch it did not confirm by its name and attempt
(:meth:`~SlurmExecutor.launched`) and tells a stop's end from the job's own
(:meth:`~SlurmExecutor.stopped`).

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
(up to a second), or refuses it (``--immediate``: a root ``srun --uid`` loses
the message granting a queued one): a launch onto resources Slurm still holds
is refused and the job stays queued; the job ends with its step and its exit code, and is read
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

Modules: :mod:`.slurm_parse` reads what Slurm's commands print; :mod:`.slurm_files` the files a
job writes that the service reads; :mod:`.slurm_client` runs Slurm's commands and keeps the
executor's state (:class:`~.slurm_client.SlurmClient`); :mod:`.slurm_launch` launches
(:class:`~.slurm_launch.SlurmLauncher`); here :class:`SlurmExecutor` adds stops, polls and
adoption, and :class:`SlurmInventory` follows the nodes.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence

from ...core.cluster import ClusterError
from .executor import ExecutorError, InventoryChange, ProcInfo
from .identity import lookup
from .logmirror import copy_new, mirror_offset
from .slurm_client import SlurmClient, SlurmError, _Held, log
from .slurm_files import READ_MOST, _unlink, read_output
from .slurm_launch import REVOKE_S, SlurmLauncher, run_as, slurm_argv
from .slurm_parse import (
    ENDED,
    LIVE,
    NOT_UP_FLAGS,
    REASONS,
    UP,
    SlurmNode,
    _time,
    attempt_comment,
    attempt_mark,
    exit_of,
    gres_gpus,
    gres_indices,
    node_state_ok,
    owner_uid,
    parse_records,
    slurm_node,
    stop_marked,
    tres,
)

__all__ = ["ENDED", "ENDED_GRACE_S", "LIVE", "NOT_UP_FLAGS", "REASONS", "REVOKE_S", "UP", "SlurmClient", "SlurmError",
           "SlurmExecutor", "SlurmInventory", "SlurmLauncher", "SlurmNode", "exit_of", "gres_gpus", "gres_indices",
           "node_state_ok", "parse_records", "read_output", "run_as", "slurm_argv", "slurm_node", "tres"]

#: the fields :meth:`SlurmExecutor._acct` reads from accounting
_ACCT = ("JobID", "State", "ExitCode", "Comment", "Submit", "End", "NodeList", "UID")
#: how long a job whose batch script wrote its exit may stay running in Slurm before it is cancelled
ENDED_GRACE_S = 5.0


class SlurmExecutor(SlurmLauncher):
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

    # -- stop ---------------------------------------------------------------------------------
    def stop(self, job_id: str, grace_s: float) -> int | None:
        p = self.procs.get(job_id)
        if p is None:
            raise ExecutorError(f"job {job_id}: not running through this executor")
        if job_id in self.exits:  # it ended on its own; not yet polled
            self._wait_srun(p.pid)
            self._forget(job_id)
            return self.exits.pop(job_id)
        self._stopping.add(job_id)
        try:
            self._mark_stopped(p.pid)
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
        if rec is None or rec.get("JobState") not in LIVE - {"COMPLETING"}:
            self._wait_srun(sid)  # (the last lines it printed as it stopped: its checkpoint's)
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

    def _mark_stopped(self, sid: int) -> None:
        """Mark the job's attempt Comment as the service's stop's before the stop begins: a restart then
        takes its end for the stop's (:meth:`stopped`), never for the job's own (:meth:`launched`)."""
        mark = attempt_mark((self.jobs.get(sid) or {}).get("Comment", ""))
        if mark is None or mark[1]:
            return
        try:
            self.cmd("scontrol", "update", f"JobId={sid}", f"Comment={attempt_comment(mark[0], True)}")
        except SlurmError as e:
            log.warning("cannot mark Slurm job %d as stopped by the service: %s", sid, e)

    def _wait_srun(self, sid: int) -> None:
        """Wait (up to ``ENDED_GRACE_S``) for the srun of a job whose script has ended: srun writes the job's
        output as slurmstepd forwards it, and its last lines come after the script's exit record, even after
        Slurm has ended the job (tens of ms here); it has written them all once it exits."""
        srun = self._sruns.get(sid)
        if srun is not None:
            try:
                srun[0].wait(ENDED_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("Slurm job %d has ended but its srun runs on: its output may lack its last lines", sid)

    def _forget(self, eid: str) -> None:
        self.mirror([eid], final=True)
        out = self.outputs.get(eid)
        if self.launcher != "sbatch" and out is not None:  # srun's files of its launches, an earlier service's too
            live = {f for _, err, script in self._sruns.values() for f in (err, script)}
            for d, pat in ((os.path.dirname(out), rf"{re.escape(eid)}\.\d+(?:\.a\d+)?\.sh"),
                           (str(self.out_dir), rf"\.srun-{re.escape(eid)}\.\d+(?:\.a\d+)?\.err")):
                try:
                    names = os.listdir(d)
                except OSError:
                    continue
                for f in (f"{d}/{n}" for n in names if re.fullmatch(pat, n)):
                    if f not in live:
                        _unlink(f)
        self._warned.difference_update([self.outputs.get(eid, ""), self._exit_files.get(eid, "")])
        p = self.procs.pop(eid, None)
        if p is not None and eid not in self.held:  # (a held one is still this executor's)
            self._leaving[p.pid] = eid
        self.outputs.pop(eid, None)
        self._starting.pop(eid, None)
        self._release_at.pop(eid, None)
        _unlink(self._exit_files.pop(eid, None))

    def mirror(self, eids: Sequence[str], final: bool = False) -> None:
        """Append what is new in Slurm's output of ``eids`` to their logs (whole lines unless ``final``)."""
        for eid in eids:
            remote, p = self.outputs.get(eid), self.procs.get(eid)
            if remote is None or p is None or not p.log_path:  # (no log: found by launched, to be stopped)
                continue
            off = mirror_offset(p.log_path, "slurm", remote)
            data = read_output(remote, off, warned=self._warned)
            if data is None:
                continue
            if not final:
                data = data[:data.rfind(b"\n") + 1]
            if data:  # (refused on a full disk: copied at a later poll, from the same byte)
                copy_new(p.log_path, "slurm", remote, off, data)

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
            p = self.procs[x]
            self._wait_srun(p.pid)
            remote = self.outputs.get(x)
            self._forget(x)
            self._keys.pop(x, None)
            if remote is not None:
                self._copying[remote] = p.log_path
        self._copy_rest()
        return out

    def _copy_rest(self) -> None:
        """Remove the output of each ended job once it is copied whole into the job's log: at once, or (where
        the log's disk was full) at the first poll that finds room for the rest."""
        for remote, local in list(self._copying.items()):
            off = mirror_offset(local, "slurm", remote) if local else 0
            data = read_output(remote, off, warned=self._warned) if local else None
            if data and (not copy_new(local, "slurm", remote, off, data) or len(data) == READ_MOST):
                continue  # (refused: the log's disk is full; or more left than one read: the rest at the next poll)
            del self._copying[remote]
            _unlink(remote)

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

    def _acct(self, *select: str) -> list[dict[str, str]]:
        """Accounting's records (``sacct``) of the jobs ``select`` names, each with its ``_ACCT`` fields; none
        where accounting is off."""
        try:
            out = self.cmd("sacct", "-n", "-P", "-X", *select, "-o", ",".join(_ACCT))
        except SlurmError:
            return []
        return [dict(zip(_ACCT, line.split("|"), strict=False)) for line in out.splitlines() if "|" in line]

    def _sacct(self, sid: int) -> int | None:
        """The exit of a job slurmctld no longer holds, from accounting (None where it is off)."""
        for rec in self._acct("-j", str(sid)):
            return exit_of(rec.get("ExitCode", ""))
        return None

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        """The Slurm job named for ``job_id`` whose Comment marks launch ``attempt``, unless it marks its stop
        too: from slurmctld's records (which keep an ended job for ``MinJobAge``), else from accounting's
        (``sacct``, where it stores comments: ``AccountingStoreFlags=job_comment``).  A job that never ran
        (held, or ended before Slurm gave it a node) is none; a pending one is found (:meth:`adopt` takes it:
        it may start any moment).  Only a job of ``user``'s account counts (the service's own for None): any
        Slurm user may name a job of theirs like the service's and set its Comment, and such a job must not
        end another user's.  Raises SlurmError where slurmctld does not answer."""
        if attempt <= 0:
            return None
        uid = lookup(user).uid if user is not None else os.geteuid()

        def of_attempt(rec: Mapping[str, str]) -> bool:
            mark = attempt_mark(rec.get("Comment", ""))
            return mark is not None and mark[0] == attempt and owner_uid(rec) == uid

        self.read_jobs()
        ours = [(sid, rec) for sid, rec in self.jobs.items() if self._eid_of(rec) == job_id and of_attempt(rec)]
        if not ours:  # (ended longer ago than MinJobAge)
            found = self._acct("-a", f"--name={self.job_name(job_id)}", "-S", "now-7days")
            ours = [(int(r["JobID"]), r) for r in found if r.get("JobID", "").isdigit() and of_attempt(r)]
        if not ours:
            return None
        sid, rec = max(ours)
        state = (rec.get("JobState") or rec.get("State", "")).split(" ")[0]  # (sacct's: "CANCELLED by 0")
        if stop_marked(rec.get("Comment", "")):
            return None  # stopped by the service: its end is the stop's
        if state == "PENDING" and "held" in rec.get("Reason", "").lower():
            return None  # never started (held)
        if state not in LIVE | {"PENDING"} and rec.get("NodeList", "") in ("", "(null)", "None assigned"):
            return None  # ended before Slurm gave it a node: nothing ran
        out = rec.get("StdOut", "") if self.out_dir is None else ""  # (with out_dir: no log to copy its output to)
        return ProcInfo(job_id, node, sid, _time(rec.get("SubmitTime") or rec.get("Submit")), out, "")

    def stopped(self, info: ProcInfo) -> bool:
        """Whether the job's attempt Comment says the service stopped it (:meth:`stop` marks it first)."""
        rec = self._job(info.pid)
        return rec is not None and self._eid_of(rec) == info.job_id and stop_marked(rec.get("Comment", ""))

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
        if rec is None:  # (from accounting, where it is on)
            return next((_time(r.get("End")) or None for r in self._acct("-j", str(info.pid))), None)
        if rec.get("JobState") not in ENDED:
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
