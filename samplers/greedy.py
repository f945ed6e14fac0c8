"""Strict argmax matching: the output equals the target's own greedy decoding."""

from __future__ import annotations

from samplers.base import VerificationSampler
from samplers.registry import register_sampler


@register_sampler("greedy")
class GreedySampler(VerificationSampler):
    """Accept draft ``x_j`` while ``x_j == argmax(logits_j)``; at the first mismatch emit the
    target argmax, and when all match emit ``argmax(logits_k)`` as the bonus token.

    Every request is treated as greedy whatever its temperature; no random numbers are drawn.
    Example: target argmaxes ``[4, 9, 2]`` and drafts ``[4, 7]`` give ``[4, 9, -1]``.
    """

    all_greedy = True
    uses_draft_probs = False
