"""Jobs as steps in Slurm allocations the service keeps open (``--executor slurm-steps``).

A batch job or a new allocation starts when slurmctld places it; a step in an
allocation that already holds its resources starts when ``srun`` reaches the
node.  Here every job runs as a step (``srun --jobid=A --exact``) in an
allocation of its own account on its node (``salloc --no-shell --uid``, named
``<prefix>.alloc``).  A job goes into one whose GPUs include its own, with
those GPUs and enough cores and memory left beside its steps; else a new one
is sized to the job (its GPUs, cores and memory).  When its last step ends an
allocation stays open, idle, for ``linger_s``: the account's next job there, or
a preempted job's resume, starts as a step in it.  An idle allocation whose
resources a launch needs (its GPUs, or cores and memory the node lacks) is
cancelled before that launch asks for its own, whoever owns it; one idle for
``linger_s`` is cancelled.  An allocation cannot shrink: a launch of another
account onto GPUs of one that runs steps is refused (the job stays queued)
until those steps end.

Slurm checks the step's account against the allocation's owner (a step of
another uid is refused: ``Access/permission denied``), gives the step its own
GPUs, cores and memory inside the allocation, and writes its output.  The
step's script writes the command's exit code next to the output, where the
service reads it; srun's own exit code stands in where the script wrote none.
A failed step is reported once srun has ended, with Slurm's reason (an OOM
kill, a time limit, a cancel: :meth:`SlurmStepsExecutor._step_reason`).
A stop sends SIGTERM to the step (``scancel --signal=TERM A.S``), waits up to
the grace period, then cancels the step; the allocation stays for the resume.
A restarted service finds its allocations by name and its jobs' steps by
their names; srun runs in its own session and outlives it.  Each launch is
marked with its attempt ``N`` (:attr:`~.executor.LaunchSpec.attempt`) where a
dead service's successor finds it: its step's name (``<prefix>:<id>:aN``;
``<prefix>:<id>`` without one, and from older versions) and its exit record's
(``<id>.<allocation>.aN.exit``), and the service's own file of srun's messages
(``.srun-<id>.<wall time in ns>.aN.err`` in ``out_dir``: when it launched); a
stop is marked before its first signal by a file of the service's own too
(``.stopped-<exit record's name>`` in ``out_dir``).
So :meth:`SlurmStepsExecutor.launched` finds the step of a launch the service
did not confirm, still running or ended with its code, and
:meth:`SlurmStepsExecutor.stopped` tells a stop's end from the job's own.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from .executor import ExecutorError, LaunchSpec, NodeUnavailable, ProcInfo
from .identity import lookup
from .logmirror import set_mirror_offset
from .slurm import ENDED_GRACE_S, SlurmExecutor
from .slurm_client import SlurmError, log
from .slurm_files import _read_text, _unlink, read_output
from .slurm_launch import run_as, slurm_argv
from .slurm_parse import LIVE, REASONS, SlurmNode, _time, gres_indices, owner_uid, parse_records, tres

#: how long an allocation stays open with no job in it: the service's round after an exit (a round a
#: second by default) launches the account's next job, and a preempted job's relaunch comes in the
#: same round as its stop; longer would keep its GPUs from jobs submitted to Slurm directly
LINGER_S = 2.0
#: how long salloc may wait for its allocation (``--immediate``): resources a cancelled allocation
#: frees reach slurmctld within tens of ms; a refusal leaves the job queued for a later round
PLACE_WAIT_S = 2
#: how long srun may take to launch a step (0.1-0.2 s here): one waiting longer waits for resources of
#: its allocation that another step still holds, while the round waits; it is withdrawn and the job
#: stays queued
STEP_WAIT_S = 5.0
#: how long sacct may take to say why a step failed (a slurmdbd that does not answer: the reason is read
#: from the step's output instead)
SACCT_WAIT_S = 5.0
#: how much of the end of a step's output is searched for slurmstepd's line naming why it ended
REASON_TAIL = 64 << 10
_GRANTED = re.compile(r"Granted job allocation (\d+)")
#: the attempt a step's exit record's name carries (``<id>.<allocation>.aN.exit``)
_EXIT_ATTEMPT = re.compile(r"\.a(\d+)\.exit\Z")
_STEP = re.compile(r"launching StepId=(\d+\.\d+)")


def sacct_step_reason(text: str, step: str) -> str | None:
    """The reason (:data:`~.slurm.REASONS`) in ``sacct -n -P -o JobID,State`` output for step ``step`` ("A.S"):
    ``12.3|OUT_OF_MEMORY``, ``12.3|CANCELLED by 0``; None where its state names none (or it is not there)."""
    for line in text.splitlines():
        jid, _, state = line.partition("|")
        if jid.strip() == step:
            words = state.split()
            return REASONS.get(words[0]) if words else None
    return None


#: the causes slurmstepd names as it ends a step (``*** STEP A.S ON node CANCELLED AT t DUE TO ... ***``)
_STEPD_CAUSES = {"TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED", "": "CANCELLED"}


def stepd_reason(text: str, step: str) -> str | None:
    """The reason slurmstepd wrote into step ``step``'s output when it ended it: its memory limit
    (``StepId=A.S exceeded memory limit``, over ``JobAcctGatherParams=OverMemoryKill``; a cgroup's
    ``oom-kill event(s) in StepId=A.S``), else ``*** STEP A.S ON node CANCELLED AT t DUE TO TIME LIMIT ***``
    (or ``NODE FAILURE, ...``, ``PREEMPTION``; a cancel: no cause); None otherwise."""
    s = re.escape(step)
    if re.search(rf"StepId={s} exceeded memory limit|oom[-_]kill event\(?s?\)? in StepId={s}\b", text):
        return REASONS["OUT_OF_MEMORY"]
    m = re.search(rf"^slurmstepd\S*: error: \*\*\* STEP {s} ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+))?(?:,[^*]*)? \*\*\*",
                  text, re.M)
    cause = _STEPD_CAUSES.get(m.group(1) or "") if m is not None else None
    return REASONS[cause] if cause is not None else None


#: why a step ended that Slurm cancelled while srun was still launching it (scancel, an allocation's end, a
#: node lost): slurmstepd had not set up its output, so no line of its says which
ABORTED_AT_LAUNCH = "ended by Slurm while its step was being launched (srun: step aborted), cause not recorded"


#: why a step ended whose srun said 0 but whose script left no exit record (it never reached its end)
NO_EXIT_RECORD = "its step ended (srun exit 0) without its script's exit record: the job did not run to its end"


def srun_aborted(text: str, step: str) -> bool:
    """Whether srun's ``-v`` output says Slurm ended step ``step`` ("A.S") before it had fully launched."""
    return re.search(rf"StepId={re.escape(step)} aborted before step completely launched", text) is not None


def _tag(attempt: int) -> str:
    """What names of a launch's step and exit record carry of its attempt (nothing without one)."""
    return f".a{attempt}" if attempt > 0 else ""


def exit_record(d: str, eid: str, sid: int, attempt: int) -> str:
    """Where launch ``attempt`` of ``eid`` in allocation ``sid`` writes its exit code: its account's
    output directory ``d`` (``<id>.<allocation>.aN.exit``; ``<id>.<allocation>.exit`` without an attempt)."""
    return f"{d}/{eid}.{sid}{_tag(attempt)}.exit"


def _attempt_of(exit_path: str) -> int:
    """The attempt an exit record's name carries (0: none)."""
    m = _EXIT_ATTEMPT.search(exit_path)
    return int(m.group(1)) if m is not None else 0


def _recorded(data: bytes | None) -> int | None:
    """The code in a whole exit record of a step's script (its code and a newline); None for another text."""
    return int(data) if data is not None and data.endswith(b"\n") and data.strip().isdigit() else None


@dataclass(slots=True)
class Alloc:
    """An allocation of this service's: its owner, node and what it holds."""

    sid: int
    uid: int
    node: str
    gpus: frozenset[int]
    cpus: int
    mem_mb: int
    submit: float  # SubmitTime, seconds since the epoch (adoption matches it)
    #: executor id -> (GPUs, cores, MB) of each job whose step runs in it
    jobs: dict[str, tuple[frozenset[int], int, int]] = field(default_factory=dict)
    idle_since: float = 0.0  # monotonic

    def room(self, gpus: frozenset[int], cpus: int, mem_mb: int) -> bool:
        """Whether a step of ``gpus``, ``cpus`` cores and ``mem_mb`` fits beside the steps in it."""
        used = list(self.jobs.values())
        return (gpus <= self.gpus and not any(g & gpus for g, _, _ in used)
                and sum(c for _, c, _ in used) + cpus <= self.cpus and sum(m for _, _, m in used) + mem_mb <= self.mem_mb)


@dataclass(slots=True)
class Step:
    """A job's step: its allocation, Slurm's step id, and srun when this service started it."""

    alloc: int
    step: str  # "A.S"
    exit_file: str
    proc: subprocess.Popen[bytes] | None = None
    err: str | None = None  # srun's messages (the service's file)
    script: str | None = None


class SlurmStepsExecutor(SlurmExecutor):
    """Runs each job as a step in an allocation of its account's (see the module notes); ``out_dir`` as
    for the srun launcher (srun writes each job's output there as its account)."""

    def __init__(self, prefix: str, partition: str | None = None, grace_s: float = 10.0,
                 env: Mapping[str, str] | None = None, poll_every_s: float = 0.2, timeout_s: float = 30.0,
                 out_dir: str | None = None, linger_s: float = LINGER_S) -> None:
        if out_dir is None:
            raise ExecutorError("Slurm steps need an output directory (out_dir): srun writes there as the job's account")
        super().__init__(prefix, partition, grace_s, env, poll_every_s=poll_every_s, timeout_s=timeout_s,
                         out_dir=out_dir, launcher="steps")
        self.linger_s = float(linger_s)
        self.allocs: dict[int, Alloc] = {}
        self.steps: dict[str, Step] = {}
        #: failed steps whose srun runs on: when their exit record was first seen (see _settled)
        self._failing: dict[str, float] = {}
        #: sruns of steps reported ended, to reap: (srun, its messages, the step, when it was reported ended)
        self._ending: list[tuple[subprocess.Popen[bytes], str | None, str, float]] = []

    @property
    def alloc_name(self) -> str:
        return f"{self.prefix}.alloc"

    def step_name(self, eid: str, attempt: int) -> str:
        """The name of the step of launch ``attempt`` of ``eid`` (``<prefix>:<id>:aN``; without an attempt,
        the job's name)."""
        return self.job_name(eid) + (f":a{attempt}" if attempt > 0 else "")

    def _named(self, name: str) -> tuple[str, int] | None:
        """(executor id, attempt; 0: none) of a step named by :meth:`step_name`, or by an older version
        (``<prefix>:<id>``); None for a name of another's."""
        if not name.startswith(self.prefix + ":"):
            return None
        m = re.fullmatch(r"(.+?)(?::a(\d+))?", name[len(self.prefix) + 1:])
        return (m.group(1), int(m.group(2) or 0)) if m is not None else None

    def _stop_mark(self, exit_path: str) -> str:
        """The service's own file that marks the stop of the step whose exit record is ``exit_path``."""
        return f"{self.out_dir}/.stopped-{os.path.basename(exit_path)}"

    def _mine(self) -> set[int]:
        return super()._mine() | set(self.allocs)

    # -- launch -------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> ProcInfo:
        if spec.job_id in self.steps:
            raise ExecutorError(f"job {spec.job_id}: already running as Slurm step {self.steps[spec.job_id].step}")
        node, gres, cpus = self._check_launch(spec)
        acct = run_as(spec.user)
        a = self._alloc_for(spec, node, gres, cpus, acct)
        a.jobs[spec.job_id] = (frozenset(spec.gpus), cpus, max(1, spec.mem_mb))
        try:
            st = self._start_step(spec, a, gres, cpus, acct)
        except BaseException:
            self._leave(a, spec.job_id)
            raise
        self.steps[spec.job_id] = st
        info = ProcInfo(spec.job_id, spec.node, a.sid, a.submit, spec.log_path, st.exit_file)
        self.procs[spec.job_id] = info
        self._exit_files[spec.job_id] = st.exit_file
        return info

    def _alloc_for(self, spec: LaunchSpec, node: SlurmNode, gres: str | None, cpus: int,
                   acct: tuple[int, int] | None) -> Alloc:
        """An allocation of the job's account on its node with room for it (the smallest), or a new one sized
        to it; idle allocations in its way are cancelled first, whoever owns them."""
        uid = acct[0] if acct is not None else os.geteuid()
        want = frozenset(spec.gpus)
        mem = max(1, spec.mem_mb)
        fits = [a for a in list(self.allocs.values()) if a.uid == uid and a.node == spec.node and a.room(want, cpus, mem)]
        if fits:
            return min(fits, key=lambda a: (len(a.gpus), a.cpus, a.mem_mb))
        busy = sorted(g for a in list(self.allocs.values()) if a.jobs and a.node == spec.node for g in a.gpus & want)
        if busy:  # an allocation cannot shrink: its GPUs come free when its steps end
            raise NodeUnavailable(f"job {spec.job_id}: GPU(s) {busy} of {spec.node} are in an allocation of "
                                  "another job's account (or too full for it) until its steps end")
        used_c = used_m = 0
        for rec in self.jobs.values():
            if rec.get("JobState") in LIVE and rec.get("NodeList") == spec.node:
                c, m = tres(rec.get("TRES", ""))
                used_c, used_m = used_c + c, used_m + m
        gone = []
        for a in sorted(list(self.allocs.values()), key=lambda a: a.idle_since):
            if not a.jobs and a.node == spec.node and (
                    a.gpus & want or used_c + cpus > node.cpus or used_m + spec.mem_mb > node.mem_mb):
                self._drop_alloc(a.sid)
                gone.append(a.sid)
                used_c, used_m = used_c - a.cpus, used_m - a.mem_mb
        end = time.monotonic() + self.timeout_s
        while gone and time.monotonic() < end:  # until Slurm has freed what they held (tens of ms)
            gone = [sid for sid in gone if (self._job(sid) or {}).get("JobState") in LIVE]
            if gone:
                time.sleep(0.02)
        argv = slurm_argv("salloc", name=self.alloc_name, node=spec.node, cpus=cpus, mem_mb=spec.mem_mb, gres=gres,
                          partition=self.partition, account=acct)
        argv = [self._which("salloc"), *argv[1:], f"--immediate={PLACE_WAIT_S}"]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=self.env,
                               timeout=self.timeout_s, cwd="/")
        except subprocess.TimeoutExpired:
            raise NodeUnavailable(f"job {spec.job_id}: salloc gave no answer within {self.timeout_s:g} s") from None
        granted = _GRANTED.search(r.stderr)
        if granted is None:
            raise NodeUnavailable(f"job {spec.job_id}: Slurm gave no allocation on {spec.node}: "
                                  f"{r.stderr.strip()[:300] or f'salloc exited {r.returncode}'}")
        sid = int(granted.group(1))
        a = Alloc(sid, uid, spec.node, want, cpus, max(1, spec.mem_mb), _time((self._job(sid) or {}).get("SubmitTime")))
        self.allocs[sid] = a
        return a

    def _start_step(self, spec: LaunchSpec, a: Alloc, gres: str | None, cpus: int,
                    acct: tuple[int, int] | None) -> Step:
        out = self._output(spec).replace("%j", str(a.sid))
        exit_file = exit_record(os.path.dirname(out), spec.job_id, a.sid, spec.attempt)
        _unlink(exit_file)  # a stopped run's, in the same allocation (launches without an attempt)
        _unlink(self._stop_mark(exit_file))
        self._copying.pop(out, None)  # (a stopped step's, not yet copied whole: this one appends, copied as it runs)
        if not os.path.exists(out):  # its output was copied whole and removed: this step's starts afresh
            set_mirror_offset(spec.log_path, "slurm", out, 0)
        tag, script = self._write_script(spec, out, _tag(spec.attempt))
        err = f"{self.out_dir}/.srun-{tag}.err"
        argv = slurm_argv("step", name=self.step_name(spec.job_id, spec.attempt), node=spec.node, cpus=cpus,
                          mem_mb=spec.mem_mb, gres=gres, workdir=spec.workdir, out=out, account=acct, jobid=a.sid)
        with open(err, "wb") as ef:
            p = subprocess.Popen([self._which("srun"), *argv[1:], script], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=ef, env=self.env, cwd="/", start_new_session=True)
        t0 = time.monotonic()
        while True:
            text = _read_text(err)
            m = _STEP.search(text)
            if m is not None:
                self.outputs[spec.job_id] = out
                return Step(a.sid, m.group(1), exit_file, p, err, script)
            waited = time.monotonic() - t0
            if p.poll() is not None or waited > min(self.timeout_s, STEP_WAIT_S):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                _unlink(err)
                _unlink(script)
                why = (" ".join(ln for ln in text.splitlines() if "error:" in ln)[:300]  # (not -v's option list)
                       or (f"srun exited {p.returncode}" if p.returncode is not None and p.returncode >= 0 else
                           f"not launched within {min(self.timeout_s, STEP_WAIT_S):g} s (its resources are busy)"))
                raise NodeUnavailable(f"job {spec.job_id}: no step in Slurm allocation {a.sid}: {why}")
            time.sleep(0.01)

    # -- observe ------------------------------------------------------------------------------
    def _step_exit(self, st: Step, eid: str | None = None) -> tuple[bool, int | None]:
        """(whether the step has ended, its exit): its script's record, else srun's code once srun ended.
        srun's 0 with no record is no success: the script never reached its end (srun can say 0 for a
        step Slurm ended before its task ran); unknown, once ``ENDED_GRACE_S`` has
        given a record written just before srun's end the time to show (at once without ``eid``: a stop)."""
        code = _recorded(read_output(st.exit_file, 0, 64, self._warned))
        if code is not None:
            return True, code
        if st.proc is not None and st.proc.poll() is not None:
            rc = st.proc.returncode
            if rc == 0 and eid is not None:
                first = self._failing.setdefault(eid, time.monotonic())
                return time.monotonic() - first > ENDED_GRACE_S, None
            return True, None if rc == 0 else rc if rc > 0 else 128 - rc
        return False, None

    def _settled(self, eid: str, st: Step) -> bool:
        """Whether a failed step's end may be reported: once its srun has ended (Slurm has torn the step
        down and written why), or ``ENDED_GRACE_S`` after its exit record came, or at once for an adopted step."""
        if st.proc is None or st.proc.poll() is not None:
            return True
        first = self._failing.setdefault(eid, time.monotonic())
        return time.monotonic() - first > ENDED_GRACE_S

    def _step_reason(self, eid: str, st: Step, code: int | None) -> str | None:
        """Why a failed step ended, as Slurm says: the step's state in accounting (``sacct``, where it is on),
        srun's own report of an OOM kill, else slurmstepd's line in the step's output (:func:`stepd_reason`),
        only for an end by a signal (the output is the job's own file), else srun's report that Slurm ended
        the step while launching it (:func:`srun_aborted`)."""
        if not st.step:
            return None
        try:  # (bounded: the service's loop waits for it)
            acct = self.cmd("sacct", "-n", "-P", "-j", st.step, "-o", "JobID,State", timeout_s=SACCT_WAIT_S)
            why = sacct_step_reason(acct, st.step)
        except SlurmError:  # accounting off, or slurmdbd not answering
            why = None
        if why is not None:
            return why
        said = _read_text(st.err) if st.err is not None else ""
        if re.search(r"^srun: error: \S+: tasks? \S+: Out Of Memory$", said, re.M):
            return REASONS["OUT_OF_MEMORY"]
        out = self.outputs.get(eid)
        if out is None or (code is not None and code < 128):
            return None
        # slurmstepd's line, else srun's word that the step was ended while it launched (no output set up yet)
        aborted = (ABORTED_AT_LAUNCH if srun_aborted(said, st.step) else
                   NO_EXIT_RECORD if code is None and st.proc is not None and st.proc.returncode == 0 else None)
        try:
            size = os.lstat(out).st_size
        except OSError:
            return aborted
        data = read_output(out, max(0, size - REASON_TAIL), REASON_TAIL, self._warned)
        return (stepd_reason(data.decode(errors="replace"), st.step) if data else None) or aborted

    def read_steps(self) -> dict[str, dict[str, str]]:
        """Every step slurmctld holds (``scontrol show step``), by step id."""
        out = self.cmd("scontrol", "--oneliner", "show", "step", ok=("No job steps",))
        return {r["StepId"]: r for r in parse_records(out) if "StepId" in r}

    def poll(self) -> dict[str, int | None]:
        self._reap()
        for eid, st in list(self.steps.items()):
            if eid not in self.exits and eid not in self._stopping:
                done, code = self._step_exit(st, eid)
                if done and (code == 0 or self._settled(eid, st)):
                    self.exits[eid] = code
                    why = None if code == 0 else self._step_reason(eid, st, code)
                    if why is not None:
                        self.reasons[eid] = why
        # (exits the steps recorded go out first: Slurm is read at the next poll, and not waited for)
        if time.monotonic() - self._read_at >= self.poll_every_s and not (set(self.exits) & set(self.procs)):
            try:
                self._follow_slurm()
            except SlurmError as e:  # slurmctld restarting: only the steps' own exit records count
                log.warning("cannot read Slurm's jobs: %s", e)
        out = {x: self.exits.pop(x) for x in list(self.exits) if x in self.procs}
        for x in out:
            self._end(x)
        self._copy_rest()  # (outputs the full disk of their logs kept: removed once copied whole)
        return out

    def _follow_slurm(self) -> None:
        """Allocations and steps as Slurm has them: ended allocations end their steps' jobs; steps this
        service did not start that are gone; allocations found, and idle ones expired."""
        self.read_jobs()
        steps = self.read_steps() if any(st.proc is None for st in self.steps.values()) else {}
        for sid in [sid for sid in self.allocs if self.jobs.get(sid, {}).get("JobState") not in LIVE]:
            a = self.allocs.pop(sid)
            for eid in a.jobs:
                if eid in self.steps and eid not in self.exits and eid not in self._stopping:
                    self.exits[eid] = None
                    self.reasons[eid] = (f"its Slurm allocation {sid} ended "
                                         f"({self.jobs.get(sid, {}).get('JobState', 'gone')})")
        for eid, st in list(self.steps.items()):  # adopted steps (no srun here) that ended with no record
            if st.proc is None and eid not in self.exits and eid not in self._stopping and st.step not in steps:
                self.exits[eid] = self._step_exit(st)[1]
        self._find_allocs()
        self._expire_idle()
        self.mirror([e for e in self.outputs if e not in self.exits])

    def _end(self, eid: str) -> None:
        """The job's step is over: its allocation is idle from now, its files go (its output once copied whole)."""
        st = self.steps.pop(eid, None)
        self._failing.pop(eid, None)
        if st is not None:
            a = self.allocs.get(st.alloc)
            if a is not None:
                self._leave(a, eid)
            if st.proc is not None:
                # srun writes the step's output as slurmstepd forwards it, its last lines after the script's
                # exit record: all of it once srun exits (the output is copied whole into the log just below)
                try:
                    st.proc.wait(ENDED_GRACE_S)
                except subprocess.TimeoutExpired:
                    log.warning("job %s: its step has ended but its srun runs on: its log may lack its last lines",
                                eid)
                self._ending.append((st.proc, st.err, st.step, time.monotonic()))
        remote, p = self.outputs.get(eid), self.procs.get(eid)
        self._forget(eid)
        if remote is not None:
            self._copying[remote] = p.log_path if p is not None else ""
            self._copy_rest()
        if st is not None and st.exit_file:
            _unlink(self._stop_mark(st.exit_file))

    @staticmethod
    def _leave(a: Alloc, eid: str) -> None:
        if a.jobs.pop(eid, None) is not None and not a.jobs:
            a.idle_since = time.monotonic()

    def _reap(self) -> None:
        for e in list(self._ending):
            p, err, step, t = e
            if p.poll() is None and time.monotonic() - t > ENDED_GRACE_S:  # it wrote its exit but runs on
                try:
                    self.cmd("scancel", step, ok=("Invalid job", "completing or completed"))
                except SlurmError as why:  # (slurmctld restarting: again at the next poll)
                    log.warning("cannot cancel Slurm step %s: %s", step, why)
                    continue
                log.warning("Slurm step %s wrote its exit but runs on: cancelled", step)
                self._ending[self._ending.index(e)] = (p, err, step, float("inf"))
            elif p.poll() is not None:
                self._ending.remove(e)
                _unlink(err)

    def _find_allocs(self) -> None:
        """Allocations of this service's it does not know (an earlier incarnation's): kept as idle ones,
        busy while a step of this service's runs in them."""
        for sid, rec in list(self.jobs.items()):
            if (sid in self.allocs or rec.get("JobName") != self.alloc_name or rec.get("JobState") not in LIVE
                    or rec.get("JobState") == "COMPLETING"):  # (cancelled already: ending)
                continue
            c, m = tres(rec.get("TRES", ""))
            self.allocs[sid] = Alloc(sid, owner_uid(rec), rec.get("NodeList", ""), frozenset(gres_indices(rec.get("GRES", ""))),
                                     c, m, _time(rec.get("SubmitTime")), {}, time.monotonic())
            for r in self.read_steps().values():  # (what each holds is not known here: all of it)
                named = self._named(r.get("Name", ""))
                if r["StepId"].split(".")[0] == str(sid) and named is not None:
                    self.allocs[sid].jobs[named[0]] = (self.allocs[sid].gpus, c, m)

    def _expire_idle(self) -> None:
        now = time.monotonic()
        for a in list(self.allocs.values()):
            for eid in [e for e in list(a.jobs) if e not in self.steps and e not in self._stopping]:
                self._leave(a, eid)  # found busy with a step no record adopted (see orphans)
            if not a.jobs and now - a.idle_since > self.linger_s:
                self._drop_alloc(a.sid)

    def _drop_alloc(self, sid: int) -> None:
        self.allocs.pop(sid, None)
        self._cancel(sid)

    # -- stop ---------------------------------------------------------------------------------
    def stop(self, job_id: str, grace_s: float) -> int | None:
        st = self.steps.get(job_id)
        if st is None:
            raise ExecutorError(f"job {job_id}: not running through this executor")
        if job_id in self.exits:  # it ended on its own; not yet polled
            code = self.exits.pop(job_id)
            self._end(job_id)
            return code
        self._stopping.add(job_id)
        try:
            self._mark_step_stopped(st)
            code = self._stop_step(st, grace_s)
        finally:
            self._stopping.discard(job_id)
        self._end(job_id)
        return code

    def _mark_step_stopped(self, st: Step) -> None:
        """Mark the step's stop before its first signal (its mark goes with the step, :meth:`_end`): a restart
        then takes its end for the stop's (:meth:`stopped`), never for the job's own (:meth:`launched`).  In
        ``out_dir`` itself, the service's: the job's account cannot forge or remove it."""
        if not st.exit_file:  # (a step found with no output: no record to read, none to mark)
            return
        try:
            fd = os.open(self._stop_mark(st.exit_file), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.close(fd)
        except OSError as e:
            log.warning("cannot mark Slurm step %s as stopped by the service: %s", st.step or "?", e)

    def _stop_step(self, st: Step, grace_s: float) -> int | None:
        end = time.monotonic() + grace_s
        sent = -1e9
        done, code = self._step_exit(st)
        while not done and time.monotonic() < end:
            if time.monotonic() - sent >= 1.0:  # again each second: a step still starting drops the signal
                sent = time.monotonic()
                self.cmd("scancel", "--signal=TERM", st.step, ok=("Invalid job", "completing or completed"))
            time.sleep(0.05)
            done, code = self._step_exit(st)
        if not done:  # past the grace period: the step is killed
            self.cmd("scancel", st.step, ok=("Invalid job", "completing or completed"))
            code = 137
        # until the step is gone from Slurm, so its GPUs are free for the next step in the allocation
        gone_by = time.monotonic() + self.timeout_s
        while time.monotonic() < gone_by and (
                (st.proc is not None and st.proc.poll() is None) or st.step in self.read_steps()):
            time.sleep(0.02)
        return code

    # -- after a restart ----------------------------------------------------------------------
    def _step_named(self, eid: str, sid: int, attempt: int = 0) -> str | None:
        """The step of ``eid`` in allocation ``sid`` (of launch ``attempt`` only, where one is given)."""
        for step_id, rec in self.read_steps().items():
            named = self._named(rec.get("Name", ""))
            if step_id.split(".")[0] == str(sid) and named is not None and named[0] == eid and attempt in (0, named[1]):
                return step_id
        return None

    def adopt(self, info: ProcInfo) -> bool:
        cur = self.steps.get(info.job_id)
        if cur is not None and cur.alloc == info.pid:
            return True
        rec = self._job(info.pid)
        if (rec is None or rec.get("JobName") != self.alloc_name or rec.get("JobState") not in LIVE
                or abs(_time(rec.get("SubmitTime")) - info.start_time) > 1):
            return False
        step = self._step_named(info.job_id, info.pid, _attempt_of(info.exit_path))
        # an ended step is taken only for its output still to be copied into the job's log (its exit record
        # tells its end at the next poll); one with no log (found by :meth:`launched`) is gone
        if step is None and (not info.log_path or not os.path.exists(info.exit_path)):
            return False
        self.read_jobs()
        self._find_allocs()
        a = self.allocs.get(info.pid)
        if a is not None:  # (what the step holds is not known here: all of the allocation)
            a.jobs[info.job_id] = (a.gpus, a.cpus, a.mem_mb)
        self.steps[info.job_id] = Step(info.pid, step or "", info.exit_path)
        self.procs[info.job_id] = info
        self._exit_files[info.job_id] = info.exit_path
        out = self._srun_output(info.job_id, info.pid, rec)
        if out:
            self.outputs[info.job_id] = out
        return True

    def exit_code(self, info: ProcInfo) -> int | None:
        data = read_output(info.exit_path, 0, 64, self._warned) if info.exit_path else None
        return int(data) if data and data.strip().isdigit() else None

    def exit_time(self, info: ProcInfo) -> float | None:
        try:  # (the record's own time, never a link's target's)
            return os.lstat(info.exit_path).st_mtime if info.exit_path else None
        except OSError:
            return None

    def launched(self, job_id: str, node: str, attempt: int, user: str | None = None) -> ProcInfo | None:
        """The step of launch ``attempt`` of ``job_id``, by the marks its launch left (see the module notes):
        one still running, named for that attempt, in an allocation of this service's that ``user``'s account
        owns (the service's own for None), for :meth:`adopt`; else one that ended, by that attempt's exit
        record in the account's output directory, for :meth:`exit_code` and :meth:`exit_time`.  None where
        neither is found, or the service's stop of it is marked (:meth:`stopped`: its end is the stop's).
        Any Slurm user can name an allocation and a step like this service's: only the account's count.  The
        exit record is the account's own file, read only as a plain file of its directory's owner, never
        through a link: a forged one ends only that account's job.  Raises SlurmError where slurmctld does
        not answer."""
        if attempt <= 0:
            return None
        uid = lookup(user).uid if user is not None else os.geteuid()
        self.read_jobs()

        def ours(sid: int) -> bool:
            rec = self.jobs.get(sid, {})
            return rec.get("JobName") == self.alloc_name and owner_uid(rec) == uid

        d = f"{self.out_dir}/{user or '_server'}"  # (as :meth:`_output` makes it)
        found = None
        for step_id, rec in self.read_steps().items():
            sid = int(step_id.split(".")[0])
            if self._named(rec.get("Name", "")) == (job_id, attempt) and owner_uid(rec) == uid and ours(sid):
                alloc = self.jobs[sid]
                found = ProcInfo(job_id, alloc.get("NodeList") or node, sid, _time(alloc.get("SubmitTime")), "",
                                 exit_record(d, job_id, sid, attempt))
                break
        if found is None:  # ended: its exit record, in an allocation of the account's (one Slurm forgot: any)
            try:
                names = os.listdir(d) if stat.S_ISDIR(os.lstat(d).st_mode) else []
            except OSError:
                names = []
            mine = re.compile(rf"{re.escape(job_id)}\.(\d+){re.escape(_tag(attempt))}\.exit")
            for sid in sorted((int(m.group(1)) for n in names if (m := mine.fullmatch(n))), reverse=True):
                path = exit_record(d, job_id, sid, attempt)
                if _recorded(read_output(path, 0, 64, self._warned)) is not None and (sid not in self.jobs or ours(sid)):
                    rec = self.jobs.get(sid, {})
                    # (its start: the launch's own, not its allocation's, which an earlier job may have opened)
                    start = self._launched_at(job_id, attempt) or _time(rec.get("SubmitTime"))
                    found = ProcInfo(job_id, rec.get("NodeList") or node, sid, start, "", path)
                    break
        return None if found is None or self.stopped(found) else found

    def _launched_at(self, eid: str, attempt: int) -> float:
        """The wall time of launch ``attempt`` of ``eid`` by this service's (or an earlier incarnation's) srun:
        its messages' file in ``out_dir`` is named with it (:meth:`_write_script`'s tag); 0 if none is left."""
        mine = re.compile(rf"\.srun-{re.escape(eid)}\.(\d+){re.escape(_tag(attempt))}\.err")
        try:
            names = os.listdir(str(self.out_dir))
        except OSError:
            return 0.0
        return max((int(m.group(1)) / 1e9 for n in names if (m := mine.fullmatch(n))), default=0.0)

    def stopped(self, info: ProcInfo) -> bool:
        """Whether the service stopped the step of ``info``: :meth:`stop` marks it first
        (:meth:`_mark_step_stopped`)."""
        return bool(info.exit_path) and os.path.lexists(self._stop_mark(info.exit_path))

    def alive(self, job_id: str) -> bool:
        st = self.steps.get(job_id)
        if st is None:
            return False
        if st.proc is not None:
            return st.proc.poll() is None
        try:
            return st.step in self.read_steps()
        except SlurmError:
            return True

    def orphans(self) -> list[ProcInfo]:
        """Steps with this service's job names in its allocations that no record holds (a launch not
        recorded)."""
        try:
            self.read_jobs()
            steps = self.read_steps()
        except SlurmError as e:
            log.warning("cannot look for unrecorded Slurm steps: %s", e)
            return []
        known = {st.step for st in self.steps.values()}
        out = []
        for step_id, rec in steps.items():
            sid = int(step_id.split(".")[0])
            alloc = self.jobs.get(sid, {})
            named = self._named(rec.get("Name", ""))
            if step_id in known or alloc.get("JobName") != self.alloc_name or named is None:
                continue
            eid, attempt = named
            out_path = self._srun_output(eid, sid, alloc)
            exit_path = exit_record(os.path.dirname(out_path), eid, sid, attempt) if out_path else ""
            out.append(ProcInfo(eid, alloc.get("NodeList", ""), sid, _time(alloc.get("SubmitTime")), "", exit_path))
        return out

    def evict(self, node: str) -> list[str]:
        """Cancel this executor's allocations on ``node`` (lost: drained or down) with their steps."""
        gone = [e for e, st in list(self.steps.items()) if self.procs[e].node == node]
        for e in gone:
            self.exits.pop(e, None)
            self._end(e)
        for a in [a for a in list(self.allocs.values()) if a.node == node]:
            self._drop_alloc(a.sid)
        return gone

    def close(self) -> None:
        """Cancel the idle allocations (those with steps stay, for the next service to adopt)."""
        for a in [a for a in list(self.allocs.values()) if not a.jobs]:
            self._drop_alloc(a.sid)
