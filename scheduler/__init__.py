"""Scheduling: waiting / running queues, token budget, preemption, and how many drafts each
sequence gets each step (the speculation controller, :mod:`scheduler.speculation`)."""

from scheduler.acceptance import RequestAcceptance, expected_tokens
from scheduler.scheduler import (
    SchedulableSequence,
    ScheduledSequence,
    Scheduler,
    SchedulerOutput,
    SequenceStatus,
)
from scheduler.spec_policy import GoodputPolicy
from scheduler.speculation import (
    DraftPlan,
    FixedK,
    RequestSpeculation,
    SpeculationController,
    StepOutcome,
    StepTiming,
    make_controller,
    within_spare,
)

__all__ = ["DraftPlan", "FixedK", "GoodputPolicy", "RequestAcceptance", "RequestSpeculation",
           "SchedulableSequence", "ScheduledSequence", "Scheduler", "SchedulerOutput",
           "SequenceStatus", "SpeculationController", "StepOutcome", "StepTiming",
           "expected_tokens", "make_controller", "within_spare"]
