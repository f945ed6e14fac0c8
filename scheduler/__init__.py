"""Scheduling: waiting / running queues, token budget, preemption, and how many drafts each
sequence gets this step (the speculation policy)."""

from scheduler.acceptance import RequestAcceptance, expected_tokens
from scheduler.scheduler import (
    SchedulableSequence,
    ScheduledSequence,
    Scheduler,
    SchedulerOutput,
    SequenceStatus,
)
from scheduler.spec_policy import RequestSpeculation, SpeculationPolicy

__all__ = ["RequestAcceptance", "RequestSpeculation", "SchedulableSequence", "ScheduledSequence",
           "Scheduler", "SchedulerOutput", "SequenceStatus", "SpeculationPolicy", "expected_tokens"]
