"""Keyed random numbers (``samplers.keyed_random``) and the verification of keyed requests.

The oracle for the generator is Random123's published known-answer vectors and an independent
numpy Philox; for verification, the keyed sample of each row computed here from numpy's noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from samplers import SamplingParams, SamplingTensors, SpecDecodeMetadata, get_sampler
from samplers.keyed_random import (
    PURPOSE_TOKEN,
    keyed_sample,
    philox4x32,
    philox_uniform,
    philox_uniform_tl,
    seed_key,
)
from tests.samplers.helpers import chi_square_p_value, expected_distribution

P_VALUE_FLOOR = 1e-6
# the Triton kernels run on a GPU where there is one, else in the interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key) -> words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_the_published_known_answers(counter, key, expected) -> None:
    words = philox4x32(*(torch.tensor(c) for c in counter), *(torch.tensor(k) for k in key))
    assert tuple(int(w) for w in words) == expected


def _numpy_uniform(seed: int, position: int, vocab_size: int, purpose: int) -> np.ndarray:
    """The documented mapping, written with numpy's uint64 arithmetic (float64 result)."""
    mask = np.uint64(0xFFFFFFFF)
    lo, hi = seed_key(seed)
    v = np.arange(vocab_size, dtype=np.uint64)
    c = [v // np.uint64(4), np.full_like(v, position), np.full_like(v, purpose),
         np.zeros_like(v)]
    k0, k1 = np.uint64(lo), np.uint64(hi)
    for _ in range(10):
        pb, pa = np.uint64(0xCD9E8D57) * c[2], np.uint64(0xD2511F53) * c[0]
        c = [(pb >> np.uint64(32)) ^ c[1] ^ k0, pb & mask, (pa >> np.uint64(32)) ^ c[3] ^ k1,
             pa & mask]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    words = np.stack(c, axis=-1)[np.arange(vocab_size), np.arange(vocab_size) % 4]
    return ((words >> np.uint64(9)).astype(np.float64) + 0.5) / 2.0 ** 23


@pytest.mark.parametrize(("seed", "position", "purpose"),
                         [(0, 0, 0), (2**63 + 5, 17, 0), (123456789012, 2**32 - 1, 3)])
def test_uniforms_follow_the_documented_counter_layout(seed, position, purpose) -> None:
    lo, hi = seed_key(seed)
    got = philox_uniform(torch.tensor([lo]), torch.tensor([hi]), torch.tensor([position]), 37,
                         purpose)[0]
    assert np.array_equal(got.double().numpy(), _numpy_uniform(seed, position, 37, purpose))
    assert 0.0 < float(got.min()) and float(got.max()) < 1.0


@triton.jit
def _uniform_kernel(out_ptr, lo, hi, position, purpose, vocab_size, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = philox_uniform_tl(offs, position, purpose, lo, hi)
    tl.store(out_ptr + offs, u, mask=offs < vocab_size)


def test_the_triton_twin_draws_the_same_bits() -> None:
    lo, hi = seed_key(2**63 + 12345)
    vocab_size = 1000
    out = torch.empty(vocab_size, device=DEVICE)
    _uniform_kernel[(triton.cdiv(vocab_size, 256),)](out, lo, hi, 77, 2, vocab_size, BLOCK=256)
    ref = philox_uniform(torch.tensor([lo]), torch.tensor([hi]), torch.tensor([77]), vocab_size,
                         2)[0]
    assert torch.equal(out.cpu(), ref)


def test_keyed_samples_follow_softmax_over_many_seeds() -> None:
    """400,000 seeds, one row each: the keyed Gumbel-max token follows softmax(z) (a 1%
    relative error on a token of probability 0.3 is about 4 standard errors here)."""
    z = torch.tensor([1.0, 0.2, -0.5, 0.9, -2.0, float("-inf"), 0.0, 0.4])
    n = 400_000
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 11
    tokens = keyed_sample(z.expand(n, -1), seeds & 0xFFFFFFFF, seeds >> 32,
                          torch.full((n,), 3))
    counts = torch.bincount(tokens, minlength=z.numel())
    probs = torch.softmax(z.double(), 0).tolist()
    assert counts[5] == 0
    assert chi_square_p_value(counts, probs) > P_VALUE_FLOOR
    # the control: the same counts against a distribution 1% off on the likeliest token
    biased = list(probs)
    biased[0] *= 1.01
    biased[1] -= probs[0] * 0.01
    assert chi_square_p_value(counts, biased) < P_VALUE_FLOOR


V = 50


def _logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 2


def _expected_keyed(logits: torch.Tensor, seed: int, position: int,
                    temperature: float) -> list[int]:
    """Each row's keyed sample, from numpy's uniforms (rows at positions position, +1, ...)."""
    out = []
    for j, row in enumerate(logits.double().numpy()):
        gumbel = -np.log(-np.log(_numpy_uniform(seed, position + j, V, PURPOSE_TOKEN)))
        out.append(int(np.argmax(row / temperature + gumbel)))
    return out


def _verify(sampler: str, drafts, params, seeds, positions, logits, use_triton=False,
            draft_probs=None) -> torch.Tensor:
    device = DEVICE if use_triton else "cpu"
    metadata = SpecDecodeMetadata.from_lists(drafts, device)
    sampling = SamplingTensors.from_params(params, None, device,
                                           torch.Generator(device).manual_seed(0),
                                           seeds=seeds, positions=positions)
    return get_sampler(sampler, use_triton=use_triton).verify(
        logits.to(device), metadata, sampling,
        None if draft_probs is None else draft_probs.to(device)).cpu()


@pytest.mark.parametrize("sampler", ["rejection", "typical"])
def test_a_keyed_request_emits_its_keyed_samples_whatever_its_drafts(sampler: str) -> None:
    logits = _logits(5, seed=1)
    expected = _expected_keyed(logits, seed=99, position=10, temperature=0.7)
    params = [SamplingParams(temperature=0.7, seed=99)]
    for drafts in ([], [expected[0]], expected[:2], expected[:3] + [(expected[3] + 1) % V],
                   expected[:4], [(expected[0] + 1) % V, 3, 4, 5]):
        out = _verify(sampler, [drafts], params, [99], [10], logits[:len(drafts) + 1])[0]
        tokens = [t for t in out.tolist() if t >= 0]
        # the accepted run is the drafts' agreeing prefix, then the keyed sample there
        agree = next((i for i, d in enumerate(drafts) if d != expected[i]), len(drafts))
        assert tokens == expected[:agree + 1], drafts


def test_keyed_verification_kernels_match_the_reference() -> None:
    logits = _logits(13, seed=4)
    # request 0's drafts: its keyed samples at positions 0 and 1, then a wrong one
    keyed = _expected_keyed(logits[:4], seed=7, position=0, temperature=0.8)
    drafts = [keyed[:2] + [(keyed[2] + 1) % V], [], [1, 2], [5, 5, 5, 5]]
    params = [SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.2, top_p=0.9, top_k=20, seed=2**40 + 3)]
    seeds, positions = [7, None, None, 2**40 + 3], [0, 4, 8, 2**33 + 1]
    ref = _verify("rejection", drafts, params, seeds, positions, logits)
    tri = _verify("rejection", drafts, params, seeds, positions, logits, use_triton=True)
    assert ref[0].tolist() == keyed[:3] + [-1, -1]
    assert torch.equal(ref[[0, 2, 3]], tri[[0, 2, 3]])  # (request 1 draws from the RNG)


def test_keyed_first_tokens_follow_the_processed_distribution() -> None:
    """Many seeds in one batch, one-hot drafts of a fixed token: the first emitted token follows
    the processed target distribution (temperature, top-k, top-p)."""
    n = 20_000
    row = [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2]
    logits = torch.tensor([row, row]).repeat(n, 1)  # [2n, 8]: a draft row and a bonus row
    params = [SamplingParams(temperature=0.9, top_k=6, top_p=0.95, seed=s) for s in range(n)]
    metadata = SpecDecodeMetadata.from_lists([[0]] * n)
    sampling = SamplingTensors.from_params(params, None, "cpu", seeds=list(range(n)),
                                           positions=[5] * n)
    out = get_sampler("rejection").verify(logits, metadata, sampling)
    counts = torch.bincount(out[:, 0], minlength=len(row))
    expected = expected_distribution(row, temperature=0.9, top_k=6, top_p=0.95)
    assert chi_square_p_value(counts, expected) > P_VALUE_FLOOR
    # draft 0 is accepted exactly when the keyed sample is 0: with probability p(0)
    accepted = (out[:, 1] >= 0).double().mean().item()
    assert abs(accepted - expected[0]) < 5 * (expected[0] * (1 - expected[0]) / n) ** 0.5


def test_greedy_requests_are_never_keyed() -> None:
    sampling = SamplingTensors.from_params([SamplingParams(temperature=0.0, seed=3)],
                                           seeds=[3], positions=[0])
    assert sampling.keys is None and not sampling.any_keyed
