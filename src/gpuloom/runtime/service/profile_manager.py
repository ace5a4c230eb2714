"""Profiling in the service: which jobs are profiled, when, and on what.

* a job is profiled before its first launch when it wants a profile (a
  ``model``, or ``profile: true``; :func:`.profiles.wants_profile`) and neither
  the store (``profiles`` table, key ``<model>/<gpus>gpu``) nor the throughput
  model's catalogue (``--profiles``) has one for its model and GPU count;
* profiling is the first part of the job's first ``start``: on the GPUs the
  plan gave it, with every core of its node that no running job holds (taken
  in the core allocator meanwhile) and memory up to the node's free memory,
  :func:`~gpuloom.perf.profiler.optimistic_profile` drives a
  :class:`~.profiling.RealProfiler` (short runs of the job's command measured
  from its ``GPULOOM_PROGRESS`` lines).  It runs synchronously in the round,
  after the round's stops and before its other launches, so nothing else can
  be given those GPUs or cores: no double booking, no lifecycle state of its
  own (the job stays ``waiting_for_initial_resource``; events
  ``profile-start``/``profiled``/``unprofilable`` record it).  The price is a
  round that lasts as long as the profiling (about ``points x (startup +
  warmup + window)``, 5 points for a 4-core node); the API keeps answering;
* the outcome is stored (demand, measured points, estimated matrix), every
  queued job of the model gets the profile as its ``JobSpec.profile`` (what
  :class:`~gpuloom.perf.sensitivity.SensitivityFactor` and the Synergy sizers
  read), the round's remaining starts are left to the next round, which sizes
  the job with its demand and launches it for real;
* a job that prints no progress line within the timeout (or exits without
  one) is recorded ``unprofilable`` and launched at once on the plan's
  (GPU-proportional) allocation; its model is not profiled again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...core.job import Job
from ...core.plan import Allocation
from ...perf.profiler import ProfileError, optimistic_profile
from ...perf.sensitivity import DEFAULT_THRESHOLD, SensitivityError, SensitivityFactor, SensitivityProfile
from ..exec.identity import owned_dir, private_dir
from ..state.store import JobRow
from .profiles import OK, profile_from_record, profile_key, record_from_result, unprofilable_record, wants_profile
from .profiling import NoProgress, RealProfiler

if TYPE_CHECKING:
    from ...core.cluster import Cluster
    from ...driver import Driver
    from ...perf.model import ThroughputModel
    from ..exec.clock import Clock
    from ..exec.executor import Executor
    from ..state.store import Store
    from .actuator import Actuator
    from .mirror import Mirror

log = logging.getLogger("gpuloom.service")


@dataclass(frozen=True, slots=True)
class ProfilingConfig:
    """How the service profiles new jobs (see :mod:`.profiles` and "Profiling" in the module notes).

    ``warmup_s``/``window_s``: job time skipped after the first progress line, then
    measured, per point; ``timeout_s``: a run with no progress line by then makes
    the job unprofilable; ``mem_points``: memory points (equal steps up to the
    node's free memory); ``threshold``: the optimistic profiler's (and Synergy's)
    10 % rule; ``grace_s``: how long a profile run gets to exit on SIGTERM.
    """

    warmup_s: float = 2.0
    window_s: float = 5.0
    timeout_s: float = 60.0
    threshold: float = DEFAULT_THRESHOLD
    mem_points: int = 4
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("warmup_s", "grace_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"profiling {name} must be >= 0, got {getattr(self, name)}")
        for name in ("window_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"profiling {name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.threshold < 10:
            raise ValueError(f"profiling threshold must be in [0, 10), got {self.threshold}")
        if self.mem_points < 1:
            raise ValueError(f"profiling mem_points must be >= 1, got {self.mem_points}")


class ProfilingHost(Protocol):
    """What profiling uses of the service: its parts for the job's node, and a wake-up when done."""

    @property
    def store(self) -> Store: ...
    @property
    def model(self) -> ThroughputModel: ...
    @property
    def mirror(self) -> Mirror: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def actuator(self) -> Actuator: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def clock(self) -> Clock: ...
    def wake(self) -> None: ...


class ProfilingManager:
    """Profiles jobs for the service (see the module notes)."""

    def __init__(self, service: ProfilingHost, config: ProfilingConfig) -> None:
        self.svc = service
        self.config = config
        self._profiles: dict[str, SensitivityProfile | None] = {}  # profile key -> profile (None: unprofilable)

    def stored_profile(self, spec: Mapping[str, Any]) -> SensitivityProfile | None:
        """The stored profile of a job's model (cached), when profiling is on and the job wants one."""
        if not wants_profile(spec):
            return None
        key = profile_key(spec)
        if key not in self._profiles:
            rec = self.svc.store.get_profile(key)
            if rec is None:
                return None
            try:
                self._profiles[key] = profile_from_record(key, rec)
            except SensitivityError as e:
                log.warning("%s: it will be profiled again", e)
                return None
        return self._profiles[key]

    def needs_profile(self, row: JobRow) -> bool:
        """A first launch of a job that wants a profile its model does not have yet (store or catalogue)."""
        if row.attempts > 0 or not wants_profile(row.spec):
            return False
        key = profile_key(row.spec)
        if key in self._profiles or self.stored_profile(row.spec) is not None:
            return False
        f = self.svc.model.get("sensitivity")
        model, g = row.spec.get("model"), int(row.spec["gpus"])
        if model and isinstance(f, SensitivityFactor):
            p = f.catalogue.get(str(model), g)
            if p is not None and p.gpus == g:  # --profiles already has a measured matrix
                return False
        return True

    def profile(self, job: Job, alloc: Allocation) -> bool:
        """Profile a job on the GPUs its plan gave it, before its first real launch.

        Runs synchronously inside the round (see the module notes): the job's GPUs
        are its plan's, its cores every core of its node no running job holds
        (taken in the core allocator for the duration), its memory points equal
        steps up to the node's memory no running job holds.  Stores the outcome
        under the model's key and returns True when the job got a profile (it
        stays queued and the next round sizes it with the profile), False when it
        should launch now on ``alloc`` (unprofilable, or profiling impossible).
        """
        cfg = self.config
        svc = self.svc
        jid = job.id
        row = svc.mirror.rows[jid]
        spec = row.spec
        key = profile_key(spec)
        if len(alloc.parts) != 1:  # the profiler measures one process
            log.info("job %s: spans %d nodes, not profiled", jid, len(alloc.parts))
            self._profiles[key] = None  # for this service run only
            svc.mirror.event(jid, "profile-skip", {"why": "spans nodes"})
            return False
        part = alloc.parts[0]
        node = svc.cluster.nodes[part.node]
        cores_alloc = svc.actuator.cores
        rid = f"{jid}.profile"
        cores = cores_alloc.take(node.name, rid, len(cores_alloc.free(node.name)))
        used_mem = sum(p.mem_mb for o, a in svc.driver.current.items() if o != jid for p in a.parts if p.node == part.node)
        mem_cap = max(int(part.mem_mb), node.mem_mb - used_mem, 1)
        n = cfg.mem_points
        mem_points = sorted({max(1, mem_cap * k // n) for k in range(1, n + 1)})
        cpu_points = list(range(1, len(cores) + 1))
        g = alloc.num_gpus
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        env.update({"GPULOOM_JOB_NAME": row.name, "GPULOOM_NUM_GPUS": str(g), "GPULOOM_NUM_NODES": "1",
                    "GPULOOM_NODE_RANK": "0"})
        ids = svc.actuator.identities
        user = ids.os_user(row.user)
        acc = None if user is None else ids.account_named(user)
        scratch = private_dir(svc.actuator.ckpt_dir / ".profile", 0o711)  # each run's dir: the job's account's
        prof = RealProfiler(
            svc.executor, jid, str(spec["command"]), node.name,
            tuple(svc.cluster.local_index(x) for x in part.gpus), cores, svc.actuator.log_dir / "profile", env,
            spec.get("workdir"), warmup_s=cfg.warmup_s, window_s=cfg.window_s, startup_timeout_s=cfg.timeout_s,
            grace_s=min(svc.actuator.grace_s, cfg.grace_s), user=user, scratch_dir=scratch,
            make_scratch=lambda p: owned_dir(p, acc),
        )
        where = {"key": key, "node": node.name, "gpus": list(part.gpus), "cpu_points": cpu_points,
                 "mem_points": mem_points}
        svc.mirror.event(jid, "profile-start", where)
        log.info("job %s: profiling %s on %s (%d cores, up to %d MB)", jid, key, node.name, len(cores), mem_cap)
        t0 = svc.clock.monotonic()
        try:
            res = optimistic_profile(prof, cpu_points, mem_points, cfg.threshold, gpus=g, model=key)
            rec = record_from_result(res)
        except (NoProgress, ProfileError) as e:
            rec = unprofilable_record(g, str(e))
        except Exception as e:  # executor trouble: not the job's fault, nothing stored
            log.exception("job %s: profiling failed", jid)
            self._profiles[key] = None
            svc.mirror.event(jid, "profile-failed", {"error": str(e)})
            return False
        finally:
            cores_alloc.release(node.name, rid)
        wall = svc.clock.monotonic() - t0
        rec.update(node=node.name, window_s=cfg.window_s, warmup_s=cfg.warmup_s, wall_s=round(wall, 3),
                   runs=len(prof.runs), job=int(jid))
        svc.store.put_profile(key, rec)
        p = profile_from_record(key, rec)
        self._profiles[key] = p
        detail: dict[str, Any] = {k: rec[k] for k in ("status", "wall_s", "runs") if k in rec}
        if p is None:
            detail["reason"] = rec["reason"]
            log.warning("job %s: %s; it runs with GPU-proportional resources", jid, rec["reason"])
        else:
            detail.update({k: rec[k] for k in ("cpus", "mem_mb", "points_measured", "grid_size")})
            for oid, other in svc.driver.jobs.items():  # every queued job of the model gets it
                ospec = svc.mirror.rows[oid].spec
                if wants_profile(ospec) and profile_key(ospec) == key:
                    other.spec = dataclasses.replace(other.spec, profile=p)
        svc.mirror.event(jid, "profiled" if rec["status"] == OK else "unprofilable", detail)
        svc.wake()
        return p is not None

