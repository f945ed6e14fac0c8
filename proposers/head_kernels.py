"""A fused kernel for the draft head's drafting: the rotary embedding from positions, one launch.

The head's rotary (:func:`proposers.head_model.rotate`, the PyTorch reference) is about a dozen
kernels for each of the queries and the keys: the positions to float32, their product with the
frequencies, ``cos``, ``sin``, the float32 copy of ``x``, its halves' four products, the
difference and the sum, the concatenation and the copy back. A proposal of 4 drafts runs it 8
times, inside a CUDA graph whose kernels cost a few microseconds each whatever their work: a
proposal is bound by its number of kernels (docs/design.md, "Measured reasons behind the
runner's choices"). Here it is one Triton launch: each program rotates one (row, head) of
``x``, computing its angles ``position * inv_freq`` in float32 as the reference does, and
rounds once, at the store.

Numerics: the same formula in float32; ``cos``/``sin`` are Triton's and may differ from
PyTorch's in the last float32 place, so outputs are equal to the reference after the rounding to
bf16 but for rare ties (checked in ``tests/proposers/test_head_kernels.py``). It serves drafts
only (verification decides what is kept), and only where no gradient is needed: training
(``examples/train_draft_head.py``) goes through the reference.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)


@triton.jit
def _to_bf16_grid(x):
    """float32 ``x`` on bf16's grid (round to nearest even, by its bits), NaN kept: the store's
    cast is then exact, compiled or interpreted (the interpreter truncates a cast to bf16)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _rotate_kernel(x_ptr, out_ptr, pos_ptr, freq_ptr, heads, xs_row, xs_head, os_row, os_head,
                   HALF: tl.constexpr, BLOCK: tl.constexpr, BF16: tl.constexpr):
    pid = tl.program_id(0)  # one (row, head)
    row, head = pid // heads, pid % heads
    i = tl.arange(0, BLOCK)
    live = i < HALF
    angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(freq_ptr + i, mask=live, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    x_row = x_ptr + row * xs_row + head * xs_head
    a = tl.load(x_row + i, mask=live, other=0.0).to(tl.float32)
    b = tl.load(x_row + HALF + i, mask=live, other=0.0).to(tl.float32)
    o_row = out_ptr + row * os_row + head * os_head
    ty = out_ptr.dtype.element_ty
    first, second = a * c - b * s, b * c + a * s
    if BF16:
        first, second = _to_bf16_grid(first), _to_bf16_grid(second)
    tl.store(o_row + i, first.to(ty), mask=live)
    tl.store(o_row + HALF + i, second.to(ty), mask=live)


def fused_rotate_applies(x: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether :func:`fused_rotate` serves this call: on a GPU (or under Triton's interpreter),
    no gradient wanted, the head dimension contiguous, positions one per row of ``x``."""
    return ((x.is_cuda or _INTERPRETED) and not torch.is_grad_enabled() and x.dim() >= 2
            and x.stride(-1) == 1 and x.shape[-1] % 2 == 0
            and tuple(positions.shape) == tuple(x.shape[:-2])
            and positions.device == x.device)


def fused_rotate(x: torch.Tensor, positions: torch.Tensor,
                 inv_freq: torch.Tensor) -> torch.Tensor:
    """:func:`proposers.head_model.rotate` in one launch: ``x [..., heads, head_dim]`` rotated
    at ``positions [...]`` by ``inv_freq [head_dim / 2]`` (float32), LLaMA's half-split layout;
    returns a new tensor of ``x``'s shape and dtype."""
    heads, dim = x.shape[-2], x.shape[-1]
    rows = x.reshape(-1, heads, dim)  # [rows, heads, head_dim] (a view where x allows)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # [rows, heads, head_dim]
    if rows.numel():
        pos = positions.reshape(-1)  # [rows]
        with torch.cuda.device(x.device) if x.is_cuda else nullcontext():
            _rotate_kernel[(rows.shape[0] * heads,)](
                rows, out, pos, inv_freq, heads, rows.stride(0), rows.stride(1),
                out.stride(0), out.stride(1), HALF=dim // 2,
                BLOCK=triton.next_power_of_2(dim // 2), BF16=x.dtype == torch.bfloat16)
    return out.view(x.shape)

