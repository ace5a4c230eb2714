"""Where results go: a folder of its own per run (``gpuloom-out/<command>-<label>-<time>/``, ``latest``), ``--out``
written exactly and never mixed, the last line saying where the report is; and the command line a result records,
rebuilt from the parsed arguments, whatever the host process's ``sys.argv``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app, main

runner = CliRunner()
QUICK = ["--generate", "10", "--cluster", "2x4", "--no-plots"]


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_the_recorded_command_comes_from_the_parsed_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["pytest", "-rs", "-x"])  # the host's arguments: never recorded
    out = tmp_path / "o"
    args = ["simulate", "--generate", "20", "--cluster", "2x4", "-P", "thresholds=100,200", "--order", "2d-las",
            "--seed", "7", "--no-plots", "-o", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    # every option given, by its long name, in the order the command declares them
    expect = (f"gpuloom simulate --cluster 2x4 --order 2d-las --param thresholds=100,200 --seed 7 --generate 20 "
              f"--out {out} --no-plots")
    assert json.loads((out / "summary.json").read_text())["command"] == expect
    assert json.loads((out / "gpuloom-run.json").read_text())["command"] == expect
    assert f"- command: `{expect}`" in (out / "report.md").read_text()
    # the same through the real entry point, with the arguments in another order
    monkeypatch.setattr(sys, "argv", ["gpuloom", *args[:1], *args[9:], *args[1:9]])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["command"] == expect
    # arguments, flags that are on, quoting; compare records itself too
    r = runner.invoke(app, ["compare", *QUICK, "-c", "order=fifo", "-c", "order=las,place=random-sticky", "--seeds",
                            "2", "-j", "1", "--json", "-o", str(tmp_path / "c d")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "c d" / "compare.json").read_text())["meta"]["command"] == (
        f"gpuloom compare --config order=fifo --config order=las,place=random-sticky --cluster 2x4 --generate 10 "
        f"--seeds 2 --processes 1 --out '{tmp_path / 'c d'}' --no-plots --json")


def test_each_run_gets_a_folder_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "gpuloom-out"
    made = []
    for args in (["simulate", *QUICK], ["simulate", *QUICK, "--order", "srtf", "--place", "random-sticky"],
                 ["simulate", *QUICK], ["compare", *QUICK, "-c", "fifo", "-c", "srtf", "-j", "1"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        new = sorted(set(p.name for p in root.iterdir()) - {"latest", *made})
        assert len(new) == 1
        made += new
        # the last line says where the report is; latest links to the newest run
        report = "compare.md" if args[0] == "compare" else "report.md"
        assert r.output.splitlines()[-1] == f"report: gpuloom-out/{new[0]}/{report}"
        assert (root / "latest").resolve() == (root / new[0]).resolve()
    stamp = r"\d{8}-\d{6}"
    assert re.fullmatch(f"simulate-fifo-{stamp}", made[0]), made
    assert re.fullmatch(f"simulate-srtf-random-sticky-{stamp}", made[1]), made
    assert re.fullmatch(f"simulate-fifo-{stamp}(-2)?", made[2]) and made[2] != made[0], made
    assert re.fullmatch(f"compare-fifo\\+srtf-{stamp}", made[3]), made
    # nothing mixed: each folder holds its own run's files only, and says which
    assert files(root / made[0]) == {"jobs.csv", "series.csv", "summary.json", "report.md", "report.txt",
                                     "gpuloom-run.json"}
    assert "compare.md" in files(root / made[3]) and "report.md" not in files(root / made[3])
    run = json.loads((root / made[3] / "gpuloom-run.json").read_text())
    assert run["command"].startswith("gpuloom compare ") and set(run["files"]) == files(root / made[3]) - {
        "gpuloom-run.json"}


def test_out_is_written_exactly_and_never_mixed(tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "report.md" in files(out) and r.output.splitlines()[-1] == f"report: {out}/report.md"
    # another command into the same folder replaces the earlier run's files, all of them
    r = runner.invoke(app, ["compare", *QUICK, "-c", "fifo", "-c", "srtf", "-j", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert not files(out) & {"report.md", "report.txt", "jobs.csv", "summary.json"}
    assert {"compare.md", "compare.json", "runs/fifo/jobs.csv"} <= files(out)
    assert json.loads((out / "gpuloom-run.json").read_text())["command"].startswith("gpuloom compare ")
    # a file gpuloom did not write: refused before anything runs, nothing touched
    (out / "notes.md").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(out)])
    assert r.exit_code == 2
    assert f"error: --out {out} holds files an earlier gpuloom run did not write (notes.md)" in r.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a folder of other files, without gpuloom-run.json; a file
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("")
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(other)])
    assert r.exit_code == 2 and "holds files and no gpuloom-run.json of an earlier gpuloom run (a.txt)" in r.output
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(other / "a.txt")])
    assert r.exit_code == 2 and f"--out {other / 'a.txt'}: not a folder" in r.output
    # an empty folder is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(app, ["simulate", *QUICK, "-o", str(empty)]).exit_code == 0


def test_out_removes_nothing_outside_its_folder(tmp_path: Path) -> None:
    """A gpuloom-run.json that lists files outside the folder, and a link to one: only what is in the folder
    goes (the link itself, not what it points to)."""
    victim, pointed = tmp_path / "victim.txt", tmp_path / "pointed.txt"
    victim.write_text("keep")
    pointed.write_text("keep")
    out = tmp_path / "o"
    out.mkdir()
    (out / "link.txt").symlink_to(pointed)
    (out / "gpuloom-run.json").write_text(json.dumps({"files": ["../victim.txt", str(victim), "link.txt"]}))
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == pointed.read_text() == "keep" and not (out / "link.txt").is_symlink()
    assert "report.md" in files(out)
    # a terminal escape in the folder's name reaches the terminal as text
    odd = tmp_path / "a\x1b[31mb"
    r = runner.invoke(app, ["simulate", *QUICK, "-o", str(odd)])
    assert r.exit_code == 0 and r.output.splitlines()[-1] == f"report: {tmp_path}/a?[31mb/report.md"
