"""Assemble a run from names and options: the throughput model's factors.

``build_model`` is where each capability switches its factor on, so the CLI,
``compare`` workers and the service build identical models from the same
options.  Options that a factor needs (files, seeds) travel in ``options``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec
from ..perf.model import DEFAULT_LOCALITY_PENALTY, ThroughputModel
from ..perf.scaling import ScalingFactor


def build_model(
    cluster: Cluster,
    specs: Sequence[JobSpec] = (),
    locality_penalty: float = DEFAULT_LOCALITY_PENALTY,
    options: Mapping[str, Any] | None = None,
) -> ThroughputModel:
    options = dict(options or {})
    model = ThroughputModel.default(cluster, locality_penalty, options.get("per_model_penalty"))
    # scaling curves f(N): speed 1 at a job's requested GPU count, so only sizers that
    # change GPU counts (elastic, static) see them; jobs without a curve stay rigid
    model.add(ScalingFactor())
    return model
