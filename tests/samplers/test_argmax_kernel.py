"""The two-launch argmax (a plain decode step's greedy sampling on CUDA) against PyTorch's.

Run under ``TRITON_INTERPRET=1`` on CPU tensors (the Makefile sets it), with a small chunk so
that every row spans several chunks and the maxima, ties and bad values fall in different ones.
"""

from __future__ import annotations

import os

import pytest
import torch

from samplers.argmax_kernel import argmax_reference, argmax_rows

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1 (set by `make test`)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INVALID = -2
V = 300  # with CHUNK 64: 5 chunks, the last one partly masked
CHUNK = 64


def _rows() -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(9, V, generator=gen)
    logits[1, [250, 7, 90]] = 9.0  # a tie across chunks: the first index wins
    logits[2, [70, 71]] = 9.0  # a tie inside one chunk
    logits[3, 299] = float("nan")  # a NaN in the masked chunk
    logits[4] = float("-inf")  # nothing finite
    logits[5, 130] = float("inf")
    logits[6, 299] = 50.0  # the maximum at the last column
    logits[7, 0] = 50.0  # and at the first
    logits[8, 10] = float("nan")  # a NaN beside a larger value elsewhere
    logits[8, 200] = 99.0
    return logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_argmax_is_pytorchs_with_bad_rows_marked(dtype):
    logits = _rows().to(DEVICE, dtype)
    got = argmax_rows(logits, INVALID, chunk=CHUNK)
    assert got.dtype == torch.long
    assert got.tolist() == argmax_reference(logits, INVALID).tolist()
    assert got.tolist()[1:9] == [7, 70, INVALID, INVALID, INVALID, 299, 0, INVALID]


def test_a_row_of_strided_rows_and_one_chunk_and_empty_inputs():
    wide = torch.randn(4, 2 * V, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    view = wide[:, :V]  # (rows V apart by 2V: the row stride is read)
    assert argmax_rows(view, INVALID, chunk=CHUNK).tolist() == view.argmax(-1).tolist()
    assert argmax_rows(view, INVALID, chunk=512).tolist() == view.argmax(-1).tolist()
    assert argmax_rows(view[:0], INVALID).shape == (0,)
    with pytest.raises(ValueError, match="2-D float"):
        argmax_rows(view.long(), INVALID)
