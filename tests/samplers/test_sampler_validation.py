"""Bad input raises a ValueError that names the problem; never silent wrong tokens."""

from __future__ import annotations

import pytest
import torch

from samplers import (
    MAX_SPEC_LEN,
    RejectionSampler,
    SamplingTensors,
    SpecDecodeMetadata,
    TypicalAcceptanceSampler,
    greedy_match,
    speculative_sampling,
    verify_dense,
)
from samplers.sampling_params import SamplingParams

V = 16


def _setup(drafts=((1, 2), (3,))):
    metadata = SpecDecodeMetadata.from_lists([list(d) for d in drafts])
    tensors = SamplingTensors.from_params([SamplingParams()] * len(drafts))
    logits = torch.randn(metadata.num_rows, V)
    return metadata, tensors, logits


def test_logits_row_count_mismatch() -> None:
    metadata, tensors, logits = _setup()
    with pytest.raises(ValueError, match="target_logits has 4 rows, expected .* = 5"):
        RejectionSampler().verify(logits[:4], metadata, tensors)


def test_logits_dtype_and_rank() -> None:
    metadata, tensors, logits = _setup()
    with pytest.raises(ValueError, match="target_logits must be float32/float16/bfloat16"):
        RejectionSampler().verify(logits.long(), metadata, tensors)
    with pytest.raises(ValueError, match="target_logits must be"):
        RejectionSampler().verify(logits[None], metadata, tensors)


def test_draft_ids_dtype_and_range() -> None:
    metadata, tensors, logits = _setup()
    metadata.draft_token_ids = metadata.draft_token_ids.int()
    with pytest.raises(ValueError, match="draft_token_ids must be int64"):
        RejectionSampler().verify(logits, metadata, tensors)
    metadata, tensors, logits = _setup(((1, V), (3,)))
    with pytest.raises(ValueError, match=r"draft_token_ids .* must be in \[0, 16\)"):
        RejectionSampler().verify(logits, metadata, tensors)
    metadata, tensors, logits = _setup(((1, -1), (3,)))
    with pytest.raises(ValueError, match="must be in"):
        RejectionSampler().verify(logits, metadata, tensors)


def test_draft_probs_shape_dtype_and_values() -> None:
    metadata, tensors, logits = _setup()
    with pytest.raises(ValueError, match=r"draft_probs must be float \[num_tokens=3"):
        RejectionSampler().verify(logits, metadata, tensors, torch.rand(2, V))
    with pytest.raises(ValueError, match="draft_probs must be float"):
        RejectionSampler().verify(logits, metadata, tensors, torch.ones(3, V, dtype=torch.int64))
    bad = torch.rand(3, V)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="draft_probs must be finite and >= 0"):
        RejectionSampler().verify(logits, metadata, tensors, bad)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_inf_logits(value: float) -> None:
    metadata, tensors, logits = _setup()
    logits[3, 5] = value
    with pytest.raises(ValueError, match="target_logits row 3 contains NaN or \\+inf"):
        RejectionSampler().verify(logits, metadata, tensors)


def test_row_without_finite_logit() -> None:
    metadata, tensors, logits = _setup()
    logits[2] = float("-inf")
    with pytest.raises(ValueError, match="row 2 is -inf everywhere"):
        TypicalAcceptanceSampler().verify(logits, metadata, tensors)


def test_minus_inf_entries_are_allowed() -> None:
    metadata, tensors, logits = _setup()
    logits[:, 5:] = float("-inf")  # e.g. bad_words / allowed_token_ids masks
    out = RejectionSampler().verify(logits, metadata, tensors)
    assert bool((out[out >= 0] < 5).all())


def test_spec_len_above_maximum() -> None:
    metadata, tensors, logits = _setup(((1,) * (MAX_SPEC_LEN + 1), (3,)))
    with pytest.raises(ValueError, match=f"max_spec_len={MAX_SPEC_LEN + 1} is above"):
        RejectionSampler().verify(logits, metadata, tensors)


def test_inconsistent_metadata_and_batch() -> None:
    metadata, tensors, logits = _setup()
    metadata.cu_num_draft_tokens = torch.tensor([1, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="is not the cumulative sum"):
        RejectionSampler().verify(logits, metadata, tensors)
    metadata, _, logits = _setup()
    with pytest.raises(ValueError, match="sampling covers 3 requests, metadata 2"):
        RejectionSampler().verify(logits, metadata,
                                  SamplingTensors.from_params([SamplingParams()] * 3))
    metadata.max_spec_len = 5
    with pytest.raises(ValueError, match="max_spec_len=5 must equal"):
        RejectionSampler().verify(logits, metadata, tensors)


def test_seed_api_shapes() -> None:
    target = torch.softmax(torch.randn(3, V), dim=1)
    with pytest.raises(ValueError, match="target_dists has 3 rows, expected k \\+ 1 = 2"):
        greedy_match(target, torch.tensor([1]))
    with pytest.raises(ValueError, match="proposal_dists has shape"):
        speculative_sampling(target, torch.rand(3, V), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="draft_token_ids has shape"):
        verify_dense(RejectionSampler(), target[None], torch.zeros(1, 1, dtype=torch.long),
                     target[None, :2], torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="posterior_threshold=0.0 is invalid"):
        TypicalAcceptanceSampler(posterior_threshold=0.0)
