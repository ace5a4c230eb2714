"""An order policy: the job asking for the fewest GPUs first, ties by arrival."""

from gpuloom.core.job import Job
from gpuloom.policies.base import View
from gpuloom.policies.order import KeyOrder


class FewestGpus(KeyOrder):
    """Smallest gang first: short queues for small jobs (large ones may wait long)."""

    dynamic = False  # the key never changes while a job waits: rounds without events are skipped

    def key(self, job: Job, view: View) -> float:
        return float(job.spec.gpus)
