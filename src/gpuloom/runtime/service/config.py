"""How a :class:`~.service.Service` runs: one dataclass instead of a long argument list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...core.cluster import Cluster
from ...perf.model import ThroughputModel
from ..exec import joblogs
from ..exec.clock import Clock
from ..exec.executor import InventorySource
from ..exec.identity import Identities
from ..state.specs import DEFAULT_DURATION
from .profile_manager import ProfilingConfig

#: a running job's log over this is cut (its first 1/8 and last 1/4 kept, :mod:`..exec.joblogs`); 0: no cap
DEFAULT_LOG_CAP = 256 << 20


@dataclass(frozen=True)
class ServiceConfig:
    """The service's settings, and the parts that replace its defaults (None: the default)."""

    state_dir: str | Path  # the database's directory (and the private state of the service)
    round_s: float = 5.0  # a round at least this often
    grace_s: float = 10.0  # SIGTERM -> SIGKILL for a stopped job
    default_duration: float = DEFAULT_DURATION  # a job's work estimate without a time limit (seconds)
    seed: int = 0  # the driver's random generator
    protect_factor: float = 3.0  # RUNNING_PROTECTED lasts this times the measured launch time
    launch_timeout_s: float = 60.0  # a launch without a progress line counts as running after this
    profiling: ProfilingConfig | None = None  # None: jobs are not profiled before their first launch
    job_dir: str | Path | None = None  # the jobs' own directories (:mod:`.security`)
    checkpoint_roots: Sequence[str | Path] | None = None  # where a job may name its checkpoint directory
    keep_finished_s: float | None = None  # finished jobs are deleted after this (None: kept)
    data_dir: str | Path | None = None  # logs/ and checkpoints/, shared with the nodes (default: state_dir)
    log_dir: str | Path | None = None  # jobs' logs (default: data_dir/logs)
    log_cap: int = DEFAULT_LOG_CAP  # bytes; 0: no cap
    model: ThroughputModel | None = None  # the model for the first cluster (default: model_factory's)
    model_factory: Callable[[Cluster], ThroughputModel] | None = None  # a model per cluster (default: simulate's)
    clock: Clock | None = None  # default: the system's clocks
    identities: Identities | None = None  # who runs a user's jobs (default: :class:`Identities`)
    inventory: InventorySource | None = None  # nodes that come and go; None: a fixed cluster

    def __post_init__(self) -> None:
        if not self.round_s > 0:
            raise ValueError(f"round length must be > 0, got {self.round_s}")
        if self.log_cap != 0 and not self.log_cap >= joblogs.MIN_CAP:
            raise ValueError(f"log cap must be 0 (none) or at least {joblogs.MIN_CAP} bytes, got {self.log_cap}")
