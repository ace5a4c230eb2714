"""Shared fixtures.  Real data is read from ``../shared/data`` beside the checkout
(or ``$GPULOOM_DATA``); tests that need it are skipped where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def data_path() -> Path:
    env = os.environ.get("GPULOOM_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    p = data_path()
    if not p.is_dir():
        pytest.skip(f"real data not found at {p}")
    return p
