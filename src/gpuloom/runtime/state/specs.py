"""Job specs in the service: parsing the API's fields, and a stored spec as a :class:`JobSpec`.

``parse_mem`` and ``parse_time_limit`` (:mod:`gpuloom.core.units`) read what users write (``8G``, ``8Gi``, ``60``).
Memory units are exact: ``K``/``M``/``G``/``T`` are powers of 1000, ``Ki``/``Mi``/``Gi``/``Ti``
powers of 1024, and the service counts memory in MB of 10^6 bytes for jobs, nodes
(``--mem-gb-per-node 64`` = 64 000 MB) and cgroup limits alike;
:func:`job_spec` turns a stored row into the :class:`~gpuloom.core.job.JobSpec`
the scheduler sees: the job's work estimate (``duration``) is ``iterations x
iteration_time`` when the spec gives both (what the simulator calls a job's
work), else its time limit, else ``default_duration``; the fields in
:data:`SPEC_ATTRS` reach the policies as ``JobSpec.attrs`` (priority, Muri stage
times, elastic curves, the queue); an inline ``profile`` record becomes ``JobSpec.profile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.job import JobSpec
from ...core.request import POLICY_ATTRS, stored_job_spec
from ...core.units import (  # noqa: F401 (the parsers' former home: callers import them from here)
    BYTES_PER_MB,
    GPU_TYPE_RE,
    MAX_DURATION,
    MEM_UNITS,
    parse_duration,
    parse_gres,
    parse_mem,
    parse_mem_bytes,
    parse_time_limit,
)
from ...perf.profile_record import is_record, profile_from_record
from .store import JobRow

DEFAULT_DURATION = 3600.0  # work estimate (s) for jobs without a time limit
SPEC_ATTRS = POLICY_ATTRS  #: job-spec fields passed to policies as ``JobSpec.attrs``

def job_spec(row: JobRow, epoch: float, default_duration: float = DEFAULT_DURATION, profile: Any = None,
             arrival: float | None = None) -> JobSpec:
    """The scheduler's view of a stored job; ``arrival`` in service time (default: seconds from ``epoch``
    to its submission)."""
    s: Mapping[str, Any] = row.spec
    if profile is None and is_record(s.get("profile")):
        profile = profile_from_record(profile_key(s), s["profile"])
    if arrival is None:
        arrival = max(0.0, row.submit_time - epoch)
    return stored_job_spec(s, str(row.id), arrival, row.user, default_duration, profile)


def profile_key(spec: Mapping[str, Any]) -> str:
    """The key a job's profile goes by: ``<model or name>/<gpus>gpu`` (the service's ``profiles`` table)."""
    return f"{spec.get('model') or spec.get('name') or 'job'}/{int(spec['gpus'])}gpu"
