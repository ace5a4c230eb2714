"""Checking policy names and parameters before a run, with messages that help fix them.

:meth:`gpuloom.scheduler.Scheduler.from_names` refuses unknown names and
parameters; these checks say the same earlier and more helpfully, so the CLI
and run configurations can report one clear line:

* :func:`check_names`: an unknown policy name, with a "did you mean" (difflib)
  and the names the stage knows;
* :func:`check_params`: ``-P`` names no chosen stage takes, with a "did you
  mean", which other policies take that name, and every name the chosen stages
  (and the throughput model) accept;
* :func:`route_params`: ``-P`` parameters split by stage, as the scheduler takes them;
* :func:`conflicts`: combinations that run but are rarely what was meant
  (warnings, not errors).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Mapping
from typing import Any

from ..core.registry import did_you_mean
from . import base as pb


def check_names(stages: Mapping[str, str]) -> None:
    """Raise :class:`~gpuloom.policies.base.PolicyError` for the first unknown policy name."""
    for stage, name in stages.items():
        pb.lookup(stage, name)


def accepted(stages: Mapping[str, str]) -> dict[str, list[str]]:
    """``{parameter: ["size static", "place static"]}``: who among the chosen stages takes each name."""
    out: dict[str, list[str]] = {}
    for stage, name in stages.items():
        for p in sorted(_named_params(stage, name)):
            out.setdefault(p, []).append(f"{stage} {name}")
    return out


def _named_params(stage: str, name: str) -> set[str]:
    """The constructor's named parameters (not ``*args`` / ``**kwargs`` of a class without its own)."""
    sig = inspect.signature(pb.lookup(stage, name).__init__)
    return {p.name for p in sig.parameters.values() if p.name != "self"
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}


def _takers(param: str) -> list[str]:
    """Every registered policy (``order 2d-las``) whose constructor takes ``param``."""
    out = []
    for stage in pb.STAGES:
        seen: set[type] = set()
        for name in pb.names(stage):
            cls = pb.lookup(stage, name)
            if cls in seen:
                continue
            seen.add(cls)
            if param in _named_params(stage, name):
                out.append(f"{stage} {name}")
    return out


def check_params(stages: Mapping[str, str], params: Collection[str], also: Collection[str] = (),
                 also_label: str = "model options") -> None:
    """Raise :class:`~gpuloom.policies.base.PolicyError` for the first parameter no chosen stage takes.

    ``also`` are further accepted names (the throughput model's options), listed as ``also_label``.
    """
    take = accepted(stages)
    for p in params:
        if p in take or p in also:
            continue
        where = ", ".join(f"{s}={n}" for s, n in stages.items())
        parts = [f"parameter {p!r} is not accepted by {where}"]
        others = _takers(p)
        if others:
            parts.append(f"{p} is a parameter of {', '.join(others)}")
        mean = did_you_mean(p, [*take, *also])
        if mean:
            parts.append(mean.removeprefix("; "))
        listed = ", ".join(f"{k} ({', '.join(v)})" for k, v in sorted(take.items())) or "none"
        extra = f"; {also_label}: {', '.join(sorted(also))}" if also else ""
        raise pb.PolicyError("; ".join(parts) + f" (accepted here: {listed}{extra})")


def conflicts(stages: Mapping[str, str]) -> list[str]:
    """Warnings for stage combinations that run but are rarely what was meant."""
    out = []
    size, place = stages.get("size"), stages.get("place")
    if place == "static" and size != "static":
        out.append(f"--place static places only whole slots of -P slot GPUs on one node (the fixed-slot "
                   f"baseline, with --size static); with --size {size}, jobs of other sizes never start")
    if size == "static" and place != "static":
        out.append(f"--size static gives every job one slot of -P slot GPUs; with --place {place} the slots "
                   "are not aligned to fixed GPU ranges (the fixed-slot baseline is --size static --place static)")
    return out


def route_params(chosen: Mapping[str, str], params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split ``-P`` parameters by stage: ``stage.name`` goes to that stage only, a bare ``name`` to the one
    chosen stage that takes it, or to every one that takes it when all of them declare it shared
    (``shared_params``); an ambiguous or unknown name is an error naming the parameter."""
    accepted = {s: pb.accepted_params(s, n) for s, n in chosen.items()}
    out: dict[str, dict[str, Any]] = {s: {} for s in chosen}
    problems: list[str] = []
    for key, value in params.items():
        stage, dot, name = key.partition(".")
        if dot:
            if stage not in chosen:
                problems.append(f"{key!r}: unknown stage {stage!r} (stages: {', '.join(chosen)})")
            elif name not in accepted[stage]:
                problems.append(f"{key!r}: {stage} policy {chosen[stage]!r} takes {_listing(accepted[stage])}"
                                + did_you_mean(name, accepted[stage]))
            else:
                out[stage][name] = value
            continue
        takers = [s for s in chosen if key in accepted[s]]
        if len(takers) == 1 or (takers and all(key in pb.lookup(s, chosen[s]).shared_params for s in takers)):
            for s in takers:
                out[s][key] = value
        elif takers:
            problems.append(f"{key!r} is taken by several stages: give {' or '.join(f'{s}.{key}' for s in takers)}")
        else:
            every = set().union(*accepted.values())
            others = _takers(key)
            problems.append(f"{key!r} is not taken by " + ", ".join(f"{s}={n}" for s, n in chosen.items())
                            + f" (they take {_listing(every)})" + did_you_mean(key, every)
                            + (f"; {key} is a parameter of {', '.join(others)}" if others else ""))
    if problems:
        raise pb.PolicyError("parameter " + "; ".join(problems))
    return out


def _listing(names: set[str]) -> str:
    return ", ".join(sorted(names)) if names else "no parameters"
