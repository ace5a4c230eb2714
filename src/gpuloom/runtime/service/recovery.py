"""Recovery after a restart: rebuild the mirror from the store, adopt live processes, requeue the rest.

A job that held a process (launching, running, being stopped) is adopted if
all its processes are alive (same pid and start time); a stop the previous
service had begun (checkpointing, stopping) is finished now (and counted as
the preemption it was).  A job whose processes are gone and that was not
being stopped ends as its exit records say: FINISHED if they are all 0,
FAILED if one is not (an exit record is final: a job that failed while the
service was down is not run again), with the time it ran up to its exit.
An exit record the service marked as its stop's (``Executor.stopped``) is no
end of the job's own: a part that failed on its own fails the job with its
code (others still alive are stopped); a job all of whose other parts ended 0
(or still run: a stop the server died in the middle of, finished now) was
ended by that stop, as the live service would have recorded it: cancelled
(a cancel request was stored), failed at its time limit, or failed saying the
reason was not recorded.  Unmarked records are read as before.
Without exit records (the wrapper itself was killed) it is requeued (STANDBY)
to resume from its checkpoint.  Adopted jobs that were protected lose their
protection at once (its start is unknown).

Held time counts from the launch's stored service time (``last_start_at``;
service time continues across the restart, :func:`..exec.clock.resume`), so a
wall-clock step while the service was down adds nothing to it; an exit record's
wall time is trusted only within ``[launch, now]`` in service time.

Launches are recorded before their processes exist (an *intent*: the
processes to be, without pids, and the attempt); a launch the previous service
did not confirm (killed before the confirmation, or before the store took it)
is looked up in the executor's records of that very attempt
(:meth:`..exec.executor.Executor.launched`, :func:`_recover_intent`).  If a
process of it started and none still runs, the job ran (to its end, perhaps):
it ends as their exit records say, once, and is never launched again.
Otherwise its intent is cleared and it is queued again; a process of it still
running, and any other process the previous service launched and never
recorded (profiling runs), is found from the pid file its wrapper writes first
and stopped gracefully (here, or :func:`_sweep`), so no job runs twice.
The local and Ray executors keep such records (their node agents'), the
Slurm executor marks each Slurm job with its attempt (its Comment), and
Slurm's steps executor each step's name and exit record.
Lifecycles restart from the stored state (the history before the restart is
in the events table).

An adopted job continues from its stored remaining work (``work_left`` as of
``work_at``) at the speed the throughput model gives its stored allocation,
group included, so it has the remaining work, group and speed the simulator
would give it at the same instant.  Co-runners that were not adopted leave
their partners' groups.

Recovery needs to read the store, not to write it: what it decides (an end,
a requeue, a stop finished) is recorded like the loop's own records
(:mod:`.outbox`), so a server restarts on a full state disk, and a job whose
end could not be recorded before the restart ends as its exit record says,
once, not run again.
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ...core.lifecycle import PROGRESS_STATES, JobState
from ...core.plan import Allocation
from ..exec.executor import ProcInfo
from ..state.codec import alloc_from_json, proc_from_json
from ..state.store import JobRow
from .actuator import Running
from .states import ACTIVE_STATES, QUEUED_STATES

if TYPE_CHECKING:
    from ...core.cluster import Cluster
    from ...core.job import Job
    from ...driver import Driver
    from ..exec.clock import Clock
    from ..exec.executor import Executor
    from ..state.store import Store
    from .actuator import Actuator
    from .deps import Gate
    from .mirror import Mirror

log = logging.getLogger("gpuloom.service")
S = JobState
#: how far short of its time limit a stopped job's held time, measured from its records' wall times, may
#: fall and the stop still be the limit's: a file's time is the kernel's coarse clock (a tick behind the
#: real one), and the launch's wall time is taken just before its service time
_LIMIT_SLACK_S = 0.1


class Recoverable(Protocol):
    """What recovery uses of the service: its parts, and how it admits, ends and cancels jobs."""

    last_id: int  # the highest job id seen (raised here)

    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def store(self) -> Store: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def actuator(self) -> Actuator: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def mirror(self) -> Mirror: ...
    @property
    def gate(self) -> Gate: ...
    def now(self) -> float: ...
    def wake(self) -> None: ...
    def fits_or_fail(self, row: JobRow) -> bool: ...
    def admit_row(self, row: JobRow, state: JobState, arrival: float | None = None) -> Job: ...
    def end(self, jid: str, state: JobState, code: int | None, reason: str | None) -> None: ...
    def request_cancel(self, jid: str) -> None: ...


def recover(svc: Recoverable) -> None:

    with svc.lock:
        for row in svc.store.list_jobs(ACTIVE_STATES):
            svc.last_id = max(svc.last_id, row.id)
            if row.state == S.WAITING_FOR_INITIAL_CONTACT.value:
                if svc.fits_or_fail(row):
                    svc.gate.add(row)  # dependencies and array limits first, like a new submission
                continue
            if row.state in QUEUED_STATES:
                if row.procs and _recover_intent(svc, row):  # a launch intended and not confirmed
                    continue
                if svc.fits_or_fail(row):
                    svc.admit_row(row, JobState(row.state))
                continue
            if not _recover_holding(svc, row) and row.cancel_requested:
                svc.request_cancel(str(row.id))
        _settle(svc)
        _sweep(svc)
    # ``last_id`` stops at the newest job read above: a job submitted since (the API does not take
    # the loop's lock, and a rebuild runs this while the service serves) is newer, and the next
    # round loads it like any other submission
    svc.wake()


def _recover_holding(svc: Recoverable, row: JobRow) -> bool:
    """Adopt, end or requeue a job that held processes; True if it was ended here."""
    act = svc.actuator
    state = JobState(row.state)
    procs = [proc_from_json(d) for d in row.procs or [] if "pid" in d]
    alloc = None
    adopted: list[ProcInfo] = []
    jid = str(row.id)
    if procs and row.alloc:
        try:
            alloc = alloc_from_json(jid, row.alloc, svc.cluster)
        except (KeyError, ValueError) as e:
            log.warning("job %s: stored allocation no longer fits the cluster (%s)", row.id, e)
        adopted = [p for p in procs if act.adopt(p)]
    alive = alloc is not None and bool(procs) and len(adopted) == len(procs)
    stopping = state in (S.CHECKPOINTING, S.STOPPING)
    wall = svc.clock.time()
    now = svc.now()
    started = _started(svc, row)
    if alive and not stopping:
        assert alloc is not None and row.alloc is not None
        job = svc.admit_row(row, state)
        cores = {p["node"]: tuple(p.get("cores", ())) for p in row.alloc["parts"]}
        for p in procs:
            act.cores.claim(p.node, p.job_id, cores.get(p.node, ()))
            act.exec_owner[p.job_id] = jid
        act.running[jid] = Running({p.job_id: p for p in procs}, {}, cores, started,
                                   act.log_size(jid) if state is S.LAUNCHING else 0)
        svc.driver.hold(job, alloc)  # its speed once every co-runner is back (_settle)
        if state is S.RUNNING_PROTECTED and job.lifecycle is not None:
            # how long it has been protected is unknown: it ran before the restart, protection ends now
            job.lifecycle.protected_until = svc.now()
        if state in PROGRESS_STATES:
            job.busy_until = job.last_update  # progressing since its last record
        else:
            job.busy_until = math.inf
        svc.mirror.event(jid, "adopt", {"pids": [p.pid for p in procs]})
        log.info("job %s: adopted running process(es) %s", row.id, [p.pid for p in procs])
        return False
    for p in adopted:  # partly alive, or a stop to finish: stop what is left
        act.stop_quietly(p.job_id)
    gone = [p for p in procs if p not in adopted]
    # a part the service stopped (its exit record's stop mark: a cancel, a time limit, the others of a job
    # one part of which failed) did not end on its own: its exit status is the stop's, not the job's
    stopped = {p.job_id for p in gone if act.stopped(p)}
    codes = {p.job_id: act.exit_code(p) for p in gone if p.job_id not in stopped}
    ngpu = int(row.spec["gpus"])
    if not stopping and procs and state in (S.LAUNCHING, S.RUNNING_PROTECTED, S.RUNNING):
        failed = {e: c for e, c in codes.items() if c not in (0, None)}
        # (parts still alive beside stopped ones: the server died in the middle of that stop, finished now)
        ended_all = (not adopted or bool(stopped)) and all(c == 0 for c in codes.values())
        if failed or ended_all:
            # an exit record is final: the job finished, failed or was stopped to end while the service was down
            ended = [t for t in (act.exit_time(p) for p in gone) if t is not None]
            end = max(ended) if ended and not adopted else wall  # (parts alive until now: held until now)
            # (wall times of the launch and of the exit record: at most the service time since the launch)
            ran = min(max(0.0, end - (row.last_start or end)), now - started)
            row.held_time += ran
            row.held_gpu_time += ran * ngpu
            svc.admit_row(row, state)
            limit = row.spec.get("time_limit")
            if failed:  # (the others were stopped for it, or are now)
                eid, code = min(failed.items())
                svc.end(jid, S.FAILED, code, f"process {eid} ended with code {code} while the service was down")
            elif not stopped:
                svc.end(jid, S.FINISHED, 0, "finished while the service was down")
            elif row.cancel_requested:  # its cancel's stop, the end not stored
                svc.end(jid, S.CANCELLED, None, "cancelled")
            elif limit and row.held_time + _LIMIT_SLACK_S >= float(limit):  # its time limit's stop
                svc.end(jid, S.FAILED, None, f"time limit of {limit} s reached")
            else:  # stopped to be failed (it could not be scheduled), the reason not stored
                svc.end(jid, S.FAILED, None, "stopped by the service, which went down before recording why")
            return True
    held = row.held_time + (now - started)
    row.held_gpu_time += (held - row.held_time) * ngpu
    row.held_time = held
    if stopping:  # the stop the previous service began was a preemption (or half of a move/resize)
        row.preemptions += 1
    why = "stop completed after a restart" if stopping else "process lost while the service was down"
    svc.mirror.record(
        jid,
        {"state": S.STANDBY.value, "alloc": None, "procs": None, "held_time": held,
         "held_gpu_time": row.held_gpu_time, "preemptions": row.preemptions,
         "reason": f"{why}; requeued to resume"},
        "requeue",
        {"why": why},
    )
    row.state = S.STANDBY.value
    if svc.fits_or_fail(row):  # a smaller cluster may no longer hold it; a parked job waits
        svc.admit_row(row, S.STANDBY)
    return False


def _recover_intent(svc: Recoverable, row: JobRow) -> bool:
    """A launch stored as an intent alone: True if its processes ran and ended (the job is ended as their
    exit records say), else False (none started, or one still runs and is stopped now: the intent is
    cleared and the caller queues the job again, to resume from its checkpoint)."""
    act = svc.actuator
    jid = str(row.id)
    parts = [(str(d["job_id"]), str(d.get("node", ""))) for d in row.procs or []]
    # (the intent stored the attempt it counts, and its launch marked its records with it)
    found = {eid: act.launched(eid, node, row.attempts, row.user) for eid, node in parts}
    ran = {eid: p for eid, p in found.items() if p is not None}
    live = [p for p in ran.values() if act.adopt(p)]
    for f in [act.pool.submit(act.stop_quietly, p.job_id) for p in live]:
        f.result()
    pids = {eid: p.pid for eid, p in ran.items() if p.pid}  # (0: its end consumed, its pid record gone)
    if live or not ran:
        if live:
            log.warning("job %s: its unconfirmed launch still ran (pids %s): stopped", jid, [p.pid for p in live])
        svc.mirror.record(jid, {"procs": None}, "launch-unconfirmed",
                          {"found": "still running: stopped" if live else "no process started", "pids": pids})
        row.procs = None
        return False
    # every process of it that started has ended on its own: the job ran.  (A part that never started
    # fails it too: the others ran, and it cannot be run alone.)
    codes = {eid: act.exit_code(p) if p is not None else None for eid, p in found.items()}
    ends = [t for t in (act.exit_time(p) for p in ran.values()) if t is not None]
    starts = [p.start_time for p in ran.values() if p.start_time > 0]
    # (wall times of its records: from the first pid written to the last exit, at most until now)
    took = max(0.0, min(max(ends), svc.clock.time()) - min(starts)) if ends and starts else 0.0
    log.warning("job %s: its unconfirmed launch ran while the service was down and ended (exit codes %s)", jid,
                codes)
    fields: dict[str, Any] = {"procs": None}
    if starts:  # (for people, as a confirmed launch records them)
        fields["last_start"] = row.last_start = min(starts)
        if row.first_start is None:
            fields["first_start"] = row.first_start = min(starts)
    svc.mirror.record(jid, fields, "launch-unconfirmed",
                      {"found": "ended on its own", "pids": pids, "exit_codes": codes})
    row.procs = None
    row.held_time += took
    row.held_gpu_time += took * int(row.spec["gpus"])
    svc.admit_row(row, S.LAUNCHING)  # (launched: it ends from there)
    failed = {e: c for e, c in codes.items() if c not in (0, None)}
    unknown = sorted(e for e, c in codes.items() if c is None and e in ran)
    never = sorted(e for e in codes if e not in ran)
    why = "while the service was down, its launch unconfirmed"
    if failed:
        eid, code = min(failed.items())
        svc.end(jid, S.FAILED, code, f"process {eid} ended with code {code} {why}")
    elif unknown:
        svc.end(jid, S.FAILED, None, f"process {unknown[0]} ended with an unknown exit code {why}")
    elif never:
        svc.end(jid, S.FAILED, None, f"process {never[0]} never started and the others ended {why}")
    else:
        svc.end(jid, S.FINISHED, 0, f"finished {why}")
    return True


def _started(svc: Recoverable, row: JobRow) -> float:
    """The service time of the job's last launch, at most now: as stored, or, for a launch recorded
    without it (an older version), from its wall time's age (:meth:`.Mirror.since`)."""
    if row.last_start_at is not None:
        return min(svc.now(), float(row.last_start_at))
    return svc.mirror.since(row.last_start) if row.last_start is not None else svc.now()


def _sweep(svc: Recoverable) -> None:
    """Stop (SIGTERM, grace, SIGKILL) processes the previous service launched but never recorded: a
    launch it did not live to confirm, a profiling run.  Recovery never leaves a job running twice."""
    act = svc.actuator
    try:
        found = svc.executor.orphans()
    except Exception as e:
        log.warning("cannot look for unrecorded processes: %s", e)
        return
    futs = []
    for p in found:
        if act.adopt(p):
            log.warning("process %s (pid %s) was launched but never recorded: stopping it", p.job_id, p.pid)
            futs.append(act.pool.submit(act.stop_quietly, p.job_id))
    for f in futs:
        f.result()


def _settle(svc: Recoverable) -> None:
    """Once every adopted job is back: members of a group whose partners were not adopted keep
    their GPUs in a smaller group; every adopted job gets its speed and is advanced to now."""
    drv = svc.driver
    now = svc.now()
    for jid, a in list(drv.current.items()):
        job = drv.jobs[jid]
        if any(o not in drv.current for o in a.group):
            a = Allocation(a.job_id, a.parts, tuple(o for o in a.group if o in drv.current))
            drv.hold(job, a)
            job.speed = drv.speed(job, a)
            job.advance(now)
            svc.actuator.regrouped(drv, job, now)
            continue
        job.speed = drv.speed(job, a)
        job.advance(now)
