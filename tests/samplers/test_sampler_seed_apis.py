"""The seeds' APIs: speculative_sampling / greedy_match (one request) and the dense samplers."""

from __future__ import annotations

import torch

from samplers import (
    RejectionSampler,
    TypicalAcceptanceSampler,
    greedy_match,
    speculative_sampling,
    verify_dense,
)

V = 6


def _point(tokens: list[int]) -> torch.Tensor:
    """Probabilities ``[len(tokens), V]`` with all mass on ``tokens[i]`` in row i."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def test_greedy_match() -> None:
    target = torch.tensor([[0.1, 0.6, 0.3, 0, 0, 0], [0.5, 0.1, 0.4, 0, 0, 0],
                           [0, 0, 0, 0.2, 0.7, 0.1]])
    idx, tok = greedy_match(target, torch.tensor([1, 0]))
    assert idx.shape == () and tok.shape == ()
    assert (idx.item(), tok.item()) == (2, 4)
    idx, tok = greedy_match(target, torch.tensor([1, 2]))
    assert (idx.item(), tok.item()) == (1, 0)
    idx, tok = greedy_match(target[:1], torch.tensor([], dtype=torch.long))
    assert (idx.item(), tok.item()) == (0, 1)


def test_speculative_sampling() -> None:
    target = _point([2, 3, 5])
    idx, tok = speculative_sampling(target, _point([2, 3]), torch.tensor([2, 3]))
    assert (idx.item(), tok.item()) == (2, 5)  # all accepted, bonus from target_dists[k]
    idx, tok = speculative_sampling(target, _point([2, 1]), torch.tensor([2, 1]))
    assert (idx.item(), tok.item()) == (1, 3)  # rejected at 1, residual is target row 1
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    soft = torch.softmax(torch.randn(4, V, generator=gen_a), dim=1)
    draft = torch.softmax(torch.randn(3, V, generator=gen_a), dim=1)
    cands = torch.tensor([0, 1, 2])
    a = speculative_sampling(soft, draft, cands, generator=gen_a)
    b = speculative_sampling(soft, draft, cands, generator=gen_b.manual_seed(3))
    gen_a.manual_seed(3)
    a = speculative_sampling(soft, draft, cands, generator=gen_a)
    assert [t.item() for t in a] == [t.item() for t in b]


def test_dense_rejection_sampler_uses_the_given_bonus() -> None:
    # Batch of 2, k = 2: request 0 accepts both drafts -> bonus 9 is a given id (not sampled),
    # request 1 rejects its first draft (target has no mass there) -> recovered 4, then -1.
    target = torch.stack([_point([1, 2, 0]), _point([4, 5, 0])])  # [2, 3, V]
    draft_probs = torch.stack([_point([1, 2]), _point([3, 5])])  # [2, 2, V]
    out = verify_dense(RejectionSampler(), target, torch.tensor([[5], [5]]), draft_probs,
                       torch.tensor([[1, 2], [3, 5]]))
    assert out.tolist() == [[1, 2, 5], [4, -1, -1]]


def test_dense_typical_sampler() -> None:
    flat = torch.full((V,), 1.0 / V)
    peaked = torch.tensor([0.96, 0.01, 0.01, 0.01, 0.005, 0.005])
    target = torch.stack([torch.stack([flat, flat, flat]), torch.stack([flat, peaked, flat])])
    out = verify_dense(TypicalAcceptanceSampler(), target, torch.tensor([[3], [3]]), None,
                       torch.tensor([[1, 2], [4, 5]]))
    assert out.tolist() == [[1, 2, 3], [4, 0, -1]]
