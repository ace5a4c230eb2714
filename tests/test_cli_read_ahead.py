"""``gpuloom simulate`` reads a Philly list in a child process while its options are parsed
(:func:`gpuloom.cli.sim.read_ahead`): the same jobs as the reader's, taken only where the options ask that
file, every other case read as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuloom.cli import sim, simload
from gpuloom.sim.traces import load_trace
from test_simulate_bytes import EXPECTED, STACKS, digests, write_philly


@pytest.fixture(autouse=True)
def _none_left():  # noqa: ANN202
    yield
    sim.drop_read_ahead()


def started(*args: str) -> list[tuple[str, str | None]]:
    """The (path, format) keys :func:`read_ahead` started a child for, given ``gpuloom <args>``."""
    sim.read_ahead(["gpuloom", *args])
    return list(sim._AHEAD)


def test_the_jobs_read_ahead_are_the_readers(data_dir: Path) -> None:
    path = str(data_dir / "sia" / "philly_jobs.csv")
    assert started("simulate", "--cluster", "64x8", "--trace", path) == [(path, None)]
    jobs = sim._read_ahead(Path(path), None)
    assert jobs is not None and len(jobs) == 82_247
    assert jobs == load_trace(path)
    assert sim._AHEAD == {}  # (taken once)
    assert sim._read_ahead(Path(path), None) is None


def test_what_is_read_ahead(tmp_path: Path) -> None:
    p = str(write_philly(tmp_path / "philly.csv", 5))
    assert started("simulate", f"--trace={p}") == [(p, None)]
    sim.drop_read_ahead()
    assert started("simulate", "-t", p, "--format", "philly") == [(p, "philly")]
    sim.drop_read_ahead()
    assert started("simulate", "-t", p, "--format=auto", "--trace", p) == [(p, "auto")]
    sim.drop_read_ahead()
    # nothing: trace options, another format, another command, no such file, no trace, help
    for args in (["simulate", "-t", p, "-T", "pending=error"], ["simulate", "-t", p, "--trace-opt=a=b"],
                 ["simulate", "-t", p, "-f", "sia"], ["compare", "-t", p], ["simulate", "-t", str(tmp_path / "x")],
                 ["simulate", "--cluster", "4x4"], ["simulate", "-t", p, "--help"], ["simulate", "-t"]):
        assert started(*args) == [], args


def test_a_child_not_taken_is_ended(tmp_path: Path) -> None:
    p = str(write_philly(tmp_path / "philly.csv", 5))
    sim.read_ahead(["gpuloom", "simulate", "--trace", p])
    (child,) = sim._AHEAD.values()
    pid = child.pid
    assert pid is not None
    assert sim._read_ahead(Path(p), "philly") is None  # (another format asked: not taken)
    sim.drop_read_ahead()
    assert sim._AHEAD == {}
    with pytest.raises(ChildProcessError):  # (reaped)
        os.waitpid(pid, 0)


def test_not_a_philly_list_is_read_by_the_command(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("id,arrival,gpus,duration\na,0,1,60\nb,5,2,30\n")
    assert started("simulate", "--trace", str(p)) == [(str(p), None)]
    assert sim._read_ahead(p, None) is None


def main_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``gpuloom <args>`` through the program's entry (:func:`gpuloom.cli.main`): exit code and stderr."""
    from gpuloom.cli import main

    monkeypatch.setattr(sys, "argv", ["gpuloom", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("stack", ["fifo", "las-window"])
def test_the_program_writes_the_bytes_it_wrote_before(stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_philly(tmp_path / "philly.csv")
    taken: list[bool] = []
    take = simload._read_ahead

    def spied(path: Path, fmt: str | None) -> list | None:
        jobs = take(path, fmt)
        taken.append(jobs is not None)
        return jobs

    monkeypatch.setattr(simload, "_read_ahead", spied)  # where workload() calls it
    code, err = main_run(monkeypatch, capsys, "simulate", "--trace", str(trace), *STACKS[stack], "--no-plots",
                         "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert taken == [True]
    assert digests(tmp_path / "o", tmp_path) == EXPECTED[stack]
    assert sim._AHEAD == {}


def test_a_malformed_list_fails_as_the_reader_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_philly(tmp_path / "philly.csv", 6)  # (its sixth job, on line 7, asks 8 GPUs)
    trace.write_text(trace.read_text().replace(",8,", ",eight,", 1))
    code, err = main_run(monkeypatch, capsys, "simulate", "--trace", str(trace), "--no-plots",
                         "--out", str(tmp_path / "o"))
    assert code != 0
    assert err == "error: philly.csv:7: field 'num_gpus': expected a positive integer, got 'eight'\n"
    assert sim._AHEAD == {}


def test_what_the_run_imports_is_imported_while_the_child_reads(tmp_path: Path) -> None:
    p = str(write_philly(tmp_path / "philly.csv", 5))
    code = ("import sys\nfrom pathlib import Path\nfrom gpuloom.cli import sim\n"
            "later = ('numpy.random', 'gpuloom.sim.plots', 'gpuloom.cli.progress')\n"
            "before = [m in sys.modules for m in later]\n"
            f"sim.read_ahead(['gpuloom', 'simulate', '--trace', {p!r}])\n"
            f"jobs = sim._read_ahead(Path({p!r}), None)\n"
            "print(before, [m in sys.modules for m in later], len(jobs))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "[False, False, False] [True, True, True] 5"


@pytest.mark.parametrize("program", ["gpuloom", "/usr/local/bin/gpuloom", "python"])
def test_the_program_starts_reading_as_its_modules_load(tmp_path: Path, program: str) -> None:
    p = str(write_philly(tmp_path / "philly.csv", 5))
    code = ("import sys\n"
            f"sys.argv = [{program!r}, 'simulate', '--trace', {p!r}]\n"
            "import gpuloom.cli\n"
            "from gpuloom.cli import ahead, sim\n"
            "started = list(ahead._AHEAD)\n"
            "children = dict(ahead._AHEAD)\n"
            "ahead.read_ahead(sys.argv)  # (as main() does: not again)\n"
            "same = ahead._AHEAD == children\n"
            "jobs = sim._read_ahead(sys.modules['pathlib'].Path(sys.argv[3]), None)\n"
            "print(started, same, len(jobs))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first = out.stdout.split("\n")[0]
    if program.endswith("gpuloom"):  # (the program: started as gpuloom.cli loaded, not again)
        assert first == f"[('{p}', None)] True 5"
    else:  # (another program importing gpuloom.cli: started by main(), as before)
        assert first == "[] False 5"
