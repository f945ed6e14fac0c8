"""Temperature, top-k, top-p and min-p on ragged rows, checked on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from samplers import SamplingTensors, logits_to_probs, process_logits
from samplers.sampling_params import SamplingParams

NEG = float("-inf")


def _process(rows: list[list[float]], params: list[SamplingParams], rows_per_request):
    return process_logits(torch.tensor(rows), SamplingTensors.from_params(params),
                          rows_per_request)


def test_temperature_scales_and_greedy_rows_stay_raw() -> None:
    out = _process([[1.0, 2.0], [4.0, -2.0], [3.0, 1.0]],
                   [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)], [2, 1])
    assert out.dtype == torch.float32
    assert out.tolist() == [[2.0, 4.0], [8.0, -4.0], [3.0, 1.0]]


def test_top_k_keeps_the_k_largest_per_request() -> None:
    rows = [[1.0, 3.0, 2.0, 0.0], [5.0, 4.0, 6.0, 7.0], [0.5, 0.25, 0.75, 1.5]]
    out = _process(rows, [SamplingParams(top_k=2), SamplingParams(top_k=-1)], [2, 1])
    assert out.tolist() == [[NEG, 3.0, 2.0, NEG], [NEG, NEG, 6.0, 7.0], rows[2]]


def test_top_k_above_the_vocabulary_keeps_everything_and_others_still_filter() -> None:
    rows = [[1.0, 3.0, 2.0, 0.0], [5.0, 4.0, 6.0, 7.0]]
    out = _process(rows, [SamplingParams(top_k=1), SamplingParams(top_k=100)], [1, 1])
    assert out.tolist() == [[NEG, 3.0, NEG, NEG], rows[1]]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    tensors = SamplingTensors.from_params([SamplingParams(top_p=0.75)])
    out = process_logits(logits, tensors, [1])
    # mass before each token: 0, 0.5, 0.8, 0.95 -> keep the first two (0.5 < 0.75 <= 0.8)
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    exact = process_logits(logits, SamplingTensors.from_params([SamplingParams(top_p=0.81)]),
                           [1])
    assert torch.isfinite(exact).tolist() == [[True, True, True, False]]


def test_min_p_is_relative_to_the_top_probability() -> None:
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    tensors = SamplingTensors.from_params([SamplingParams(min_p=0.2)])
    out = process_logits(probs.log(), tensors, [1])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]  # bar 0.12


def test_top_p_uses_the_tempered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    hot = SamplingTensors.from_params([SamplingParams(temperature=100.0, top_p=0.5)])
    cold = SamplingTensors.from_params([SamplingParams(temperature=0.1, top_p=0.5)])
    assert torch.isfinite(process_logits(logits, hot, [1])).sum() == 2  # ~1/3 each
    assert torch.isfinite(process_logits(logits, cold, [1])).sum() == 1


def test_logits_to_probs() -> None:
    tensors = SamplingTensors.from_params([SamplingParams(temperature=2.0, top_k=2),
                                           SamplingParams(temperature=0.0)])
    probs = logits_to_probs(torch.tensor([[2.0, 0.0, -5.0], [0.0, 3.0, 1.0]]), tensors, [1, 1])
    e = math.exp(-1.0)
    assert torch.allclose(probs[0], torch.tensor([1 / (1 + e), e / (1 + e), 0.0]))
    assert probs[1].tolist() == [0.0, 1.0, 0.0]


def test_bad_rows_per_request() -> None:
    tensors = SamplingTensors.from_params([SamplingParams()] * 2)
    with pytest.raises(ValueError, match="must be >= 0 and sum to the 3 rows"):
        process_logits(torch.zeros(3, 4), tensors, [1, 1])
    with pytest.raises(ValueError, match="expected batch_size=2"):
        process_logits(torch.zeros(3, 4), tensors, [3])
