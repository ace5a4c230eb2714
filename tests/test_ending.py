"""The ``gpuloom`` program ends without freeing a simulation's objects one by one (gpuloom.cli.ending)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# an object that says when it is freed, kept for the process's end
KEPT = """
import atexit, sys
from gpuloom.cli.ending import exit_without_teardown, keep_until_exit
class Noisy:
    def __del__(self, say=sys.stdout.write):
        say("freed\\n")
keep_until_exit(Noisy())
atexit.register(lambda: print("atexit handler"))
print("buffered", end="")  # (stdout is a pipe: block-buffered until flushed)
"""


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                          check=False)


def test_the_process_ends_flushed_and_its_exit_handlers_run_but_nothing_is_freed() -> None:
    r = _python(KEPT + "exit_without_teardown(3)\nprint('not reached')\n")
    assert (r.returncode, r.stdout, r.stderr) == (3, "bufferedatexit handler\n", "")
    # a normal exit frees it (what the test tells apart)
    r = _python(KEPT + "sys.exit(3)\n")
    assert r.returncode == 3 and "freed" in r.stdout


def test_a_thread_still_running_gets_the_normal_exit() -> None:
    r = _python(KEPT + "import threading, time\nthreading.Thread(target=time.sleep, args=(0.5,)).start()\n"
                "exit_without_teardown(3)\nprint(' returned')\nsys.exit(4)\n")
    assert r.returncode == 4 and r.stdout.startswith("buffered returned\n") and "freed" in r.stdout


# gpuloom simulate, as the program runs it: a run's result says when it is freed
SIMULATE = """
import sys
from gpuloom.sim.metrics import RunResult
RunResult.__del__ = lambda self, say=sys.stderr.write: say("result freed\\n")  # (no name to look up then)
from gpuloom.cli import {fn}
sys.argv = ["gpuloom", "simulate", "--generate", "30", "--cluster", "2x4", "--no-plots", "--out", {out!r}]
{fn}()
"""


@pytest.mark.parametrize("fn", ["entry", "main"])
def test_simulate_ends_the_program_without_freeing_its_run(fn: str, tmp_path: Path) -> None:
    r = _python(SIMULATE.format(fn=fn, out=str(tmp_path / "o")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith(f"report: {tmp_path / 'o' / 'report.md'}\n")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "gpuloom-run.json", "jobs.csv", "report.md", "report.txt", "series.csv", "summary.json"]
    # the program (entry) frees nothing; main, run in process, returns, and its run is freed as usual
    assert ("result freed" in r.stderr) == (fn == "main"), r.stderr
