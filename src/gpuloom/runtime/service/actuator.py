"""Launch and stop: the service's driver backend, carrying plans out through the executor.

:class:`Actuator` implements :class:`~gpuloom.driver.Backend` for the service:

* **stop** (preemption, and the first half of a move or resize): the job walks
  its stop steps up to CHECKPOINTING (or STOPPING, if it was still launching),
  which is in the store while every process of the round gets SIGTERM *in
  parallel* (each gets the full grace period to checkpoint; SIGKILL after);
  once they exited, the job walks on to STANDBY, its cores are released and
  its held time, remaining work and stop count are recorded;
* **launch** (a start, or the second half of a move or resize): one
  :meth:`Executor.launch <gpuloom.runtime.exec.executor.Executor.launch>` per part
  of the allocation (a part is one node; a job spanning nodes gets one
  process per node, executor ids ``ID.RANK``), with node-local GPU ids
  (``Cluster.local_index``), concrete cores from a
  :class:`~..exec.executor.CoreAllocator`, the part's memory limit and
  ``GPULOOM_JOB_ID``, ``GPULOOM_CHECKPOINT_DIR`` and, when the job ran before,
  ``GPULOOM_RESUME=1``; the parts of a job spanning nodes also get what
  torchrun and ``torch.distributed`` expect (:mod:`..exec.gang`).  The job walks its start steps to LAUNCHING; it
  makes no progress (``busy_until`` = inf) until its first ``GPULOOM_PROGRESS``
  line promotes it (:meth:`Actuator.promote`).  A launch that raises fails the
  job alone (:class:`~gpuloom.driver.LaunchFailed`), its processes stopped and
  cores released; one refused by a node that cannot take it now
  (:class:`~..exec.executor.NodeUnavailable`) leaves the job queued;
* **regrouped**: only the record changes (new co-runners, new remaining work).

**The store's part** (:mod:`.outbox`).  What gates an action is written now: a
launch's intent and its confirmation (refused, the launch is undone and the
job stays queued, as are the round's later starts), and the round's stop
states, in one transaction before the driver applies anything
(:meth:`Actuator.prepare_stops`).  What has happened once the action is done
(a stop's end, a promotion, a regroup) is recorded, in order, when the store
takes it.

A first launch of a job that wants a profile goes to the profiling manager
first; when it profiles the job, the launch is not carried out this round
(the next round sizes the job with its profile), nor is any other start of
the round.  :meth:`reap` and :meth:`terminate` are the observe side: exits
reported by the executor, and stops that end a job (cancel, time limit).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...core.cluster import Cluster
from ...core.job import Job
from ...core.lifecycle import JobState
from ...core.parse import normalise_gpu_type
from ...core.plan import Action, ActionKind, Allocation
from ...driver import Driver, LaunchFailed, Step, lifecycle_steps
from ..exec import joblogs
from ..exec.executor import CoreAllocator, Executor, LaunchSpec, NodeUnavailable, ProcInfo
from ..exec.gang import gang_env
from ..exec.identity import Identities, owned_dir, private_dir
from ..exec.progress import ProgressError
from ..exec.progress import parse_line as parse_progress
from ..state.codec import alloc_to_json, proc_to_json
from ..state.store import JobRow, unavailable
from .mirror import Mirror

log = logging.getLogger("gpuloom.service")
S = JobState
PROGRESS_MARK = b"GPULOOM_PROGRESS"  # progress lines: ``GPULOOM_PROGRESS iter=N``


@dataclass(slots=True)
class Running:
    """What the service knows about a launched job."""

    procs: dict[str, ProcInfo]  # executor id -> process
    exited: dict[str, int]  # executor id -> exit code, for parts already gone
    cores: dict[str, tuple[int, ...]]  # node name -> core ids
    start: float  # service time of this launch (held time counts from it)
    log_offset: int = 0  # bytes in the log before this launch, a logical offset (progress lines after it count)
    looked: float = -math.inf  # service time of the last look for a progress line that found none


def gpu_type_env(name: str) -> str:
    """A node's GPU type for a job's ``GPULOOM_GPU_TYPE``: the product (``v100`` for ``Tesla V100-SXM2-16GB``),
    letters, digits, ``.``, ``_`` and ``-`` only (a node's name for its GPUs is not the job's to trust)."""
    return re.sub(r"[^a-z0-9._-]", "", normalise_gpu_type(name))[:64]


class Profiler(Protocol):
    """What a launch asks of profiling (:class:`.profile_manager.ProfilingManager`)."""

    def needs_profile(self, row: JobRow) -> bool: ...
    def profile(self, job: Job, alloc: Allocation) -> bool: ...


class Actuator:
    def __init__(self, mirror: Mirror, cluster: Cluster, executor: Executor, state_dir: Path, grace_s: float,
                 launch_timeout_s: float, identities: Identities | None = None, job_dir: Path | None = None,
                 log_dir: Path | None = None) -> None:
        self.mirror = mirror
        self.cluster = cluster
        self.executor = executor
        self.grace_s = grace_s
        self.launch_timeout_s = launch_timeout_s
        self.identities = identities if identities is not None else Identities(switch=False)
        self.log_dir = private_dir(log_dir if log_dir is not None else state_dir / "logs")
        self._log_dir = str(self.log_dir)
        self.ckpt_dir = job_dir if job_dir is not None else state_dir / "checkpoints"
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.cores = CoreAllocator({n.name: n.cpus for n in cluster.nodes})
        self.running: dict[str, Running] = {}
        self.exec_owner: dict[str, str] = {}  # executor id -> job id
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpuloom-stop")
        self.profiler: Profiler | None = None
        self.profiled = False  # a job got a profile in this round: later starts wait for the next
        self.refused = False  # the store refused a launch's record in this round: later starts wait too
        self.prepared: dict[str, str] = {}  # job id -> the stop state prepare_stops stored for this round
        self.on_change: Callable[[], None] = lambda: None

    # -- logs and progress ------------------------------------------------------------------
    def log_path(self, jid: str | int) -> Path:
        return self.log_dir / f"{jid}.log"

    def log_size(self, jid: str) -> int:
        """Bytes the job has written to its log (a logical offset: cuts do not move it, :mod:`..exec.joblogs`)."""
        return joblogs.logical_size(self.log_path(jid)) or 0

    def last_progress(self, jid: str | int) -> int | None:
        """The iteration count of the job's last ``GPULOOM_PROGRESS`` line (last 8 KiB of its log)."""
        tail = joblogs.tail(self.log_path(jid), 8192).decode(errors="replace")
        for line in reversed(tail.splitlines()):
            try:
                p = parse_progress(line)
            except ProgressError:
                continue
            if p is not None:
                return p.iter
        return None

    def progress_since(self, run: Running, jid: str, now: float) -> float | None:
        """When (service time) the first progress line since ``run.log_offset`` was printed, or None if
        there is none yet (the offset, logical, advances as it reads).

        Its ``t=`` is the job's wall time: its age is how far the wall clock is past it now, kept after
        the last look that found no line (and at most now), so a wall-clock step between the two moves
        it no further than that.  A line without ``t=`` was printed now, as far as anyone knows."""
        chunk, after = joblogs.read(self.log_path(jid), run.log_offset, 1 << 16)
        at = chunk.find(PROGRESS_MARK)
        if at < 0:
            # the next read starts a marker's length back: a marker split between reads is found whole
            run.log_offset = max(run.log_offset, after - len(PROGRESS_MARK))
            run.looked = now
            return None
        end = chunk.find(b"\n", at)
        try:
            p = parse_progress(chunk[at:end].decode(errors="replace")) if end >= 0 else None
        except ProgressError:
            p = None
        if p is None or p.t is None:
            return now
        return min(now, max(run.looked, now - (self.mirror.clock.time() - p.t)))

    def cap_logs(self, cap: int, why: str = "", most: int | None = None, jids: Sequence[str] | None = None) -> int:
        """Cut the running jobs' logs (or those of ``jids``) over ``cap`` bytes (0: none), largest first,
        ``most`` of them at most (:func:`..exec.joblogs.cut`); the jobs keep running.  How many were cut."""
        if cap <= 0:
            return 0
        over = []
        for jid in self.running if jids is None else jids:
            run = self.running.get(jid)
            for path in self.logs_of(jid, len(run.procs) if run is not None else 1):
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue
                if size > cap:
                    over.append((size, jid, path))
        over.sort(reverse=True)
        done = 0
        for size, jid, path in over[:most]:
            try:
                n = joblogs.cut(path, cap, why)
            except OSError as e:
                log.warning("job %s: cannot cut its log %s (%d bytes): %s", jid, path, size, e)
                continue
            if n:
                done += 1
                log.info("job %s: log over its cap of %d bytes%s: %d bytes cut", jid, cap, why, n)
        return done

    def logs_of(self, jid: str, parts: int) -> list[str]:
        """The job's log files: its log, and those of its other nodes' processes where they write their own."""
        main = os.path.join(self._log_dir, f"{jid}.log")
        return [main, *(f"{main}.{r}" for r in range(1, parts))]

    # -- the driver's backend ---------------------------------------------------------------
    def stop(self, driver: Driver, steps: Sequence[Step], now: float) -> None:
        """Stop halves of a round, in parallel (see the module notes)."""
        rest: dict[str, tuple[JobState, ...]] = {}
        for st in steps:
            jid = st.job.id
            lc = st.job.lifecycle
            assert lc is not None and st.stop is not None
            # SIGTERM is sent in CHECKPOINTING (or STOPPING, for a job still launching); the rest
            # of the steps follow once the processes exited
            k = next((i + 1 for i, s in enumerate(st.stop) if s in (S.CHECKPOINTING, S.STOPPING)), 0)
            lc.walk(st.stop[:k], now)
            rest[jid] = st.stop[k:]
            if k and self.prepared.pop(jid, None) != lc.state.value:  # (stored by prepare_stops, normally)
                self.mirror.write(jid, {"state": lc.state.value}, lc.state.value, {})
        self._terminate(list(rest))
        t = self.mirror.now()
        for st in steps:
            job, jid = st.job, st.job.id
            run = self.running.pop(jid, None)
            lc = job.lifecycle
            assert lc is not None
            lc.walk(rest[jid], t)
            row = self.mirror.rows[jid]
            old = st.action.old
            if run is not None:
                self.release(jid, run)
                held = row.held_time + max(0.0, t - run.start)
                row.held_gpu_time += (held - row.held_time) * (old.num_gpus if old is not None else 0)
                row.held_time = held
            row.preemptions += 1
            job.busy_until = math.inf
            self.mirror.record(
                jid,
                {"state": S.STANDBY.value, "alloc": None, "procs": None, "held_time": row.held_time,
                 "held_gpu_time": row.held_gpu_time, "preemptions": row.preemptions,
                 "reason": "preempted" if st.kind is ActionKind.STOP else f"{st.kind.value}: relaunching",
                 "progress": self.last_progress(jid), **self.mirror.work(job)},
                "preempt" if st.kind is ActionKind.STOP else "stop-for-" + st.kind.value,
                {},
            )

    def prepare_stops(self, driver: Driver, actions: Sequence[Action], now: float) -> None:
        """Store the state in which each job a round stops gets its SIGTERM (CHECKPOINTING, or STOPPING
        for one still launching), all in one transaction, before the driver applies the round: a store
        that refuses it raises here, and the round is not applied at all.  Once stored, a stop survives
        a crash (recovery finishes it); its end is recorded like an exit, when the store takes it."""
        self.prepared = {}
        changes: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = []
        for act in actions:
            if act.kind is ActionKind.START or act.kind is ActionKind.REGROUP:
                continue
            stop, _ = lifecycle_steps(driver.jobs[act.job_id], act.kind, now)
            at = next((s for s in stop or () if s in (S.CHECKPOINTING, S.STOPPING)), None)
            if at is not None:
                changes.append((act.job_id, {"state": at.value}, at.value, {}))
        self.mirror.write_many(changes)
        self.prepared = {jid: f["state"] for jid, f, _, _ in changes}

    def launch(self, driver: Driver, step: Step, now: float) -> bool:
        job, alloc, kind = step.job, step.action.new, step.kind
        assert alloc is not None
        jid = job.id
        row = self.mirror.rows[jid]
        if self.refused:
            return False  # the store refused a launch of this round: the others wait for the next
        if kind is ActionKind.START:
            if self.profiled:
                return False  # a new profile changes sizes: the next round re-plans the starts left
            try:
                if self.profiler is not None and self.profiler.needs_profile(row) and self.profiler.profile(job, alloc):
                    self.profiled = True
                    return False  # profiled: queued again, the next round sizes it with its profile
            except Exception as e:
                if not unavailable(e):
                    raise
                log.warning("job %s: not launched this round: its profile cannot be stored: %s", jid, e)
                self.refused = True
                return False
        spec = row.spec
        resume = row.attempts > 0
        multi = len(alloc.parts) > 1
        procs: dict[str, ProcInfo] = {}
        cores: dict[str, tuple[int, ...]] = {}
        ckpt = spec.get("checkpoint_dir") or str(self.ckpt_dir / jid)
        try:
            user = self.identities.os_user(row.user)
            if not spec.get("checkpoint_dir"):  # ours: made for the job's account (a given one, by the job)
                owned_dir(ckpt, None if user is None else self.identities.account_named(user))
            env_common = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
            env_common.update(
                {
                    "GPULOOM_JOB_ID": jid,
                    "GPULOOM_JOB_NAME": row.name,
                    "GPULOOM_CHECKPOINT_DIR": ckpt,
                    "GPULOOM_ATTEMPT": str(row.attempts + 1),
                    "GPULOOM_NUM_GPUS": str(alloc.num_gpus),
                    "GPULOOM_NUM_NODES": str(len(alloc.parts)),
                }
            )
            if resume:
                env_common["GPULOOM_RESUME"] = "1"
            if row.array_id is not None:  # Slurm's SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID
                env_common["GPULOOM_ARRAY_JOB_ID"] = str(row.array_id)
                env_common["GPULOOM_ARRAY_TASK_ID"] = str(row.array_task)
            log_offset = self.log_size(jid)
            launches = []
            if multi:  # torchrun / torch.distributed: rank 0's node hosts the rendezvous (:mod:`..exec.gang`)
                addr, port = self.executor.rendezvous(self.cluster.nodes[alloc.parts[0].node].name)
            for rank, p in enumerate(alloc.parts):
                node = self.cluster.nodes[p.node].name
                eid = f"{jid}.{rank}" if multi else jid
                c = self.cores.take(node, eid, p.cpus)
                cores[node] = c
                self.exec_owner[eid] = jid
                env = dict(env_common, GPULOOM_NODE_RANK=str(rank), GPULOOM_GPU_TYPE=gpu_type_env(
                    self.cluster.nodes[p.node].gpu_type))
                if multi:
                    env.update(gang_env(rank, [len(q.gpus) for q in alloc.parts], addr, port))
                launches.append(LaunchSpec(eid, str(spec["command"]), node,
                                           tuple(self.cluster.local_index(g) for g in p.gpus), c, int(p.mem_mb),
                                           str(self.log_path(jid)), env, spec.get("workdir"), user,
                                           row.attempts + 1))
            # intent: recorded before any process exists, so a restart finds what it may have left
            # (the attempt counts: a relaunch resumes from whatever the lost process checkpointed; the
            # executor marks its records with it, so a restart tells this launch's from an earlier one's)
            self.mirror.write(jid, {"procs": [{"job_id": ls.job_id, "node": ls.node, "pending": True}
                                              for ls in launches], "attempts": row.attempts + 1,
                                    "checkpoint_dir": ckpt}, "launch-intent", {})
            for ls in launches:
                procs[ls.job_id] = self.executor.launch(ls)
        except Exception as e:
            node_busy = isinstance(e, NodeUnavailable)
            refused = unavailable(e)  # its intent could not be recorded: nothing was launched
            log.warning("job %s: %s: %s", jid, "not launched this round" if node_busy or refused else "launch failed",
                        e)
            self._abandon(jid, len(alloc.parts), procs)
            if refused:
                self.refused = True
                return False
            if node_busy:  # stays queued: a later round places it again (the intent's attempt counts)
                row.attempts += 1
                self.mirror.record(jid, {"procs": None, "attempts": row.attempts}, "launch-deferred", {"why": str(e)})
                return False
            raise LaunchFailed(f"launch failed: {e}") from None
        wall = self.mirror.clock.time()  # for people: first_start, last_start
        started = self.mirror.now()
        attempts = row.attempts + 1
        resumes = row.resume_count + (1 if resume else 0)
        first = row.first_start if row.first_start is not None else wall
        alloc_json = alloc_to_json(alloc, self.cluster, cores)
        fields = {"state": S.LAUNCHING.value, "alloc": alloc_json,
                  "procs": [proc_to_json(p, cores[p.node]) for p in procs.values()],
                  "attempts": attempts, "resume_count": resumes, "first_start": first,
                  "last_start": wall, "last_start_at": started, "checkpoint_dir": ckpt, "reason": None,
                  **self.mirror.work(job)}
        event = "launch" if kind is ActionKind.START else kind.value
        detail = {"resume": resume, "pids": [p.pid for p in procs.values()], "alloc": alloc_json}
        try:
            self.mirror.write(jid, fields, event, detail)
        except Exception as e:
            # not confirmed: undone (its processes stopped), never left running unknown to the store.  But
            # a process that has already ended on its own while the store refused ran the job (to its end,
            # perhaps): undone and queued, it would run again.  Such a launch stands, its confirmation
            # recorded when the store takes it, its exits reported like any other's.  A crash before the
            # store takes them leaves the intent alone: the local executor's run records, marked with the
            # attempt, say that this launch ran and how it ended (a stop removes its pid record), and
            # recovery ends the job as they say (:func:`.recovery.recover`).
            later = unavailable(e)
            self.refused = self.refused or later
            ran = later and self._ended_any(procs)
            log.warning("job %s: %s: %s", jid, "ran meanwhile, its launch recorded later" if ran
                        else "not launched this round", e)
            if ran:
                self.mirror.record(jid, fields, event, detail)
            else:
                self._abandon(jid, len(alloc.parts), procs)
                row.attempts = attempts  # (the stored intent counts it, as for a node that refused it)
                if not later:
                    raise LaunchFailed(f"its launch could not be recorded: {e}") from None
                return False
        self.running[jid] = Running(procs, {}, cores, started, log_offset)
        lc = job.lifecycle
        assert lc is not None
        lc.walk([s for s in step.start if s is not S.RUNNING_PROTECTED], now)  # promoted on its first progress
        job.busy_until = math.inf
        row.attempts, row.resume_count, row.first_start = attempts, resumes, first
        return True

    def _ended_any(self, procs: Mapping[str, ProcInfo]) -> bool:
        """Whether one of a launch's processes has already ended (unknown counts as running)."""
        for eid in procs:
            try:
                if not self.executor.alive(eid):
                    return True
            except Exception as e:
                log.warning("cannot tell whether %s still runs: %s", eid, e)
        return False

    def _abandon(self, jid: str, parts: int, procs: Mapping[str, ProcInfo]) -> None:
        """Undo a launch: stop what it started, give back its cores."""
        for eid in procs:
            self.stop_quietly(eid)
        for eid in [f"{jid}.{r}" for r in range(parts)] + [jid]:
            for n in self.cluster.nodes:
                if eid in self.cores.used[n.name]:
                    self.cores.release(n.name, eid)
            self.exec_owner.pop(eid, None)

    def regrouped(self, driver: Driver, job: Job, now: float) -> None:
        run = self.running.get(job.id)
        if job.alloc is None:
            return
        self.mirror.record(job.id, {"alloc": alloc_to_json(job.alloc, self.cluster, run.cores if run else None),
                                    **self.mirror.work(job)}, "regroup", {"group": list(job.alloc.group)})

    def progressed(self, driver: Driver, job: Job, now: float) -> None:
        pass  # the service learns of completions from the executor, not from predictions

    # -- observe ----------------------------------------------------------------------------
    def promote(self, jobs: Mapping[str, Job], now: float) -> None:
        """LAUNCHING -> RUNNING_PROTECTED once the job prints its first progress line after this
        launch (or after ``launch_timeout_s`` for jobs that print none, dated at the process start:
        its recorded launch takes no time); RUNNING_PROTECTED -> RUNNING when protection expires.

        The promotion is dated when the line was printed (its ``t=``, kept between the launch and
        now, :meth:`progress_since`), not when a round noticed it: between rounds (seconds apart) the
        job was already working, and its remaining work, its launch time and its protection say so.
        Every duration here is service time (monotonic)."""
        for jid, run in self.running.items():
            job = jobs[jid]
            lc = job.lifecycle
            assert lc is not None
            if lc.state is S.LAUNCHING:
                printed = self.progress_since(run, jid, now)
                if printed is None and now - run.start >= self.launch_timeout_s:
                    printed = run.start  # no progress line: it was running from its process start
                if printed is not None:
                    ready = min(now, max(lc.since, printed))
                    job.busy_until = ready  # working from the line on: advance() credits now - ready
                    job.advance(now)
                    lc.to(S.RUNNING_PROTECTED, ready)
                    self.mirror.record(jid, {"state": lc.state.value, **self.mirror.work(job)}, lc.state.value,
                                       {"launch_s": lc.last_launch_time})
            if lc.state is S.RUNNING_PROTECTED and lc.refresh(now) is S.RUNNING:
                self.mirror.record(jid, {"state": S.RUNNING.value}, S.RUNNING.value, {})

    def reap(self) -> list[tuple[str, JobState, int | None, str | None]]:
        """Jobs whose processes ended since the last poll: (job id, end state, exit code, reason).

        A part that exits non-zero fails the whole job (its other parts are stopped)."""
        ended: list[tuple[str, JobState, int | None, str | None]] = []
        for eid, code in self.executor.poll().items():
            jid = self.exec_owner.get(eid)
            if jid is None or jid not in self.running:
                continue
            run = self.running[jid]
            if eid not in run.procs or eid in run.exited:
                continue
            run.exited[eid] = -1 if code is None else code
            if code != 0:
                for e in [e for e in run.procs if e not in run.exited]:
                    self.stop_quietly(e)
                    run.exited[e] = -1
                what = "with an unknown exit code" if code is None else f"with code {code}"
                why = self.end_reason(eid)
                ended.append((jid, S.FAILED, code, f"process {eid} ended {what}" + (f": {why}" if why else "")))
            elif len(run.exited) == len(run.procs):
                ended.append((jid, S.FINISHED, 0, None))
        return ended

    def terminate(self, jids: Sequence[str]) -> None:
        """Stop the jobs' processes (in parallel); the caller ends the jobs (cancel, time limit)."""
        self._terminate([j for j in jids if j in self.running])

    def _terminate(self, jids: Sequence[str]) -> None:
        futs = []
        for jid in jids:
            run = self.running.get(jid)
            if run is None:
                continue
            for eid in run.procs:
                if eid not in run.exited:
                    futs.append((jid, eid, self.pool.submit(self.executor.stop, eid, self.grace_s)))
        for jid, eid, f in futs:
            try:
                code = f.result()
            except Exception as e:  # executor failure: the process is gone or unreachable
                log.warning("job %s: stopping %s failed: %s", jid, eid, e)
                code = None
            self.running[jid].exited[eid] = -1 if code is None else code
            self.mirror.event(jid, "stopped", {"exec_id": eid, "exit_code": code})

    def release(self, jid: str, run: Running) -> None:
        for eid, p in run.procs.items():
            self.cores.release(p.node, eid)
            self.exec_owner.pop(eid, None)

    def end(self, jid: str) -> tuple[Running | None, float]:
        """Forget a job's processes; (its run, seconds held in it)."""
        run = self.running.pop(jid, None)
        if run is None:
            return None, 0.0
        self.release(jid, run)
        return run, max(0.0, self.mirror.now() - run.start)

    # -- executor calls that must not raise -------------------------------------------------
    def stop_quietly(self, eid: str) -> int | None:
        try:
            return self.executor.stop(eid, self.grace_s)
        except Exception as e:
            log.warning("stopping %s failed: %s", eid, e)
            return None

    def adopt(self, p: ProcInfo) -> bool:
        try:
            return bool(self.executor.adopt(p))
        except Exception as e:  # e.g. the node is no longer served by this executor
            log.warning("job %s: cannot adopt pid %s on %s: %s", p.job_id, p.pid, p.node, e)
            return False

    def exit_code(self, p: ProcInfo) -> int | None:
        try:
            return self.executor.exit_code(p)
        except Exception:
            return None

    def stopped(self, p: ProcInfo) -> bool:
        try:
            return bool(self.executor.stopped(p))
        except Exception:
            return False

    def launched(self, eid: str, node: str, attempt: int, row_user: str) -> ProcInfo | None:
        try:  # (as the launch ran: the job's user's OS account, or the service's own)
            return self.executor.launched(eid, node, attempt, self.identities.os_user(row_user))
        except Exception as e:
            log.warning("cannot look for the process of launch %d of %s: %s", attempt, eid, e)
            return None

    def exit_time(self, p: ProcInfo) -> float | None:
        try:
            return self.executor.exit_time(p)
        except Exception:
            return None

    def end_reason(self, eid: str) -> str | None:
        try:
            return self.executor.end_reason(eid)
        except Exception:
            return None

    def close(self) -> None:
        self.pool.shutdown(wait=True)

