"""Simulation sweeps on a Ray cluster: each configuration is one Ray task.

``gpuloom compare --ray auto|ADDRESS`` (and any sweep that calls
:func:`~gpuloom.sim.runconfig.run_many` with ``ray=True``) runs here instead of
the local process pool.  The cluster and the job specs go into Ray's object
store once (``ray.put``) and every task reads them from there; each task sends
only its :class:`~gpuloom.sim.runconfig.RunConfig` and returns its
:class:`~gpuloom.sim.metrics.RunResult`.  A run is deterministic for its seed,
so the results are the same as the process pool's, whichever node ran which
configuration (``tests/test_ray.py`` compares the files ``compare`` writes).

Every node must be able to import the same gpuloom (installed on each node, or
shipped with a Ray ``runtime_env``).  Progress is reported per finished run.
The caller connects to Ray first (``ray.init``); each task asks for one CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec
from .metrics import RunResult
from .runconfig import ConfigError, ModelBuilder, Progress, RunConfig, run_config, unique_labels


def _work(cluster: Cluster, specs: Sequence[JobSpec], model_builder: ModelBuilder | None, rc: RunConfig) -> RunResult:
    return run_config(rc, cluster, specs, model_builder, None)


def run_many_ray(
    configs: Sequence[RunConfig],
    cluster: Cluster,
    specs: Sequence[JobSpec],
    progress: Progress | None = None,
    model_builder: ModelBuilder | None = None,
) -> dict[str, RunResult]:
    """:func:`~gpuloom.sim.runconfig.run_many` on Ray: results keyed by label, in input order."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'gpuloom[ray]'") from None
    if not ray.is_initialized():
        raise ConfigError("not connected to a Ray cluster (ray.init)")
    labels = unique_labels(configs)
    for rc in configs:
        rc.validate()
    if not configs:
        return {}
    task: Any = ray.remote(num_cpus=1, max_retries=2)(_work)
    cl_ref, specs_ref, mb_ref = ray.put(cluster), ray.put(list(specs)), ray.put(model_builder)
    refs = {task.remote(cl_ref, specs_ref, mb_ref, rc): lb for lb, rc in zip(labels, configs, strict=True)}
    results: dict[str, RunResult] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            r = results[refs[ref]] = ray.get(ref)
            if progress is not None:
                progress(refs[ref], len(r.finished), len(r.jobs))
    return {lb: results[lb] for lb in labels}
