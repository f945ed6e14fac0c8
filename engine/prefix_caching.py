"""The engine's side of prefix caching: which context a sequence may read from the runner's
prefix cache (:mod:`engine.runner.prefix_cache`) and which committed tokens it leaves there.

A sequence reads the longest cached prefix of its context less the last token (whose logits
must be computed), unless it asks for prompt logprobs (those need every prompt position's
logits). A sequence leaving its slot (finished, aborted, preempted) leaves the tokens its
``num_computed_tokens`` rows hold: committed prompt and output tokens, never a draft; a
sequence that failed leaves nothing (its rows may hold non-finite values).
"""

from __future__ import annotations

from typing import Protocol

from engine.metrics import MetricsCollector
from engine.sequence import Sequence
from scheduler.scheduler import ScheduledSequence


class PrefixRunner(Protocol):
    """What prefix caching needs of the runner (``ModelRunner``, ``LeaderRunner``)."""

    def cached_prefix(self, token_ids: list[int]) -> tuple[int, int]: ...

    def attach_prefix(self, slot: int, token_ids: list[int]) -> None: ...


def prefix_hit(runner: PrefixRunner, seq: Sequence) -> tuple[int, int]:
    """(the context tokens of ``seq`` the cache serves, how many of their rows it takes from
    the free space); the scheduler's ``cached_prefix`` hook for a newcomer."""
    if seq.params.prompt_logprobs is not None:
        return 0, 0
    return runner.cached_prefix(seq.all_token_ids[:-1])


def attach_hits(runner: PrefixRunner, scheduled: list[ScheduledSequence],
                admitted: list[Sequence], metrics: MetricsCollector) -> None:
    """Point each admitted sequence's slot at its cached prefix (its item's
    ``num_cached_tokens``) and count the lookup."""
    new = {id(seq) for seq in admitted}
    for item in scheduled:
        seq = item.seq
        if id(seq) not in new:
            continue
        hit = item.num_cached_tokens
        metrics.record_prefix_lookup(seq.num_tokens - 1, hit)
        if seq.num_cached_tokens is None:  # (the first admission's, as vLLM reports it)
            seq.num_cached_tokens = hit
        if hit:
            runner.attach_prefix(seq.slot, seq.all_token_ids[:hit])
            seq.num_computed_tokens = hit


def leaving_tokens(seq: Sequence) -> list[int] | None:
    """The committed tokens a sequence leaving its slot leaves in the cache (None: none)."""
    if seq.finish_reason == "error" or not seq.num_computed_tokens:
        return None
    return seq.all_token_ids[:seq.num_computed_tokens]
