"""Strict argmax matching: the output equals the target's own greedy decoding."""

from __future__ import annotations

import torch

from samplers.argmax_kernel import argmax_reference, argmax_rows
from samplers.base import VerificationSampler
from samplers.keyed_graphs import KeyedGraphs
from samplers.limits import INVALID_TOKEN_ID
from samplers.metadata import SpecDecodeMetadata
from samplers.registry import register_sampler
from samplers.sampling_params import SamplingParams
from samplers.sampling_tensors import SamplingTensors


def argmax_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling without drafts: each row's argmax (the first of equal maxima, as the
    verification kernels pick), ``INVALID_TOKEN_ID`` for a row with a NaN or +inf or only -inf
    (as they mark it); int64 ``[num_rows]`` from ``logits [num_rows, vocab_size]``. No host
    work: a plain decode step's sampling (the verification path builds sampling tensors and
    launches its chunked kernels for the same answer). On CUDA two Triton launches
    (:mod:`samplers.argmax_kernel`), elsewhere its PyTorch reference."""
    if logits.is_cuda and logits.dim() == 2 and logits.stride(-1) == 1:
        return argmax_rows(logits, INVALID_TOKEN_ID)
    return argmax_reference(logits, INVALID_TOKEN_ID)


@register_sampler("greedy")
class GreedySampler(VerificationSampler):
    """Accept draft ``x_j`` while ``x_j == argmax(logits_j)``; at the first mismatch emit the
    target argmax, and when all match emit ``argmax(logits_k)`` as the bonus token.

    Every request is treated as greedy whatever its temperature; no random numbers are drawn.
    Example: target argmaxes ``[4, 9, 2]`` and drafts ``[4, 7]`` give ``[4, 9, -1]``.
    """

    all_greedy = True
    uses_draft_probs = False


def chain_batch(batch: int) -> int:
    """The batch size of :class:`GreedyChains`' graph that serves ``batch`` requests: the next
    power of two (as the draft head's graphs pad theirs), so that a batch shrinking one
    request at a time meets a graph at every size but a few."""
    return 1 << (batch - 1).bit_length()


class GreedyChains:
    """Greedy verification of uniform chains (every request ``k`` drafts: a drafting flight's),
    replayed from one CUDA graph per ``(padded batch, k)``
    (:class:`~samplers.keyed_graphs.KeyedGraphs`, the batch padded by :func:`chain_batch`):
    the three verification kernels and their workspaces as one launch. The graph runs
    ``sampler.verify`` unchanged, so its tokens are the sampler's (tested). A greedy sampler
    reads no sampling tensor but their shapes (every request is greedy, no filters, no random
    numbers), so the graph of a batch size serves any greedy requests of that size, and its
    padding rows (zero logits and drafts at first, then whatever a larger batch left there)
    give answers that are dropped.

    Why padded: a graph per exact batch size cost a closed batch of 32 `eagle` requests an
    eager run and a capture at every size it shrank through, 2-5 ms a step more each time
    (docs/design.md, "Speculation at batch 32")."""

    def __init__(self, sampler: VerificationSampler, graphs: KeyedGraphs) -> None:
        if not sampler.all_greedy:
            raise ValueError(f"GreedyChains needs a greedy sampler, not {type(sampler).__name__}")
        self.sampler, self.graphs = sampler, graphs
        # (each graph's greedy tensors of its padded batch, kept alive with it)
        self._sampling: dict[tuple[int, int], SamplingTensors] = {}

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor,
               sampling: SamplingTensors) -> torch.Tensor:
        """int64 ``[batch, k + 1]``: ``sampler.verify`` of ``logits [batch * (k + 1), vocab]``
        and ``drafts [batch, k]`` (a fresh tensor: the graph's output is overwritten by its
        next replay). ``sampling``: the requests' tensors, all greedy (read for nothing but
        that: the graph verifies its padded batch with greedy tensors of its own)."""
        batch, k = drafts.shape
        padded = chain_batch(batch)
        key = (padded, k)
        greedy = self._sampling.get(key)
        if greedy is None:
            greedy = self._sampling[key] = SamplingTensors.from_params(
                [SamplingParams(temperature=0.0)] * padded, None, drafts.device)
        return self.graphs.run(
            key, lambda lg, dr: self.sampler.verify(lg, SpecDecodeMetadata.uniform(dr), greedy),
            [logits, drafts], rows=[padded * (k + 1), padded])[:batch].clone()
