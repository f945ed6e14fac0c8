"""Statistical losslessness: at every draft position, the emitted token follows the processed
target distribution, for many target/draft pairs and sampling parameters.

One huge batch of identical requests on a small vocabulary (each request is one independent
trial). Every position is tested with a chi-square test; the same counts tested against a
distribution with 1 % of its mass moved must fail, so the test can see a 1 % error.
"""

from __future__ import annotations

import pytest
import torch

from samplers import RejectionSampler
from samplers.sampling_params import SamplingParams
from tests.samplers.helpers import (
    P_VALUE_FLOOR,
    biased,
    chi_square_p_value,
    expected_distribution,
    identical_batch,
    position_counts,
)

NUM_REQUESTS = 200_000
VOCAB = 8
K = 3


def _target_logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(K + 1, VOCAB, generator=gen) * 1.5  # [k + 1, vocab]


def _run(target: torch.Tensor, draft: torch.Tensor, params: SamplingParams,
         one_hot: bool, seed: int) -> torch.Tensor:
    """Verify NUM_REQUESTS requests whose drafts are sampled from ``draft [k, vocab]``."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(draft.repeat(NUM_REQUESTS, 1), 1, generator=gen)
    drafts = drafts.reshape(NUM_REQUESTS, K)  # [num_requests, k]
    metadata, sampling = identical_batch(NUM_REQUESTS, drafts, params)
    logits = target.repeat(NUM_REQUESTS, 1)  # [num_requests * (k + 1), vocab]
    draft_probs = None if one_hot else draft.repeat(NUM_REQUESTS, 1)
    torch.manual_seed(seed)
    return RejectionSampler().verify(logits, metadata, sampling, draft_probs)


def _mix(p: torch.Tensor, seed: int, weight: float) -> torch.Tensor:
    """A draft distribution close to ``p`` (high acceptance, so late positions get samples)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.softmax(torch.randn(p.shape, generator=gen), dim=-1)
    return (1 - weight) * p + weight * noise


CASES = {
    # name: (params, draft builder(target probs) -> draft probs, one-hot drafts)
    "draft_equals_target": (SamplingParams(), lambda p: p, False),
    "random_pair": (SamplingParams(), lambda p: _mix(p, 1, 0.3), False),
    "one_hot_drafts": (SamplingParams(temperature=0.5), lambda p: _mix(p, 2, 0.2), True),
    "temperature_0.6": (SamplingParams(temperature=0.6), lambda p: _mix(p, 3, 0.3), False),
    "temperature_1.7": (SamplingParams(temperature=1.7), lambda p: _mix(p, 4, 0.3), False),
    "top_k_3": (SamplingParams(top_k=3), lambda p: _mix(p, 5, 0.2), False),
    "top_p_0.7": (SamplingParams(top_p=0.7), lambda p: _mix(p, 6, 0.2), False),
    "min_p_0.2": (SamplingParams(min_p=0.2), lambda p: _mix(p, 7, 0.2), False),
    "all_filters": (SamplingParams(temperature=0.8, top_k=5, top_p=0.95, min_p=0.05),
                    lambda p: _mix(p, 8, 0.2), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_position_follows_the_target(name: str) -> None:
    params, make_draft, one_hot = CASES[name]
    target = _target_logits(seed=len(name))
    expected = [expected_distribution(row.tolist(), params.temperature, params.top_k,
                                      params.top_p, params.min_p) for row in target]
    draft = make_draft(torch.tensor(expected[:K], dtype=torch.float32))  # [k, vocab]
    out = _run(target, draft, params, one_hot, seed=len(name) + 100)
    for position in range(K + 1):
        counts = position_counts(out, position, VOCAB)
        p_value = chi_square_p_value(counts, expected[position])
        assert p_value > P_VALUE_FLOOR, (name, position, counts.tolist(), expected[position])
        # Power: the same counts must reject a target that is off by 1 % of its mass.
        assert chi_square_p_value(counts, biased(expected[position])) < P_VALUE_FLOOR, \
            (name, position, int(counts.sum()))


def test_disjoint_supports_resample_from_the_target() -> None:
    """Draft mass only where the target has none: every draft is rejected at slot 0 and the
    recovered token follows the target."""
    target = torch.full((K + 1, VOCAB), float("-inf"))
    target[:, 4:] = torch.tensor([0.3, -0.2, 1.0, 0.1])
    draft = torch.zeros(K, VOCAB)
    draft[:, :4] = 0.25
    out = _run(target, draft, SamplingParams(), one_hot=False, seed=11)
    assert bool((out[:, 1:] == -1).all())
    expected = expected_distribution(target[0, 4:].tolist())
    counts = position_counts(out, 0, VOCAB)
    assert int(counts[:4].sum()) == 0
    assert chi_square_p_value(counts[4:], expected) > P_VALUE_FLOOR
    assert chi_square_p_value(counts[4:], biased(expected)) < P_VALUE_FLOOR


def test_partially_overlapping_supports() -> None:
    target = torch.full((K + 1, VOCAB), float("-inf"))
    target[:, 2:] = torch.tensor([0.5, 0.0, 1.0, -0.5, 0.3, 0.2])
    draft = torch.zeros(K, VOCAB)
    draft[:, :5] = torch.tensor([0.03, 0.02, 0.4, 0.25, 0.3])
    out = _run(target, draft, SamplingParams(), one_hot=False, seed=12)
    expected = [0.0, 0.0] + expected_distribution(target[0, 2:].tolist())
    tested = 0
    for position in range(K + 1):
        counts = position_counts(out, position, VOCAB)
        assert chi_square_p_value(counts, expected) > P_VALUE_FLOOR, position
        if int(counts.sum()) >= 100_000:  # enough samples to see a 1 % error
            assert chi_square_p_value(counts, biased(expected)) < P_VALUE_FLOOR, position
            tested += 1
    assert tested >= 2
