"""Hand-built cases with one possible answer: placeholders, empty drafts, mixed k, each rule."""

from __future__ import annotations

import pytest
import torch

from samplers import (
    GreedySampler,
    RejectionSampler,
    SamplingTensors,
    SpecDecodeMetadata,
    TypicalAcceptanceSampler,
    get_sampler,
)
from samplers.sampling_params import SamplingParams

NEG = float("-inf")
V = 10


def point_mass_rows(tokens: list[int]) -> torch.Tensor:
    """Logits ``[len(tokens), V]`` where row i can only produce ``tokens[i]``."""
    logits = torch.full((len(tokens), V), NEG)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 0.0
    return logits


def sampling(n: int, **kwargs) -> SamplingTensors:
    return SamplingTensors.from_params([SamplingParams(**kwargs)] * n)


@pytest.mark.parametrize("draft_probs", [False, True])
def test_mixed_k_batch_rejection(draft_probs: bool) -> None:
    # request 0: drafts [3, 5] both certain, bonus 7 -> all accepted + bonus
    # request 1: no drafts, bonus 2
    # request 2: draft 4 impossible (target only allows 1) -> rejected at slot 0, recovered 1
    # request 3: drafts [6, 8, 9]; 6 certain, 8 impossible (target 0) -> [6, 0, -1, -1]
    drafts = [[3, 5], [], [4], [6, 8, 9]]
    rows = [3, 5, 7] + [2] + [1, 2] + [6, 0, 9, 9]
    metadata = SpecDecodeMetadata.from_lists(drafts)
    probs = None
    if draft_probs:
        probs = torch.zeros(metadata.num_tokens, V)
        probs[torch.arange(metadata.num_tokens), metadata.draft_token_ids] = 1.0
    out = RejectionSampler().verify(point_mass_rows(rows), metadata, sampling(4), probs)
    assert out.dtype == torch.int64
    assert out.tolist() == [[3, 5, 7, -1], [2, -1, -1, -1], [1, -1, -1, -1], [6, 0, -1, -1]]


def test_recovered_token_comes_from_the_residual() -> None:
    # p = [0.5, 0.3, 0.2], d = [0.2, 0.6, 0.2], draft 1: accepted with probability 0.5; on
    # rejection the residual max(p - d, 0) = [0.3, 0, 0] can only give token 0.
    p = torch.tensor([0.5, 0.3, 0.2])
    logits = torch.stack([p.log(), p.log()])  # [2, 3]: draft row, bonus row
    d = torch.tensor([[0.2, 0.6, 0.2]])
    metadata = SpecDecodeMetadata.from_lists([[1]])
    first = []
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        tensors = SamplingTensors.from_params([SamplingParams()], [gen])
        out = RejectionSampler().verify(logits, metadata, tensors, d)[0].tolist()
        first.append(out[0])
        if out[0] != 1:
            assert out == [0, -1]
    assert 60 < first.count(1) < 140  # accepted about half of the time


def test_one_hot_rejection_never_returns_the_draft() -> None:
    # One-hot draft 2 rejected with probability 1 - p(2); the recovered token is never 2.
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.25, 0.25, 0.5]]))
    metadata = SpecDecodeMetadata.from_lists([[2]])
    for seed in range(100):
        gen = torch.Generator().manual_seed(seed)
        tensors = SamplingTensors.from_params([SamplingParams()], [gen])
        out = RejectionSampler().verify(logits, metadata, tensors)[0].tolist()
        assert out[0] == 2 or (out[0] in (0, 1) and out[1] == -1)


def test_greedy_sampler_matches_argmax() -> None:
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(dim=1).tolist()
    # request 0: drafts equal argmax at rows 0, 1 -> both accepted, bonus argmax row 2
    # request 1: first draft wrong -> argmax of row 3
    # request 2: no drafts -> argmax of its only row (row 6)
    wrong = (argmax[3] + 1) % V
    metadata = SpecDecodeMetadata.from_lists([[argmax[0], argmax[1]], [wrong, 0], []])
    out = GreedySampler().verify(logits, metadata, sampling(3, temperature=0.9))
    assert out.tolist() == [[argmax[0], argmax[1], argmax[2]], [argmax[3], -1, -1],
                            [argmax[6], -1, -1]]


def test_greedy_requests_inside_a_rejection_batch_are_deterministic() -> None:
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(1))
    argmax = logits.argmax(dim=1).tolist()
    metadata = SpecDecodeMetadata.from_lists([[argmax[0], argmax[1]], [argmax[3], 0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0)]
    for _ in range(3):
        out = RejectionSampler().verify(logits, metadata, SamplingTensors.from_params(params))
        expected_1 = [argmax[3], 0, argmax[5]] if argmax[4] == 0 else [argmax[3], argmax[4], -1]
        assert out.tolist() == [[argmax[0], argmax[1], argmax[2]], expected_1]


def test_typical_acceptance_rule() -> None:
    uniform = torch.zeros(4)  # H = ln 4, bar = min(0.09, 0.3 / 4) = 0.075 < 0.25: accept
    peaked = torch.tensor([10.0, 0.0, 0.0, 0.0])  # p(1) ~ 4.5e-5 < bar: reject -> argmax 0
    bonus = torch.tensor([NEG, NEG, 0.0, NEG])  # bonus can only be 2
    logits = torch.stack([uniform, peaked, bonus, uniform, bonus])
    metadata = SpecDecodeMetadata.from_lists([[3, 1], [1]])
    out = TypicalAcceptanceSampler().verify(logits, metadata, sampling(2))
    assert out.tolist() == [[3, 0, -1], [1, 2, -1]]
    strict = TypicalAcceptanceSampler(posterior_threshold=0.3, posterior_alpha=1.0)
    # bar = min(0.3, 1.0 / 4) = 0.25: p = 0.25 is not above it -> rejected -> argmax (index 0)
    assert strict.verify(logits, metadata, sampling(2)).tolist()[1] == [0, -1, -1]


def test_registry_names_and_aliases() -> None:
    assert isinstance(get_sampler("rejection"), RejectionSampler)
    assert isinstance(get_sampler("rejection_sampler"), RejectionSampler)
    assert isinstance(get_sampler("greedy"), GreedySampler)
    typical = get_sampler("typical_acceptance_sampler", posterior_threshold=0.2)
    assert isinstance(typical, TypicalAcceptanceSampler)
    assert typical.posterior_threshold == 0.2 and typical.posterior_alpha == 0.3
    with pytest.raises(ValueError, match="unknown sampler 'nope'"):
        get_sampler("nope")
