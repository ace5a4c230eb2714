"""The stored job states by what they mean to the loop (values of ``jobs.state``)."""

from __future__ import annotations

from ...core.lifecycle import HOLDING_STATES, TERMINAL, JobState

S = JobState
#: holding nothing, waiting for the plan to give it resources
QUEUED_STATES = (S.WAITING_FOR_INITIAL_CONTACT.value, S.WAITING_FOR_INITIAL_RESOURCE.value, S.STANDBY.value)
#: a process exists (starting, progressing, or being stopped)
HOLDING = tuple(s.value for s in JobState if s in HOLDING_STATES)
ACTIVE_STATES = QUEUED_STATES + HOLDING
FINAL_STATES = tuple(s.value for s in JobState if s in TERMINAL)
