"""The suite's own parallel run (tests/conftest.py): the tests of a grouped file share one xdist worker, the
others spread over the workers, and a test marked ``serial`` runs while no other test runs on any worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import work_units, xdist_scope

REPO = Path(__file__).resolve().parents[1]

# each test writes when it ran and on which worker
RECORD = '''
import json, os, time
from pathlib import Path


def record(name: str, seconds: float) -> None:
    t0 = time.monotonic()
    time.sleep(seconds)
    Path(os.environ["SPANS"], name).write_text(json.dumps([t0, time.monotonic(), os.environ["PYTEST_XDIST_WORKER"]]))
'''
# a file of the Slurm group (named as the suite's is): four tests of 0.2 s, the first starting 6 s of work
# that outlives it (as the docs blocks do), holding the machine until it ends
GROUPED = '''
import threading

import pytest
from conftest import hold_machine
from record import record


def test_starts_work_that_outlives_it(request: pytest.FixtureRequest) -> None:
    release = hold_machine(request.config)
    threading.Thread(target=lambda: (record("held", 6.0), release())).start()


@pytest.mark.parametrize("i", range(4))
def test_grouped(i: int) -> None:
    record(f"grouped{i}", 0.2)
'''
# a file of the docs group (named as the suite's is): a fixture starts four blocks of 3 s, one after another, each
# holding the machine while it runs (as tests/test_docs.py's do); its tests only wait for them, the first for the
# last block (as a docs test waits for its block behind the slow ones): were they to hold the machine meanwhile,
# a serial test would wait for the first test, which waits for a block that waits for the serial test
BLOCKS = '''
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import hold_machine
from record import record


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest):
    pool = ThreadPoolExecutor(1)

    def held(i: int) -> None:
        release = hold_machine(request.config)
        try:
            record(f"block{i}", 3.0)
        finally:
            release()

    yield [pool.submit(held, i) for i in range(4)]
    pool.shutdown(wait=True)


@pytest.mark.waits
@pytest.mark.parametrize("i", range(4))
def test_block(i: int, runs) -> None:
    runs[3 - i].result()
'''
# four tests of 1.5 s, and a serial one of 0.5 s
OTHERS = '''
import pytest
from record import record


@pytest.mark.parametrize("i", range(4))
def test_ordinary(i: int) -> None:
    record(f"ordinary{i}", 1.5)


@pytest.mark.serial
def test_alone() -> None:
    record("serial", 0.5)
'''
# the suite's conftest.py, loaded as it is, for its scheduler and its serial marker
CONFTEST = f'''
import importlib.util

_spec = importlib.util.spec_from_file_location("suite_conftest", {str(REPO / "tests" / "conftest.py")!r})
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_xdist_make_scheduler = _suite.pytest_xdist_make_scheduler
pytest_runtest_protocol = _suite.pytest_runtest_protocol
pytest_collection_modifyitems = _suite.pytest_collection_modifyitems
hold_machine = _suite.hold_machine
'''


def test_xdist_scope_is_the_files_group_else_the_test() -> None:
    assert xdist_scope("tests/test_slurm.py::test_a[x-1]") == "group:slurm"
    assert xdist_scope("tests/test_docs.py::test_doc_block[README.md:12]") == "group:docs"
    assert xdist_scope("tests/test_sim.py::test_a") == "tests/test_sim.py::test_a"


def test_serial_tests_outside_a_group_go_last_in_one_unit() -> None:
    collection = ["t/test_a.py::s1", "t/test_ray.py::r1", "t/test_ray.py::rs", "t/test_ray.py::r2", "t/test_a.py::x",
                  "t/test_b.py::s2", "t/test_b.py::y"]
    serial = {"t/test_a.py::s1", "t/test_ray.py::rs", "t/test_b.py::s2"}
    assert work_units(collection, serial) == [
        ("group:ray", ["t/test_ray.py::r1", "t/test_ray.py::rs", "t/test_ray.py::r2"]),
        ("t/test_a.py::x", ["t/test_a.py::x"]),
        ("t/test_b.py::y", ["t/test_b.py::y"]),
        ("serial", ["t/test_a.py::s1", "t/test_b.py::s2"]),
    ]
    assert work_units(collection[4:5], set()) == [("t/test_a.py::x", ["t/test_a.py::x"])]


def test_slow_tests_outside_a_group_go_right_after_the_groups() -> None:
    # a slow test collected last starts before the other lone tests, not as the suite's tail; a slow test of a
    # group stays in its group, and a slow serial test still waits for the end
    collection = ["t/test_a.py::x", "t/test_ray.py::r1", "t/test_ray.py::r2", "t/test_b.py::y", "t/test_c.py::long",
                  "t/test_c.py::alone"]
    slow = {"t/test_c.py::long", "t/test_ray.py::r2", "t/test_c.py::alone"}
    assert work_units(collection, {"t/test_c.py::alone"}, slow) == [
        ("group:ray", ["t/test_ray.py::r1", "t/test_ray.py::r2"]),
        ("t/test_c.py::long", ["t/test_c.py::long"]),
        ("t/test_a.py::x", ["t/test_a.py::x"]),
        ("t/test_b.py::y", ["t/test_b.py::y"]),
        ("serial", ["t/test_c.py::alone"]),
    ]


def inner_run(tmp_path: Path, workers: int, files: dict[str, str]) -> dict[str, list]:
    """Run ``files`` (test files by name) in an inner session of ``workers`` workers with the suite's conftest;
    -> the spans each test recorded, by name."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n    waits: holds nothing\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "record.py").write_text(RECORD)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    spans = tmp_path / "spans"
    spans.mkdir()
    env = dict(os.environ, SPANS=str(spans),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src"), str(REPO / "tests")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist",
                        "loadgroup", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return {p.name: json.loads(p.read_text()) for p in spans.iterdir()}


def test_a_group_shares_a_worker_and_a_serial_test_runs_alone(tmp_path: Path) -> None:
    got = inner_run(tmp_path, 3, {"test_slurm.py": GROUPED, "test_others.py": OTHERS, "test_docs.py": BLOCKS})
    assert len(got) == 14
    assert len({got[f"grouped{i}"][2] for i in range(4)}) == 1  # the group: one worker
    s0, s1, _ = got.pop("serial")
    assert [k for k, (a, b, _) in got.items() if a < s1 and s0 < b] == []  # nothing ran beside the serial test
    # the blocks started at once held the machine one at a time: the serial test waited for the one running,
    # not for all four (which take 12 s)
    assert any(got[f"block{i}"][0] >= s1 for i in range(4)), (s0, s1, {f"block{i}": got[f"block{i}"] for i in range(4)})
    for i in range(4):
        del got[f"block{i}"]
    del got["held"]  # (work held while the tests start: the serial test waited for it, as the check above says)
    ordinary = sorted(got[f"ordinary{i}"] for i in range(4))
    # and the others ran side by side, on more than one worker
    assert len({w for _, _, w in ordinary}) > 1
    assert any(ordinary[i + 1][0] < ordinary[i][1] for i in range(len(ordinary) - 1)), ordinary


# one test of 4 s, a serial test collected right after it, and six of 0.3 s
LONG = '''
import pytest
from record import record


def test_long() -> None:
    record("long", 4.0)


@pytest.mark.serial
def test_serial() -> None:
    record("serial", 0.2)


@pytest.mark.parametrize("i", range(6))
def test_short(i: int) -> None:
    record(f"short{i}", 0.3)
'''


def test_a_serial_test_does_not_hold_back_the_other_workers_while_a_long_test_runs(tmp_path: Path) -> None:
    got = inner_run(tmp_path, 2, {"test_long.py": LONG})
    assert len(got) == 8
    s0, s1, _ = got.pop("serial")
    assert [k for k, (a, b, _) in got.items() if a < s1 and s0 < b] == []  # it still ran alone
    # the other worker ran short tests beside the long one (the serial test, handed out second, held every worker
    # back until the long test ended; the long test's worker has one short test queued behind it)
    long0, long1, w = got.pop("long")
    assert len([k for k, (a, _, v) in got.items() if v != w and a < long1]) >= 4, (long0, long1, w, got)


# a test whose forked child outlives it by 12 s (as an abandoned child of the code under test may), then a serial
# test, in that order on one worker (a file of the Slurm group): a lock the child shared with its test's worker
# would hold the serial test back until the child ended
FORKS = '''
import os, time

import pytest
from record import record


def test_forks_a_child_that_outlives_it() -> None:
    record("fork", 0.0)
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(12)
        os._exit(0)


@pytest.mark.serial
def test_serial() -> None:
    record("serial", 0.1)
'''


def test_a_forked_child_that_outlives_its_test_does_not_hold_the_machine(tmp_path: Path) -> None:
    got = inner_run(tmp_path, 2, {"test_slurm.py": FORKS})
    assert got["serial"][0] - got["fork"][1] < 6, got  # (held back, it would start 12 s after the fork)


def test_no_test_of_a_grouped_file_is_serial() -> None:
    """A serial test in a group runs when its group's worker reaches it, mid-run: it waits for every test then
    running on the other workers (a whole-Philly test, the minute of a Slurm step limit), and none of them starts
    one meanwhile, so the machine drains for it.  Outside a group it goes to the suite's end (work_units)."""
    from conftest import XDIST_GROUPS

    marked = [f for f in XDIST_GROUPS if "pytest.mark.serial" in (REPO / "tests" / f).read_text()]
    assert marked == [], f"serial tests in grouped files: {marked}"
