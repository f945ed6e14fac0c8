"""Strict argmax matching: the output equals the target's own greedy decoding."""

from __future__ import annotations

import torch

from samplers.base import VerificationSampler
from samplers.limits import INVALID_TOKEN_ID
from samplers.registry import register_sampler


def argmax_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling without drafts: each row's argmax (the first of equal maxima, as the
    verification kernels pick), ``INVALID_TOKEN_ID`` for a row with a NaN or +inf or only -inf
    (as they mark it); int64 ``[num_rows]`` from ``logits [num_rows, vocab_size]``. Two
    kernels and no host work: a plain decode step's sampling (the verification path builds
    sampling tensors and launches its chunked kernels for the same answer)."""
    best, index = logits.max(dim=-1)
    return torch.where(torch.isfinite(best), index, INVALID_TOKEN_ID)


@register_sampler("greedy")
class GreedySampler(VerificationSampler):
    """Accept draft ``x_j`` while ``x_j == argmax(logits_j)``; at the first mismatch emit the
    target argmax, and when all match emit ``argmax(logits_k)`` as the bonus token.

    Every request is treated as greedy whatever its temperature; no random numbers are drawn.
    Example: target argmaxes ``[4, 9, 2]`` and drafts ``[4, 7]`` give ``[4, 9, -1]``.
    """

    all_greedy = True
    uses_draft_probs = False
