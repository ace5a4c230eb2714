"""Assemble a throughput model from options, driven by declarations of the factors.

Each factor is declared once, as a :class:`FactorDecl`: its name, the options
it reads (:class:`ModelOption`: name, type, default, help, and whether it is a
command-line flag or only a ``-P name=value`` option), and how to build it.
Everything else follows from the declarations:

* :func:`build_model` builds the model for any options, the same way for the
  simulator (``simulate``, ``compare`` and their worker processes) and the
  service (``serve``);
* :data:`MODEL_OPTIONS` tells a ``-P`` model option from a policy parameter;
* the CLI adds one flag per ``flag=True`` option to every command that runs
  the model (:mod:`gpuloom.cli.common`), so a new factor's options reach
  ``simulate``, ``compare`` and ``serve`` from its declaration alone.

A factor with ``always=True`` is asked for every model (it may decline, e.g.
sensitivity without any profiles); the others are built when their main
option (the first one) is given.  A factor's builder sees the options and the
run's job specs (a Synergy trace names the profile file its reader loaded, and
the sizers use those profiles without ``--profiles``; jobs that carry their own
profiles, as a trace exported from the service does, get the sensitivity factor too).
Likewise a trace can name the options its source simulated it under
(``JobSpec.attrs["source_options"]``, e.g. PAL's traces: ``variability=artifact``,
``locality_rule=any``, ``place.backfill=false``); :func:`trace_options` gives
them; its model options apply wherever the run gives the option no value
(:func:`build_model`), its policy parameters likewise
(:meth:`gpuloom.driver.stack.Stack.scheduler`).  ``seed`` is a shared
option: the run's seed, the default of every seed-like option.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..core.cluster import Cluster
from ..core.job import JobSpec, attr_keys_known, may_hold
from ..core.registry import Registry, RegistryError
from .model import DEFAULT_LOCALITY_PENALTY, LOCALITY_RULES, Factor, LocalityFactor, ThroughputModel


class ModelOptionError(ValueError):
    """A model option with a bad value; the message names the option."""


@dataclass(frozen=True, slots=True)
class ModelOption:
    """One option of a factor.  ``type`` converts a textual value; ``flag`` exposes ``--name``."""

    name: str
    type: Callable[[Any], Any]
    default: Any = None
    help: str = ""
    flag: bool = True
    metavar: str = ""
    cli_type: builtins.type = str  # what the command line parses the flag as

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class FactorDecl:
    """A throughput factor: its options and how to build it (``None``: not for these options)."""

    name: str
    options: tuple[ModelOption, ...]
    build: Callable[[Cluster, Mapping[str, Any], Sequence[JobSpec]], Factor | None]
    always: bool = False
    help: str = ""


def _path(v: Any) -> str:
    return str(v) if isinstance(v, Path) else str(v)


def _penalty(v: Any) -> float:
    f = float(v)
    if not f >= 1.0 or f == float("inf"):
        raise ValueError(f"must be a finite number >= 1, got {v!r}")
    return f


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    f = float(v)
    if not f.is_integer():
        raise ValueError(f"expected an integer, got {v!r}")
    return int(f)


def _any(v: Any) -> Any:
    return v


def _rule(v: Any) -> str:
    r = str(v)
    if r not in LOCALITY_RULES:
        raise ValueError(f"expected one of {', '.join(LOCALITY_RULES)}, got {v!r}")
    return r


def _positive(v: Any) -> float:
    f = float(v)
    if not f > 0 or f == float("inf"):
        raise ValueError(f"must be a finite number > 0, got {v!r}")
    return f


def trace_profiles(specs: Sequence[JobSpec]) -> str | None:
    """The profile file a trace reader loaded for these jobs (Synergy traces), if exactly one."""
    if not may_hold(specs, "profiles_file"):
        return None
    files = {s.attrs.get("profiles_file") for s in specs if s.attrs and s.attrs.get("profiles_file")}
    return str(files.pop()) if len(files) == 1 else None


def trace_options(specs: Sequence[JobSpec]) -> dict[str, Any]:
    """The options every job's ``attrs["source_options"]`` names alike (none if a job names none).

    Model options by name, policy parameters as ``stage.name``."""
    common: dict[str, Any] | None = None
    for s in specs:
        src = s.attrs.get("source_options") if s.attrs else None
        if not isinstance(src, Mapping):
            return {}
        if common is None:
            common = dict(src)
        elif src != common:
            common = {k: v for k, v in common.items() if src.get(k) == v}
    return common or {}


def _with_trace_options(options: Mapping[str, Any] | None, specs: Sequence[JobSpec]) -> dict[str, Any]:
    """``options`` with the trace's own (:func:`trace_options`) where it gives none.

    A trace's ``variability=generate|artifact`` needs the measured data folder: without
    one it is left out with a warning (the run did not ask for it)."""
    given = {k: v for k, v in (options or {}).items() if v is not None}
    extra = {k: v for k, v in trace_options(specs).items() if k in _options()[0] and k not in given}
    word = str(extra.get("variability", "")).partition(":")
    if word[0] in ("generate", "artifact") and not word[2] and given.get("variability_dir") is None:
        from .datadir import data_dir, describe_search

        if data_dir() is None:
            import warnings

            warnings.warn(f"the trace's jobs were simulated with variability={extra['variability']}, which needs "
                          f"the measured data folder ({describe_search()}): running without PM-scores",
                          stacklevel=3)
            del extra["variability"]
    return {**extra, **given}


# -- the factors ----------------------------------------------------------------------------
def _locality(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor:
    return LocalityFactor(o["locality_penalty"], o.get("per_model_penalty"), cluster, o["locality_rule"])


def _scaling(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor:
    from .scaling import ScalingFactor

    # speed 1 at a job's requested GPU count, so only sizers that change GPU counts
    # (elastic, static) see the curves; jobs without a curve stay rigid
    return ScalingFactor()


def _interleave(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor:
    from .interleave import DEFAULT_THRESHOLD, InterleaveFactor, parse_overhead

    thr = o.get("interleave_threshold")
    threshold = DEFAULT_THRESHOLD if thr is None else float(thr)
    resources = int(o["interleave_stages"])
    if o["interleave_model"] == "shared":
        from .sharing import SharedInterleaveFactor

        # Muri's measured overhead is its lock-step executor's: charged here only when given otherwise
        ov = o["interleave_overhead"]
        if o["interleave_profiles"] == "raw":
            raise ValueError("interleave_profiles=raw is Muri's lock-step model: not with interleave_model=shared")
        return SharedInterleaveFactor(threshold=threshold, overhead=None if ov == "muri" else parse_overhead(ov),
                                      resources=resources)
    return InterleaveFactor(threshold=threshold, overhead=parse_overhead(o["interleave_overhead"]),
                            resources=resources, profiles=o["interleave_profiles"])


def _choice(**meanings: str) -> Callable[[Any], str]:
    """A parser of one of ``meanings``' names (case and spaces aside); its error gives each with its meaning."""
    names = [f"{k} ({m})" for k, m in meanings.items()]
    expected = f"expected {', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else f"expected {names[0]}"

    def parse(v: Any) -> str:
        m = str(v).strip().lower()
        if m not in meanings:
            raise ValueError(f"{expected}, got {v!r}")
        return m
    return parse


_interleave_profiles = _choice(normalised="stage times summing to the iteration time",
                               raw="as the trace gives them, as Muri's simulator uses them")
_interleave_model = _choice(muri="lock-step groups, Muri's executor",
                            shared="processes sharing GPUs, each on its own cores")


def _variability(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor | None:
    from .variability import VariabilityFactor, variability_from_spec

    if str(o["variability"]).strip().lower() == "none":  # off, also against a trace's own setting
        return None
    seed = o.get("variability_seed")
    scores = variability_from_spec(str(o["variability"]), cluster, o.get("variability_dir"),
                                   int(o.get("seed", 0) if seed is None else seed))
    return VariabilityFactor(scores)


def _topology(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor | None:
    from .topology import TopologyFactor, load_topology

    return TopologyFactor(cluster, load_topology(o["topology"]))


def _sensitivity(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor | None:
    from .sensitivity import Catalogue, CpuMemProfile, SensitivityFactor, load_catalogue

    path = o.get("profiles") or trace_profiles(specs)
    if path is not None:
        return SensitivityFactor(load_catalogue(path), cluster)
    # jobs that carry their own profiles (a trace exported from the service, inline profiles)
    # (None first: isinstance against a runtime-checkable Protocol costs about 12 us a job)
    if any(s.profile is not None and isinstance(s.profile, CpuMemProfile) for s in specs):
        return SensitivityFactor(Catalogue(), cluster)
    return None


def _storage(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor | None:
    from .storage import StorageFactor, load_storage_demands
    from .synergy_profiles import SensitivityError

    path = o.get("profiles") or trace_profiles(specs)
    if path is None:
        raise SensitivityError("storage_mbps needs the profiles' storage demands: give --profiles FILE "
                               "or a trace that carries them")
    return StorageFactor(load_storage_demands(path), cluster, o["storage_mbps"])


def _gpu_type(cluster: Cluster, o: Mapping[str, Any], specs: Sequence[JobSpec]) -> Factor | None:
    from .gputype import GpuTypeFactor, from_jobs, load_type_speeds, trace_speeds_file

    # a matrix from --gpu-speeds, else the one the trace's reader loaded, else the jobs' own speeds;
    # none of these: no factor (every type runs a job at its reference speed)
    path = o.get("gpu_speeds") or trace_speeds_file(specs)
    if path is not None:
        speeds = load_type_speeds(path)
        inline = from_jobs(specs)
        if inline is not None:
            speeds.rates.update(inline.rates)
            speeds._index()
    else:
        speeds = from_jobs(specs)  # type: ignore[assignment]
        if speeds is None:
            return None
    if o.get("reference_type"):
        from ..core.parse import normalise_gpu_type

        speeds.reference = normalise_gpu_type(str(o["reference_type"]))
    return GpuTypeFactor(speeds, cluster)


_OPTION_OF: dict[str, str] = {"seed": "(shared)"}  # option name -> the factor declaring it


def _factor(obj: Any, where: str) -> FactorDecl:
    """``obj`` if it is a :class:`FactorDecl` whose options no other factor declares."""
    if not isinstance(obj, FactorDecl):
        raise RegistryError(f"{where}: a model factor is a FactorDecl(name, options, build), got {obj!r}")
    for o in obj.options:
        owner = _OPTION_OF.get(o.name, obj.name)
        if owner != obj.name:
            raise RegistryError(f"{where}: option {o.name!r} of factor {obj.name!r} is already factor {owner!r}'s")
    _OPTION_OF.update((o.name, obj.name) for o in obj.options)
    return obj


#: every model factor by name, in the order the model multiplies them: the built-ins below, then outside ones
#: (entry points of ``gpuloom.factors``, each a FactorDecl registered under its own name)
FACTORS: Registry[FactorDecl] = Registry("model factor", group="gpuloom.factors", check=_factor)
for _decl in (
    FactorDecl("locality", (
        ModelOption("locality_penalty", _penalty, DEFAULT_LOCALITY_PENALTY,
                    f"Slowdown of a job spanning nodes (default {DEFAULT_LOCALITY_PENALTY}).", metavar="X",
                    cli_type=float),
        ModelOption("per_model_penalty", _any, None, "Per-model locality penalties (a table).", flag=False),
        ModelOption("locality_rule", _rule, "excess", "excess (default): pay for nodes beyond the fewest a job "
                    "needs; any: every job spanning nodes pays (PAL's simulator; the default on PAL's traces).",
                    flag=False),
    ), _locality, always=True, help="cross-node penalty (PAL)"),
    FactorDecl("scaling", (), _scaling, always=True, help="scaling curves f(N) (F-scheduling)"),
    FactorDecl("interleave", (
        ModelOption("interleave_overhead", _any, "muri", "Muri sharing overhead: muri (default), none, a factor "
                    "or a list.", flag=False),
        ModelOption("interleave_threshold", float, None, "Muri stage threshold (fraction).", flag=False),
        ModelOption("interleave_stages", _int, 4, "Resources interleaved: 4 (storage, CPU, GPU, network) or 3.",
                    flag=False),
        ModelOption("interleave_model", _interleave_model, "muri", "muri: lock-step groups (Muri's executor); shared: "
                    "processes sharing GPUs, each on its own cores, taking turns on GPU and network "
                    "(the service; perf/sharing.py).", flag=False),
        ModelOption("interleave_profiles", _interleave_profiles, "normalised", "normalised: stage times summing "
                    "to the iteration time; raw: as the trace gives them (Muri's simulator).", flag=False),
    ), _interleave, always=True, help="GPU sharing of a group (Muri)"),
    FactorDecl("variability", (
        ModelOption("variability", str, None, "PAL PM-scores: a PerfVar CSV, generate[:DIR] / artifact[:DIR], or none "
                    "(default: none, or the trace's own, e.g. artifact for PAL's traces).", metavar="SPEC"),
        ModelOption("variability_seed", _int, None, "Seed for generated PM-scores (default --seed).", metavar="N",
                    cli_type=int),
        ModelOption("variability_dir", _path, None, "Folder of PAL's measured variability data.", flag=False),
    ), _variability, help="per-GPU PM-scores (PAL)"),
    FactorDecl("topology", (
        ModelOption("topology", _path, None, "`nvidia-smi topo -m` output for the nodes (YARN-8821).",
                    metavar="FILE"),
    ), _topology, help="GPU interconnect cost (YARN-8821)"),
    FactorDecl("sensitivity", (
        ModelOption("profiles", _path, None, "Synergy sensitivity profiles CSV: CPU/memory speed-ups.",
                    metavar="FILE"),
    ), _sensitivity, always=True, help="CPU/memory sensitivity (Synergy)"),
    FactorDecl("gpu_type", (
        ModelOption("gpu_speeds", _path, None, "Throughput per GPU type: Gavel's throughputs JSON, or a CSV/JSON/TOML "
                    "of model x type (docs/gavel.md).", metavar="FILE"),
        ModelOption("reference_type", str, None, "The GPU type whose throughput is speed 1.0 (default: the file's, "
                    "v100 for Gavel's).", flag=False),
    ), _gpu_type, always=True, help="a speed per GPU type (Gavel)"),
    FactorDecl("storage", (
        ModelOption("storage_mbps", _positive, None, "Storage bandwidth per node, MB/s (Synergy's speed column).",
                    flag=False),
    ), _storage, help="storage bandwidth (Synergy)"),
):
    FACTORS.add(_decl, _decl.name)

SHARED_OPTIONS: tuple[ModelOption, ...] = (ModelOption("seed", _int, 0, "Seed of generated model data.", flag=False),)


@cache
def _options() -> tuple[dict[str, ModelOption], frozenset[str], tuple[ModelOption, ...]]:
    """(every option by name, their names, the command-line flags in declaration order), once the factors
    (outside ones included) are loaded."""
    decls = list(FACTORS.values())
    options = {o.name: o for d in decls for o in d.options} | {o.name: o for o in SHARED_OPTIONS}
    return options, frozenset(options), tuple(o for d in decls for o in d.options if o.flag)


def __getattr__(name: str) -> Any:
    """``OPTIONS``, ``MODEL_OPTIONS`` (names that configure the model rather than a policy: ``-P
    name=value``) and ``FLAG_OPTIONS``, computed when first asked for (after outside factors load)."""
    names = ("OPTIONS", "MODEL_OPTIONS", "FLAG_OPTIONS")
    if name not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _options()[names.index(name)]


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(policy parameters, model options) from one ``-P`` mapping."""
    names = _options()[1]
    policy = {k: v for k, v in params.items() if k not in names}
    model = {k: v for k, v in params.items() if k in names}
    return policy, model


def normalise_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Typed options with every default filled in; unknown names and bad values are errors naming them."""
    out: dict[str, Any] = {}
    known = _options()[0]
    for k, v in (options or {}).items():
        opt = known.get(k)
        if opt is None:
            raise ModelOptionError(f"unknown model option {k!r}; known: {', '.join(sorted(known))}")
        if v is None:
            continue
        try:
            out[k] = opt.type(v)
        except (TypeError, ValueError) as e:
            raise ModelOptionError(f"model option {k} ({opt.cli}): {e}") from None
    for name, opt in known.items():
        out.setdefault(name, opt.default)
    return out


def build_model(cluster: Cluster, options: Mapping[str, Any] | None = None,
                specs: Sequence[JobSpec] = ()) -> ThroughputModel:
    """The throughput model for ``options`` and the run's jobs (see the module notes); the same for every face."""
    opts = normalise_options(_with_trace_options(options, specs))
    model = ThroughputModel(cluster)
    with attr_keys_known(specs):  # (several factors look for a key of their own in every job's attrs)
        for decl in FACTORS.values():
            if not decl.always and opts.get(decl.options[0].name) is None:
                continue
            f = decl.build(cluster, opts, specs)
            if f is not None:
                model.add(f)
    for f in model.factors:  # factors that read the others (the shared interleaving model)
        attach = getattr(f, "attach", None)
        if callable(attach):
            attach(model)
    return model
