"""Simulation sweeps on a Ray cluster: each run is one Ray task.

``gpuloom compare --ray auto|ADDRESS`` (and any sweep that calls
:func:`~gpuloom.sim.runconfig.run_many` or :func:`~gpuloom.sim.runconfig.run_seeds`
with ``ray=True``) runs here instead of the local process pool.  The cluster and
each workload (and a queue tree every run is measured against) go into Ray's
object store once (``ray.put``) and the tasks read
them from there; each task sends only its :class:`~gpuloom.sim.runconfig.RunConfig`
and returns its :class:`~gpuloom.sim.metrics.RunResult`.  A run is
deterministic for its seed, so the results are the same as the process pool's,
whichever node ran which configuration (``tests/test_ray.py`` compares the
files ``compare`` writes).

Every node must import the same gpuloom (installed on each node, or shipped
with a Ray ``runtime_env``).  Progress is reported when a run ends.  The caller
connects to Ray first (``ray.init``); each task asks for one CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..core.queues import QueueTree
from .metrics import RunResult
from .runconfig import ConfigError, ModelBuilder, OnProgress, RunConfig, RunProgress, run_config


def _work(cluster: Cluster, specs: Sequence[JobSpec], model_builder: ModelBuilder | None, rc: RunConfig,
          queues: QueueTree | None = None) -> RunResult:
    return run_config(rc, cluster, specs, model_builder, None, None, queues)


def execute_on_ray(
    tasks: Sequence[tuple[str, int, RunConfig, Any]],
    cluster: Cluster,
    workloads: Mapping[Any, Sequence[JobSpec]],
    on_progress: OnProgress | None = None,
    model_builder: ModelBuilder | None = None,
    poll: Callable[[], None] | None = None,
    queues: QueueTree | None = None,
) -> list[RunResult]:
    """Run ``(label, seed, config, workload key)`` tasks as Ray tasks; results in task order
    (``queues``: the tree every run is measured against, as for the process pool)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'gpuloom[ray]'") from None
    if not ray.is_initialized():
        raise ConfigError("not connected to a Ray cluster (ray.init)")
    remote: Any = ray.remote(num_cpus=1, max_retries=2)(_work)
    cl_ref, mb_ref, q_ref = ray.put(cluster), ray.put(model_builder), ray.put(queues)
    wl_refs = {k: ray.put(list(v)) for k, v in workloads.items()}
    refs = {remote.remote(cl_ref, wl_refs[wkey], mb_ref, rc, q_ref): i for i, (_, _, rc, wkey) in enumerate(tasks)}
    results: dict[int, RunResult] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        for ref in done:
            i = refs[ref]
            r = results[i] = ray.get(ref)
            if on_progress is not None:
                label, seed, _, _ = tasks[i]
                on_progress(RunProgress(label, seed, len(r.finished), len(r.jobs), r.end_time, True))
        if poll is not None:
            poll()
    return [results[i] for i in range(len(tasks))]
