"""`gpuloom reproduce`: a fast smoke test on reduced inputs, and its error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.sim.reproduce import ReproduceError, run, table


def test_reproduce_all_on_reduced_input(data_dir: Path, tmp_path: Path) -> None:
    results = run("all", data_dir, "paper", seeds=2, out=tmp_path, limit=40)
    assert [r.name for r in results] == ["muri", "synergy", "pal", "fsched"]
    text = table(results)
    assert "Muri Fig. 9" in text and "PAL Sec. V-B" in text and "Synergy abstract" in text
    for r in results:
        assert r.rows and all(row.values for row in r.rows)
        assert (tmp_path / f"reproduce_{r.name}_paper.png").stat().st_size > 1000
    pal = next(r for r in results if r.name == "pal")
    assert pal.seeds == 2 and all(len(row.values) == 2 and row.spread is not None for row in pal.rows)
    fs = next(r for r in results if r.name == "fsched")
    assert "reproduced: yes" in fs.notes[0]  # the thesis' direction
    data = json.loads((tmp_path / "reproduce.json").read_text())
    assert {d["name"] for d in data} == {"muri", "synergy", "pal", "fsched"}


def test_reproduce_cli_and_errors(data_dir: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["reproduce", "fsched", "--data", str(data_dir), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "F-scheduling" in r.output and "static n=6" in r.output
    r = CliRunner().invoke(app, ["reproduce", "nope", "--data", str(data_dir), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown experiment" in r.output
    with pytest.raises(ReproduceError, match="preset"):
        run("muri", data_dir, "blog")
    with pytest.raises(ReproduceError, match="missing input"):
        run("muri", tmp_path, "paper")
