"""The seeds' functional API (``speculate.utils``): one request, dense probabilities."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams
from samplers.greedy import GreedySampler
from samplers.metadata import SpecDecodeMetadata, host_to_device
from samplers.rejection import RejectionSampler
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
