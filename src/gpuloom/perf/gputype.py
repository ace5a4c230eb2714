"""A speed per GPU type (Gavel, OSDI'20): the ``gpu_type`` factor of the throughput model.

A job's speed-up from an older GPU to a newer one differs by model, often by
several times.  :class:`TypeSpeeds` is the matrix that says it: each job
*kind* (a job type and a GPU count) has a throughput on each GPU type, and
optionally a throughput when it shares a GPU with another kind (Gavel's
pairwise co-location measurements).  :class:`GpuTypeFactor` turns it into the
factor ``speed(job, alloc) = rate(kind, type of the nodes) / rate(kind,
reference type)``, so a job's trace duration stays its run time on the
reference type (Gavel's jobs are sized on a V100) and every policy that asks
the model sees the same speeds.  A multi-node allocation runs at its slowest
type's pace; a type, or a job, the matrix does not know is neutral (1.0).

The matrix comes from one of:

* Gavel's throughput file (``simulation_throughputs.json``: ``{type: {"('Model
  (batch size B)', scale)": {"null": solo steps/s, "('Other', scale)": [this
  job's, the other's steps/s]}}}``; the ``*_unconsolidated`` columns, Gavel's
  multi-GPU jobs spread over servers, are left out: the locality factor prices
  spreading; each model also gets a row, the mean of its job types' relative speeds,
  for jobs known by model alone: ``resnet50`` in a Philly trace);
* a profile the user gives (:func:`load_type_speeds`): a CSV with a ``model``
  column, an optional ``gpus`` column and one column per GPU type, or JSON/TOML
  ``{"reference": "v100", "jobs": {"resnet50": {"v100": 2.1, "k80": 0.4}}}``;
  rates in any unit (only their ratios along a row matter);
* the jobs themselves: ``attrs["type_speeds"]`` (``{type: speed}``, e.g. what the
  service measured, exported with ``gpuloom history --as-trace``);
* the service's measurements, per job (:meth:`TypeSpeeds.measure`).

Lookups for a job, first hit wins: the job's own measured entry (by id), its
``attrs["job_type"]`` (Gavel's ``ResNet-50 (batch size 64)``, any case and
spacing), then its model (:func:`~gpuloom.core.parse.normalise_model`); for
each, the entry for its GPU count, else one without a count, else the nearest
count below (then above): Gavel measured scale factors 1, 2, 4 and 8, its
traces ask for up to 64.  GPU types are compared through
:func:`~gpuloom.core.parse.normalise_gpu_type`.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.cluster import Cluster
from ..core.job import Job, JobSpec, may_hold
from ..core.parse import FieldError, normalise_gpu_type, normalise_model
from ..core.plan import Allocation

Kind = tuple[str, int | None]  #: (canonical job type or model, GPU count or None)

#: ``JobSpec.attrs`` keys this module reads
JOB_TYPE_KEY = "job_type"
INLINE_KEY = "type_speeds"
SPEEDS_FILE_KEY = "gpu_speeds_file"
_ID = "\0id:"  # prefix of per-job (measured) kinds: cannot clash with a model name


class TypeSpeedsError(FieldError):
    """A throughput matrix that cannot be used; the message names the file and where."""


def canonical(name: str) -> str:
    """A job type as matrix keys hold it: lower case, blanks collapsed (``ResNet-50 (batch size 64)`` ->
    ``resnet-50 (batch size 64)``)."""
    return " ".join(name.lower().split())


@dataclass
class TypeSpeeds:
    """Throughput per (job kind, GPU type), and per co-located pair of kinds.

    ``rates[(kind, gpus)][type]`` is a throughput in any unit (steps/s in Gavel's file);
    ``pairs[((a, ga), (b, gb))][type] = (rate of a, rate of b)`` while they share a GPU;
    ``reference`` the type whose rate is speed 1.0 (a row without it is relative to its fastest).
    ``version`` counts changes (measurements), so caches of derived speeds know when to refresh.
    """

    rates: dict[Kind, dict[str, float]] = field(default_factory=dict)
    pairs: dict[tuple[Kind, Kind], dict[str, tuple[float, float]]] = field(default_factory=dict)
    reference: str | None = None
    source: str = ""
    version: int = 0
    _by_name: dict[str, list[int | None]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.reference is not None:
            self.reference = normalise_gpu_type(self.reference)
        self._index()

    def _index(self) -> None:
        by: dict[str, list[int | None]] = {}
        for name, g in self.rates:
            by.setdefault(name, []).append(g)
        self._by_name = by

    # -- contents ---------------------------------------------------------------------------
    @property
    def types(self) -> tuple[str, ...]:
        """Every GPU type some row rates, in first-seen order."""
        return tuple(dict.fromkeys(t for row in self.rates.values() for t in row))

    def add(self, name: str, gpus: int | None, type_: str, rate: float) -> None:
        """Set one rate (``name`` a job type or model; ``gpus`` None: any count)."""
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError(f"rate of {name!r} on {type_!r} must be a finite number >= 0, got {rate!r}")
        key = (canonical(name), gpus)
        if key not in self.rates:
            self.rates[key] = {}
            self._by_name.setdefault(key[0], []).append(gpus)
        self.rates[key][normalise_gpu_type(type_)] = float(rate)
        self.version += 1

    def measure(self, job_id: str, type_: str, speed: float) -> None:
        """One job's measured speed on one type, relative to its reference (the service's progress
        lines, converted by the caller): it wins over the job's kind from then on, type by type."""
        if not (speed >= 0 and math.isfinite(speed)):
            raise ValueError(f"job {job_id}: measured speed on {type_!r} must be a finite number >= 0, got {speed!r}")
        key = (_ID + job_id, None)
        if key not in self.rates:
            self.rates[key] = {}
            self._by_name.setdefault(key[0], []).append(None)
        self.rates[key][normalise_gpu_type(type_)] = float(speed)
        self.version += 1

    def forget(self, job_id: str) -> None:
        """Drop a job's measured rates (it ended)."""
        if self.rates.pop((_ID + job_id, None), None) is not None:
            self._by_name.pop(_ID + job_id, None)
            self.version += 1

    def measured(self, job_id: str) -> dict[str, float]:
        """The rates measured for ``job_id`` (type -> rate), empty if none."""
        return dict(self.rates.get((_ID + job_id, None), {}))

    # -- lookups ------------------------------------------------------------------------------
    def _row(self, name: str, gpus: int) -> tuple[Kind, dict[str, float]] | None:
        counts = self._by_name.get(name)
        if not counts:
            return None
        if gpus in counts:
            g: int | None = gpus
        elif None in counts:
            g = None
        else:
            known = sorted(c for c in counts if c is not None)
            below = [c for c in known if c < gpus]
            g = below[-1] if below else known[0]
        return (name, g), self.rates[(name, g)]

    def kind_of(self, spec: JobSpec) -> tuple[Kind, dict[str, float]] | None:
        """The declared matrix row for ``spec``'s kind (see the module notes), or None."""
        attrs = spec.attrs
        jt = attrs.get(JOB_TYPE_KEY) if attrs else None
        hit = None
        if jt:
            hit = self._row(canonical(str(jt)), spec.gpus) or self._row(normalise_model(str(jt)), spec.gpus)
        if hit is None and spec.model:
            hit = self._row(canonical(spec.model), spec.gpus) or self._row(normalise_model(spec.model), spec.gpus)
        return hit

    def relative(self, spec: JobSpec) -> dict[str, float] | None:
        """``{type: speed}`` for ``spec`` relative to the reference type (its kind's row over the row's
        reference rate, else its fastest), overridden type by type by what was measured for the job;
        None if the matrix knows neither."""
        hit = self.kind_of(spec)
        out: dict[str, float] | None = None
        if hit is not None:
            row = hit[1]
            ref = self._ref_rate(row)
            out = {t: (r / ref if ref > 0 else 0.0) for t, r in row.items()}
        mine = self.rates.get((_ID + spec.id, None)) if self._by_name.get(_ID + spec.id) else None
        if mine:
            out = dict(out or {})
            out.update(mine)
        return out

    def rate(self, name: str, gpus: int, type_: str | None = None) -> tuple[float, int | None] | None:
        """(throughput of job type or model ``name`` on ``gpus`` GPUs of ``type_`` (default the reference
        type, else the row's fastest), the GPU count of the row used), or None if unknown."""
        hit = self._row(canonical(name), gpus) or self._row(normalise_model(name), gpus)
        if hit is None:
            return None
        row = hit[1]
        r = self._ref_rate(row) if type_ is None else row.get(normalise_gpu_type(type_))
        return None if r is None else (r, hit[0][1])

    def _ref_rate(self, row: Mapping[str, float]) -> float:
        ref = self.reference
        if ref is not None:
            r = row.get(ref)
            if r is not None and r > 0:
                return r
        return max(row.values(), default=0.0)

    def reference_rate(self, spec: JobSpec) -> float | None:
        """The rate ``spec``'s kind reaches on the reference type (what speed 1.0 stands for)."""
        hit = self.kind_of(spec)
        if hit is None:
            return None
        r = self._ref_rate(hit[1])
        return r if r > 0 else None

    def pair(self, a: JobSpec, b: JobSpec, type_: str) -> tuple[float, float] | None:
        """(speed of ``a``, speed of ``b``) relative to each one's reference while they share a GPU of
        ``type_``, or None if the matrix has no such pair."""
        ha, hb = self.kind_of(a), self.kind_of(b)
        if ha is None or hb is None or not self.pairs:
            return None
        got = self.pairs.get((ha[0], hb[0]))
        flip = False
        if got is None:
            got = self.pairs.get((hb[0], ha[0]))
            flip = True
        if got is None or type_ not in got:
            return None
        ra, rb = got[type_]
        if flip:
            ra, rb = rb, ra
        refa, refb = self._ref_rate(ha[1]), self._ref_rate(hb[1])
        return (ra / refa if refa > 0 else 0.0, rb / refb if refb > 0 else 0.0)


# ------------------------------------------------------------------------------------- files
_GAVEL_KEY = re.compile(r"^\(\s*'(.*)'\s*,\s*(\d+)\s*\)$")


def _gavel_kind(text: str, path: Path, where: str) -> Kind:
    m = _GAVEL_KEY.match(text.strip())
    if not m:
        raise TypeSpeedsError(f"{where}: expected \"('Job type', scale factor)\", got {text!r}", path)
    return canonical(m.group(1)), int(m.group(2))


def _rate(v: Any, path: Path, where: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeSpeedsError(f"{where}: expected a throughput, got {v!r}", path) from None
    if not (f >= 0 and math.isfinite(f)):
        raise TypeSpeedsError(f"{where}: a throughput must be a finite number >= 0, got {v!r}", path)
    return f


def _is_gavel(data: Any) -> bool:
    if not isinstance(data, Mapping) or not data or "jobs" in data:
        return False
    first = next(iter(data.values()))
    return isinstance(first, Mapping) and all(isinstance(k, str) and k.startswith("(") for k in list(first)[:3])


def _from_gavel(data: Mapping[str, Any], path: Path, pairs: bool) -> TypeSpeeds:
    ts = TypeSpeeds(reference="v100" if "v100" in data else None, source=str(path))
    for type_, rows in data.items():
        if "unconsolidated" in type_:
            continue
        t = normalise_gpu_type(type_)
        if not isinstance(rows, Mapping):
            raise TypeSpeedsError(f"type {type_!r}: expected an object of job types", path)
        for key, entry in rows.items():
            kind = _gavel_kind(key, path, f"{type_} / {key}")
            if not isinstance(entry, Mapping) or "null" not in entry:
                raise TypeSpeedsError(f"{type_} / {key}: expected an object with a 'null' (solo) throughput", path)
            ts.rates.setdefault(kind, {})[t] = _rate(entry["null"], path, f"{type_} / {key} / null")
            if not pairs:
                continue
            for other, both in entry.items():
                if other == "null":
                    continue
                okind = _gavel_kind(other, path, f"{type_} / {key} / {other}")
                if not (isinstance(both, Sequence) and len(both) == 2):
                    raise TypeSpeedsError(f"{type_} / {key} / {other}: expected [this job's, the other's] "
                                          f"throughputs", path)
                ts.pairs.setdefault((kind, okind), {})[t] = (_rate(both[0], path, f"{type_} / {key} / {other}"),
                                                             _rate(both[1], path, f"{type_} / {key} / {other}"))
    _model_rows(ts)
    ts._index()
    return ts


def _model_rows(ts: TypeSpeeds) -> None:
    """Rows by model name too (``resnet50``: Gavel's job types carry a batch size), each the mean of its
    job types' speeds relative to their reference type, so jobs known only by model (Philly, Sia traces)
    get their model's typical speed-ups."""
    groups: dict[Kind, list[dict[str, float]]] = {}
    for (name, g), row in ts.rates.items():
        m = normalise_model(name)
        ref = ts._ref_rate(row)
        if m != name and ref > 0:
            groups.setdefault((m, g), []).append({t: r / ref for t, r in row.items()})
    for key, rows in groups.items():
        if key in ts.rates:
            continue
        types = {t for r in rows for t in r}
        ts.rates[key] = {t: sum(r.get(t, 0.0) for r in rows) / len(rows) for t in types}


def _from_table(data: Mapping[str, Any], path: Path) -> TypeSpeeds:
    jobs = data.get("jobs")
    if not isinstance(jobs, Mapping) or not jobs:
        raise TypeSpeedsError("expected a 'jobs' table: {model: {gpu type: throughput}}", path)
    ref = data.get("reference")
    ts = TypeSpeeds(reference=str(ref) if ref else None, source=str(path))
    for name, row in jobs.items():
        name_s, gpus = str(name), None
        m = re.match(r"^(.*?)\s*/\s*(\d+)$", name_s)  # "resnet50/4": the row for 4-GPU jobs
        if m:
            name_s, gpus = m.group(1), int(m.group(2))
        if not isinstance(row, Mapping) or not row:
            raise TypeSpeedsError(f"jobs / {name}: expected {{gpu type: throughput}}", path)
        for t, v in row.items():
            ts.add(name_s, gpus, str(t), _rate(v, path, f"jobs / {name} / {t}"))
    ts.version = 0
    return ts


def _from_csv(path: Path) -> TypeSpeeds:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise TypeSpeedsError("empty file", path)
    head = [c.strip() for c in rows[0]]
    low = [c.lower() for c in head]
    if "model" not in low:
        raise TypeSpeedsError("the header needs a 'model' column, then one column per GPU type", path, 1)
    mi = low.index("model")
    gi = low.index("gpus") if "gpus" in low else None
    tcols = [i for i in range(len(head)) if i not in (mi, gi)]
    if not tcols:
        raise TypeSpeedsError("no GPU type columns in the header", path, 1)
    ts = TypeSpeeds(source=str(path))
    for ln, r in enumerate(rows[1:], start=2):
        if len(r) != len(head):
            raise TypeSpeedsError(f"expected {len(head)} fields, got {len(r)}", path, ln)
        name = r[mi].strip()
        if not name:
            raise TypeSpeedsError("empty model name", path, ln, "model")
        gpus = None
        if gi is not None and r[gi].strip():
            try:
                gpus = int(r[gi])
            except ValueError:
                raise TypeSpeedsError(f"expected a GPU count, got {r[gi]!r}", path, ln, "gpus") from None
        for i in tcols:
            cell = r[i].strip()
            if cell:
                try:
                    v = float(cell)
                except ValueError:
                    raise TypeSpeedsError(f"expected a throughput, got {cell!r}", path, ln, head[i]) from None
                if not (v >= 0 and math.isfinite(v)):
                    raise TypeSpeedsError(f"a throughput must be >= 0, got {cell!r}", path, ln, head[i])
                ts.add(name, gpus, head[i], v)
    ts.version = 0
    return ts


_CACHE: dict[tuple[str, float, bool], TypeSpeeds] = {}


def load_type_speeds(path: str | Path, pairs: bool = True) -> TypeSpeeds:
    """Read a throughput matrix (see the module notes: Gavel's JSON, a CSV, or a JSON/TOML table);
    ``pairs=False`` skips Gavel's co-location pairs.  Files are read once per modification time."""
    p = Path(path)
    try:
        key = (str(p.resolve()), p.stat().st_mtime, pairs)
    except OSError as e:
        raise TypeSpeedsError(f"cannot read: {e.strerror}", p) from None
    hit = _CACHE.get(key)
    if hit is not None:
        return _copy(hit)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        ts = _from_csv(p)
    else:
        try:
            text = p.read_text()
            data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise TypeSpeedsError(f"not valid {'TOML' if suffix == '.toml' else 'JSON'}: {e}", p) from None
        ts = _from_gavel(data, p, pairs) if _is_gavel(data) else _from_table(data, p)
    if not ts.rates:
        raise TypeSpeedsError("no throughputs in the file", p)
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = ts
    return _copy(ts)


def _copy(ts: TypeSpeeds) -> TypeSpeeds:
    """A copy whose rows can be measured into without changing the cached file's."""
    out = TypeSpeeds({k: dict(v) for k, v in ts.rates.items()}, ts.pairs, ts.reference, ts.source)
    return out


def from_jobs(specs: Iterable[JobSpec]) -> TypeSpeeds | None:
    """A matrix of the jobs' own ``attrs["type_speeds"]`` (relative speeds, per job), or None."""
    if isinstance(specs, Sequence) and not may_hold(specs, INLINE_KEY):
        return None
    ts = TypeSpeeds(source="the jobs' type_speeds")
    for s in specs:
        row = s.attrs.get(INLINE_KEY) if s.attrs else None
        if not row:
            continue
        if not isinstance(row, Mapping):
            if isinstance(row, str):
                try:
                    row = ast.literal_eval(row)
                except (ValueError, SyntaxError):
                    row = None
            if not isinstance(row, Mapping):
                raise ValueError(f"job {s.id}: type_speeds must be {{gpu type: speed}}, got {row!r}")
        for t, v in row.items():
            ts.measure(s.id, str(t), float(v))
    if not ts.rates:
        return None
    ts.version = 0
    return ts


def trace_speeds_file(specs: Sequence[JobSpec]) -> str | None:
    """The throughput file a trace reader loaded for these jobs (Gavel's traces), if exactly one."""
    if not may_hold(specs, SPEEDS_FILE_KEY):
        return None
    files = {s.attrs.get(SPEEDS_FILE_KEY) for s in specs if s.attrs and s.attrs.get(SPEEDS_FILE_KEY)}
    return str(files.pop()) if len(files) == 1 else None


# ------------------------------------------------------------------------------------- the factor
class GpuTypeFactor:
    """Throughput factor ``"gpu_type"``: a job's speed on the GPU types of its allocation.

    ``speeds(job)`` gives ``{type: speed}`` over the cluster's types (1.0 where the matrix says
    nothing), cached per job until the matrix changes; policies read it to weigh where a job
    runs fastest.  Jobs sharing GPUs are slowed by the interleave factor alone: the matrix's
    co-located pairs (:meth:`TypeSpeeds.pair`) are read but not applied here, since a job that
    carries Muri stage profiles too would pay twice (see docs/gavel.md).
    """

    name = "gpu_type"

    def __init__(self, speeds: TypeSpeeds, cluster: Cluster) -> None:
        self.matrix = speeds
        self.cluster = cluster
        self.node_type: list[str] = [normalise_gpu_type(n.gpu_type) for n in cluster.nodes]
        self.types: tuple[str, ...] = cluster.gpu_types

    def speeds(self, job: Job) -> dict[str, float]:
        """``{type: speed}`` of ``job`` on every type of the cluster (1.0 where unknown)."""
        m = self.matrix
        hit = job.extra.get("type_speeds")
        if hit is not None and hit[0] == m.version and hit[1] is m:
            return hit[2]
        rel = m.relative(job.spec)
        out = {t: 1.0 for t in self.types}
        if rel:
            for t in self.types:
                v = rel.get(t)
                if v is not None:
                    out[t] = v
        job.extra["type_speeds"] = (m.version, m, out)
        return out

    def known(self, job: Job) -> bool:
        """Whether the matrix has a row for ``job``."""
        return self.matrix.relative(job.spec) is not None

    def __call__(self, job: Job, alloc: Allocation) -> float:
        sp = self.speeds(job)
        nt = self.node_type
        parts = alloc.parts
        if len(parts) == 1:
            return sp.get(nt[parts[0].node], 1.0)
        return min(sp.get(nt[p.node], 1.0) for p in parts)


def runnable_types(job: Job, model: Any) -> tuple[str, ...] | None:
    """The GPU types ``job`` can run on by ``model``'s ``gpu_type`` factor (speed > 0), or None when
    it runs on every type (or the model has no such factor): placement keeps jobs off the others
    (Gavel measured no throughput for some jobs on a K80)."""
    f = model.get("gpu_type")
    if f is None:
        return None
    sp = f.speeds(job)
    hit = job.extra.get("runnable_types")
    if hit is not None and hit[0] is sp:
        return hit[1]
    out = None if all(v > 0 for v in sp.values()) else tuple(t for t, v in sp.items() if v > 0)
    job.extra["runnable_types"] = (sp, out)
    return out


def add_gpu_types(model: Any, speeds: TypeSpeeds) -> Any:
    """Add (or replace) the ``gpu_type`` factor of ``model`` with ``speeds``; returns the model."""
    model.factors = [f for f in model.factors if f.name != "gpu_type"]
    return model.add(GpuTypeFactor(speeds, model.cluster))
