"""Continuous batching: which sequences run this step and how many tokens each brings.

Every step the scheduler fills one token budget (``max_num_batched_tokens``):

1. **Running sequences first, in admission order.** Every decoding sequence brings its one
   uncached token; then each gets up to k drafts (k from the engine's ``spec_tokens(seq)``,
   cut to the budget left); then a sequence still prefilling brings the next chunk that fits.
2. **Then newcomers**, oldest first, while fewer than ``max_num_seqs`` run, budget is left and
   (when the caller says how many KV tokens are free) the KV cache can hold their first chunk.
   A long prompt is prefilled in chunks over several steps while the others keep decoding.
3. A sequence is sampled (and may carry drafts) only on the step whose chunk reaches the end of its
   context; earlier chunks only fill the cache.

**Preemption.** When the KV cache cannot hold a step, the engine asks :meth:`preempt` for the most
recently admitted running sequence: it leaves the running queue, loses its cache and goes back to
the *front* of the waiting queue; when readmitted, its prompt + output so far are prefilled again
(recompute) and decoding resumes where it stopped, with the same tokens (a seeded sample's random
numbers are keyed by its seed and output position: ``samplers.keyed_random``).

**Prefix caching.** With ``cached_prefix(seq) -> (hit, taken)`` a newcomer whose first ``hit``
context tokens are cached brings only the rest (its item's ``num_cached_tokens``; the engine
attaches those rows), and admission counts the ``taken`` cached rows that stop being free.

Finished sequences leave the running queue at once (:meth:`finish`), freeing their place for the
next step.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class SchedulableSequence(Protocol):
    """What the scheduler reads and changes on a sequence (``engine.sequence.Sequence``)."""

    status: SequenceStatus

    @property
    def num_uncached_tokens(self) -> int:
        """Context tokens not in the KV cache yet (all before prefill, 1 when decoding)."""

    def reset_for_recompute(self) -> None:
        """Preempted: the cache is gone; prompt + output are prefilled again later."""


@dataclass
class ScheduledSequence:
    """One sequence's share of a step: ``num_context_tokens`` uncached context tokens (a prefill
    chunk, or the one newest token when decoding) and up to ``num_spec_tokens`` drafts."""

    seq: SchedulableSequence
    num_context_tokens: int
    # True when the chunk reaches the end of the context, so the step samples new tokens.
    samples: bool
    num_spec_tokens: int = 0
    num_cached_tokens: int = 0  # a newcomer's context tokens served by the prefix cache

    @property
    def num_tokens(self) -> int:
        return self.num_context_tokens + self.num_spec_tokens


# spec_tokens(seq) -> the number of drafts the speculation policy wants for seq this step
SpecTokens = Callable[[SchedulableSequence], int]
# cached_prefix(seq) -> (its leading context tokens the prefix cache holds, how many of their
# rows are counted free now)
CachedPrefix = Callable[[SchedulableSequence], tuple[int, int]]


@dataclass
class SchedulerOutput:
    """The sequences of one step, in running-queue order; ``admitted`` were waiting before."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    admitted: list[SchedulableSequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    """Waiting and running queues with admission, a token budget and preemption."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} is invalid: allowed an integer >= 1")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} is invalid: "
                             "allowed an integer >= 1")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SchedulableSequence] = deque()
        # admission order: the last one is preempted first
        self.running: list[SchedulableSequence] = []

    def add(self, seq: SchedulableSequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, spec_tokens: SpecTokens, free_kv_tokens: int | None = None,
                 cached_prefix: CachedPrefix | None = None) -> SchedulerOutput:
        """Plan one step. ``spec_tokens(seq)`` is the number of drafts the engine wants for a
        sequence that samples this step; ``free_kv_tokens`` (None = unknown) gates admission.

        The budget goes, in this order, to the newest token of every decoding sequence, to their
        drafts, to the prefill chunks of running sequences, then to newcomers (with drafts when
        their whole prompt fits). A newcomer is admitted only when the KV rows left after this
        step's running tokens (drafts included) hold its first chunk.
        """
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        items: dict[int, ScheduledSequence] = {}
        decoding = [seq for seq in self.running if seq.num_uncached_tokens == 1]
        for seq in decoding[:budget]:
            items[id(seq)] = ScheduledSequence(seq, 1, True)
        budget -= len(items)
        for item in items.values():
            item.num_spec_tokens = max(0, min(spec_tokens(item.seq), budget))
            budget -= item.num_spec_tokens
        for seq in self.running:
            if budget > 0 and id(seq) not in items and seq.num_uncached_tokens > 1:
                items[id(seq)] = self._plan(seq, budget, spec_tokens)
                budget -= items[id(seq)].num_tokens
        out.scheduled = [items[id(seq)] for seq in self.running if id(seq) in items]
        if free_kv_tokens is not None:
            free_kv_tokens -= out.num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, taken = cached_prefix(seq) if cached_prefix is not None else (0, 0)
            first_chunk = min(seq.num_uncached_tokens - hit, budget)
            if free_kv_tokens is not None:
                if first_chunk + taken > free_kv_tokens:
                    break
                free_kv_tokens -= first_chunk + taken
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            item = self._plan(seq, budget, spec_tokens, hit)
            budget -= item.num_tokens
            out.scheduled.append(item)
            out.admitted.append(seq)
        return out

    @staticmethod
    def _plan(seq: SchedulableSequence, budget: int, spec_tokens: SpecTokens,
              cached: int = 0) -> ScheduledSequence:
        uncached = seq.num_uncached_tokens - cached
        num_context = min(uncached, budget)
        item = ScheduledSequence(seq, num_context, num_context == uncached, 0, cached)
        if item.samples:
            item.num_spec_tokens = max(0, min(spec_tokens(seq), budget - num_context))
        return item

    def preempt(self) -> SchedulableSequence | None:
        """Take the most recently admitted running sequence back to the front of the waiting
        queue (its cache is dropped: the caller frees its slot first). None if nothing runs."""
        if not self.running:
            return None
        seq = self.running.pop()
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        return seq

    def finish(self, seq: SchedulableSequence) -> None:
        """Remove a finished (or aborted) sequence from whichever queue holds it."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
