"""Each row's argmax of a step's logits in two Triton launches: a plain decode step's greedy
sampling on CUDA.

Why. PyTorch's ``max(dim=-1)`` of a few rows over a large vocabulary was one of the step's
slowest launches, and the finite check after it took six more kernels (docs/design.md,
"Measured reasons behind the runner's choices"). Here the first launch splits every row into
chunks of ``CHUNK`` logits, one program each (many SMs take part at batch 1), and the second
combines each row's chunks.

What it computes (:func:`argmax_reference` in PyTorch): the index of each row's largest logit,
the first of equal maxima; ``invalid`` for a row that holds a NaN, whose largest logit is +inf,
or whose logits are all -inf (the verification kernels' marking of such rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["CHUNK", "argmax_reference", "argmax_rows"]

CHUNK = 4096  # logits a first-launch program reads (16 KiB of float32)


@triton.jit(do_not_specialize=["vocab_size", "row_stride"])
def _chunk_argmax_kernel(logits_ptr, best_ptr, index_ptr, vocab_size, row_stride, num_chunks,
                         CHUNK: tl.constexpr):
    """Chunk ``c`` of row ``r``: its largest logit (NaN when it holds a NaN) and that logit's
    first index."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    live = cols < vocab_size
    x = tl.load(logits_ptr + row.to(tl.int64) * row_stride + cols, mask=live,
                other=float("-inf")).to(tl.float32)
    has_nan = tl.max((x != x).to(tl.int32), axis=0) > 0
    x = tl.where(x != x, float("-inf"), x)
    best = tl.max(x, axis=0)
    first = tl.min(tl.where((x == best) & live, cols, vocab_size), axis=0)
    out = row * num_chunks + chunk
    tl.store(best_ptr + out, tl.where(has_nan, float("nan"), best))
    tl.store(index_ptr + out, first)


@triton.jit
def _combine_kernel(best_ptr, index_ptr, out_ptr, num_chunks, invalid,
                    CHUNKS: tl.constexpr):
    """Row ``r``'s argmax from its chunks' (the first chunk of the largest), or ``invalid``."""
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    live = c < num_chunks
    best = tl.load(best_ptr + row * num_chunks + c, mask=live, other=float("-inf"))
    index = tl.load(index_ptr + row * num_chunks + c, mask=live, other=0)
    nans = tl.max((best != best).to(tl.int32), axis=0)
    top = tl.max(tl.where(best != best, float("-inf"), best), axis=0)
    first = tl.min(tl.where((best == top) & live, index, 2147483647), axis=0)
    valid = (nans == 0) & (top != float("inf")) & (top != float("-inf"))
    tl.store(out_ptr + row, tl.where(valid, first.to(tl.int64), invalid))


def argmax_rows(logits: torch.Tensor, invalid: int, chunk: int = CHUNK) -> torch.Tensor:
    """int64 ``[num_rows]``: each row's argmax of ``logits [num_rows, vocab_size]`` (a float
    dtype, its last dimension contiguous; on CUDA, or anywhere under ``TRITON_INTERPRET=1``),
    ``invalid`` where the module docstring says. ``chunk``: logits a first-launch program
    reads (a power of two)."""
    if logits.dim() != 2 or not logits.dtype.is_floating_point or logits.stride(1) != 1:
        raise ValueError(f"logits must be a 2-D float tensor with contiguous rows, got "
                         f"{tuple(logits.shape)} {logits.dtype} strides {logits.stride()}")
    rows, vocab_size = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    if vocab_size == 0:
        return out.fill_(invalid)
    num_chunks = triton.cdiv(vocab_size, chunk)
    best = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    _chunk_argmax_kernel[(rows, num_chunks)](logits, best, index, vocab_size, logits.stride(0),
                                            num_chunks, CHUNK=chunk, num_warps=4)
    _combine_kernel[(rows,)](best, index, out, num_chunks, invalid,
                             CHUNKS=max(16, triton.next_power_of_2(num_chunks)), num_warps=1)
    return out


def argmax_reference(logits: torch.Tensor, invalid: int) -> torch.Tensor:
    """:func:`argmax_rows` in PyTorch (``max`` returns the first of equal maxima and carries a
    NaN; a NaN, +inf or all -inf row has no finite maximum)."""
    best, index = logits.max(dim=-1)
    return torch.where(torch.isfinite(best), index, invalid)
