"""What the stored time series cost: writing a day of 2 s samples, and reading ranges back.

``python benchmarks/run.py series`` (SQLite in a temporary directory): 43,200 points (24 h at one
per 2 s, each with six queues) written as the service writes them (five a transaction, not
fsynced one by one), then the dashboard's reads: 1 h at 12 s a point over the fine points, 24 h
at 288 s over the fine points, and 24 h at 300 s over the stored 5-minute means.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from gpuloom.runtime.service.series import SeriesRecorder, downsample
from gpuloom.runtime.state.store import Store

T0 = 1_800_000_000.0
POINTS = 43_200


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'db.sqlite'}")
        rec = SeriesRecorder(store, 2.0)
        doc = {"gpus": 64.0, "allocated": 40.0, "busy": 38.0, "pending": 120.0, "running": 30.0,
               "queues": {f"q{i}": 4.0 for i in range(6)}}
        t0 = time.perf_counter()
        for k in range(POINTS):
            rec.add({"time": T0 + 2 * k, **doc})
        rec.flush()
        spent = time.perf_counter() - t0
        print(f"write {POINTS} points, 5 a transaction: {spent:.1f} s ({spent / POINTS * 5 * 1000:.2f} ms a write)")
        now = T0 + 2 * POINTS
        for span, step, coarse in ((3600, 12.0, False), (86400, 288.0, False), (86400, 300.0, True)):
            t0 = time.perf_counter()
            pts = downsample(rec.read(now - span, coarse=coarse), step)
            ms = (time.perf_counter() - t0) * 1000
            print(f"read {span // 3600:>2} h at {step:g} s a point ({'5-minute means' if coarse else 'every sample'}): "
                  f"{len(pts)} points in {ms:.0f} ms")
        store.close()


if __name__ == "__main__":
    main()
