"""The queue rounds: admit across queues, plan what was admitted, reclaim, hooks, limits.

With a queue stage (:mod:`gpuloom.policies.queues`) a round plans what the stage admits, guaranteed
jobs first (:meth:`QueueRounds._queued`): read lazily, as far as placement needs, when the stack allows
(:meth:`QueueRounds._queue_walk_ok`), only backfilling the jobs admitted since a settled round
(:meth:`QueueRounds._queued_appended`); lent GPUs are reclaimed in the same round (:mod:`.reclaim`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.job import Job
from ..core.plan import Plan
from ..policies import base as pb
from ..policies.incremental import TailWalk, appended_plan
from ..policies.queue_base import Admission
from .reclaim import Reclaim
from .rounds import Round, _free_gpus


class QueueRounds(Reclaim):
    """A round with a queue stage (on the pipeline and its reclaim steps)."""

    order: pb.OrderPolicy
    walk_queues: bool
    walk_whole: bool

    def _queued(self, ordered: Sequence[Job], view: pb.View, lazy: bool = False) -> Round:
        """Admit across queues, plan the admitted jobs, reclaim lent GPUs, hooks, limits.

        Reclaim happens where a queue below its guarantee has a waiting job
        while borrowed (tier B) work holds GPUs.  First, if a guaranteed job was
        left out, the round is planned again in two passes (:meth:`_two_pass`).
        Then every job the queue stage still owes a place (a waiting job that
        fits its queue's unused guarantee, in the queue's order:
        :meth:`~gpuloom.policies.base.QueuePolicy.owed`) is placed by the place
        policy on what the non-borrowed jobs leave, evicting the borrowed work
        in its way (:meth:`_evict_for`).  So a guaranteed job that fits nowhere
        (the guaranteed jobs fragment the cluster) does not keep its queue's
        smaller jobs from the guarantee.  A plan hook may undo a reclaim (it
        keeps running jobs where they are) for one round; a queue still owed
        after the hooks in the next round too reclaims over the hook.
        """
        q = self.queue
        strict = not self.place.backfill
        adm = q.admit(ordered, view, strict, lazy=lazy)
        rnd = self._admitted_round(adm, view, lazy)
        one_pass = rnd
        whole = False  # planned again on the walk gone on whole
        if adm.paused is not None:
            # the lazy walk waits at its bound (Admission.paused), where it would be cut short: with GPUs left
            # free and jobs past it, it goes on as the whole walk (the same jobs up to here, then the rest) and
            # the round is planned again on it, as admitting again whole would; else it stops there
            if adm.paused and self.walk_whole and _free_gpus(rnd.plan, view) > 0 and q.read_whole(adm):
                rnd = one_pass = self._admitted_round(adm, view, lazy)
                whole = True
            else:
                adm.finish()
        # GPUs left free while the walk was cut short: plan again on everything.  (A lazy walk that placement
        # stopped reading before it stopped itself becomes the whole walk where it is: the plan is the whole
        # walk's, QueuePolicy.read_whole)
        if (not whole and _free_gpus(rnd.plan, view) > 0
                and (adm.truncated or (adm.walk is not None and adm.walk.more is not None))
                and not (self.walk_whole and q.read_whole(adm))):
            adm = q.admit(ordered, view, strict, full=True, lazy=lazy)
            rnd = one_pass = self._admitted_round(adm, view, lazy)
        # (the borrowing jobs placed are among those the walk read)
        if adm.over and any(j.id in rnd.plan.allocations for j in adm.over):
            if _left_out_while_lent(adm, rnd.plan):
                rnd = self._two_pass(adm, view, lazy, rnd)
                q.note_reclaim()
            owed = q.owed(rnd.plan, view)
            if owed:
                rnd = self._evict_for(owed, rnd, view)
        rnd = self._hooked(rnd, view)
        if self.hooks and adm.over:
            # a hook (elastic sizing's protection) may keep borrowed work where an owner's job should go:
            # for one round; a queue owed after the hooks two rounds running reclaims over the hook
            owed = q.owed(rnd.plan, view)
            again = q.owed_again(owed)
            if again:
                rnd = self._evict_for(again, rnd, view, {o.queue for o in owed})
                # a lender the reclaim left below its guarantee is owed from this round on
                q.owed_again(q.owed(rnd.plan, view))
        elif self.hooks:
            q.owed_again(())  # nothing borrowed: nothing owed this round (two rounds running means in a row)
        plan = q.enforce(rnd.plan, view)
        # one pass whose prefix filled the cluster (_walked), kept as it was: a round on its plan plans it again,
        # so the next may only backfill the jobs admitted meanwhile (_queued_appended)
        settled = rnd is one_pass and plan is rnd.plan and rnd.full
        q.settled(settled)
        rnd = rnd if plan is rnd.plan else Round(plan, rnd.requests)
        rnd.full = settled
        return rnd

    def _queued_appended(self, view: pb.View) -> Round | None:
        """The round when only ``view.appended`` jobs were admitted since a settled queue round
        (:meth:`_queued`) and the queue stage admits them after every other
        (:meth:`~gpuloom.policies.queue_base.QueuePolicy.appended`): the whole walk would redo the last
        round's steps on the plan it left and then backfill the new jobs, as without queues
        (:func:`~gpuloom.policies.incremental.appended_plan`).  That round would also reclaim for a queue
        owed GPUs, or in two passes for a guaranteed job left out while the new jobs borrow: None then
        (the whole round is planned)."""
        q, appended = self.queue, view.appended or ()
        if not q.appended(appended, view):
            return None
        size = self.size
        plan, requests = appended_plan(appended, lambda j: size.request(j, view), self.place, view)
        placed = [j for j in appended if j.id in plan.allocations]
        if q.owed(plan, view) or (placed and not q.all_guaranteed_placed(plan)):
            q.settled(False)
            return None
        q.note_appended(placed)
        return Round(plan, requests, full=True)

    def _admitted_round(self, adm: Admission, view: pb.View, lazy: bool) -> Round:
        """The plan of what the queue stage admitted: through :func:`~gpuloom.policies.incremental.prefix_plan`
        over the lazy walk (placement reads admission only as far as it needs: :meth:`_walked`) when
        ``lazy``, else by :meth:`_plan`."""
        walk = adm.walk
        if lazy and walk is not None and walk.more is not None:  # (a lazy walk not read yet)
            if not self.walk_whole:
                return self._walked(walk, view, None)
            tails: list[TailWalk] = []
            q = self.queue

            def go_on() -> bool:
                # the walk waits at its bound (Admission.paused) while placement backfills past its prefix:
                # what is free then is what the plan leaves free if the walk stops there (the backfill ends, the
                # jobs not kept were released before).  With GPUs free and jobs left past the bound the round
                # would admit again whole and plan again; the walk goes on whole instead and placement reads on:
                # up to here it read what it reads of the whole walk, in the same state
                free = tails[0].free if tails else None
                return bool(adm.paused) and free is not None and free.free_gpus > 0 and q.read_whole(adm)

            walk.go_on = go_on
            try:
                return self._walked(walk, view, None, tails)
            finally:
                walk.go_on = None
        return self._plan(adm.ordered, view)

    def _queue_walk_ok(self, view: pb.View) -> bool:
        """The queue stage's admission may be read lazily and placed through
        :func:`~gpuloom.policies.incremental.prefix_plan`: what :meth:`_prefix_round` asks of the stack, with
        FIFO (the stage then reads its jobs per queue as the driver admitted them) and borrowing allowed."""
        place, tally, order = self.place, view.tally, self.order
        return (self.walk_queues and self.preemptive and not self.hooks and not place.arranges
                and place.pure_choose and place.backfill and tally is not None and not tally.unkeyed
                and tally.index_order and order.keyed and order.follows_view
                and self.fast.ready(view, queues=True))

def _left_out_while_lent(adm: Admission, plan: Plan) -> bool:
    """A guaranteed job is not in ``plan`` while borrowed work is."""
    allocs = plan.allocations
    return any(j.id not in allocs for j in adm.guaranteed) and any(j.id in allocs for j in adm.over)



