"""Shared fixtures.  Real data is found as the commands find it (``$GPULOOM_DATA``, else
``../shared/data`` beside the checkout: :mod:`gpuloom.perf.datadir`); tests that need it are
skipped where it is absent."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuloom.perf.datadir import data_dir as find_data
from gpuloom.perf.datadir import describe_search

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# The suite runs on several pytest-xdist workers (``-n``/``--dist loadgroup`` in pyproject's addopts).  The tests
# of each file below share one costly thing that a module- or session-scoped fixture starts once per worker, so
# they all go to one worker, in file order (every other test goes to whichever worker is free).
XDIST_GROUPS = {
    "test_slurm.py": "slurm",  # one test Slurm for the session (slurm_util.slurm_fixture)
    "test_slurm_steps.py": "slurm",  # the same one (its executors' names are each test's own)
    "test_ray.py": "ray",  # one fake 3-node Ray cluster for the module
    "test_docs.py": "docs",  # doc_runs starts every selected block of the session's items at once
    "test_service_postgres.py": "postgres",  # one PostgreSQL server for the module
}


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test goes in: its file's group, else the test alone."""
    group = XDIST_GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])
    return nodeid if group is None else f"group:{group}"


SERIAL_UNIT = "serial"
SERIAL_IDS = "serial-tests.json"  # in the directory the workers share: the serial and slow tests' node ids


def work_units(collection: list[str], serial: set[str], slow: frozenset[str] | set[str] = frozenset()
               ) -> list[tuple[str, list[str]]]:
    """The units of work in the order they are handed out: the largest first, then the tests marked ``slow``
    (minutes each: started late, one would end the suite alone on its worker), and every serial test outside a
    group in one last unit (a group's keep their file's order: its tests share state).  A serial test waits for
    every test running and no worker starts one meanwhile: handed out last, it waits only for the suite's tail."""
    units: dict[str, list[str]] = {}
    for nodeid in collection:
        scope = xdist_scope(nodeid)
        units.setdefault(SERIAL_UNIT if nodeid in serial and not scope.startswith("group:") else scope,
                         []).append(nodeid)
    last = units.pop(SERIAL_UNIT, [])
    # (stable: ties keep the collection's order)
    ordered = sorted(units.items(), key=lambda u: (-len(u[1]), not (len(u[1]) == 1 and u[1][0] in slow)))
    return ordered + ([(SERIAL_UNIT, last)] if last else [])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: write the serial and slow tests' node ids where the controller's scheduler reads them (it
    sees only node ids, not marks)."""
    if not hasattr(config, "workerinput"):
        return
    shared = config._tmp_path_factory.getbasetemp().parent
    tmp = shared / f"{SERIAL_IDS}.{config.workerinput['workerid']}"
    tmp.write_text(json.dumps({mark: [i.nodeid for i in items if i.get_closest_marker(mark) is not None]
                               for mark in ("serial", "slow")}))
    os.replace(tmp, shared / SERIAL_IDS)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups above (xdist's own reads ``xdist_group`` marks into node ids, which
    pytest 9 no longer lets it change), its units in :func:`work_units`' order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        scopes: dict[str, str]

        def _split_scope(self, nodeid: str) -> str:
            return self.scopes.get(nodeid) or xdist_scope(nodeid)

        def schedule(self) -> None:
            if self.collection is not None or not self._check_nodes_have_same_collection():
                super().schedule()  # (later calls; or a differing collection, which it reports)
                return
            # xdist's first schedule() with the units in our order, the rest as it does
            ids = config._tmp_path_factory.getbasetemp() / SERIAL_IDS
            marked = json.loads(ids.read_text()) if ids.exists() else {}
            self.collection = list(next(iter(self.registered_collections.values())))
            for scope, unit in work_units(self.collection, set(marked.get("serial", ())), set(marked.get("slow", ()))):
                self.scopes.update(dict.fromkeys(unit, scope))
                self.workqueue[scope] = dict.fromkeys(unit, False)
            for _ in range(max(0, len(self.nodes) - len(self.workqueue))):
                self.assigned_work.popitem()[0].shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()

    g = Groups(config, log)
    g.scopes = {}
    return g


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked ``serial`` (one that measures what this machine's cores do) runs while no other worker runs
    a test: it waits for the tests running to end, and no test starts until it has ended.  A test marked
    ``waits`` holds nothing: it only waits for work that holds the machine itself (:func:`hold_machine`)."""
    if item.get_closest_marker("waits") is not None:
        yield
        return
    with _machine(item.config, exclusive=item.get_closest_marker("serial") is not None):
        yield


def hold_machine(config: pytest.Config) -> Callable[[], None]:
    """Hold the machine shared (as a running test does) for work that outlives its test, such as each docs
    block a fixture starts; -> the function that releases it (call it once the work ends).  Called from a
    test that holds the machine, it can wait for ever on a serial test that waits for that test: call it
    from a thread of the work, with only ``waits`` tests waiting for it."""
    cm = _machine(config, exclusive=False)
    cm.__enter__()
    return lambda: cm.__exit__(None, None, None) and None


@contextlib.contextmanager
def _machine(config: pytest.Config, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock over the session's workers, from two lock files in the directory they share: every
    test holds ``tests.lock`` shared, a serial one exclusively; ``queue.lock``, taken before it, keeps the tests
    that come after a waiting serial one from starting (else it might wait for ever)."""
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing runs beside this test
        yield
        return
    shared = config._tmp_path_factory.getbasetemp().parent  # (a worker's own is <basetemp>/popen-gwN)
    queue = os.open(shared / "queue.lock", os.O_RDWR | os.O_CREAT, 0o600)
    tests = os.open(shared / "tests.lock", os.O_RDWR | os.O_CREAT, 0o600)
    _LOCK_FDS.update((queue, tests))
    try:
        fcntl.flock(queue, fcntl.LOCK_EX)
        fcntl.flock(tests, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(queue, fcntl.LOCK_UN)
        yield
    finally:
        _LOCK_FDS.difference_update((queue, tests))
        os.close(tests)  # (closing releases the locks)
        os.close(queue)


# A lock taken with flock belongs to the open file, which a forked child shares: a child that outlives its
# test (a test's own fork, a daemon) would hold the machine for ever. Forked children close their copies.
_LOCK_FDS: set[int] = set()


def _close_lock_fds_in_child() -> None:
    for fd in _LOCK_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _LOCK_FDS.clear()


os.register_at_fork(after_in_child=_close_lock_fds_in_child)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package's modules once, in the session's first process: every server, command and agent the
    tests start imports them, and where ``$PYTHONDONTWRITEBYTECODE`` is set nothing else writes them (each
    process would compile them anew)."""
    config.addinivalue_line("markers", "waits: holds nothing while it runs (tests/conftest.py)")
    if hasattr(config, "workerinput"):  # (an xdist worker: its controller did)
        return
    import compileall

    compileall.compile_dir(REPO / "src" / "gpuloom", quiet=1)
    if getattr(config.option, "numprocesses", None):
        _rewrite_test_modules_once(config)


def _rewrite_test_modules_once(config: pytest.Config) -> None:
    """Every xdist worker imports every test module, rewriting its asserts first (pytest's assertion rewriting:
    about half of a worker's collection), all at once on a fresh clone, and each anew where
    ``$PYTHONDONTWRITEBYTECODE`` keeps them from caching it.  The controller writes pytest's cache of each
    rewritten module once instead; the workers read it (pytest checks it against the source).  These are pytest's
    private functions: where they change, nothing is written and the workers rewrite as before."""
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for fn in sorted([*Path(__file__).parent.glob("test_*.py"), Path(__file__)]):
            pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(fn, pyc, state.trace) is None:
                pyc.parent.mkdir(parents=True, exist_ok=True)
                source_hash, co = rewrite._rewrite_test(fn, config)
                rewrite._write_pyc(state, co, source_hash, pyc)
    except Exception:  # (an optimisation only)
        pass


@pytest.fixture(scope="session")
def data_dir() -> Path:
    p = find_data()
    if p is None:
        pytest.skip(f"real data not found: looked in {describe_search()}")
    return p


# ---------------------------------------------------------------------------------------------
# make_view: a tiny, complete round input for testing a policy as a pure function
@pytest.fixture
def make_view():  # noqa: ANN201
    """``make_view(jobs=..., current=..., cluster=..., model=..., now=...)`` -> a policy ``View``:
    :func:`gpuloom.sim.contract.small_view` (a 2x4 cluster, the model ``simulate`` builds and six
    arrived jobs of 1-4 GPUs carrying what every registered policy may read)."""
    from gpuloom.sim.contract import small_view

    return small_view


@pytest.fixture(scope="session", autouse=True)
def _remove_job_dirs():  # noqa: ANN202
    """The services tests start (as root) put default checkpoint directories in
    ``$GPULOOM_JOB_DIR_BASE/gpuloom-ID`` (see ``runtime/service/security.py``): this session's go in a base
    of its own (servers the tests start inherit the variable), removed after the session, so two
    test sessions on one machine never remove each other's."""
    import os
    import shutil
    import tempfile

    from gpuloom.runtime.service.security import JOB_DIR_BASE, JOB_DIR_BASE_ENV

    # (not named gpuloom-*: sessions of an older checkout remove every new /var/tmp/gpuloom-* when they end)
    base = tempfile.mkdtemp(prefix="tests-gpuloom-", dir=JOB_DIR_BASE)
    os.chmod(base, 0o711)  # job accounts pass through to their own directories
    old = os.environ.get(JOB_DIR_BASE_ENV)
    os.environ[JOB_DIR_BASE_ENV] = base
    yield
    if old is None:
        os.environ.pop(JOB_DIR_BASE_ENV, None)
    else:
        os.environ[JOB_DIR_BASE_ENV] = old
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """A test whose fixtures have all ended must leave none of the project's non-daemon threads running (see
    tests/thread_guard.py): torn down after every other function-scoped fixture, so theirs count too."""
    from thread_guard import no_leaked_threads

    with no_leaked_threads():
        yield


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``tmpfs(name, size)``: a fresh tmpfs of ``size`` mounted at ``tmp_path/name``, unmounted afterwards
    (needs root: the full-disk tests)."""
    mounted: list[Path] = []

    def _mount(name: str, size: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(d)], check=True)
        mounted.append(d)
        return d

    yield _mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    """A cgroup parent of the test's own for its jobs (a fresh name), removed after the test."""
    from service_util import own_cgroup_parent

    yield from own_cgroup_parent()


@pytest.fixture
def os_users() -> Iterator[list[str]]:
    """Two fresh OS accounts (root only), deleted afterwards."""
    import os

    if os.geteuid() != 0:
        pytest.skip("creating OS accounts needs root")
    names = [f"gl{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for n in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", n], check=True, capture_output=True)
    yield names
    for n in names:
        subprocess.run(["userdel", n], capture_output=True)


# ---------------------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``server(*args)``: ``gpuloom serve *args`` started with its state in ``tmp_path``; every server made
    is stopped, and the jobs under ``tmp_path`` killed, after the test."""
    from service_util import Server, kill_jobs

    servers: list[Server] = []

    def make(*args: str) -> Server:
        s = Server(tmp_path, *args).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
    kill_jobs(tmp_path)


# ---------------------------------------------------------------------------------------------
# the browser tests: a headless Chromium, and where their screenshots go
@pytest.fixture
def browser() -> Iterator[Any]:
    """The system's Chromium, headless, driven by playwright; the test is skipped, loudly, where there is
    no Chromium (``apt-get install chromium``, or ``$GPULOOM_CHROMIUM``) or no playwright."""
    import warnings

    from service_util import CHROMIUM, CHROMIUM_ARGS

    if CHROMIUM is None:
        msg = ("!!! BROWSER TEST SKIPPED: no Chromium found (apt-get install chromium, or set GPULOOM_CHROMIUM); "
               "the dashboard was NOT tested in a browser !!!")
        warnings.warn(msg, stacklevel=2)
        pytest.skip(msg)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("!!! BROWSER TEST SKIPPED: the playwright package is missing (pip install -e '.[test]') !!!")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``$GPULOOM_SCREENSHOTS`` (``docs/img`` refreshes the docs' ones), else the test's
    directory."""
    import os

    d = Path(os.environ.get("GPULOOM_SCREENSHOTS") or tmp_path / "shots")
    d.mkdir(parents=True, exist_ok=True)
    return d
