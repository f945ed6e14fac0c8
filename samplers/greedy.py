"""Strict argmax matching: the output equals the target's own greedy decoding."""

from __future__ import annotations

import torch

from samplers.argmax_kernel import argmax_reference, argmax_rows
from samplers.base import VerificationSampler
from samplers.keyed_graphs import KeyedGraphs
from samplers.limits import INVALID_TOKEN_ID
from samplers.metadata import SpecDecodeMetadata
from samplers.registry import register_sampler
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


class GreedyChains:
    """Greedy verification of uniform chains (every request ``k`` drafts: a drafting flight's),
    replayed from one CUDA graph per ``(batch, k)`` (:class:`~samplers.keyed_graphs.KeyedGraphs`):
    the three verification kernels and their workspaces as one launch. The graph runs
    ``sampler.verify`` unchanged, so its tokens are the sampler's (tested). A greedy sampler
    reads no sampling tensor but their shapes (every request is greedy, no filters, no random
    numbers), so the graph of a batch size serves any greedy requests of that size."""

    def __init__(self, sampler: VerificationSampler, graphs: KeyedGraphs) -> None:
        if not sampler.all_greedy:
            raise ValueError(f"GreedyChains needs a greedy sampler, not {type(sampler).__name__}")
        self.sampler, self.graphs = sampler, graphs
        self._sampling: dict[tuple[int, int], SamplingTensors] = {}  # (kept alive per graph)

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor,
               sampling: SamplingTensors) -> torch.Tensor:
        """int64 ``[batch, k + 1]``: ``sampler.verify`` of ``logits [batch * (k + 1), vocab]``
        and ``drafts [batch, k]`` (a fresh tensor: the graph's output is overwritten by its
        next replay)."""
        key = tuple(drafts.shape)
        sampling = self._sampling.setdefault(key, sampling)
        return self.graphs.run(
            key, lambda lg, dr: self.sampler.verify(lg, SpecDecodeMetadata.uniform(dr), sampling),
            [logits, drafts]).clone()
