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

#: Options read by :func:`build_model` rather than by a policy.  ``-P name=value``
#: with one of these names configures the throughput model.
MODEL_OPTIONS = frozenset({"profiles", "variability", "variability_seed", "variability_dir", "topology",
                           "per_model_penalty", "interleave_overhead", "interleave_threshold",
                           "locality_rule", "interleave_stages", "storage_mbps"})


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(policy parameters, model options) from one ``-P`` mapping."""
    policy = {k: v for k, v in params.items() if k not in MODEL_OPTIONS}
    model = {k: v for k, v in params.items() if k in MODEL_OPTIONS}
    return policy, model


def build_model(
    cluster: Cluster,
    specs: Sequence[JobSpec] = (),
    locality_penalty: float = DEFAULT_LOCALITY_PENALTY,
    options: Mapping[str, Any] | None = None,
) -> ThroughputModel:
    options = dict(options or {})
    # -P locality_rule=excess (default: pay only for nodes beyond the fewest needed) | any (PAL's artifact)
    model = ThroughputModel.default(cluster, locality_penalty, options.get("per_model_penalty"),
                                    str(options.get("locality_rule", "excess")))
    # scaling curves f(N): speed 1 at a job's requested GPU count, so only sizers that
    # change GPU counts (elastic, static) see them; jobs without a curve stay rigid
    model.add(ScalingFactor())
    # Muri: speed of jobs sharing GPUs in a group (1.0 alone, so free for runs without groups);
    # -P interleave_overhead=muri (default: Muri's measured sharing slowdown)|none|F|F2,F3,F4,
    # -P interleave_threshold=0.02 and -P interleave_stages=4 (storage, CPU, GPU, network) | 3 configure it
    from ..perf.interleave import DEFAULT_RESOURCES, DEFAULT_THRESHOLD, InterleaveFactor, parse_overhead

    model.add(InterleaveFactor(threshold=float(options.get("interleave_threshold", DEFAULT_THRESHOLD)),
                               overhead=parse_overhead(options.get("interleave_overhead", "muri")),
                               resources=int(options.get("interleave_stages", DEFAULT_RESOURCES))))
    if options.get("variability"):  # PAL PM-scores: a PerfVar CSV, or "generate[:DIR]"
        from ..perf.variability import add_variability, variability_from_spec

        seed = int(options.get("variability_seed", options.get("seed", 0)))
        add_variability(model, variability_from_spec(str(options["variability"]), cluster,
                                                     options.get("variability_dir"), seed))
    if options.get("topology"):  # YARN-8821: an `nvidia-smi topo -m` file for the nodes
        from ..perf.topology import add_topology, load_topology

        add_topology(model, load_topology(options["topology"]))
    # Synergy: CPU/memory sensitivity (-P profiles=model_sensitivity_profiles.csv), or the
    # profiles the trace reader already loaded (a Synergy trace names its profile file)
    profiles = options.get("profiles") or trace_profiles(specs)
    if profiles:
        from ..perf.sensitivity import add_sensitivity, load_catalogue

        add_sensitivity(model, load_catalogue(profiles))
    if options.get("storage_mbps"):  # Synergy's storage-bandwidth demands against each node's bandwidth
        from ..perf.storage import add_storage

        add_storage(model, float(options["storage_mbps"]), profiles)
    return model


def trace_profiles(specs: Sequence[JobSpec]) -> str | None:
    """The profile file the trace reader loaded for these jobs (Synergy traces), if exactly one."""
    files = {s.attrs.get("profiles_file") for s in specs if s.attrs and s.attrs.get("profiles_file")}
    return files.pop() if len(files) == 1 else None
