"""The APIs of the documents the project started from, on top of the ragged ``verify``.

- ``speculative_sampling`` / ``greedy_match``: naive_speculate's ``speculate.utils`` (one
  request, dense probabilities, ``(rejected_idx, resampled_token)`` back).
- ``verify_dense(sampler, ...)``: vLLM V0's dense sampler call (``[batch_size, k + 1,
  vocab_size]`` probabilities in, ``[batch_size, k + 1]`` tokens out, -1 after a rejection).

The engine uses none of them; they exist so that code written against those APIs runs here.
"""

from __future__ import annotations

import torch

from samplers.base import VerificationSampler
from samplers.greedy import GreedySampler
from samplers.metadata import SpecDecodeMetadata, host_to_device
from samplers.rejection import RejectionSampler
from samplers.sampling_params import SamplingParams
from samplers.sampling_tensors import SamplingTensors


def speculative_sampling(
    target_dists: torch.Tensor,  # [k + 1, vocab_size] probabilities
    proposal_dists: torch.Tensor,  # [k, vocab_size] probabilities
    candidate_tokens: torch.Tensor,  # [k]
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one request's drafts by modified rejection sampling.

    Returns 0-d tensors ``(rejected_idx, resampled_token)``: the index of the first rejected
    draft (``k`` when all are accepted) and the token emitted there, drawn from the residual
    distribution, or from ``target_dists[k]`` when nothing was rejected.
    """
    out = _verify_one(RejectionSampler(), target_dists, proposal_dists, candidate_tokens,
                      SamplingParams(), generator)
    return _first_rejection(out)


def greedy_match(
    target_dists: torch.Tensor,  # [k + 1, vocab_size] probabilities
    candidate_tokens: torch.Tensor,  # [k]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one request's drafts by argmax match.

    Returns 0-d tensors ``(rejected_idx, resampled_token)``: the first index where the candidate
    differs from ``argmax(target_dists[i])`` (``k`` when none does) and the target argmax there
    (``argmax(target_dists[k])`` when nothing was rejected).
    """
    out = _verify_one(GreedySampler(), target_dists, None, candidate_tokens,
                      SamplingParams(temperature=0.0), None)
    return _first_rejection(out)


def _verify_one(sampler, target_dists: torch.Tensor, proposal_dists: torch.Tensor | None,
                candidate_tokens: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> torch.Tensor:
    if target_dists.dim() != 2 or candidate_tokens.dim() != 1:
        raise ValueError(f"target_dists must be [k + 1, vocab_size] and candidate_tokens [k], "
                         f"got {tuple(target_dists.shape)} and {tuple(candidate_tokens.shape)}")
    k = candidate_tokens.shape[0]
    if target_dists.shape[0] != k + 1:
        raise ValueError(f"target_dists has {target_dists.shape[0]} rows, expected k + 1 = "
                         f"{k + 1}")
    if proposal_dists is not None and tuple(proposal_dists.shape) != (k, target_dists.shape[1]):
        raise ValueError(f"proposal_dists has shape {tuple(proposal_dists.shape)}, expected "
                         f"{(k, target_dists.shape[1])}")
    device = target_dists.device
    metadata = SpecDecodeMetadata(
        draft_token_ids=candidate_tokens.long(),
        num_draft_tokens=[k],
        cu_num_draft_tokens=host_to_device([k], torch.int32, device),
        max_spec_len=k,
    )
    sampling = SamplingTensors.from_params([params], [generator], device)
    return sampler.verify(torch.log(target_dists.float()), metadata, sampling, proposal_dists)[0]


def _first_rejection(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``out [k + 1]`` -> (index of the last emitted token, that token), as 0-d tensors."""
    rejected_idx = (out >= 0).sum() - 1
    return rejected_idx, out[rejected_idx]


def verify_dense(
    sampler: VerificationSampler,
    target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    draft_probs: torch.Tensor | None,  # [batch_size, k, vocab_size]
    draft_token_ids: torch.Tensor,  # [batch_size, k]
) -> torch.Tensor:
    """vLLM V0's dense call: probabilities in, ``[batch_size, k + 1]`` out, -1 after the first
    rejection; ``bonus_token_ids`` fill the last slot when every draft is accepted. The
    distributions are used as given (temperature 1, no filters, the global RNG)."""
    probs = target_with_bonus_probs
    if probs.dim() != 3:
        raise ValueError(f"target_with_bonus_probs must be [batch_size, k + 1, vocab_size], "
                         f"got {tuple(probs.shape)}")
    batch_size, k, vocab_size = probs.shape[0], probs.shape[1] - 1, probs.shape[2]
    if tuple(draft_token_ids.shape) != (batch_size, k):
        raise ValueError(f"draft_token_ids has shape {tuple(draft_token_ids.shape)}, "
                         f"expected {(batch_size, k)}")
    if tuple(bonus_token_ids.shape) != (batch_size, 1):
        raise ValueError(f"bonus_token_ids has shape {tuple(bonus_token_ids.shape)}, "
                         f"expected {(batch_size, 1)}")
    if draft_probs is not None and sampler.uses_draft_probs:
        if tuple(draft_probs.shape) != (batch_size, k, vocab_size):
            raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected "
                             f"{(batch_size, k, vocab_size)}")
        draft_probs = draft_probs.reshape(batch_size * k, vocab_size)
    else:
        draft_probs = None
    device = probs.device
    metadata = SpecDecodeMetadata(
        draft_token_ids=draft_token_ids.reshape(-1).long(),
        num_draft_tokens=[k] * batch_size,
        cu_num_draft_tokens=(torch.arange(1, batch_size + 1, device=device,
                                          dtype=torch.int32) * k),
        max_spec_len=k,
    )
    sampling = SamplingTensors.from_params([SamplingParams()] * batch_size, None, device)
    logits = torch.log(probs.float()).reshape(batch_size * (k + 1), vocab_size)
    out = sampler.verify(logits, metadata, sampling, draft_probs)
    all_accepted = out[:, k] >= 0
    out[:, k] = torch.where(all_accepted, bonus_token_ids[:, 0].to(out.dtype), out[:, k])
    return out
