"""Every command in README.md and docs/*.md runs as written.

Which blocks run.  Fenced blocks whose language is ``bash``/``sh``/``shell``
are commands; ``python`` blocks are programs.  Blocks in other languages
(``toml``, ``yaml``, ``csv``, ``json``, none) are not run, and must not hold
``gpuloom`` commands (:func:`test_no_command_hides_outside_a_run_block`).  An
HTML comment on the line before a block (invisible when rendered) marks it:

* ``<!-- no-run: reason -->``: not run; the reason is required and kept few
  (installing packages; the test suite itself);
* ``<!-- slow -->``: marked ``@pytest.mark.slow`` (plain ``pytest`` still runs it).

How they run.  Each block gets a fresh copy of the checkout (without ``.git``
and the virtual environment) with ``../shared/data`` beside it, a symlink to
the real data; commands start in the copy's root, as a user who just cloned
would type them, with ``gpuloom`` and ``python`` of the interpreter running
the tests first on ``PATH`` (an activated environment) and no
``$GPULOOM_DATA``: the commands find ``../shared/data`` on their own.  A
command block runs line by line (a ``\\`` continues a line) under ``bash -e -o
pipefail``; every line must exit 0.  A line ending in ``&`` (``gpuloom serve
... &``) starts in the background, and the next line waits until the server
answers, as a person would; ``$GPULOOM_STATE_DIR`` and ``$GPULOOM_PORT=0``
keep each block's server, its state and its port apart from any other.  At
the end of a block the server and any job process it left are stopped.
Blocks that read ``../shared/data`` are skipped where the data is absent.

The blocks run concurrently (one thread per core, slow ones first) from the
moment the first of them is asked for; each test waits for its own block.
Each block holds the machine while it runs, as a test does: a ``serial`` test
waits for the blocks running, not for every block (``tests/conftest.py``).

``python tests/test_docs.py`` lists the commands the tests run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import hold_machine

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"bash", "sh", "shell"}
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)")
MARK = re.compile(r"^<!--\s*(no-run|slow)\s*(?::\s*(.*?))?\s*-->\s*$")
LINE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    no_run: str | None = None
    slow: bool = False

    @property
    def key(self) -> str:
        return f"{self.path.relative_to(REPO).as_posix()}:{self.line}"

    @property
    def needs_data(self) -> bool:
        return "shared/data" in self.text

    def commands(self) -> list[str]:
        """Logical lines: ``\\`` continuations joined; blank lines and comment lines dropped."""
        out: list[str] = []
        cur = ""
        for raw in self.text.splitlines():
            if cur:
                cur += " " + raw.strip()
            else:
                cur = raw.strip()
            if cur.endswith("\\"):
                cur = cur[:-1].rstrip()
                continue
            if cur and not cur.startswith("#"):
                out.append(cur)
            cur = ""
        if cur and not cur.startswith("#"):
            out.append(cur)
        return out


def doc_blocks(paths: list[Path] = DOCS) -> list[Block]:
    blocks = []
    for path in paths:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            fence, lang = m.group(1), m.group(2).lower()
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].startswith(fence):
                j += 1
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            mark = MARK.match(prev.strip())
            no_run = slow = None
            if mark and mark.group(1) == "no-run":
                no_run = mark.group(2) or ""
            if mark and mark.group(1) == "slow":
                slow = True
            blocks.append(Block(path, start + 1, lang, "\n".join(lines[start + 1 : j]), no_run, bool(slow)))
            i = j + 1
    return blocks


BLOCKS = doc_blocks()
RUNNABLE = [b for b in BLOCKS if b.lang in RUN_LANGS | {"python"} and b.no_run is None]


def strip_comment(cmd: str) -> str:
    """``cmd`` without a trailing shell comment (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            return cmd[:i].rstrip()
    return cmd


def data_dir() -> Path:
    """The data the blocks get as ``../shared/data``: where the commands would find it from the checkout."""
    from gpuloom.perf.datadir import data_dir as find_data

    return find_data(cwd=REPO) or REPO.parent / "shared" / "data"


# -- running one block ------------------------------------------------------------------
@dataclass
class Outcome:
    ok: bool
    log: str
    seconds: float


def _copy_checkout(dst: Path) -> Path:
    repo = dst / "repo"
    shutil.copytree(REPO, repo, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", ".mypy_cache",
        ".hypothesis", "gpuloom-out", "results", "*.db", "*.db-wal", "*.db-shm"))
    (dst / "shared").mkdir()
    if data_dir().is_dir():
        (dst / "shared" / "data").symlink_to(data_dir().resolve())
    return repo


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPULOOM_DATA", "GPULOOM_URL", "GPULOOM_TOKEN", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["GPULOOM_STATE_DIR"] = str(root / "state")
    env["GPULOOM_PORT"] = "0"
    env["HOME"] = str(root / "home")
    env["MPLBACKEND"] = "Agg"
    env["COLUMNS"] = "200"
    (root / "home").mkdir(exist_ok=True)
    return env


def _wait_for_server(root: Path, proc: subprocess.Popen, deadline: float) -> str:
    server = root / "state" / "server.json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"background command exited with {proc.returncode}"
        if server.exists():
            try:
                url = json.loads(server.read_text())["url"]
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        return ""
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.1)
    return "background server did not answer within its time"


def _stop(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything left in its process group (it leads a session of its own)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; members of its group may not be
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)


def _reap_jobs(root: Path) -> None:
    """Stop job processes a block's server launched (they run in sessions of their own, in the copy)."""
    import psutil

    me = os.getpid()
    for p in psutil.process_iter(["pid", "cwd"]):
        try:
            if p.info["pid"] != me and p.info["cwd"] and Path(p.info["cwd"]).is_relative_to(root):
                p.kill()
        except (psutil.Error, ValueError):
            pass


def run_block(block: Block, root: Path) -> Outcome:
    t0 = time.monotonic()
    repo = _copy_checkout(root)
    env = _env(root)
    log: list[str] = []
    background: list[subprocess.Popen] = []
    ok = True
    try:
        if block.lang == "python":
            script = root / "block.py"
            script.write_text(block.text + "\n")
            log.append(f"$ python {block.key}")
            r = subprocess.run([sys.executable, str(script)], cwd=repo, env=env, capture_output=True, text=True,
                               timeout=LINE_TIMEOUT)
            log.append(r.stdout + r.stderr)
            ok = r.returncode == 0
        else:
            for n, cmd in enumerate(block.commands()):
                log.append(f"$ {cmd}")
                code = strip_comment(cmd)
                out_path = root / f"line-{n}.log"
                if code.endswith("&") and not code.endswith("&&"):
                    with open(out_path, "w") as out:
                        proc = subprocess.Popen(["bash", "-c", code[:-1]], cwd=repo, env=env, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
                    background.append(proc)
                    err = _wait_for_server(root, proc, time.monotonic() + 120)
                    if err:
                        log.append(err + ":\n" + out_path.read_text())
                        ok = False
                        break
                    continue
                # output to a file, not a pipe, and the line's own process group: whatever it leaves
                # behind cannot hold the test up, and is stopped when the line ends
                with open(out_path, "w") as out:
                    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", cmd], cwd=repo, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
                    try:
                        rc = proc.wait(LINE_TIMEOUT)
                    finally:
                        _stop(proc)
                log.append(out_path.read_text() + (f"[exit {rc}]" if rc else ""))
                if rc != 0:
                    ok = False
                    break
    except subprocess.TimeoutExpired as e:
        log.append(f"timed out after {e.timeout} s")
        ok = False
    finally:
        for proc in background:
            _stop(proc)
        if background:
            _reap_jobs(root)
    return Outcome(ok, "\n".join(log), time.monotonic() - t0)


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def doc_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Start every selected block at once (slow ones first); yield ``{key: Future[Outcome]}``."""
    selected = {item.callspec.params["block"].key for item in request.session.items
                if getattr(item, "originalname", "") == "test_doc_block" and hasattr(item, "callspec")}
    todo = [b for b in RUNNABLE if b.key in selected and not (b.needs_data and not data_dir().is_dir())]
    todo.sort(key=lambda b: not b.slow)
    pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2))

    def held(block: Block, root: Path) -> Outcome:
        """A block runs beside the session's other tests, holding the machine as a test does: a serial test
        waits for the blocks running, and the next ones wait for it."""
        release = hold_machine(request.config)
        try:
            return run_block(block, root)
        finally:
            release()

    futures = {b.key: pool.submit(held, b, tmp_path_factory.mktemp("doc")) for b in todo}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.waits  # (its block holds the machine while it runs)
@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.key, marks=[pytest.mark.slow] if b.slow else []) for b in RUNNABLE])
def test_doc_block(block: Block, doc_runs: dict[str, Future[Outcome]]) -> None:
    if block.needs_data and not data_dir().is_dir():
        pytest.skip(f"real data not found at {data_dir()}")
    outcome = doc_runs[block.key].result()
    assert outcome.ok, f"{block.key} failed:\n{outcome.log[-6000:]}"


def test_no_command_hides_outside_a_run_block() -> None:
    """Commands live in run blocks (or in a few no-run blocks that say why)."""
    for b in BLOCKS:
        if b.lang not in RUN_LANGS | {"python"}:
            assert not re.search(r"^\s*(gpuloom|python3?) ", b.text, re.M), \
                f"{b.key}: a command in a ```{b.lang or '(no language)'} block: tag it bash (or no-run, with a reason)"
        if b.no_run is not None:
            assert b.no_run.strip(), f"{b.key}: <!-- no-run --> needs a reason"
    # the README's install and test commands, and a Ray and a Slurm cluster of several machines
    assert len([b for b in BLOCKS if b.no_run is not None]) <= 4, "keep no-run blocks few"


def test_blocks_are_found() -> None:
    keys = {b.key for b in RUNNABLE}
    assert {"README.md", "docs/service.md", "docs/reports.md"} <= {k.split(":")[0] for k in keys}
    b = Block(REPO / "x.md", 1, "bash", "gpuloom a \\\n  --b 1   # c\n# comment\n\ngpuloom d &\n")
    assert b.commands() == ["gpuloom a --b 1   # c", "gpuloom d &"]
    assert strip_comment("gpuloom serve &   # a 'note'") == "gpuloom serve &"
    assert strip_comment("echo '# not a comment' x#y") == "echo '# not a comment' x#y"


def test_markers_are_read(tmp_path: Path) -> None:
    md = tmp_path / "m.md"
    md.write_text("text\n\n<!-- no-run: installs things -->\n```bash\npip install x\n```\n"
                  "<!-- slow -->\n\n```bash\ngpuloom simulate\n```\n```toml\na = 1\n```\n")
    a, b, c = doc_blocks([md])
    assert (a.no_run, a.slow, b.no_run, b.slow, c.lang) == ("installs things", False, None, True, "toml")


if __name__ == "__main__":  # list what the tests run
    for b in BLOCKS:
        if b.lang in RUN_LANGS | {"python"}:
            tag = f"  [not run: {b.no_run}]" if b.no_run is not None else ("  [slow]" if b.slow else "")
            print(f"{b.key} ({b.lang}){tag}")
            cmds = b.commands() if b.lang != "python" else [f"python <<EOF ({len(b.text.splitlines())} lines) EOF"]
            for c in cmds:
                print(f"    {c}")
