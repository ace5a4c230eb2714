"""``sia``: Sia's sampled workloads (``name,time,application,num_replicas,batch_size``).

They carry no duration.  Durations come from PAL's conversion of the same
workloads (hal-uw/blox-pal, ``pal/traces/philly/workload-N-noheader.csv``): its
first 160 rows have exactly the submit times of Sia's ``workload-N.csv`` and
give every (application, GPU count) one fixed duration (cifar10 -> res18,
bert -> transformer, deepspeech2 -> deepspeech, yolov3 -> res50, imagenet ->
alexnet).  Those pairs are :data:`SIA_DURATIONS`.  A GPU count PAL never used
(cifar10 at 4 or 10, imagenet at 10-14) is filled with a power law
``d = a * gpus**-b`` fitted per application through PAL's points (log-log least
squares).  PAL also replaced about half the cifar10 rows by 1-GPU gnmt jobs of
32 s; this reader keeps Sia's job (application, GPUs) instead.  Pass
``durations={"cifar10": 600, "bert": {8: 2400}}`` to use your own; an
application with no duration anywhere is a :class:`TraceError`.  Applications
are matched through :func:`gpuloom.core.parse.normalise_model`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from ...core.parse import normalise_model
from .fields import Builder, Header, Trace, Where, check_width, first_row, float_field, int_field, read_rows, str_field
from .formats import FORMATS

# (application, GPUs) -> seconds, as PAL's conversion of Sia's Philly workloads
# (pal/traces/philly/workload-N-noheader.csv) assigns them; see the module docstring.
SIA_DURATIONS: dict[str, dict[int, float]] = {
    "cifar10": {6: 854.0, 8: 826.0, 12: 573.0, 16: 449.0},  # PAL: res18
    "bert": {6: 3055.0, 8: 2480.0, 12: 1589.0, 16: 1334.0},  # PAL: transformer
    "deepspeech2": {6: 4153.0, 8: 3500.0, 12: 2572.0},  # PAL: deepspeech
    "yolov3": {4: 12869.0},  # PAL: res50
    "imagenet": {24: 31395.0, 32: 26207.0, 48: 18879.0},  # PAL: alexnet
}


def _power_law(points: Mapping[int, float]) -> Callable[[int], float]:
    """``d(g) = a * g**-b`` through ``points`` (least squares in log-log; flat for one point)."""
    xs = [math.log(g) for g in points]
    ys = [math.log(d) for d in points.values()]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return lambda g: math.exp(my + slope * (math.log(g) - mx))


def _duration_table(durations: Mapping[str, float | Mapping[int, float]]) -> Callable[[str, int], float | None]:
    exact: dict[str, dict[int, float]] = {}
    flat: dict[str, float] = {}
    for name, v in durations.items():
        app = normalise_model(name)
        if isinstance(v, Mapping):
            exact[app] = {int(g): float(d) for g, d in v.items()}
        else:
            flat[app] = float(v)
    fits = {app: _power_law(pts) for app, pts in exact.items() if pts}

    def lookup(name: str, gpus: int) -> float | None:
        app = normalise_model(name)
        if app in exact and gpus in exact[app]:
            return exact[app][gpus]
        if app in flat:
            return flat[app]
        if app in fits:
            return round(fits[app](gpus), 1)
        return None

    return lookup


@FORMATS.register("sia")
def read_sia(path: str | Path, durations: Mapping[str, float | Mapping[int, float]] | None = None) -> Trace:
    """Sia workload CSV (``name,time,application,num_replicas,batch_size``); durations as documented."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "sia")
    lookup = _duration_table(SIA_DURATIONS if durations is None else durations)
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ("name", "time", "application", "num_replicas"), w)
    pn, pt, pa, pr = h.pos["name"], h.pos["time"], h.pos["application"], h.pos["num_replicas"]
    pb = h.pos.get("batch_size")
    for row in rows:
        b.rows += 1
        check_width(row, h.width, w)
        name = str_field(row[pn], "name", w)
        t = float_field(row[pt], "time", w)
        app = str_field(row[pa], "application", w)
        gpus = int_field(row[pr], "num_replicas", w)
        attrs: dict[str, Any] = {"application": app}
        if pb is not None:
            attrs["batch_size"] = int_field(row[pb], "batch_size", w)
        dur = lookup(app, gpus)
        if dur is None:
            raise w.error("application", f"no duration known for {app!r} (pass durations={{{app!r}: seconds}})")
        b.add(w, JobSpec, name, t, gpus, dur, model=app, attrs=attrs)
    return b.done()
