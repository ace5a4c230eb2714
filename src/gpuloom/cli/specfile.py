"""Job spec files: YAML or JSON text to a mapping of job fields.

YAML 1.1 reads ``1:30:00`` as the base-60 integer 5400 and ``10:00`` as 600; a
time limit's bare number is minutes, so such values would silently become
5400 minutes.  Spec files are read with a loader that keeps ``H:MM:SS``-like
scalars as text, for the time parser to read as Slurm does.
"""

from __future__ import annotations

import json
from typing import Any

import yaml


class SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without base-60 numbers: ``1:30:00`` stays the string ``"1:30:00"``."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        text = self.construct_scalar(node)
        return text if ":" in str(text) else super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> Any:
        text = self.construct_scalar(node)
        return text if ":" in str(text) else super().construct_yaml_float(node)


SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)
SpecLoader.add_constructor("tag:yaml.org,2002:float", SpecLoader.construct_yaml_float)


def parse_spec_text(text: str, is_json: bool) -> Any:
    """The document in ``text`` (JSON if ``is_json``, else YAML read by :class:`SpecLoader`); raises
    ``ValueError`` or ``yaml.YAMLError``."""
    return json.loads(text) if is_json else yaml.load(text, Loader=SpecLoader)  # noqa: S506 (a SafeLoader)
