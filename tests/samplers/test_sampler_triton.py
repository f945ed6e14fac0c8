"""The Triton kernels give the references' tokens from the same random numbers.

Run under ``TRITON_INTERPRET=1`` (the Makefile sets it), on CPU tensors, with small sizes and a
small vocabulary chunk so that every kernel sees several chunks.
"""

from __future__ import annotations

import os

import pytest
import torch

from samplers import (
    GreedySampler,
    RejectionSampler,
    SamplingTensors,
    SpecDecodeMetadata,
    TypicalAcceptanceSampler,
    parse_output,
)
from samplers.greedy import argmax_tokens
from samplers.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1 (set by `make test`)")

V = 300  # not a power of two: masked tails
CHUNK = 128  # 3 chunks, the last one partly masked
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DRAFTS = [[5, 17, 250], [], [42], [7, 7], [299, 0, 3]]
PARAMS = [SamplingParams(temperature=0.7, seed=1), SamplingParams(seed=2),
          SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, seed=4),
          SamplingParams(seed=5)]


def _inputs(seed: int, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    metadata = SpecDecodeMetadata.from_lists(DRAFTS, DEVICE)
    logits = (torch.randn(metadata.num_rows, V, generator=gen) * 2).to(dtype)
    # Make some drafts likely so that acceptance, rejection and bonus paths all occur.
    first = 0
    for drafts in DRAFTS:
        for j, x in enumerate(drafts):
            logits[first + j, x] += 6.0 if (seed + j) % 3 else 0.0
        first += len(drafts) + 1
    draft_probs = torch.softmax(torch.randn(metadata.num_tokens, V, generator=gen), dim=1)
    return metadata, logits.to(DEVICE), draft_probs.to(DEVICE)


def _both(sampler_cls, seed: int, params: list[SamplingParams], use_probs: bool,
          dtype: torch.dtype = torch.float32, **kwargs):
    metadata, logits, draft_probs = _inputs(seed, dtype)
    outs = []
    for use_triton in (False, True):
        generators = [None if p.seed is None else
                      torch.Generator(DEVICE).manual_seed(p.seed + 1000 * seed) for p in params]
        tensors = SamplingTensors.from_params(params, generators, DEVICE)
        sampler = sampler_cls(use_triton=use_triton, chunk_size=CHUNK, **kwargs)
        outs.append(sampler.verify(logits, metadata, tensors,
                                   draft_probs if use_probs else None))
    return outs


@pytest.mark.parametrize("use_probs", [False, True])
def test_rejection_kernels_match_reference(use_probs: bool) -> None:
    for seed in range(2):
        ref, tri = _both(RejectionSampler, seed, PARAMS, use_probs)
        assert tri.tolist() == ref.tolist(), seed


def test_typical_kernels_match_reference() -> None:
    ref, tri = _both(TypicalAcceptanceSampler, 2, PARAMS, False,
                     posterior_threshold=0.2, posterior_alpha=0.5)
    assert tri.tolist() == ref.tolist()


def test_greedy_kernels_match_reference_and_argmax() -> None:
    ref, tri = _both(GreedySampler, 0, PARAMS, False)
    assert tri.tolist() == ref.tolist()
    metadata, logits, _ = _inputs(0)
    assert tri[1, 0] == logits[4].argmax()  # request 1 has no drafts: its row is row 4


def test_filters_and_bfloat16_logits_match_reference() -> None:
    params = [SamplingParams(top_k=10, seed=1), SamplingParams(top_p=0.6, seed=2),
              SamplingParams(min_p=0.05, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(top_k=3, top_p=0.9, temperature=0.5, seed=5)]
    ref, tri = _both(RejectionSampler, 1, params, True, dtype=torch.bfloat16)
    assert tri.tolist() == ref.tolist()


def test_kernels_mark_invalid_requests() -> None:
    metadata, logits, _ = _inputs(0)
    logits[4, 11] = float("nan")  # request 1's only row
    logits[5] = float("-inf")  # request 2's draft row: no finite logit
    tensors = SamplingTensors.from_params(PARAMS, None, DEVICE)
    out = RejectionSampler(use_triton=True, validate=False, chunk_size=CHUNK).verify(
        logits, metadata, tensors)
    assert out[1].tolist() == [-2] * 4 and out[2].tolist() == [-2] * 4
    assert bool((out[[0, 3, 4], 0] >= 0).all())
    with pytest.raises(ValueError, match="request 1: invalid verification input"):
        parse_output(out)
    bad_ids = SpecDecodeMetadata.from_lists([[5, 17, 250], [], [42], [7, 7], [299, 0, V]],
                                            DEVICE)
    out = RejectionSampler(use_triton=True, validate=False, chunk_size=CHUNK).verify(
        _inputs(0)[1], bad_ids, tensors)
    assert out[4].tolist() == [-2] * 4 and bool((out[:4, 0] >= 0).all())


def test_sampling_tensor_rows_start_on_16_bytes() -> None:
    """Triton compiles a kernel per pointer alignment class: the per-request rows must start
    aligned whatever the batch size, or a new batch size recompiles mid-run."""
    for batch_size in range(1, 10):
        tensors = SamplingTensors.from_params([SamplingParams(temperature=0.5)] * batch_size,
                                              None, DEVICE)
        for t in (tensors.temperature, tensors.inv_temperature, tensors.top_p, tensors.min_p,
                  tensors.top_k, tensors.is_greedy):
            assert t.shape == (batch_size,) and t.data_ptr() % 16 == 0, batch_size


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts kernels compiled on a GPU")
def test_one_compiled_kernel_for_every_k_and_batch_size() -> None:
    """A step with a new k or batch size reuses the kernels compiled for the first one (a
    recompile cost about 0.3 s inside a run on an H200)."""
    from samplers import verify_triton as vt

    kernels = (vt._row_stats_kernel, vt._decide_kernel, vt._finalize_kernel)

    def compiled() -> int:
        return sum(len(cache[0]) for kernel in kernels for cache in kernel.device_caches.values())

    counts = []
    for k in (4, 1, 2, 0, 3):
        for batch_size in (1, 3, 4, 6):
            drafts = [[(7 * i + j) % V for j in range(k)] for i in range(batch_size)]
            metadata = SpecDecodeMetadata.from_lists(drafts, DEVICE)
            logits = torch.randn(metadata.num_rows, V, device=DEVICE)
            tensors = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * batch_size,
                                                  None, DEVICE)
            GreedySampler(use_triton=True, chunk_size=CHUNK).verify(logits, metadata, tensors)
            counts.append(compiled())
    assert counts[-1] == counts[0], counts


def test_plain_argmax_sampling_gives_the_kernels_tokens_and_marks() -> None:
    """``argmax_tokens`` (an overlapped plain step's greedy sampling) answers as the greedy
    kernels do for rows without drafts: ties to the first index, bad rows marked."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, V, generator=gen)
    logits[1, [7, 90, 200]] = 9.0  # a three-way tie: the first index wins
    logits[2, 13] = float("nan")
    logits[3] = float("-inf")
    logits[4, 250] = float("inf")
    logits = logits.to(DEVICE)
    metadata = SpecDecodeMetadata.from_lists([[]] * 6, DEVICE)
    tensors = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 6, None, DEVICE)
    kernels = GreedySampler(use_triton=True, validate=False, chunk_size=CHUNK).verify(
        logits, metadata, tensors)[:, 0]
    plain = argmax_tokens(logits)
    assert plain.tolist() == kernels.tolist()
    assert plain.tolist()[1:5] == [7, -2, -2, -2]
