"""One driver for both faces: the owner of jobs and plans, and the one route from options to a run.

:mod:`.core` holds the :class:`Driver` (jobs, current plan, rounds, completions,
lifecycle steps) and the :class:`Backend` protocol that the simulator and the
service implement; :mod:`.stack` turns names and options into a scheduler and a
throughput model.  The layer sits on the scheduler and below ``sim`` and
``runtime``: core <- perf <- policies <- scheduler <- driver <- sim, runtime <- cli.
"""

from .core import Backend, Driver, DriverError, LaunchFailed, Listener, Step, lifecycle_steps
from .stack import STAGE_DEFAULTS, Stack

__all__ = ["STAGE_DEFAULTS", "Backend", "Driver", "DriverError", "LaunchFailed", "Listener", "Stack", "Step",
           "lifecycle_steps"]
