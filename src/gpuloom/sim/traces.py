"""Trace readers: the real traces of published GPU-cluster schedulers -> :class:`JobSpec` lists.

``load_trace(path, fmt="auto", **opts)`` returns the jobs of one file sorted by
arrival (stable: ties keep file order); ``read_trace`` returns a :class:`Trace`
that also says how many rows were read and which were skipped and why.  Each
format has one reader function (``read_<format>``) registered in
:data:`FORMATS`; ``"auto"`` picks one from the extension and the header.

Common rules (every reader):

* the csv module does the splitting (quoting, ``\\r\\n``), numbers are checked
  field by field: a malformed row raises :class:`TraceError` naming the file,
  the 1-based line and the field (``trace.csv:17: field 'num_gpus': expected a
  positive integer, got 'x'``);
* blank lines are ignored (the Philly list ends with one); a file with no jobs
  is an error, and so is a job id seen twice (the message names both lines);
* times become seconds since the trace's origin; work is measured in reference
  seconds (``JobSpec.duration``), from ``iterations * iter_time`` where a trace
  gives both.

Per-format decisions (the data README in ``shared/data`` lists the files):

``philly``  Sia's ``philly_jobs.csv``: wall-clock ``timestamp`` (not sorted) ->
    seconds since the earliest submission (``Trace.meta["origin"]``); ids
    ``philly-<k>`` with ``k`` the 0-based data row in file order;
    ``attrs["cluster"]`` is the virtual cluster.  ``gpu_time`` is always
    ``duration * num_gpus`` in the file and is not kept.
``sia``  Sia's sampled workloads (``name,time,application,num_replicas,
    batch_size``) carry no duration.  Durations come from PAL's conversion of
    the same workloads (hal-uw/blox-pal, ``pal/traces/philly/workload-N-noheader
    .csv``): its first 160 rows have exactly the submit times of Sia's
    ``workload-N.csv`` and give every (application, GPU count) one fixed
    duration (cifar10 -> res18, bert -> transformer, deepspeech2 ->
    deepspeech, yolov3 -> res50, imagenet -> alexnet).  Those pairs are
    :data:`SIA_DURATIONS`.  A GPU count PAL never used (cifar10 at 4 or 10,
    imagenet at 10-14) is filled with a power law ``d = a * gpus**-b`` fitted
    per application through PAL's points (log-log least squares).  PAL also
    replaced about half the cifar10 rows by 1-GPU gnmt jobs of 32 s; the
    ``sia`` reader keeps Sia's job (application, GPUs) instead.  Pass
    ``durations={"cifar10": 600, "bert": {8: 2400}}`` to use your own; an
    application with no duration anywhere is a :class:`TraceError`.
``pal`` / ``blox``  ``job_id,num_gpus,submit_time,duration,model[,batch_size]``;
    the ``-noheader`` variants are ``id,model,submit,duration,gpus`` (checked:
    the first 160 rows of ``workload-N-noheader.csv`` match Sia's workload N,
    not PAL's headered ``workload-N.csv``, which holds different jobs).
``muri``  all times in milliseconds -> seconds.  Work = ``iterations *
    iteration_time`` (the simulator traces' ``duration`` is that product
    rounded up to a whole second, in 6 of 5,755 trace2 jobs one second more;
    in the testbed trace ``duration`` is the
    measured run and differs by -81 %..+30 %), the trace's value is kept in
    ``attrs["trace_duration"]``.  ``attrs["resource_times"] = (t0, t1, t2)``
    seconds per iteration: t0 CPU (data loading and preprocessing, or the RL
    environment: dqn/a2c have t0 ~ 0.44-0.51 s and t1 ~ 0.01 s), t1 GPU
    compute (bert/gpt2: t1 dominates), t2 network (inter-GPU communication:
    it is 0 for every 1-GPU job).  Also ``iteration_time``, ``batch_size``,
    ``priority``, ``interval`` (s).
``gavel``  tab-separated.  7 fields (``msr/``): ``job_type, command,
    num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor``
    (the data README's order is not what the files hold: the 4th field is only
    ever 0/1 and is 0 exactly for CycleGAN's ``--max-steps``; the 7th takes
    1..64 and is the GPU count).  10 fields (``physical_cluster/``): ``job_type,
    command, working_directory, num_steps_arg, needs_data_dir, total_steps,
    scale_factor, priority_weight, SLO, arrival_time`` (Gavel's parse_trace).
    Duration = ``total_steps / steps_per_second``.  No throughput measurements
    are in the data, so :data:`GAVEL_SAMPLES_PER_SECOND` is an **assumption**:
    rough single-V100 samples/s per model (steps/s = samples/s / batch size),
    the same for every scale factor.  Pass ``steps_per_second={job_type or
    model: steps/s}`` for real numbers.
``synergy``  ``id, model, arrival, iterations, GPUs`` (no header).  Iteration
    times from ``model_sensitivity_profiles.csv`` (``iter_time`` of row
    ``<model>_<gpus>``, else the model's row with the nearest lower GPU count),
    looked for beside the trace or one folder up, or given as ``profiles=``;
    ``iter_times={model: s}`` overrides.  The profile row (GPU-proportional
    CPUs and memory, best speedup, the CPU x memory throughput matrix) goes to
    ``attrs["sensitivity"]``.  Cells such as ``62.5*2`` or ``int(62.5/3)`` are
    evaluated by a tiny ``ast`` arithmetic evaluator, never ``eval``.
``tiresias``  ``job_id,num_gpu,submit_time,iterations,model_name,duration,
    interval``: work = ``duration``; ``iter_time = duration / iterations``.
``alibaba``  openb pod list.  Arrival = ``creation_time``; work =
    ``deletion_time - scheduled_time``.  Pods that cannot be jobs are skipped
    and counted in ``Trace.skipped``: CPU-only pods (``num_gpu`` 0,
    ``"cpu-only"``) and pods that never ran (``Pending``, no
    ``scheduled_time``, ``"never-scheduled"``); ``pending="error"`` makes the
    latter an error instead.  ``Running`` pods were still running when the
    trace ended, so their duration is a lower bound (``attrs["censored"]``).
    ``cpus = ceil(cpu_milli / 1000)``, ``mem_mb = memory_mib``; ``cpu_milli``,
    ``gpu_milli`` (per GPU: < 1000 is a GPU fraction), ``qos``, ``phase`` and
    ``gpu_spec`` (when given) are in attrs.
``csv`` / ``jsonl``  gpuloom's own format (docs/traces.md): ``id, arrival, gpus``
    and ``duration`` or ``iterations`` + ``iter_time``; optional ``model, user,
    cpus, mem_mb``; any other column/key goes to attrs (a JSON ``attrs`` object
    is merged).  :func:`save_trace` writes it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..core.job import JobError, JobSpec

__all__ = [
    "FORMATS",
    "GAVEL_SAMPLES_PER_SECOND",
    "SIA_DURATIONS",
    "Trace",
    "TraceError",
    "detect_format",
    "load_trace",
    "read_trace",
    "safe_arith",
    "save_trace",
]


class TraceError(ValueError):
    """A trace that cannot be read; the message names file, line and field."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = "" if path is None else Path(path).name
        if line is not None:
            where += f":{line}"
        text = f"field {field!r}: {message}" if field else message
        super().__init__(f"{where}: {text}" if where else text)


@dataclass(slots=True)
class Trace:
    """What one file held: the jobs (sorted by arrival) plus how it was read."""

    jobs: list[JobSpec]
    format: str
    path: str
    rows: int  # data rows read (blank lines and headers excluded)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped
    meta: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- field parsing

class _Where:
    """Where we are in a file; builds the errors."""

    __slots__ = ("path", "line")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.line = 0

    def error(self, field: str | None, message: str) -> TraceError:
        return TraceError(message, self.path, self.line or None, field)


def _int(s: str, name: str, w: _Where, *, low: int = 1) -> int:
    """An integer field (``"4"`` or ``"4.0"``) that is ``>= low``."""
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    try:
        v = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise w.error(name, f"expected {what}, got {s!r}") from None
        if not f.is_integer():
            raise w.error(name, f"expected {what}, got {s!r}") from None
        v = int(f)
    if v < low:
        raise w.error(name, f"expected {what}, got {s!r}")
    return v


def _float(s: str, name: str, w: _Where, *, positive: bool = False) -> float:
    """A finite number, ``>= 0`` (or ``> 0`` when ``positive``)."""
    what = "a number > 0" if positive else "a number >= 0"
    try:
        v = float(s)
    except ValueError:
        raise w.error(name, f"expected {what}, got {s!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise w.error(name, f"expected {what}, got {s!r}")
    return v


def _str(s: str, name: str, w: _Where) -> str:
    s = s.strip()
    if not s:
        raise w.error(name, "must not be empty")
    return s


def _rows(path: Path, w: _Where, delimiter: str = ",") -> Iterator[list[str]]:
    """Non-blank rows of a delimited file; ``w.line`` follows the reader."""
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", path) from None
    with f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            for row in reader:
                w.line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                yield row
        except csv.Error as e:
            w.line = reader.line_num
            raise w.error(None, f"malformed CSV: {e}") from None
        except UnicodeDecodeError:
            raise w.error(None, "not a UTF-8 text file") from None


class _Header:
    """Column positions from a header row; checks that the required ones are there."""

    def __init__(self, row: Sequence[str], required: Iterable[str], w: _Where) -> None:
        self.names = [c.strip() for c in row]
        self.pos = {c: i for i, c in enumerate(self.names)}
        missing = [c for c in required if c not in self.pos]
        if missing:
            raise w.error(None, f"header lacks column(s) {', '.join(missing)}; has {', '.join(self.names)}")
        self.width = len(self.names)


def _first(rows: Iterator[list[str]], path: Path) -> list[str]:
    """The header row; an empty file is an error."""
    row = next(rows, None)
    if row is None:
        raise TraceError("empty file", path)
    return row


def _check_width(row: Sequence[str], width: int, w: _Where) -> None:
    if len(row) != width:
        raise w.error(None, f"expected {width} fields, got {len(row)}")


class _Builder:
    """Collects jobs, checks duplicate ids, turns JobSpec's own checks into TraceErrors."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        self.jobs: list[JobSpec] = []
        self.lines: dict[str, int] = {}
        self.rows = 0
        self.skipped: dict[str, int] = {}

    def add(self, w: _Where, make: Callable[..., JobSpec], *args: Any, **kw: Any) -> None:
        try:
            spec = make(*args, **kw)
        except JobError as e:
            raise w.error(None, str(e)) from None
        first = self.lines.setdefault(spec.id, w.line)
        if first != w.line:
            raise w.error("id", f"duplicate job id {spec.id!r} (first on line {first})")
        self.jobs.append(spec)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def done(self, **meta: Any) -> Trace:
        if not self.jobs:
            why = f" ({', '.join(f'{n} {r}' for r, n in self.skipped.items())} skipped)" if self.skipped else ""
            what = "no data rows" if self.rows == 0 else "no jobs"
            raise TraceError(f"empty trace: {what}{why}", self.path)
        jobs = sorted(self.jobs, key=lambda j: j.arrival)
        return Trace(jobs, self.fmt, str(self.path), self.rows, dict(self.skipped), dict(meta))


# --------------------------------------------------------------------------- philly

def read_philly(path: str | Path) -> Trace:
    """Sia's processed Philly job list (``timestamp,duration,num_gpus,gpu_time,cluster``)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "philly")
    rows = _rows(p, w)
    h = _Header(_first(rows, p), ("timestamp", "duration", "num_gpus", "cluster"), w)
    it, id_, ig, ic = h.pos["timestamp"], h.pos["duration"], h.pos["num_gpus"], h.pos["cluster"]
    stamps: list[datetime] = []
    durs: list[float] = []
    gpus: list[int] = []
    clusters: list[str] = []
    fromiso = datetime.fromisoformat
    width = h.width
    inf = math.inf
    for row in rows:  # the hot loop of the biggest trace: plain conversions, checked slowly only on failure
        if len(row) != width:
            _check_width(row, width, w)
        try:
            ts, dur, g = fromiso(row[it]), float(row[id_]), int(row[ig])
            if not 0 < dur < inf or g < 1:
                raise ValueError
        except ValueError:
            try:
                ts = fromiso(row[it])
            except ValueError:
                raise w.error("timestamp", f"expected a date-time like 2017-10-09 07:01:55, got {row[it]!r}") from None
            dur = _float(row[id_], "duration", w, positive=True)
            g = _int(row[ig], "num_gpus", w)
        stamps.append(ts)
        durs.append(dur)
        gpus.append(g)
        clusters.append(row[ic])
    b.rows = len(stamps)
    if not stamps:
        return b.done()
    origin = min(stamps)
    # ids are unique by construction and every field was checked above
    b.jobs = [JobSpec(f"philly-{k}", (stamps[k] - origin).total_seconds(), gpus[k], durs[k],
                      attrs={"cluster": clusters[k]}) for k in range(len(stamps))]
    return b.done(origin=origin.isoformat(sep=" "))


# --------------------------------------------------------------------------- sia

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
    for app, v in durations.items():
        if isinstance(v, Mapping):
            exact[app] = {int(g): float(d) for g, d in v.items()}
        else:
            flat[app] = float(v)
    fits = {app: _power_law(pts) for app, pts in exact.items() if pts}

    def lookup(app: str, gpus: int) -> float | None:
        if app in exact and gpus in exact[app]:
            return exact[app][gpus]
        if app in flat:
            return flat[app]
        if app in fits:
            return round(fits[app](gpus), 1)
        return None

    return lookup


def read_sia(path: str | Path, durations: Mapping[str, float | Mapping[int, float]] | None = None) -> Trace:
    """Sia workload CSV (``name,time,application,num_replicas,batch_size``); durations as documented."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "sia")
    lookup = _duration_table(SIA_DURATIONS if durations is None else durations)
    rows = _rows(p, w)
    h = _Header(_first(rows, p), ("name", "time", "application", "num_replicas"), w)
    pn, pt, pa, pr = h.pos["name"], h.pos["time"], h.pos["application"], h.pos["num_replicas"]
    pb = h.pos.get("batch_size")
    for row in rows:
        b.rows += 1
        _check_width(row, h.width, w)
        name = _str(row[pn], "name", w)
        t = _float(row[pt], "time", w)
        app = _str(row[pa], "application", w)
        gpus = _int(row[pr], "num_replicas", w)
        attrs: dict[str, Any] = {"application": app}
        if pb is not None:
            attrs["batch_size"] = _int(row[pb], "batch_size", w)
        dur = lookup(app, gpus)
        if dur is None:
            raise w.error("application", f"no duration known for {app!r} (pass durations={{{app!r}: seconds}})")
        b.add(w, JobSpec, name, t, gpus, dur, model=app, attrs=attrs)
    return b.done()


# --------------------------------------------------------------------------- pal / blox

def read_pal(path: str | Path) -> Trace:
    """Blox/PAL CSV: ``job_id,num_gpus,submit_time,duration,model[,batch_size]`` or the headerless
    ``id,model,submit,duration,gpus`` variant (recognised by a non-header first row)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "pal")
    rows = _rows(p, w)
    first = _first(rows, p)
    if "job_id" in [c.strip() for c in first]:
        h = _Header(first, ("job_id", "num_gpus", "submit_time", "duration", "model"), w)
        pi, pg, ps, pd, pm = (h.pos[c] for c in ("job_id", "num_gpus", "submit_time", "duration", "model"))
        pb = h.pos.get("batch_size")
        width = h.width
        body: Iterable[list[str]] = rows
    else:  # headerless: id, model, submit, duration, gpus
        pi, pm, ps, pd, pg, pb, width = 0, 1, 2, 3, 4, None, 5
        body = _chain_first(first, rows)
    for row in body:
        b.rows += 1
        _check_width(row, width, w)
        jid = _str(row[pi], "job_id", w)
        gpus = _int(row[pg], "num_gpus", w)
        t = _float(row[ps], "submit_time", w)
        dur = _float(row[pd], "duration", w, positive=True)
        model = _str(row[pm], "model", w)
        attrs = {} if pb is None else {"batch_size": _int(row[pb], "batch_size", w)}
        b.add(w, JobSpec, jid, t, gpus, dur, model=model, attrs=attrs)
    return b.done()


def _chain_first(first: list[str], rest: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rest


# --------------------------------------------------------------------------- muri

MURI_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration",
                "interval", "iteration_time", "resource_time_0", "resource_time_1", "resource_time_2", "priority")


def read_muri(path: str | Path) -> Trace:
    """Muri trace (times in ms) -> seconds; see the module docstring for the resource columns."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "muri")
    rows = _rows(p, w)
    h = _Header(_first(rows, p), MURI_COLUMNS, w)
    P = h.pos
    for row in rows:
        b.rows += 1
        _check_width(row, h.width, w)
        jid = _str(row[P["job_id"]], "job_id", w)
        gpus = _int(row[P["num_gpu"]], "num_gpu", w)
        submit = _float(row[P["submit_time"]], "submit_time", w) / 1000.0
        iters = _int(row[P["iterations"]], "iterations", w)
        model = _str(row[P["model_name"]], "model_name", w)
        batch = _int(row[P["batch_size"]], "batch_size", w)
        trace_dur = _float(row[P["duration"]], "duration", w) / 1000.0
        interval = _float(row[P["interval"]], "interval", w) / 1000.0
        it = _float(row[P["iteration_time"]], "iteration_time", w, positive=True) / 1000.0
        rt = tuple(_float(row[P[f"resource_time_{i}"]], f"resource_time_{i}", w) / 1000.0 for i in range(3))
        prio = _int(row[P["priority"]], "priority", w, low=0)
        attrs = {"resource_times": rt, "iteration_time": it, "batch_size": batch, "priority": prio,
                 "interval": interval, "trace_duration": trace_dur}
        b.add(w, JobSpec.from_iterations, jid, submit, gpus, iters, it, model=model, attrs=attrs)
    return b.done()


# --------------------------------------------------------------------------- gavel

# ASSUMPTION (no throughput measurements ship with the data): rough single-V100
# training throughput in samples per second; steps/s = samples/s / batch size.
# Models without a batch size in their job type are in steps/s directly.
GAVEL_SAMPLES_PER_SECOND: dict[str, float] = {
    "ResNet-18": 4000.0,  # CIFAR-10 images/s
    "ResNet-50": 350.0,  # ImageNet images/s
    "Transformer": 2000.0,  # Multi30k sentences/s
    "LM": 1500.0,  # WikiText-2 sequences/s
    "Recommendation": 300000.0,  # ML-20m users/s (autoencoder)
}
GAVEL_STEPS_PER_SECOND: dict[str, float] = {"A3C": 5.0, "CycleGAN": 2.0}


def _gavel_job_type(job_type: str) -> tuple[str, int | None]:
    """``"ResNet-18 (batch size 128)"`` -> ``("ResNet-18", 128)``."""
    model, sep, rest = job_type.partition(" (batch size ")
    if sep and rest.endswith(")") and rest[:-1].isdigit():
        return model.strip(), int(rest[:-1])
    return job_type.strip(), None


def read_gavel(path: str | Path, steps_per_second: Mapping[str, float] | None = None) -> Trace:
    """Gavel ``.trace`` (7-field msr or 10-field physical-cluster layout, tab-separated)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "gavel")
    sps = dict(steps_per_second or {})
    for row in _rows(p, w, delimiter="\t"):
        b.rows += 1
        if len(row) == 7:
            job_type, _cmd, _arg, ndd, steps_s, arrival_s, scale_s = row
            prio_s = None
        elif len(row) == 10:
            job_type, _cmd, _wd, _arg, ndd, steps_s, scale_s, prio_s, _slo, arrival_s = row
        else:
            raise w.error(None, f"expected 7 or 10 tab-separated fields, got {len(row)}")
        job_type = _str(job_type, "job_type", w)
        if ndd.strip() not in ("0", "1"):
            raise w.error("needs_data_dir", f"expected 0 or 1, got {ndd!r}")
        steps = _int(steps_s, "total_steps", w)
        arrival = _float(arrival_s, "arrival_time", w)
        gpus = _int(scale_s, "scale_factor", w)
        model, batch = _gavel_job_type(job_type)
        rate = sps.get(job_type, sps.get(model))
        if rate is None:
            if model in GAVEL_STEPS_PER_SECOND:
                rate = GAVEL_STEPS_PER_SECOND[model]
            elif model in GAVEL_SAMPLES_PER_SECOND and batch:
                rate = GAVEL_SAMPLES_PER_SECOND[model] / batch
            else:
                raise w.error("job_type", f"no throughput known for {job_type!r} (pass steps_per_second=)")
        if not rate > 0:
            raise w.error("job_type", f"steps per second for {job_type!r} must be > 0, got {rate}")
        attrs: dict[str, Any] = {"job_type": job_type, "total_steps": steps, "steps_per_second": rate}
        if batch is not None:
            attrs["batch_size"] = batch
        if prio_s is not None:
            attrs["priority"] = _float(prio_s, "priority_weight", w)
        jid = f"{p.stem}-{b.rows - 1}"
        b.add(w, JobSpec.from_iterations, jid, arrival, gpus, steps, 1.0 / rate,
                  model=model, attrs=attrs)
    return b.done()


# --------------------------------------------------------------------------- synergy

def safe_arith(text: str) -> float:
    """Evaluate ``62.5*2``, ``int(62.5/3)``: one safe evaluator for the project, without ``eval``
    (see :func:`gpuloom.perf.sensitivity.safe_number`)."""
    from ..perf.sensitivity import safe_number

    return safe_number(text)


def read_synergy_profiles(path: str | Path) -> dict[str, dict[str, Any]]:
    """``model_sensitivity_profiles.csv`` -> ``{"res50_2": {"iter_time", "cpus", "mem_gb", "speedup", "tput"}}``."""
    p = Path(path)
    w = _Where(p)
    rows = _rows(p, w)
    h = _Header(_first(rows, p), ("model_file", "cpus", "mem", "iter_time"), w)
    pt = next((i for i, c in enumerate(h.names) if c.startswith("tput_rows")), None)
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        _check_width(row, h.width, w)
        name = _str(row[h.pos["model_file"]], "model_file", w)
        rec: dict[str, Any] = {}
        for col, key in (("iter_time", "iter_time"), ("cpus", "cpus"), ("mem", "mem_gb"), ("speedup", "speedup")):
            if col not in h.pos:
                continue
            cell = row[h.pos[col]]
            try:
                rec[key] = safe_arith(cell)
            except ValueError as e:
                raise w.error(col, str(e)) from None
        if not rec["iter_time"] > 0:
            raise w.error("iter_time", f"expected a number > 0, got {row[h.pos['iter_time']]!r}")
        if pt is not None and row[pt].strip():
            try:
                rec["tput"] = tuple(tuple(safe_arith(c) for c in r.split(",")) for r in row[pt].split("|"))
            except ValueError as e:
                raise w.error(h.names[pt], str(e)) from None
        out[name] = rec
    if not out:
        raise TraceError("empty profile file", p)
    return out


def _find_profiles(trace: Path) -> Path | None:
    for d in (trace.parent, trace.parent.parent):
        q = d / "model_sensitivity_profiles.csv"
        if q.is_file():
            return q
    return None


def read_synergy(path: str | Path, profiles: str | Path | None = None,
                 iter_times: Mapping[str, float] | None = None) -> Trace:
    """Synergy trace ``id, model, arrival, iterations, GPUs`` (no header)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "synergy")
    prof_path = Path(profiles) if profiles is not None else _find_profiles(p)
    prof = read_synergy_profiles(prof_path) if prof_path is not None else {}
    prof_str = None if prof_path is None else str(prof_path)
    overrides = dict(iter_times or {})
    for row in _rows(p, w):
        b.rows += 1
        _check_width(row, 5, w)
        jid = _str(row[0], "id", w)
        model = _str(row[1], "model", w)
        arrival = _float(row[2], "arrival", w)
        iters = _int(row[3], "iterations", w)
        gpus = _int(row[4], "gpus", w)
        rec = None
        if model in overrides:
            it = float(overrides[model])
        else:
            cands = [g for g in range(gpus, 0, -1) if f"{model}_{g}" in prof]
            if not cands:
                where = f"in {prof_path.name}" if prof_path else "(no model_sensitivity_profiles.csv found)"
                raise w.error("model", f"no iteration time for {model!r} with {gpus} GPU(s) {where}; "
                                       "pass profiles= or iter_times=")
            rec = prof[f"{model}_{cands[0]}"]
            it = rec["iter_time"]
        attrs: dict[str, Any] = {} if rec is None else {
            "sensitivity": {k: rec[k] for k in ("cpus", "mem_gb", "speedup", "tput") if k in rec},
            # where the profiles came from: build_model loads them for the sizers (greedy/tune/opt)
            "profiles_file": prof_str}
        b.add(w, JobSpec.from_iterations, jid, arrival, gpus, iters, it, model=model, attrs=attrs)
    return b.done(profiles=None if prof_path is None else prof_path.name)


# --------------------------------------------------------------------------- tiresias

def read_tiresias(path: str | Path) -> Trace:
    """Tiresias CSV ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` (seconds)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "tiresias")
    rows = _rows(p, w)
    cols = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration")
    h = _Header(_first(rows, p), cols, w)
    pi, pg, ps, pit, pm, pd = (h.pos[c] for c in cols)
    pv = h.pos.get("interval")
    for row in rows:
        b.rows += 1
        _check_width(row, h.width, w)
        jid = _str(row[pi], "job_id", w)
        gpus = _int(row[pg], "num_gpu", w)
        t = _float(row[ps], "submit_time", w)
        iters = _int(row[pit], "iterations", w)
        model = _str(row[pm], "model_name", w)
        dur = _float(row[pd], "duration", w, positive=True)
        attrs = {} if pv is None else {"interval": _float(row[pv], "interval", w)}
        b.add(w, JobSpec, jid, t, gpus, dur, model=model, iterations=iters,
                  iter_time=dur / iters, attrs=attrs)
    return b.done()


# --------------------------------------------------------------------------- alibaba

ALIBABA_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                   "creation_time", "deletion_time", "scheduled_time")


def read_alibaba(path: str | Path, pending: str = "skip") -> Trace:
    """Alibaba cluster-trace-gpu-v2023 pod list; CPU-only and never-scheduled pods are skipped (counted)."""
    if pending not in ("skip", "error"):
        raise ValueError(f"pending must be 'skip' or 'error', got {pending!r}")
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "alibaba")
    rows = _rows(p, w)
    h = _Header(_first(rows, p), ALIBABA_COLUMNS, w)
    P = h.pos
    for row in rows:
        b.rows += 1
        _check_width(row, h.width, w)
        name = _str(row[P["name"]], "name", w)
        gpus = _int(row[P["num_gpu"]], "num_gpu", w, low=0)
        cpu_milli = _int(row[P["cpu_milli"]], "cpu_milli", w, low=0)
        mem = _int(row[P["memory_mib"]], "memory_mib", w, low=0)
        gpu_milli = _int(row[P["gpu_milli"]], "gpu_milli", w, low=0)
        created = _float(row[P["creation_time"]], "creation_time", w)
        phase = _str(row[P["pod_phase"]], "pod_phase", w)
        if gpus == 0:
            b.skip("cpu-only")
            continue
        sched_s = row[P["scheduled_time"]].strip()
        if not sched_s:
            if pending == "error":
                raise w.error("scheduled_time", f"pod {name} ({phase}) never ran: no scheduled_time")
            b.skip("never-scheduled")
            continue
        sched = _float(sched_s, "scheduled_time", w)
        deleted = _float(row[P["deletion_time"]], "deletion_time", w)
        if deleted <= sched:
            raise w.error("deletion_time", f"pod {name} ends ({deleted:g}) before it runs ({sched:g})")
        if gpu_milli == 0 or gpu_milli > 1000:
            raise w.error("gpu_milli", f"expected 1..1000 per GPU for a GPU pod, got {gpu_milli}")
        attrs: dict[str, Any] = {"cpu_milli": cpu_milli, "gpu_milli": gpu_milli, "qos": row[P["qos"]].strip(),
                                 "phase": phase, "censored": phase == "Running", "queued": sched - created}
        spec_s = row[P["gpu_spec"]].strip()
        if spec_s:
            attrs["gpu_spec"] = spec_s
        b.add(w, JobSpec, name, created, gpus, deleted - sched, cpus=math.ceil(cpu_milli / 1000),
                  mem_mb=mem, attrs=attrs)
    return b.done()


# --------------------------------------------------------------------------- gpuloom csv / jsonl

OWN_FIELDS = ("id", "arrival", "gpus", "duration", "iterations", "iter_time", "model", "user", "cpus", "mem_mb")


def _own_job(d: Mapping[str, Any], w: _Where, attrs: dict[str, Any]) -> JobSpec:
    """One gpuloom job from string-or-typed values (CSV cells are strings)."""

    def get(k: str) -> Any:
        v = d.get(k)
        return None if v is None or (isinstance(v, str) and not v.strip()) else v

    def num(k: str, conv: Callable[..., Any], **kw: Any) -> Any:
        v = get(k)
        if v is None:
            return None
        if isinstance(v, bool):
            raise w.error(k, f"expected a number, got {v!r}")
        return conv(str(v), k, w, **kw)

    for k in ("id", "arrival", "gpus"):
        if get(k) is None:
            raise w.error(k, "missing")
    jid = _str(str(d["id"]), "id", w)
    arrival = num("arrival", _float)
    gpus = num("gpus", _int)
    dur = num("duration", _float, positive=True)
    iters = num("iterations", _int)
    it = num("iter_time", _float, positive=True)
    kw: dict[str, Any] = {"model": str(get("model") or ""), "user": str(get("user") or ""),
                          "cpus": num("cpus", _int, low=0), "mem_mb": num("mem_mb", _int, low=0), "attrs": attrs}
    if iters is not None or it is not None:
        if iters is None or it is None:
            raise w.error("iterations" if iters is None else "iter_time", "iterations and iter_time go together")
        if dur is not None and not math.isclose(dur, iters * it, rel_tol=1e-6):
            raise w.error("duration", f"{dur:g} disagrees with iterations * iter_time = {iters * it:g}")
        return JobSpec.from_iterations(jid, arrival, gpus, iters, it, **kw)
    if dur is None:
        raise w.error("duration", "missing (give duration, or iterations and iter_time)")
    return JobSpec(jid, arrival, gpus, dur, **kw)


def _cell_value(s: str) -> Any:
    """An extra CSV column's value: int, float, or the string as is."""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_csv(path: str | Path) -> Trace:
    """gpuloom's CSV job format (header required; see docs/traces.md)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "csv")
    rows = _rows(p, w)
    h = _Header(_first(rows, p), ("id", "arrival", "gpus"), w)
    extra = [(i, c) for i, c in enumerate(h.names) if c not in OWN_FIELDS]
    for row in rows:
        b.rows += 1
        _check_width(row, h.width, w)
        d = dict(zip(h.names, row, strict=True))
        attrs = {c: _cell_value(row[i]) for i, c in extra if row[i].strip()}
        b.add(w, _own_job, d, w, attrs)
    return b.done()


def read_jsonl(path: str | Path) -> Trace:
    """gpuloom's JSON-lines job format: one object per line (see docs/traces.md)."""
    p = Path(path)
    w = _Where(p)
    b = _Builder(p, "jsonl")
    try:
        f = open(p, encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", p) from None
    with f:
        for n, text in enumerate(f, 1):
            w.line = n
            if not text.strip():
                continue
            b.rows += 1
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise w.error(None, f"invalid JSON: {e.msg} at column {e.colno}") from None
            if not isinstance(d, dict):
                raise w.error(None, f"expected a JSON object, got {type(d).__name__}")
            attrs = d.get("attrs", {})
            if not isinstance(attrs, dict):
                raise w.error("attrs", "expected a JSON object")
            attrs = {**{k: v for k, v in d.items() if k not in OWN_FIELDS and k != "attrs"}, **attrs}
            b.add(w, _own_job, d, w, attrs)
    return b.done()


def save_trace(jobs: Sequence[JobSpec], path: str | Path, fmt: str | None = None) -> None:
    """Write ``jobs`` in gpuloom's own format (``csv`` or ``jsonl``, by default from the extension).

    Extra ``attrs`` become columns (CSV: only scalar values) or keys; :func:`load_trace` reads it back.
    """
    p = Path(path)
    fmt = fmt or ("jsonl" if p.suffix == ".jsonl" else "csv")
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"save_trace writes 'csv' or 'jsonl', not {fmt!r}")

    def base(j: JobSpec) -> dict[str, Any]:
        d: dict[str, Any] = {"id": j.id, "arrival": j.arrival, "gpus": j.gpus}
        if j.iterations is not None and j.iter_time is not None:
            d["iterations"], d["iter_time"] = j.iterations, j.iter_time
        else:
            d["duration"] = j.duration
        for k in ("model", "user"):
            if getattr(j, k):
                d[k] = getattr(j, k)
        for k in ("cpus", "mem_mb"):
            if getattr(j, k) is not None:
                d[k] = getattr(j, k)
        return d

    if fmt == "jsonl":
        with open(p, "w", encoding="utf-8") as f:
            for j in jobs:
                d = base(j)
                if j.attrs:
                    d["attrs"] = dict(j.attrs)
                f.write(json.dumps(d, default=list) + "\n")
        return
    rows = []
    for j in jobs:
        d = base(j)
        for k, v in j.attrs.items():
            if k in OWN_FIELDS:
                raise ValueError(f"job {j.id}: attrs key {k!r} clashes with a column")
            if isinstance(v, str | int | float | bool):
                d[k] = v
        rows.append(d)
    cols: dict[str, None] = {}
    for d in rows:
        cols.update(dict.fromkeys(d))
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(cols), lineterminator="\n")
    wr.writeheader()
    wr.writerows(rows)
    p.write_text(buf.getvalue(), encoding="utf-8")


# --------------------------------------------------------------------------- registry and detection

FORMATS: dict[str, Callable[..., Trace]] = {
    "philly": read_philly,
    "sia": read_sia,
    "pal": read_pal,
    "blox": read_pal,
    "muri": read_muri,
    "gavel": read_gavel,
    "synergy": read_synergy,
    "tiresias": read_tiresias,
    "alibaba": read_alibaba,
    "csv": read_csv,
    "jsonl": read_jsonl,
}

_HEADERS: list[tuple[str, frozenset[str]]] = [
    ("philly", frozenset({"timestamp", "duration", "num_gpus", "cluster"})),
    ("sia", frozenset({"name", "time", "application", "num_replicas"})),
    ("muri", frozenset({"resource_time_0", "iteration_time", "num_gpu"})),
    ("alibaba", frozenset({"cpu_milli", "gpu_milli", "pod_phase", "creation_time"})),
    ("tiresias", frozenset({"job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration"})),
    ("pal", frozenset({"job_id", "num_gpus", "submit_time", "duration", "model"})),
    ("csv", frozenset({"id", "arrival", "gpus"})),
]


def _first_line(p: Path) -> str:
    try:
        with open(p, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.rstrip("\r\n")
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", p) from None
    raise TraceError("empty file", p)


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its extension and first line; :class:`TraceError` when unclear."""
    p = Path(path)
    first = _first_line(p)
    if p.suffix == ".jsonl" or first.lstrip().startswith("{"):
        return "jsonl"
    if p.suffix == ".trace" or first.count("\t") in (6, 9):
        return "gavel"
    cells = {c.strip() for c in next(csv.reader([first]))}
    for name, need in _HEADERS:
        if need <= cells:
            return name
    row = next(csv.reader([first]))
    if len(row) == 5 and not _is_number(row[1]) and all(_is_number(c) for c in row[2:]):
        if "noheader" in p.name:
            return "pal"
        if _find_profiles(p) is not None:
            return "synergy"
        raise TraceError("headerless 5-column file is either 'pal' (id,model,submit,duration,gpus) or "
                         "'synergy' (id,model,arrival,iterations,gpus): give the format", p)
    raise TraceError(f"cannot tell the trace format from the first line {first[:80]!r}; "
                     f"give one of: {', '.join(FORMATS)}", p)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def read_trace(path: str | Path, fmt: str = "auto", **opts: Any) -> Trace:
    """Read ``path`` as ``fmt`` (a :data:`FORMATS` name or ``"auto"``); ``opts`` go to the reader."""
    p = Path(path)
    if not p.is_file():
        raise TraceError("no such file", p)
    name = detect_format(p) if fmt == "auto" else fmt
    reader = FORMATS.get(name)
    if reader is None:
        raise TraceError(f"unknown trace format {fmt!r}; known: auto, {', '.join(FORMATS)}", p)
    try:
        trace = reader(p, **opts)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise TraceError(f"format {name!r} does not take option(s) {', '.join(opts)}", p) from None
        raise
    trace.format = name
    return trace


def load_trace(path: str | Path, fmt: str = "auto", **opts: Any) -> list[JobSpec]:
    """The jobs of one trace file, sorted by arrival.  See :func:`read_trace` and the module docstring."""
    return read_trace(path, fmt, **opts).jobs
