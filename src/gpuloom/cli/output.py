"""Where a command's results go, and the command line they record.

Output folders.  Without ``--out``, each run of ``simulate``, ``compare``,
``reproduce``, ``validate`` or ``elastic`` gets a folder of its own,
``gpuloom-out/<command>-<label>-<YYYYmmdd-HHMMSS>/`` (``-2``, ``-3``... when
two runs start in the same second), and ``gpuloom-out/latest`` links to the
newest, so no run ever overwrites or mixes with another.  ``--out DIR`` writes
exactly ``DIR``: a new or empty folder, or one holding only an earlier gpuloom
run's files, which are removed first (the files it listed in its
``gpuloom-run.json``, nothing else); a folder holding anything else is refused
before the run starts, so ``--out`` never deletes a file gpuloom did not write.
Every folder gets ``gpuloom-run.json``: the command, the gpuloom version, when
it started, its wall time and the files it wrote.

The command line a result records is rebuilt from the parsed arguments of the
running command (click's context), never from ``sys.argv``: a command run
inside another program (a test, a notebook, ``CliRunner``) records itself, not
its host's arguments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

try:  # recent typer vendors click; older ones use the click package
    from typer._click import core as _core
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover
    from click import core as _core  # type: ignore[no-redef]
    from click.globals import get_current_context  # type: ignore[no-redef]

from .common import OptionError, console, plain

ROOT = Path("gpuloom-out")
MANIFEST = "gpuloom-run.json"
LATEST = "latest"
OUT_HELP = ("Output folder, written exactly (an earlier gpuloom run's files in it are replaced; other files: "
            "refused); default: a new gpuloom-out/<command>-<label>-<time>/, linked as gpuloom-out/latest.")


def report_line(path: Path) -> None:
    """The last line a command prints: where its report is (control characters in the path shown as ``?``)."""
    console.print(f"report: {plain(path)}", highlight=False, markup=False, soft_wrap=True)


# the command's start (perf_counter time): the process's, when run as ``gpuloom`` (:func:`gpuloom.cli.main`)
_started: list[float] = []


@contextmanager
def mark_process_start() -> Iterator[None]:
    """Within: count a command's wall time from the start of this process (interpreter start-up and
    imports included: what a person timing ``gpuloom ...`` sees)."""
    _started[:] = [time.perf_counter() - process_age()]
    try:
        yield
    finally:
        _started.clear()


def process_age() -> float:
    """Seconds since this process started: on Linux ``/proc/uptime`` less the start tick in ``/proc/self/stat``
    (both on the clock since boot, to a tick), without importing psutil; elsewhere psutil's ``create_time``
    (whole seconds of boot time plus the start tick: it may read up to a second long); 0 where neither answers."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - start)
    except (OSError, ValueError, IndexError):
        import psutil

        try:
            return max(0.0, time.time() - psutil.Process().create_time())
        except psutil.Error:
            return 0.0


def command_wall_s(default_start: float) -> float:
    """Seconds since the command began: since the process started (:func:`mark_process_start`), else since
    ``default_start`` (a command run in-process, by a test or another program)."""
    return time.perf_counter() - (_started[0] if _started else default_start)


# -- the command line ---------------------------------------------------------------------------
_GIVEN = {_core.ParameterSource.COMMANDLINE, _core.ParameterSource.ENVIRONMENT, _core.ParameterSource.PROMPT}


def _long(opts: list[str]) -> str:
    longs = [o for o in opts if o.startswith("--")]
    return longs[0] if longs else opts[0]


def _words(ctx: Any) -> list[str]:
    """The arguments given to ``ctx``'s command, in the order it declares them (arguments first)."""
    args: list[str] = []
    opts: list[str] = []
    for p in ctx.command.params:
        if p.name not in ctx.params or ctx.get_parameter_source(p.name) not in _GIVEN:
            continue
        v = ctx.params[p.name]
        if getattr(p, "param_type_name", "") == "argument":
            args += [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
            continue
        name = _long(p.opts)
        if getattr(p, "is_flag", False) and isinstance(v, bool):
            if v:
                opts.append(name)
            elif p.secondary_opts:
                opts.append(_long(p.secondary_opts))
        elif getattr(p, "multiple", False):
            for x in v or ():
                opts += [name, *([str(y) for y in x] if isinstance(x, tuple) else [str(x)])]
        elif isinstance(v, tuple):
            opts += [name, *(str(x) for x in v)]
        elif v is not None:
            opts += [name, str(v)]
    return args + opts


def command_line() -> str | None:
    """``gpuloom <command> <the arguments given>`` of the running command, quoted for a shell;
    None outside a command."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    chain = []
    while ctx is not None and ctx.parent is not None:  # the root (``gpuloom``) has no parent
        chain.append(ctx)
        ctx = ctx.parent
    words = ["gpuloom"]
    for c in reversed(chain):
        words += [c.info_name or "", *_words(c)]
    return shlex.join(words)


# -- output folders -----------------------------------------------------------------------------
def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_.")
    return s[:limit].rstrip("_.") or "run"


class Output:
    """One command's output folder (see the module docstring).

    Make it before the run (``--out`` is checked then, so a refused folder costs no run time),
    :meth:`create` the folder when there is something to write, :meth:`finish` at the end.
    """

    def __init__(self, command: str, out: Path | None, root: Path = ROOT) -> None:
        self.command = command
        self.out = out
        self.root = root
        self.started = time.perf_counter()
        self.started_at = datetime.now()
        self.cmd = command_line()
        self.path: Path | None = None
        self._old: list[Path] = []
        if out is not None:
            self._old = self._earlier_files(out)

    @staticmethod
    def _earlier_files(out: Path) -> list[Path]:
        """The files of the earlier gpuloom run in ``out`` (to remove); an error if ``out`` holds others."""
        if not out.exists():
            return []
        if not out.is_dir():
            raise OptionError(f"--out {out}: not a folder")
        present = sorted(p for p in out.rglob("*") if not p.is_dir())
        if not present:
            return []
        listed: set[str] = set()
        manifest = out / MANIFEST
        if manifest.is_file():
            try:
                doc = json.loads(manifest.read_text())
                listed = {str(f) for f in doc.get("files", [])} | {MANIFEST}
            except (ValueError, AttributeError, TypeError):
                listed = set()
        foreign = [p for p in present if p.relative_to(out).as_posix() not in listed]
        if foreign:
            shown = ", ".join(p.relative_to(out).as_posix() for p in foreign[:3])
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            why = ("files an earlier gpuloom run did not write" if listed
                   else f"files and no {MANIFEST} of an earlier gpuloom run")
            raise OptionError(f"--out {out} holds {why} ({shown}{more}); gpuloom replaces only its own earlier "
                              "results: give a new or empty folder, or leave out --out for a folder of its own")
        return present

    def create(self, label: str = "") -> Path:
        """The folder, made (``--out``: the earlier run's files removed first); idempotent."""
        if self.path is not None:
            return self.path
        if self.out is not None:
            for p in self._old:
                p.unlink(missing_ok=True)
            for d in sorted({q for p in self._old for q in p.parents if self.out in q.parents}, reverse=True):
                try:
                    d.rmdir()  # only folders the earlier run's files left empty
                except OSError:
                    pass
            self.out.mkdir(parents=True, exist_ok=True)
            self.path = self.out
            return self.path
        stamp = self.started_at.strftime("%Y%m%d-%H%M%S")
        base = "-".join(x for x in (self.command, _slug(label) if label else "", stamp) if x)
        self.root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            p = self.root / (base if n == 1 else f"{base}-{n}")
            try:
                p.mkdir()
            except FileExistsError:
                continue
            self.path = p
            return p
        raise OptionError(f"{self.root}: too many runs named {base}")

    def wall_s(self) -> float:
        """Seconds since the command began."""
        return command_wall_s(self.started)

    def finish(self, extra: dict[str, Any] | None = None) -> Path:
        """Write ``gpuloom-run.json`` (listing every file in the folder) and point ``latest`` at a default folder."""
        from .. import __version__

        path = self.create()
        files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if not p.is_dir() and p.name != MANIFEST)
        doc = {"command": self.cmd, "gpuloom_version": __version__,
               "started": self.started_at.isoformat(timespec="seconds"), "wall_time_s": self.wall_s(),
               **(extra or {}), "files": files}
        (path / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
        if self.out is None:
            self._link_latest(path)
        return path

    def _link_latest(self, path: Path) -> None:
        link = self.root / LATEST
        tmp = self.root / f".{LATEST}.{os.getpid()}"
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(path.name, target_is_directory=True)
            os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
        except OSError:  # no symbolic links here (some file systems): the printed path says where
            tmp.unlink(missing_ok=True)
