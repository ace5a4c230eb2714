"""``gavel``: Gavel's ``.trace`` files (tab-separated).

7 fields (``msr/``): ``job_type, command, num_steps_arg, needs_data_dir,
total_steps, arrival_time, scale_factor`` (the data README's order is not what
the files hold: the 4th field is only ever 0/1 and is 0 exactly for
CycleGAN's ``--max-steps``; the 7th takes 1..64 and is the GPU count).
10 fields (``physical_cluster/`` and what Gavel's simulator writes with
``output_trace_file_name``): ``job_type, command, working_directory,
num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
arrival_time`` (Gavel's parse_trace).

Duration = ``total_steps / steps_per_second`` on the reference type (a V100),
the throughput Gavel measured for the job type and scale factor: the reader
looks for Gavel's throughput file beside the trace in the data folder
(``gavel/throughputs/simulation_throughputs.json`` for ``msr/`` and generated
traces, ``physical_cluster_throughputs.json`` for ``physical_cluster/``), or
takes ``throughputs=FILE``; it records the file in ``attrs["gpu_speeds_file"]``
so the throughput model's ``gpu_type`` factor gives each job its speed per
GPU type (:mod:`gpuloom.perf.gputype`).  Scale factors Gavel did not measure
(its msr traces ask for up to 64 GPUs; it measured 1, 2, 4, 8) use the nearest
measured one below.  ``throughputs="none"``, or a job type the file lacks,
falls back to :data:`GAVEL_SAMPLES_PER_SECOND`, an **assumption**: rough
single-V100 samples/s per model (steps/s = samples/s / batch size).
``steps_per_second={job_type or model: steps/s}`` wins over both: an exact job
type wins; models are matched through :func:`gpuloom.core.parse.normalise_model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.job import JobSpec
from ...core.parse import normalise_model
from .fields import Builder, Trace, Where, float_field, int_field, read_rows, str_field
from .formats import FORMATS

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
_SAMPLES = {normalise_model(m): v for m, v in GAVEL_SAMPLES_PER_SECOND.items()}
_STEPS = {normalise_model(m): v for m, v in GAVEL_STEPS_PER_SECOND.items()}


def _gavel_job_type(job_type: str) -> tuple[str, int | None]:
    """``"ResNet-18 (batch size 128)"`` -> ``("ResNet-18", 128)``."""
    model, sep, rest = job_type.partition(" (batch size ")
    if sep and rest.endswith(")") and rest[:-1].isdigit():
        return model.strip(), int(rest[:-1])
    return job_type.strip(), None


def find_throughputs(trace: Path) -> Path | None:
    """Gavel's throughput file for a trace in the data folder's ``gavel/`` (see the module notes), or None."""
    name = "physical_cluster_throughputs.json" if trace.parent.name == "physical_cluster" else \
        "simulation_throughputs.json"
    ups = list(trace.parents[:4]) if len(trace.parents) >= 2 else list(trace.absolute().parents[:4])
    for up in ups:
        cand = up / "throughputs" / name
        if cand.is_file():
            return cand
        cand = up / "gavel" / "throughputs" / name
        if cand.is_file():
            return cand
    return None


@FORMATS.register("gavel")
def read_gavel(path: str | Path, steps_per_second: Mapping[str, float] | None = None,
               throughputs: str | Path | None = None) -> Trace:
    """Gavel ``.trace`` (7-field msr or 10-field physical-cluster layout, tab-separated)."""
    p = Path(path)
    w = Where(p)
    b = Builder(p, "gavel")
    sps = dict(steps_per_second or {})
    matrix = None
    tp: Path | None = None
    if throughputs is None:
        tp = find_throughputs(p)
    elif str(throughputs).strip().lower() != "none":
        tp = Path(throughputs)
    if tp is not None:
        from ...perf.gputype import load_type_speeds

        matrix = load_type_speeds(tp, pairs=False)
    # keys that are not job types with a batch size also match a model in any spelling
    sps_model = {normalise_model(k): v for k, v in sps.items() if _gavel_job_type(k)[1] is None}
    for row in read_rows(p, w, delimiter="\t"):
        b.rows += 1
        if len(row) == 7:
            job_type, _cmd, _arg, ndd, steps_s, arrival_s, scale_s = row
            prio_s = None
        elif len(row) == 10:
            job_type, _cmd, _wd, _arg, ndd, steps_s, scale_s, prio_s, _slo, arrival_s = row
        else:
            raise w.error(None, f"expected 7 or 10 tab-separated fields, got {len(row)}")
        job_type = str_field(job_type, "job_type", w)
        if ndd.strip() not in ("0", "1"):
            raise w.error("needs_data_dir", f"expected 0 or 1, got {ndd!r}")
        steps = int_field(steps_s, "total_steps", w)
        arrival = float_field(arrival_s, "arrival_time", w)
        gpus = int_field(scale_s, "scale_factor", w)
        model, batch = _gavel_job_type(job_type)
        norm = normalise_model(model)
        rate = sps.get(job_type, sps_model.get(norm))
        measured = None
        if rate is None and matrix is not None:
            measured = matrix.rate(job_type, gpus)
            if measured is not None and measured[0] > 0:
                rate = measured[0]
        if rate is None:
            if norm in _STEPS:
                rate = _STEPS[norm]
            elif norm in _SAMPLES and batch:
                rate = _SAMPLES[norm] / batch
            else:
                raise w.error("job_type", f"no throughput known for {job_type!r} (pass steps_per_second=)")
        if not rate > 0:
            raise w.error("job_type", f"steps per second for {job_type!r} must be > 0, got {rate}")
        attrs: dict[str, Any] = {"job_type": job_type, "total_steps": steps, "steps_per_second": rate}
        if matrix is not None and tp is not None:
            attrs["gpu_speeds_file"] = str(tp)  # the gpu_type factor's matrix (measured rows or not)
        if batch is not None:
            attrs["batch_size"] = batch
        if prio_s is not None:
            attrs["priority"] = float_field(prio_s, "priority_weight", w)
        jid = f"{p.stem}-{b.rows - 1}"
        b.add(w, JobSpec.from_iterations, jid, arrival, gpus, steps, 1.0 / rate,
                  model=model, attrs=attrs)
    return b.done()
