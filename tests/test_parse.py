"""gpuloom.core.parse: one model-name normalisation, one boolean parser, one arithmetic evaluator,
and every place that compares model names or reads booleans going through them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuloom.core import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.parse import (
    MODEL_ALIASES,
    FieldError,
    bool_literal,
    normalise_model,
    parse_bool,
    safe_arith,
)
from gpuloom.perf.model import LocalityFactor
from gpuloom.perf.scaling import CATALOGUES, builtin_curve, canonical_model
from gpuloom.perf.sensitivity import FAMILIES, family_of, safe_number
from gpuloom.perf.topology import TOPOLOGY_SENSITIVITY
from gpuloom.perf.variability import ARTIFACT_MODEL_CLASSES, MODEL_CLASSES, model_class
from gpuloom.policies.base import PolicyError, make, parse_flag
from gpuloom.sim.runconfig import ConfigError, parse_run_config
from gpuloom.sim.traces import safe_arith as traces_safe_arith

# --------------------------------------------------------------------------- model names


@pytest.mark.parametrize(
    ("names", "norm"),
    [
        (("ResNet-50", "resnet50", "res50", "RESNET_50", "ResNet-50 (batch size 64)", " resnet 50 "), "resnet50"),
        (("res18", "ResNet-18", "resnet18"), "resnet18"),
        (("InceptionV3", "inception-v3", "inception3"), "inception3"),
        (("deepspeech2", "DeepSpeech", "deepspeech"), "deepspeech"),
        (("BERT", "bert-base", "Bert Base"), "bert"),
        (("GPT-2", "gpt2"), "gpt2"),
        (("Transformer (batch size 128)", "transformer"), "transformer"),
    ],
)
def test_normalise_model_spellings(names: tuple[str, ...], norm: str) -> None:
    assert {normalise_model(n) for n in names} == {norm}
    assert canonical_model is normalise_model  # perf.scaling's old name is the same function


def test_aliases_are_final() -> None:
    # an alias target is never itself an alias: normalising twice changes nothing
    assert not set(MODEL_ALIASES.values()) & set(MODEL_ALIASES)


@given(st.text(max_size=30))
def test_normalise_model_idempotent_and_case_blind(s: str) -> None:
    n = normalise_model(s)
    assert normalise_model(n) == n
    # any two names equal after .lower() (the old LocalityFactor / Catalogue rule) stay equal
    assert normalise_model(s.lower()) == n


@pytest.mark.parametrize(
    "table",
    [MODEL_CLASSES, ARTIFACT_MODEL_CLASSES, TOPOLOGY_SENSITIVITY, *CATALOGUES.values()],
    ids=["model_classes", "artifact_classes", "topology", *CATALOGUES],
)
def test_model_tables_hold_normalised_keys(table: dict) -> None:
    assert all(normalise_model(k) == k for k in table)


def test_every_lookup_goes_through_normalise_model() -> None:
    loc = LocalityFactor(2.0, per_model={"ResNet-50": 3.0, "BERT": 1.5})
    assert loc.penalty_for("res50") == loc.penalty_for("resnet50") == 3.0
    assert loc.penalty_for("bert") == 1.5 and loc.penalty_for("gpt2") == 2.0
    assert model_class("Inception-V3") == model_class("inceptionv3") == "A"
    assert model_class("DeepSpeech") == "B" and model_class("PointNet") == "C"
    assert family_of("ResNet-18") == family_of("res18") == "image"
    assert all(family_of(m.upper()) == fam for fam, ms in FAMILIES.items() for m in ms)
    assert family_of("no-such-model") is None
    assert TOPOLOGY_SENSITIVITY[normalise_model("DeepSpeech2")] == 0.20
    assert builtin_curve("ResNet-50 (batch size 64)") is builtin_curve("res50")


def test_topology_factor_sensitivity_by_any_spelling(data_dir: Path) -> None:
    from gpuloom.perf.topology import TopologyFactor, load_topology

    topo = load_topology(data_dir / "topology" / "v100_dgx1class_8gpu_oneflow_dlperf.txt")
    f = TopologyFactor(Cluster.homogeneous(1, 8), topo, sensitivity={"My-Model": 0.5})
    assert f.sensitivity_of(Job(JobSpec("a", 0, 2, 10, model="my_model"))) == 0.5
    assert f.sensitivity_of(Job(JobSpec("b", 0, 2, 10, model="VGG-19"))) == 0.30
    assert f.sensitivity_of(Job(JobSpec("c", 0, 2, 10, model="PointNet"))) == 0.0


def test_catalogue_lookup_by_any_spelling() -> None:
    import numpy as np

    from gpuloom.perf.sensitivity import CPU_AXIS, MEM_AXIS_5, Catalogue, SensitivityError, SensitivityProfile

    flat = np.ones((len(CPU_AXIS), 5))
    cat = Catalogue([SensitivityProfile("res50", 1, CPU_AXIS, MEM_AXIS_5, flat)])
    assert cat.get("ResNet-50", 1) is cat.get("res50", 4) is cat.get("RES50", 1)
    assert cat.models == ["res50"]  # as the profiles name them
    with pytest.raises(SensitivityError, match="given twice"):
        cat.add(SensitivityProfile("resnet50", 1, CPU_AXIS, MEM_AXIS_5, flat))


# --------------------------------------------------------------------------- booleans

@pytest.mark.parametrize("v", [True, "true", "True", " YES ", "on", "1", 1])
def test_parse_bool_true(v: object) -> None:
    assert parse_bool(v, "x") is True


@pytest.mark.parametrize("v", [False, "false", "FALSE", "no", "Off", "0", 0])
def test_parse_bool_false(v: object) -> None:
    assert parse_bool(v, "x") is False


@pytest.mark.parametrize("v", ["maybe", "", 2, 1.0, None, "t", [True]])
def test_parse_bool_rejects(v: object) -> None:
    with pytest.raises(ValueError) as e:
        parse_bool(v, "backfill")
    assert str(e.value) == f"backfill must be true or false, got {v!r}"


def test_bool_parsers_are_one() -> None:
    # the policy helper, the run configuration and the CLI's value guess all answer as parse_bool
    for v in ("yes", "Off", "1", True):
        assert parse_flag(v, "f") is parse_bool(v)
    with pytest.raises(ValueError, match="^f must be true or false, got 'maybe'$"):
        parse_flag("maybe", "f")
    with pytest.raises(PolicyError, match="backfill must be true or false"):
        make("place", "packed-sticky", {"backfill": "sometimes"})
    assert parse_run_config("order=fifo,preemptive=off").preemptive is False
    assert parse_run_config("order=fifo,preemptive=YES").preemptive is True
    with pytest.raises(ConfigError, match="config 'order=fifo,preemptive=maybe': preemptive must be true or false"):
        parse_run_config("order=fifo,preemptive=maybe")
    from gpuloom.cli.common import parse_value

    assert parse_value("TRUE") is True and parse_value("false") is False
    assert parse_value("1") == 1 and parse_value("yes") == "yes"  # untyped text: only true/false are bools
    assert bool_literal(" True ") is True and bool_literal("no") is None


# --------------------------------------------------------------------------- arithmetic and errors

def test_one_arithmetic_evaluator() -> None:
    assert safe_number is safe_arith and traces_safe_arith is safe_arith
    assert safe_arith("62.5*2") == 125.0 and safe_arith("int(62.5/3)") == 20.0
    assert safe_arith("round(2.5) + 7 % 4") == 5.0
    for bad in ("1e400*10", "float('inf')", "x", "2**3", "[1]"):
        with pytest.raises(ValueError):
            safe_arith(bad)


def test_field_error_message() -> None:
    assert str(FieldError("bad", "/a/b/f.csv", 3, "x")) == "f.csv:3: field 'x': bad"
    assert str(FieldError("bad", "/a/b/f.csv", 3)) == "f.csv:3: bad"
    assert str(FieldError("bad", "/a/b/f.csv")) == "f.csv: bad"
    assert str(FieldError("bad")) == "bad"
    e = FieldError("bad", "/a/b/f.csv", 3, "x")
    assert (e.path, e.line, e.field, e.reason) == ("/a/b/f.csv", 3, "x", "bad")
    assert isinstance(e, ValueError)
