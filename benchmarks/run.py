"""Run every benchmark (or those named): ``python benchmarks/run.py [core synergy ...]``.

Each ``benchmarks/bench_<name>.py`` defines ``main()`` and prints its own table.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def main(argv: list[str]) -> int:
    files = sorted(HERE.glob("bench_*.py"))
    wanted = set(argv)
    for f in files:
        name = f.stem.removeprefix("bench_")
        if wanted and name not in wanted:
            continue
        print(f"\n=== {name} ===", flush=True)
        spec = importlib.util.spec_from_file_location(f.stem, f)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        t0 = time.perf_counter()
        saved, sys.argv = sys.argv, [str(f)]  # each benchmark runs with its own defaults
        try:
            mod.main()
        finally:
            sys.argv = saved
        print(f"--- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
