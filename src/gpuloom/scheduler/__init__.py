"""One scheduling round: order → queue → group → size → place, then plan hooks.

Which shortcuts a round may take is chosen from the stages' declarations by
:class:`~gpuloom.policies.fastpath.FastPaths`; ``-P`` routing is
:func:`~gpuloom.policies.check.route_params`.

The same :class:`Scheduler` object drives the simulator (:mod:`gpuloom.sim`)
and the real service (:mod:`gpuloom.runtime`), both through the driver
(:mod:`gpuloom.driver`): it builds a :class:`~gpuloom.policies.base.View`
and receives a :class:`Round`, the plan together with the requests it answers,
so :meth:`Scheduler.check` reads nothing left behind by an earlier call.

**Binding.**  :meth:`Scheduler.bind` checks the stages' declared needs
(``requires_factors``) against a throughput model before the first round:
missing factors are added (their declared default) or, with ``strict`` or when
there is no default (node topologies), refused naming the stage, the factor and
the option that gives it.  Both faces bind through the driver.

**Parameters.**  :meth:`Scheduler.from_names` takes ``-P`` style parameters:
``stage.name`` goes to that stage only; a bare ``name`` to the one chosen stage
that accepts it.  A bare name two chosen stages accept is ambiguous (an error
that lists the qualified forms) unless every one of them declares it shared
(``shared_params``: static slots); a name no chosen stage accepts is an error
that lists the accepted names.

Speed: when the sizer keeps every job at its requested GPU count
(``fixed_gpus``) and the group policy does not merge jobs (``merges``), only the prefix of the ordered
queue whose GPU demand can fill the cluster (counted as in phase 1 of
placement) is sized and placed.  If that plan leaves GPUs free while jobs past
the prefix wait, the round is redone on the whole queue, so the result is the
same as without the shortcut.

**Pending reasons.**  A round also says why each active job it leaves waiting
waits (``Round.reasons``, Slurm's REASON column): ``Resources`` when the GPUs
the plan leaves free are fewer than it asks for, ``Priority`` when enough are
free but jobs ahead of it hold it back (a strict queue, a non-preemptive
order), ``Placement`` when free GPUs exist but no placement of its gang does
(fragmentation, consolidation).  A stage may give its own reasons
(:meth:`~gpuloom.policies.base.Stage.pending_reasons`: a queue at its quota,
say), which take precedence.

**Queues.**  With a queue stage (:mod:`gpuloom.policies.queues`) the
pipeline runs on what it admits, guaranteed jobs first; lent GPUs are
reclaimed in the same round (:meth:`Scheduler._queued`: two passes, then
eviction for what a queue is still owed), the stage enforces its limits after
the hooks, and :meth:`Scheduler.check` runs its invariants.

*Plan hooks* (:meth:`~gpuloom.policies.base.Stage.plan_hooks`) run after
placement and may amend the plan against the current state (e.g. hysteresis:
keep protected jobs where they are); each is a callable ``hook(plan, view) ->
Plan``.  When a hook keeps a job on its current allocation, that job's request
is updated to match, so the gang check still holds against the final plan.

**Modules.**  :mod:`.core`: the :class:`Scheduler` (stages, binding, the round without a queue stage,
reasons, checks); :mod:`.rounds`: :class:`Round` and the pipeline every round runs; :mod:`.queued`: the
queue rounds; :mod:`.reclaim`: their two passes and evictions.
"""

from .core import PLACEMENT, PRIORITY, RESOURCES, RequirementError, Scheduler
from .rounds import PlanHook, Round

__all__ = ["PLACEMENT", "PRIORITY", "RESOURCES", "PlanHook", "RequirementError", "Round", "Scheduler"]
