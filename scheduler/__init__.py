"""Continuous-batching scheduler: waiting / running queues, token budget, preemption."""

from scheduler.scheduler import ScheduledRequest, Scheduler, SchedulerOutput

__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput"]
