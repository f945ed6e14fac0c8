"""Plain sampling of one token per request (after a prefill, or for requests without drafts)."""

from __future__ import annotations

import torch

from samplers.metadata import SpecDecodeMetadata
from samplers.rejection import RejectionSampler
from samplers.sampling_tensors import SamplingTensors


def sample(logits: torch.Tensor, sampling: SamplingTensors) -> torch.Tensor:
    """One token per request from ``logits [batch_size, vocab_size]``; returns int64 [batch_size].

    Greedy requests take the argmax of the raw logits. The others take the exponential race
    ``argmax(p / q)`` over their processed distribution ``p``, with ``q ~ Exp(1)`` drawn from the
    request's own generator (or the global RNG). This is verification with no drafts, run by the
    same code, so a request verified with ``k = 0`` gets bit-identical tokens and consumes the
    same random numbers.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch_size, vocab_size], got {tuple(logits.shape)}")
    metadata = SpecDecodeMetadata.no_drafts(logits.shape[0], logits.device)
    return RejectionSampler().verify(logits, metadata, sampling)[:, 0]
