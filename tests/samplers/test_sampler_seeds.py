"""Seeded determinism, batch-composition independence, and k = 0 == plain sampling."""

from __future__ import annotations

import pytest
import torch

from samplers import (
    SamplingParams,
    SamplingTensors,
    SpecDecodeMetadata,
    get_sampler,
    logits_to_probs,
)

V = 50


def _logits(num_rows: int, seed: int) -> torch.Tensor:
    return torch.randn(num_rows, V, generator=torch.Generator().manual_seed(seed)) * 2


def _verify(name: str, drafts: list[list[int]], params: list[SamplingParams],
            seeds: list[int | None], logits: torch.Tensor, with_probs: bool) -> torch.Tensor:
    generators = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    metadata = SpecDecodeMetadata.from_lists(drafts)
    tensors = SamplingTensors.from_params(params, generators)
    probs = torch.softmax(torch.ones(metadata.num_tokens, V), dim=1) if with_probs else None
    return get_sampler(name).verify(logits, metadata, tensors, probs)


@pytest.mark.parametrize("name", ["rejection", "typical"])
@pytest.mark.parametrize("with_probs", [False, True])
def test_a_seeded_request_ignores_its_batch(name: str, with_probs: bool) -> None:
    mine_drafts, mine = [3, 9, 27], SamplingParams(temperature=0.8, top_k=20, seed=7)
    mine_logits = _logits(4, seed=0)
    alone = _verify(name, [mine_drafts], [mine], [7], mine_logits, with_probs)[0]
    others = [([1, 2], SamplingParams(temperature=0.0), None),
              ([], SamplingParams(temperature=1.3), 5),
              ([4, 4, 4, 4, 4], SamplingParams(top_p=0.5), None)]
    for position in range(len(others) + 1):
        batch = list(others)
        batch.insert(position, (mine_drafts, mine, 7))
        logits = torch.cat([mine_logits if d is mine_drafts else _logits(len(d) + 1, seed=9)
                            for d, _, _ in batch])
        out = _verify(name, [b[0] for b in batch], [b[1] for b in batch],
                      [b[2] for b in batch], logits, with_probs)
        assert out[position, :4].tolist() == alone.tolist()
        assert bool((out[position, 4:] == -1).all())


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    logits = _logits(4 * 64, seed=3)
    drafts = [[1, 2, 3]] * 64
    params = [SamplingParams(temperature=1.0)] * 64
    a = _verify("rejection", drafts, params, list(range(64)), logits, False)
    b = _verify("rejection", drafts, params, list(range(64)), logits, False)
    c = _verify("rejection", drafts, params, list(range(100, 164)), logits, False)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def _plain_sample(logits: torch.Tensor, params: list[SamplingParams],
                  generators: list[torch.Generator]) -> list[int]:
    """Plain sampling written out: the argmax for greedy rows, else the exponential race
    ``argmax(p / q)`` with ``q ~ Exp(1)`` over the vocabulary from the request's generator."""
    probs = logits_to_probs(logits, SamplingTensors.from_params(params), [1] * len(params))
    tokens = []
    for row, p, g, prob in zip(logits, params, generators, probs, strict=True):
        if p.temperature == 0.0:
            tokens.append(int(row.argmax()))
        else:
            q = torch.empty(V).exponential_(generator=g)
            tokens.append(int((prob / q).argmax()))
    return tokens


@pytest.mark.parametrize("name", ["rejection", "typical", "greedy"])
def test_k0_verification_is_plain_sampling(name: str) -> None:
    """With no drafts, verification gives the tokens of plain sampling and leaves each generator
    in the same state, step after step."""
    params = [SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=0.0, seed=2),
              SamplingParams(top_p=0.8, seed=3), SamplingParams(min_p=0.1, seed=4)]
    if name == "greedy":
        params = [SamplingParams(temperature=0.0, seed=i) for i in range(4)]
    gen_a = [torch.Generator().manual_seed(p.seed) for p in params]
    gen_b = [torch.Generator().manual_seed(p.seed) for p in params]
    metadata = SpecDecodeMetadata.from_lists([[]] * len(params))
    for step in range(5):
        logits = _logits(len(params), seed=step)
        plain = _plain_sample(logits, params, gen_a)
        verified = get_sampler(name).verify(logits, metadata,
                                            SamplingTensors.from_params(params, gen_b))
        assert verified.shape == (len(params), 1)
        assert verified[:, 0].tolist() == plain
        for a, b in zip(gen_a, gen_b, strict=True):
            assert torch.equal(a.get_state(), b.get_state())


def test_greedy_requests_consume_no_random_numbers() -> None:
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    tensors = SamplingTensors.from_params([SamplingParams(temperature=0.0)], [gen])
    get_sampler("rejection").verify(_logits(3, 0), SpecDecodeMetadata.from_lists([[1, 2]]),
                                    tensors)
    assert torch.equal(gen.get_state(), state)


def _sample(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    metadata = SpecDecodeMetadata.from_lists([[]] * logits.shape[0])
    return get_sampler("rejection").verify(logits, metadata, tensors)[:, 0]


def test_no_draft_verification_is_argmax_for_greedy_and_follows_probs_otherwise() -> None:
    logits = _logits(2, seed=4)
    tensors = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 2)
    assert _sample(logits, tensors).tolist() == logits.argmax(dim=1).tolist()
    probs = torch.tensor([0.7, 0.2, 0.1])
    rows = probs.log().repeat(60_000, 1)  # [60000, 3]
    generator = torch.Generator().manual_seed(0)
    tokens = _sample(rows, SamplingTensors.from_params([SamplingParams()] * 60_000,
                                                       default_generator=generator))
    freq = torch.bincount(tokens, minlength=3).double() / 60_000
    assert torch.allclose(freq, probs.double(), atol=0.01)
