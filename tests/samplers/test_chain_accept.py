"""Greedy verification of uniform chains from the target's argmax in one launch
(``samplers.chain_accept``): the tokens the greedy sampler's verification kernels give from the
same logits, and the accepted count, last token and next first position those tokens imply (as
the drafting step computed them before). Cases: ties (the first maximum wins), every draft
accepted (the bonus token), a rejection at each position, a NaN row, an all -inf row and an
out-of-vocabulary draft (the chain marked invalid)."""

from __future__ import annotations

import pytest
import torch

from samplers import GreedySampler, SamplingParams, SamplingTensors
from samplers.chain_accept import accept_chains, accept_chains_reference
from samplers.greedy import argmax_tokens
from samplers.limits import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID
from samplers.metadata import SpecDecodeMetadata
from tests.conftest import DEVICE, needs_triton

pytestmark = needs_triton

V = 50


def _chains(gen: torch.Generator, batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[batch * (k + 1), V]`` with ties to the first maximum, and drafts that follow
    their argmaxes for a random number of positions, then differ."""
    logits = torch.randn(batch * (k + 1), V, generator=gen)
    logits[:, 7] = logits.max(dim=1).values  # (a tie: column 7 equals the maximum ...)
    best = logits.argmax(dim=1).view(batch, k + 1)  # (... and the first one wins)
    keep = torch.randint(0, k + 1, (batch,), generator=gen)
    drafts = best[:, :k].clone()
    for b in range(batch):
        if keep[b] < k:
            drafts[b, keep[b]] = (best[b, keep[b]] + 1) % V
    return logits, drafts


def _sampler_tokens(logits: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The greedy sampler's verification kernels' tokens ``[batch, k + 1]``."""
    sampler = GreedySampler(validate=False, use_triton=True)  # (the kernels mark bad rows)
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * len(drafts), None,
                                         DEVICE)
    return sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), greedy)


@pytest.mark.parametrize("accept", [accept_chains, accept_chains_reference],
                         ids=["kernel", "reference"])
@pytest.mark.parametrize("k", [1, 4, 6])
def test_chains_accepted_from_the_argmax_as_the_greedy_sampler_verifies_them(accept, k):
    gen = torch.Generator().manual_seed(k)
    batch = 7
    logits, drafts = _chains(gen, batch, k)
    logits[1 * (k + 1) + k, 5] = float("nan")  # (chain 1: a NaN in its bonus row)
    logits[2 * (k + 1)] = float("-inf")  # (chain 2: an all -inf row)
    drafts[3, k - 1] = V  # (chain 3: a draft outside the vocabulary)
    drafts[4] = logits.view(batch, k + 1, V)[4, :k].argmax(dim=1)  # (chain 4: all accepted)
    logits, drafts = logits.to(DEVICE), drafts.to(DEVICE)
    base = torch.arange(10, 10 + batch, device=DEVICE)
    expected = _sampler_tokens(logits, drafts)
    assert (expected[1:4] == INVALID_TOKEN_ID).all()
    assert (expected[4] != PLACEHOLDER_TOKEN_ID).all()
    tokens, accepted, last, next_base = accept(argmax_tokens(logits), drafts, base, V)
    assert tokens.tolist() == expected.tolist()
    # (what the drafting step derived from the sampler's tokens)
    made = ((expected != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1).clamp(0, k)
    assert accepted.tolist() == made.tolist()
    assert last.tolist() == expected.gather(1, made[:, None]).clamp_min(0).tolist()
    assert next_base.tolist() == (base + made + 1).tolist()


def test_the_kernel_agrees_with_its_reference_on_many_chains():
    gen = torch.Generator().manual_seed(11)
    for batch, k in [(1, 1), (3, 2), (32, 4), (5, 7)]:
        logits, drafts = _chains(gen, batch, k)
        argmax = argmax_tokens(logits.to(DEVICE))
        base = torch.randint(0, 1000, (batch,), generator=gen).to(DEVICE)
        got = accept_chains(argmax, drafts.to(DEVICE), base, V)
        want = accept_chains_reference(argmax, drafts.to(DEVICE), base, V)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), (batch, k)
