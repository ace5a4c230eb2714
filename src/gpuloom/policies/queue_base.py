"""The queue stage's contract (:mod:`gpuloom.policies.queues` has the stages themselves).

The scheduler (:meth:`gpuloom.scheduler.Scheduler._queued`) calls, each round:
:meth:`QueuePolicy.admit` (tiers of the ordered jobs), :meth:`QueuePolicy.owed`
after planning (what queues below their guarantee are still owed, for reclaim
by eviction) and :meth:`QueuePolicy.note_guaranteed`; after the plan hooks
:meth:`QueuePolicy.owed` and :meth:`QueuePolicy.owed_again` (a hook may delay a
reclaim by one round, not more), then :meth:`QueuePolicy.enforce`;
:meth:`QueuePolicy.check` with the round check.  The base, registered as ``none``, is disabled: the scheduler then
runs the pipeline as if there were no queue stage.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.job import Job
from ..core.plan import Allocation, Plan
from .base import PlacePolicy, Stage, View


@dataclass(slots=True)
class Admission:
    """What the queue stage admits in one round (:mod:`gpuloom.policies.queues`)."""

    guaranteed: list[Job] = field(default_factory=list)  # tier A: within their queue's guarantee
    over: list[Job] = field(default_factory=list)  # tier B: borrowing, in the cross-queue order
    held: dict[str, str] = field(default_factory=dict)  # job id -> why it is not admitted
    truncated: bool = False  # the walk stopped once the admitted jobs asked for every GPU
    #: guaranteed, then over, read as one sequence; ``over`` grows as it is read when the walk is lazy
    #: (``admit(lazy=True)``); ``truncated`` and ``held`` are complete once it is read to the end
    walk: Any = None
    #: when the stage keeps it: (the borrowing walk's steps as (leaf, what its job took, or None: held
    #: back), each leaf's GPUs in use when the walk began, each leaf's next job when it last stopped)
    log: Any = None
    #: each leaf's next job in the borrowing walk (None: none left) as far as the walk was read
    heads: Any = None
    #: a lazy walk (``admit(lazy=True)`` without ``full``) whose jobs read so far ask for twice the cluster's
    #: GPUs waits there: its reading ends, and the next one goes on as ``admit(full=True)``'s walk would if
    #: :meth:`QueuePolicy.read_whole` lifted the bound meanwhile, else the walk stops there (``truncated``
    #: when jobs are left).  While it waits: whether jobs are left past it (True) or not (False); else None
    paused: bool | None = None

    def finish(self) -> None:
        """Read a lazy walk to its end (``over``, ``held`` and ``truncated`` are then complete)."""
        if self.walk is not None:
            self.walk.finish()

    @property
    def ordered(self) -> list[Job]:
        return self.guaranteed + self.over if self.over else self.guaranteed


@dataclass(slots=True)
class Owed:
    """A queue below its guarantee: which (``queue``, a stage's own number), the GPUs it may still take
    (within every limit), and its waiting jobs that fit them in its order (read once, possibly lazily: a
    reader may stop once the room is used up)."""

    queue: int
    room: float
    jobs: Iterable[Job]


class QueuePolicy(Stage):
    """The queue stage: admission and order across queues (see the module notes)."""

    stage: ClassVar[str] = "queue"
    dynamic: ClassVar[bool] = False
    #: False: the scheduler skips the stage (no admission, no two-pass reclaim, no checks)
    enabled: ClassVar[bool] = False

    def admit(self, ordered: Sequence[Job], view: View, strict: bool = False, full: bool = False,
              lazy: bool = False) -> Admission:
        """Tiers of ``ordered`` (the order policy's order); ``strict``: no job passes one that does not fit;
        ``full``: walk past the point where the admitted jobs ask for every GPU; ``lazy``: the borrowing tier
        is walked only as far as ``Admission.walk`` is read, and a stage that keeps its jobs per queue from
        the driver's changes (:meth:`listener`) may read them instead of ``ordered`` (FIFO: ``ordered`` is
        the order of admission)."""
        return Admission(list(ordered))

    def listener(self, tally: Any) -> Any:
        """An object the driver whose tally is ``tally`` tells of its changes
        (:class:`~gpuloom.driver.Listener`), or None."""
        return None

    def check_listener(self, tally: Any) -> Any:
        """Another such object for the stage's round check (:meth:`check`), which keeps sums of its own, or None."""
        return None

    def read_whole(self, adm: Admission) -> bool:
        """Make ``adm``'s lazy walk, not read to a stop of its own yet, go on as ``admit(full=True)``'s would
        (True), so the round need not admit again to learn whether it was cut short; else False."""
        return False

    def running_borrowed(self, adm: Admission, view: View) -> list[Job] | None:
        """The running jobs of ``adm``'s lazy borrowing walk in its order when the stage knows them without
        reading the walk, else None."""
        return None

    def owed(self, plan: Plan, view: View) -> list[Owed]:
        """Per queue below its guarantee in ``plan``: what it is owed (see :class:`Owed`)."""
        return []

    def lent(self, allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        """The borrowed work in ``allocs`` that reclaim may evict: the placed jobs not called guaranteed
        (nor in ``guaranteed``) of every queue holding more than its guarantee, the last to evict first."""
        return []

    def lent_since(self, before: Sequence[Job], gone: Sequence[Allocation], added: Sequence[Allocation],
                   allocs: Mapping[str, Allocation], view: View, guaranteed: Collection[str] = ()) -> list[Job]:
        """:meth:`lent` of ``allocs``, where ``before`` is what the last call gave for the same mapping, since
        changed by taking out the allocations ``gone`` and putting in ``added`` (a stage may work it out from
        those changes)."""
        return self.lent(allocs, view, guaranteed)

    def owed_again(self, owed: Sequence[Owed]) -> list[Owed]:
        """Of ``owed`` (after the plan hooks), what was owed after the last round's hooks too; remembers
        ``owed`` for the next round.  The scheduler reclaims these over the hooks' objection."""
        return []

    def note_guaranteed(self, jobs: Sequence[Job]) -> None:
        """The scheduler placed these owed jobs by evicting borrowed work: they count as guaranteed."""

    def enforce(self, plan: Plan, view: View) -> Plan:
        """The plan after placement and hooks, amended to respect the queues' limits."""
        return plan

    def check(self, plan: Plan, view: View, place: PlacePolicy) -> None:
        """Raise :class:`~gpuloom.core.plan.PlanError` where the plan breaks a queue invariant."""
        return None

    def settled(self, done: bool) -> None:
        """The scheduler's word on the round just planned (``done``: one pass over the walk, the prefix filled
        the cluster, nothing reclaimed or evicted)."""

    def appended(self, jobs: Sequence[Job], view: View) -> bool:
        """Whether the round of ``view``, where only ``jobs`` were admitted since a settled round, admits
        them after every job admitted before (the round then only backfills them)."""
        return False

    def all_guaranteed_placed(self, plan: Plan) -> bool:
        """Every job the last admission called guaranteed is in ``plan``."""
        return True

    def note_appended(self, placed: Sequence[Job]) -> None:
        """The round only backfilled its new jobs (:meth:`appended`); ``placed`` of them got GPUs."""

    def note_reclaim(self) -> None:
        """The scheduler planned again in two passes to reclaim lent GPUs."""
