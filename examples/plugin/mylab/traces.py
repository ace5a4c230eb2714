"""A trace format: one job a line, ``id arrival_s gpus duration_s``; ``#`` starts a comment."""

from pathlib import Path

from gpuloom.core.job import JobSpec
from gpuloom.sim.traces import TraceError


def read_mylab(path: Path) -> list[JobSpec]:
    jobs = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        fields = line.partition("#")[0].split()
        if not fields:
            continue
        if len(fields) != 4:
            raise TraceError(f"expected 4 fields (id arrival gpus duration), got {len(fields)}", path, n)
        name, arrival, gpus, duration = fields
        jobs.append(JobSpec(name, float(arrival), int(gpus), float(duration)))
    return jobs
