"""What a newcomer reads in the first hour says what is true: the files the docs name exist, every column of
``jobs.csv`` and key of the summary is documented, CI runs the README's own set-up and test commands, ``--help``
shows no type after a flag, the server's start line reads as English."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuloom.core.cluster import Cluster
from gpuloom.core.job import JobSpec
from gpuloom.sim import simulate
from gpuloom.sim.report import write_jobs_csv

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "README.md"]
PACKAGE = REPO / "src" / "gpuloom"
FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
TICKED = re.compile(r"`([^`\n]+)`")
LINKED = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"[\w.-]+(/[\w.-]+)*/?")


def named_paths(doc: Path) -> list[tuple[str, Path]]:
    """``(as written, where it must be)`` for each repository path ``doc`` names outside code blocks: links
    (relative to ``doc``), and paths in backticks that start at the repository's root (``tests/test_cli.py``,
    ``examples/``) or at the package's (``runtime/api/app.py``, as the docs' tables write them)."""
    text = FENCED.sub("", doc.read_text())
    top = {p.name for p in REPO.iterdir()} - {".git", ".venv"}
    sub = {p.name for p in PACKAGE.iterdir() if not p.name.startswith("_")}
    out = []
    for m in LINKED.finditer(text):
        target = m.group(1).split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            out.append((target, doc.parent / target))
    for m in TICKED.finditer(text):
        t = m.group(1).strip().split("::")[0]  # tests/x.py::test_y
        if not PATH.fullmatch(t):
            continue
        first = t.split("/")[0]
        if first in top and ("/" in t or "." in t):
            out.append((t, REPO / t))
        elif first in sub and "/" in t:
            out.append((t, PACKAGE / t))
    return out


def test_the_docs_name_only_files_that_exist() -> None:
    missing = [f"{doc.relative_to(REPO)}: {text}" for doc in DOCS for text, path in named_paths(doc) if not path.exists()]
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)
    # the check sees what it should: a link, a root path, a package path, a test id
    found = {text for doc in DOCS for text, _ in named_paths(doc)}
    assert {"docs/ray.md", "examples/cluster.toml", "runtime/api/app.py", "tests/test_validation_e2e.py"} <= found


def reports_doc_row(name: str) -> str:
    rows = [line for line in (REPO / "docs" / "reports.md").read_text().splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"docs/reports.md: one table row for {name}"
    return rows[0]


def test_every_column_of_jobs_csv_and_key_of_the_summary_is_documented(tmp_path: Path) -> None:
    res = simulate(Cluster.homogeneous(1, 2), [JobSpec("a", 0, 1, 100), JobSpec("b", 5, 2, 50)], round_len=10)
    header = write_jobs_csv(res, tmp_path / "jobs.csv").read_text().splitlines()[0].split(",")
    assert any(c.startswith("phase_") for c in header)  # the lifecycle's columns are there to check
    row = reports_doc_row("jobs.csv")
    documented = {w.strip() for span in TICKED.findall(row) for w in span.split(",")}
    assert set(header) <= documented, f"jobs.csv columns missing in docs/reports.md: {set(header) - documented}"
    text = (REPO / "docs" / "reports.md").read_text()
    undocumented = [k for k in res.summary() if f"`{k}`" not in text]
    assert not undocumented, f"summary keys missing in docs/reports.md: {undocumented}"


def test_ci_runs_the_readme_set_up_and_test_commands_exactly() -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    setup = next(b for b in blocks if "python3 -m venv .venv" in b).splitlines()
    test = next(b for b in blocks if "-m pytest" in b).strip()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "python3 -m venv .venv && .venv/bin/pip install -e ." in setup
    assert any(line.startswith("python3 -m venv .venv && .venv/bin/pip install -e . ||") for line in ci)
    assert test == ".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    runs = [line for line in ci if "-m pytest" in line]
    assert len(runs) == 1 and f"{{ {test} || status=1; }}" in runs[0], runs  # nothing added to the command


def test_help_shows_no_type_after_a_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from gpuloom.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    for args in (["--help"], ["simulate", "--help"], ["serve", "--help"], ["queues", "set", "--help"]):
        monkeypatch.setattr(sys, "argv", ["gpuloom", *args])
        with pytest.raises(SystemExit) as e:
            main()
        out = capsys.readouterr().out
        assert e.value.code == 0 and "--help" in out and "<bool>" not in out, args


def test_the_server_start_line(tmp_path: Path) -> None:
    from service_util import Server

    s = Server(tmp_path, "--cluster", "1x1", "--order", "srtf", "--log-level", "info").start()
    s.stop()
    line = next(x for x in (tmp_path / "serve.out").read_text().splitlines() if "serving gpuloom on" in x)
    assert "/docs; 1 node, 1 GPU; stages srtf/none/proportional/packed-sticky; store sqlite" in line, line
