"""One data resolver for every command: ``$GPULOOM_DATA``, else ``../shared/data`` beside the checkout (of the
current directory, then of the package), from any working directory; its error says where it looked."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.perf import datadir
from gpuloom.perf.datadir import DataDirError, candidates, require_data_dir
from gpuloom.perf.datadir import data_dir as find_data


def clone(root: Path, name: str, with_data: bool) -> Path:
    """``root/name`` laid out as a checkout (``pyproject.toml``, ``docs/``, the package file), ``root/shared/data``
    beside it when ``with_data``."""
    repo = root / name
    (repo / "docs").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'gpuloom'\n")
    pkg = repo / "src" / "gpuloom" / "perf"
    pkg.mkdir(parents=True)
    (pkg / "datadir.py").write_text("")
    if with_data:
        (root / "shared" / "data").mkdir(parents=True)
    return repo


def test_the_order_of_the_places(tmp_path: Path) -> None:
    here = clone(tmp_path / "a", "repo", with_data=False)
    there = clone(tmp_path / "b", "gpuloom", with_data=False)
    pkg = there / "src/gpuloom/perf/datadir.py"
    # from docs/ of one checkout, the package loaded from another: that checkout's, the cwd's parent's, the package's
    assert candidates(here / "docs", pkg, env="") == [tmp_path / "a/shared/data", here / "shared/data",
                                                      tmp_path / "b/shared/data"]
    assert candidates(here / "docs", pkg, env="/x/y") == [Path("/x/y")]  # the variable alone, when set
    # from a folder in no checkout, the package not in a checkout (an installed wheel)
    plain = tmp_path / "c" / "work"
    plain.mkdir(parents=True)
    assert candidates(plain, tmp_path / "site-packages/gpuloom/perf/datadir.py", env="") == [tmp_path / "c/shared/data"]


def test_found_from_a_subfolder_and_from_anywhere_through_the_package(tmp_path: Path) -> None:
    repo = clone(tmp_path / "a", "repo", with_data=True)
    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    nowhere = tmp_path / "site/gpuloom/perf/datadir.py"
    assert find_data(repo / "docs", nowhere, env="") == tmp_path / "a/shared/data"
    assert find_data(repo, nowhere, env="") == tmp_path / "a/shared/data"
    assert find_data(elsewhere, nowhere, env="") is None
    assert find_data(elsewhere, repo / "src/gpuloom/perf/datadir.py", env="") == tmp_path / "a/shared/data"


def test_the_error_says_where_it_looked(tmp_path: Path) -> None:
    repo = clone(tmp_path, "repo", with_data=False)
    pkg = tmp_path / "site/gpuloom/perf/datadir.py"
    with pytest.raises(DataDirError) as e:
        require_data_dir(None, cwd=repo / "docs", package=pkg, env="")
    assert str(e.value) == (
        f"no data folder (the shared data: muri/, synergy/, pal/, sia/, ...): looked in $GPULOOM_DATA (not set), "
        f"then {tmp_path / 'shared/data'}, {repo / 'shared/data'}; set GPULOOM_DATA=DIR or give --data DIR")
    with pytest.raises(DataDirError, match=r"^\$GPULOOM_DATA=/no/such is not a folder"):
        require_data_dir(None, cwd=repo, package=pkg, env="/no/such")
    with pytest.raises(DataDirError, match=r"^--data /no/such: no such folder$"):
        require_data_dir("/no/such", cwd=repo, package=pkg, env="")
    assert require_data_dir(repo, env="") == repo  # --data first


def test_commands_find_the_data_from_another_directory(data_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``reproduce`` (as ``validate``, through the same function) and ``simulate --variability generate`` from
    ``docs/`` of a checkout with the data beside it; from a folder with none, an error naming where it looked."""
    repo = clone(tmp_path, "repo", with_data=False)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_dir.resolve())
    monkeypatch.setattr(datadir, "_PACKAGE", tmp_path / "site/gpuloom/perf/datadir.py")  # only the cwd counts
    monkeypatch.delenv("GPULOOM_DATA", raising=False)
    monkeypatch.chdir(repo / "docs")
    r = CliRunner().invoke(app, ["reproduce", "fsched", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["simulate", "--variability", "generate", "--generate", "5", "--cluster", "2x4",
                                 "--no-plots", "--json", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    empty = tmp_path / "x" / "empty"
    empty.mkdir(parents=True)
    monkeypatch.chdir(empty)
    r = CliRunner().invoke(app, ["reproduce", "fsched", "--out", str(tmp_path / "o2")])
    assert r.exit_code == 2 and f"looked in $GPULOOM_DATA (not set), then {tmp_path / 'x/shared/data'}" in r.output
    assert not (tmp_path / "o2").exists()  # no folder for a run that could not start
    r = CliRunner().invoke(app, ["simulate", "--variability", "generate", "--generate", "5", "--cluster", "2x4",
                                 "--no-plots", "--json", "--out", str(tmp_path / "s2")])
    assert r.exit_code == 2 and "variability 'generate' needs the measured data folder: no data folder" in r.output
    assert "give generate:DIR" in r.output
