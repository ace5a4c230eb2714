"""Launching a job on Slurm: the placing commands' argv, the account a job runs as, the batch script,
and the launch itself (a new batch job or srun allocation, or the release of a held one)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .executor import ExecutorError, LaunchSpec, NodeUnavailable, ProcInfo
from .identity import lookup, owned_dir
from .slurm_client import SlurmClient, SlurmError, log
from .slurm_files import _read_text, _unlink
from .slurm_parse import SlurmNode, _time, attempt_comment

#: how long after a requeue a held job may be released again (see :meth:`SlurmExecutor.launch`)
REVOKE_S = 1.1
_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SRUN_JOB = re.compile(r"srun: jobid (\d+):")
_SRUN_STEP = re.compile(r"srun: launching StepId=(\d+)\.")
#: what srun says when slurmctld refuses an ``--immediate`` allocation the node has no room for now
_SRUN_BUSY = ("Requested nodes are busy", "Immediate execution impossible")


#: what each placing command adds: before the common options, after them.  srun's allocation is
#: ``--immediate`` (placed in the request or refused): srun run by root with ``--uid`` cannot read the
#: message that grants a queued allocation later (munge's credential is the job account's), and
#: slurmctld kills the job ("Killing interactive JobId=N: Communication connection failure")
_MODES = {"sbatch": (["--parsable"], ["--requeue"]), "srun": (["-v"], ["--input=none", "--immediate"]),
          "step": (["-v"], ["--input=none", "--exact"]), "salloc": (["--no-shell"], [])}


def slurm_argv(mode: str, *, name: str, node: str, cpus: int, mem_mb: int, gres: str | None,
               partition: str | None = None, workdir: str | None = None, out: str | None = None,
               account: tuple[int, int] | None = None, jobid: int | None = None, comment: str | None = None
               ) -> list[str]:
    """The argv (without the script) of the command that places one job on ``node``: ``sbatch`` (a batch
    job), ``srun`` (a new allocation and its step), ``step`` (``srun`` of a step in allocation ``jobid``:
    no partition, ``--exact`` so it holds only its own cores and memory) or ``salloc`` (an allocation
    that runs nothing).  ``account``: (uid, gid) to run as (root only); ``out``: the output, appended;
    ``comment``: the job's Comment (its attempt mark)."""
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
    if comment is not None:
        argv.append(f"--comment={comment}")
    if account is not None:  # --uid alone leaves the job the submitter's group (root's): the account's group too
        argv += [f"--uid={account[0]}", f"--gid={account[1]}"]
    return argv


def _comment(spec: LaunchSpec) -> str | None:
    """The Comment marking a launch's Slurm job with its attempt (none without one)."""
    return attempt_comment(spec.attempt) if spec.attempt > 0 else None


def run_as(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) a job of ``user`` is submitted as, or None to submit as the service's own account."""
    if user is None:
        return None
    acc = lookup(user)
    return (acc.uid, acc.gid) if os.geteuid() != 0 or acc.uid != 0 else None


class SlurmLauncher(SlurmClient):
    """Launches of a :class:`~.slurm.SlurmExecutor` (see the notes of :mod:`.slurm`)."""

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

    def script(self, spec: LaunchSpec, exit_dir: str | None = None, mem_mb: int = 0, exit_tag: str = "") -> str:
        """The batch script: the job's environment, then its command, waited for through SIGTERM; then,
        with ``exit_dir``, its exit code written to ``<exit_dir>/<id>.<Slurm job id><exit_tag>.exit`` (seen
        by the next poll, before Slurm has torn the job down).  ``mem_mb``: the job's memory where Slurm sets
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
            f = shlex.quote(f"{exit_dir}/{spec.job_id}.") + '"$SLURM_JOB_ID"' + shlex.quote(f"{exit_tag}.exit")
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
            raise NodeUnavailable(f"job {spec.job_id}: GPU(s) {sorted(taken)} of {spec.node} are held by "
                                  f"{self.holders(spec.node, taken)}")
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
            # (reused only if the wall clock has not stepped back since its requeue: slurmd would refuse the
            # job's launch credentials until it passes the requeue's second again; a new Slurm job starts)
            if held.key == self._key(spec) and rec is not None and rec.get("JobState") == "PENDING" and \
                    time.time() >= held.wall:
                try:
                    mark = [f"Comment={c}"] if (c := _comment(spec)) is not None else []  # this launch's attempt
                    self.cmd("scontrol", "update", f"JobId={held.slurm_id}", f"NumCPUs={cpus}",
                             f"CPUsPerTask={cpus}", f"MinMemoryNode={max(1, spec.mem_mb)}", "StartTime=now", *mark)
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

    def _write_script(self, spec: LaunchSpec, out: str, exit_tag: str = "") -> tuple[str, str]:
        """Write the job's script for srun next to its output ``out`` (``exit_tag``: see :meth:`script`);
        (a tag naming this launch: ``<id>.<wall time in ns><exit_tag>``, the path)."""
        d = os.path.dirname(out)
        tag = f"{spec.job_id}.{time.time_ns()}{exit_tag}"  # (its wall time, and the attempt a step's records carry)
        script = f"{d}/{tag}.sh"
        acc = lookup(spec.user) if spec.user is not None else None
        try:  # the script has the job's environment: its account's only (the directory is the account's)
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
            with os.fdopen(fd, "w") as f:
                f.write(self.script(spec, d, spec.mem_mb, exit_tag))
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
        read from its ``-v`` line ``jobid N:``, and the launch returns once srun says ``launching StepId=N.0``.
        Where srun ends before that (no room now: ``--immediate`` refused it; or its step was not created),
        nothing of the job ran: :class:`NodeUnavailable`, the job stays queued."""
        tag, script = self._write_script(spec, out)
        err = f"{self.out_dir}/.srun-{tag}.err"  # the service's own (srun's messages, the job id)
        argv = slurm_argv("srun", name=self.job_name(spec.job_id), node=spec.node, cpus=cpus, mem_mb=spec.mem_mb,
                          gres=gres, partition=self.partition, workdir=spec.workdir, out=out,
                          account=run_as(spec.user), comment=_comment(spec))
        argv = [self._which("srun"), *argv[1:], script]
        with open(err, "wb") as ef:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=ef, env=self.env,
                                 cwd="/", start_new_session=True)
        end = time.monotonic() + self.timeout_s
        sid = None
        while True:
            text = _read_text(err)
            if sid is None and (m := _SRUN_JOB.search(text)) is not None:
                sid = int(m.group(1))
            if sid is not None and _SRUN_STEP.search(text):
                self._sruns[sid] = (p, err, script)
                return sid
            if p.poll() is not None or time.monotonic() > end:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                _unlink(err)
                _unlink(script)
                # srun's own "Unable to ..." first: a root srun --uid also logs messages of slurmctld's to the
                # job's account it cannot read ("Munge decode failed"); "error:", not -v's "error : FILE"
                errs = [ln for ln in text.splitlines() if "error:" in ln]
                why = " ".join([ln for ln in errs if "Unable to" in ln] or errs)[:300] or (
                    f"srun exited {p.returncode}" if p.returncode >= 0 else f"srun killed after {self.timeout_s:g} s")
                if sid is not None:  # an allocation whose step never ran the script
                    self._cancel(sid)
                    raise NodeUnavailable(f"job {spec.job_id}: Slurm job {sid} ran no step: {why}")
                if any(s in text for s in _SRUN_BUSY):
                    raise NodeUnavailable(f"job {spec.job_id}: {spec.node} has no room now: {why}")
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
                          account=run_as(spec.user), comment=_comment(spec))
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
