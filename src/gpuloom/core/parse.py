"""Plain values from text, each parsed in one place.

* :func:`parse_bool` reads a boolean given as a bool or as a word (policy
  parameters, run configurations, trace cells).

No I/O, no state.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "bool_literal", "parse_bool"]


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
