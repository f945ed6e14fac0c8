"""Scheduling: waiting / running queues, token budget, preemption, and how many drafts each
sequence gets this step (the speculation policy)."""

from scheduler.scheduler import (
    SchedulableSequence,
    ScheduledSequence,
    Scheduler,
    SchedulerOutput,
    SequenceStatus,
)
from scheduler.spec_policy import SpeculationPolicy

__all__ = ["SchedulableSequence", "ScheduledSequence", "Scheduler", "SchedulerOutput",
           "SequenceStatus", "SpeculationPolicy"]
