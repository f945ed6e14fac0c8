"""The index inputs of a draft head's chain after a verified step, in one launch
(``proposers.chain_inputs``): against values worked out by hand, and against the PyTorch
reference over padded and unpadded layouts and strided token tensors."""

from __future__ import annotations

import pytest
import torch

from proposers.chain_inputs import chain_inputs, chain_inputs_reference
from tests.conftest import DEVICE, needs_triton

pytestmark = [needs_triton, pytest.mark.head_kernels]  # (the kernel itself: tests/conftest.py)


@pytest.mark.parametrize("build", [chain_inputs, chain_inputs_reference],
                         ids=["kernel", "reference"])
def test_two_chains_padded_to_four_give_the_six_parts(build):
    tokens = torch.tensor([[11, 12, -1], [21, -1, -1]], device=DEVICE)  # (placeholders: -1)
    accepted = torch.tensor([1, 0], device=DEVICE)
    base = torch.tensor([40, 7], device=DEVICE)
    # pair rows' slots (two chains of three, padded to 8 rows with scratch slot 9), then the
    # chains' slots (padded to four)
    slots = torch.tensor([3, 3, 3, 5, 5, 5, 9, 9, 3, 5, 9, 9], device=DEVICE)
    out = build(tokens, accepted, base, slots, 8, 4).tolist()
    assert out[:8] == [11, 12, 0, 21, 0, 0, 0, 0]
    assert out[8:16] == [3, 3, 3, 5, 5, 5, 9, 9]
    assert out[16:24] == [40, 41, 42, 7, 8, 9, 0, 0]
    assert out[24:28] == [1, 3, 0, 0]  # (chain b's newest pair: row b * 3 + accepted[b])
    assert out[28:32] == [3, 5, 9, 9]
    assert out[32:36] == [41, 7, 0, 0]


def test_the_kernel_agrees_with_its_reference():
    gen = torch.Generator().manual_seed(5)
    for batch, width, rows, padded in [(1, 1, 1, 1), (1, 5, 5, 1), (3, 4, 16, 4), (7, 2, 40, 8),
                                       (33, 5, 320, 64)]:
        wide = torch.randint(-1, 1000, (batch, 2 * width), generator=gen).to(DEVICE)
        tokens = wide[:, ::2]  # (a strided view)
        accepted = torch.randint(0, width, (batch,), generator=gen).to(DEVICE)
        base = torch.randint(0, 500, (batch,), generator=gen).to(DEVICE)
        slots = torch.randint(0, 64, (rows + padded,), generator=gen).to(DEVICE)
        got = chain_inputs(tokens, accepted, base, slots, rows, padded)
        want = chain_inputs_reference(tokens, accepted, base, slots, rows, padded)
        assert torch.equal(got, want), (batch, width, rows, padded)
