"""Plain values from text, each parsed in one place: model names, booleans, arithmetic cells.

* :func:`normalise_model` is how model names are compared everywhere (throughput
  catalogues, locality and topology tables, PAL's model classes, Synergy's
  profiles, trace lookups): ``"ResNet-50 (batch size 64)"``, ``"resnet50"``,
  ``"res50"`` and ``"RESNET_50"`` are one model.
* :func:`normalise_gpu_type` is how GPU types are compared (a node's type, a job's ask,
  a throughput matrix's columns): ``"Tesla V100-SXM2-16GB"``, ``"V100"`` and ``"v100"``
  are one type.
* :func:`parse_bool` reads a boolean given as a bool or as a word (policy
  parameters, run configurations, trace cells).
* :func:`safe_arith` evaluates a numeric cell such as ``62.5*2`` or
  ``int(62.5/3)`` (Synergy's profiles) without ``eval``.
* :class:`FieldError` is the base of the errors that point into a file
  (``trace.csv:17: field 'num_gpus': expected a positive integer, got 'x'``).

No I/O and no state beyond a memo of :func:`normalise_model`.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "FieldError", "bool_literal", "normalise_gpu_type", "normalise_model",
           "parse_bool", "safe_arith"]


# --------------------------------------------------------------------------- errors pointing into a file

class FieldError(ValueError):
    """A value in a file that cannot be used: ``file:line: field 'x': reason``.

    ``path``, ``line`` and ``field`` may each be missing (a whole-file problem has
    no line, a malformed row no field); the message shows the file's name only,
    :attr:`path` keeps the path as given.
    """

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = "" if path is None else Path(path).name
        if line is not None:
            where += f":{line}"
        text = f"field {field!r}: {message}" if field else message
        super().__init__(f"{where}: {text}" if where else text)


# --------------------------------------------------------------------------- model names

#: Spellings of one model used by different sources -> the name gpuloom compares
#: (after lower-casing and dropping everything but letters and digits).
MODEL_ALIASES: dict[str, str] = {
    "res50": "resnet50", "res18": "resnet18", "res101": "resnet101", "res152": "resnet152",
    "inceptionv3": "inception3", "inceptionv4": "inception4",
    "bertbase": "bert", "deepspeech2": "deepspeech",
}
_PARENS = re.compile(r"\(.*?\)")
_NOT_ALNUM = re.compile(r"[^a-z0-9]")


@lru_cache(maxsize=4096)
def normalise_model(name: str) -> str:
    """The comparable form of a model name: ``"ResNet-50 (batch size 64)"`` -> ``"resnet50"``.

    Drops parenthesised parts (Gavel's ``(batch size N)``), lower-cases, keeps
    letters and digits only, then maps the aliases of :data:`MODEL_ALIASES`
    (``res50`` -> ``resnet50``, ``InceptionV3`` -> ``inception3``,
    ``deepspeech2`` -> ``deepspeech``, ``bert-base`` -> ``bert``).  Idempotent;
    tables keyed by model hold normalised keys and look up normalised names.
    Two names equal after ``.lower()`` (or after lower-casing and dropping
    punctuation) stay equal here, so every lookup that hit with one of those
    rules still hits.
    """
    s = _NOT_ALNUM.sub("", _PARENS.sub("", name).lower())
    return MODEL_ALIASES.get(s, s)


# --------------------------------------------------------------------------- GPU types

_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct", "gpu"})
_TYPE_SPLIT = re.compile(r"[\s_\-/]+")


@lru_cache(maxsize=1024)
def normalise_gpu_type(name: str) -> str:
    """The comparable form of a GPU type: ``"Tesla V100-SXM2-16GB"`` -> ``"v100"``.

    Lower-cases, drops vendor words (NVIDIA, Tesla, GeForce, ...) and keeps the
    first word of what is left, i.e. the product (``"A100-SXM4-80GB"`` ->
    ``"a100"``, ``"H100 80GB HBM3"`` -> ``"h100"``); a first word of letters only
    takes the next one along (``"GeForce RTX 3090"`` -> ``"rtx3090"``,
    ``"TITAN V"`` -> ``"titanv"``).  Memory and form-factor variants are one type.
    Idempotent; an empty name stays empty.
    """
    words = [w for w in _TYPE_SPLIT.split(name.strip().lower()) if w and w not in _VENDOR_WORDS]
    if not words:
        return ""
    first = words[0]
    if first.isalpha() and len(words) > 1 and not words[1].endswith("gb"):
        first += words[1]
    return first


# --------------------------------------------------------------------------- booleans

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})


def parse_bool(value: Any, where: str = "value") -> bool:
    """``True``/``False``, the words of :data:`TRUE_WORDS` / :data:`FALSE_WORDS` (any case,
    surrounding blanks ignored) or the integers 1 / 0 -> bool.

    Anything else raises ``ValueError("<where> must be true or false, got <value>")``.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in TRUE_WORDS:
            return True
        if s in FALSE_WORDS:
            return False
    raise ValueError(f"{where} must be true or false, got {value!r}")


def bool_literal(text: str) -> bool | None:
    """For untyped text (a ``-P`` value, an extra CSV column): ``"true"``/``"false"`` in any case
    is a bool (through :func:`parse_bool`), anything else ``None``.

    Only those two words: in untyped text ``1`` is a number and ``yes`` may well be a name.
    """
    s = text.strip().lower()
    return parse_bool(s) if s in ("true", "false") else None


# --------------------------------------------------------------------------- safe arithmetic

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_FUNCS: dict[str, Callable[[float], float]] = {"int": int, "float": float, "round": round}


def safe_arith(text: str) -> float:
    """Evaluate a numeric cell such as ``62.5*2`` or ``int(62.5/3)`` without ``eval``.

    Accepts numbers, ``+ - * / // %``, unary ``-``/``+``, parentheses and
    ``int``/``float``/``round`` of one argument; anything else (names, ``**``,
    attributes, calls with keywords), a division by zero or a non-finite result
    raises ``ValueError`` naming the text.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not a number or arithmetic expression: {text!r}") from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and len(node.args) == 1
            and not node.keywords
        ):
            return _FUNCS[node.func.id](ev(node.args[0]))
        raise ValueError(f"unsupported expression element {type(node).__name__} in {text!r}")

    try:
        value = float(ev(tree))
    except ZeroDivisionError:
        raise ValueError(f"division by zero in {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value
