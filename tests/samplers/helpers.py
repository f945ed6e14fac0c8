"""Shared helpers of the sampler tests: batches of identical requests and a chi-square test."""

from __future__ import annotations

import math

import torch

from samplers import SamplingTensors, SpecDecodeMetadata
from samplers.sampling_params import SamplingParams

P_VALUE_FLOOR = 1e-6  # a correct sampler passes above it; the biased control must fall below


def expected_distribution(logits: list[float], temperature: float = 1.0, top_k: int = 0,
                          top_p: float = 1.0, min_p: float = 0.0) -> list[float]:
    """The processed target distribution of one row, written independently of ``samplers``:
    temperature, then top-k, top-p, min-p, each renormalising (plain Python, no ties assumed)."""
    z = [x / temperature for x in logits]
    keep = [True] * len(z)

    def probs() -> list[float]:
        m = max(v for v, k in zip(z, keep, strict=True) if k)
        e = [math.exp(v - m) if k else 0.0 for v, k in zip(z, keep, strict=True)]
        total = sum(e)
        return [x / total for x in e]

    order = sorted(range(len(z)), key=lambda i: -z[i])
    if top_k > 0:
        for i in order[top_k:]:
            keep[i] = False
    if top_p < 1.0:
        p, mass = probs(), 0.0
        for i in order:
            if mass >= top_p:
                keep[i] = False
            mass += p[i]
    if min_p > 0.0:
        p = probs()
        for i, pi in enumerate(p):
            if pi < min_p * max(p):
                keep[i] = False
    return probs()


def chi_square_p_value(counts: torch.Tensor, probs: list[float]) -> float:
    """P-value of ``counts [vocab_size]`` under ``probs``; 0 if a zero-probability token occurs."""
    p = torch.tensor(probs, dtype=torch.float64)
    counts = counts.double()
    n = counts.sum()
    if bool((counts[p == 0] > 0).any()):
        return 0.0
    support = p > 0
    if int(support.sum()) == 1:
        return 1.0  # a point mass: every count is on it (checked above)
    expected = n * p[support]
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(support.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def biased(probs: list[float], mass: float = 0.01) -> list[float]:
    """``probs`` with ``mass`` moved from its most probable token to its second most probable:
    the hardest 1 % error for a chi-square test to see."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    out = list(probs)
    out[order[0]] -= mass
    out[order[1]] += mass
    return out


def position_counts(out: torch.Tensor, position: int, vocab_size: int) -> torch.Tensor:
    """Histogram ``[vocab_size]`` of the tokens emitted at ``position`` (rows that reached it)."""
    column = out[:, position]
    return torch.bincount(column[column >= 0], minlength=vocab_size)


def identical_batch(num_requests: int, drafts_per_request: torch.Tensor, params: SamplingParams
                    ) -> tuple[SpecDecodeMetadata, SamplingTensors]:
    """Metadata and sampling tensors of ``num_requests`` requests with the same k.

    ``drafts_per_request``: ``[num_requests, k]`` draft ids.
    """
    k = drafts_per_request.shape[1]
    metadata = SpecDecodeMetadata(
        draft_token_ids=drafts_per_request.reshape(-1).long(),
        num_draft_tokens=[k] * num_requests,
        cu_num_draft_tokens=torch.arange(1, num_requests + 1, dtype=torch.int32) * k,
        max_spec_len=k,
    )
    return metadata, SamplingTensors.from_params([params] * num_requests)
