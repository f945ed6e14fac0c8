"""The index inputs of a draft head's chain after a verified step, laid out in one launch.

Why. An overlapped drafting step has its head draft from the step's verified tokens on the
device (:meth:`proposers.draft_head.DraftHead.draft_after`): its CUDA graph reads one int64
tensor of six parts, which PyTorch built from the step's tokens, accepted counts and first
positions in about eight small kernels (clamps, aranges, products, sums, zeros, a
concatenation). A drafting step at batch 1 is bound by its number of kernels (docs/design.md,
"The drafting step's GPU time"), so here it is one launch.

What (:func:`chain_inputs_reference`). For a step of ``batch`` chains of ``width`` tokens
(``tokens [batch, width]``: verified tokens, negative for placeholders), ``accepted [batch]``
and ``base [batch]`` (each chain's first position), padded to ``rows`` pair rows and ``padded``
chains, with ``slots [rows + padded]`` (each pair row's cache slot, then each chain's; the
padding's: the scratch slot), the parts are, each padded with zeros:

0. ``[rows]`` the pairs' tokens, placeholders as token 0;
1. ``[rows]`` the pair rows' slots;
2. ``[rows]`` the pairs' positions ``base[b] + t``;
3. ``[padded]`` the row of each chain's newest verified pair, ``b * width + accepted[b]``;
4. ``[padded]`` the chains' slots;
5. ``[padded]`` that pair's position, ``base[b] + accepted[b]``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

__all__ = ["chain_inputs", "chain_inputs_reference"]

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)


# (one compiled kernel for every step: a new specialisation of a step's integers compiled again
# inside decoding: docs/performance.md, "One-off costs inside timed runs")
@triton.jit(do_not_specialize=["tokens_stride", "batch", "width", "rows", "padded"])
def _chain_inputs_kernel(tokens_ptr, tokens_stride, accepted_ptr, base_ptr, slots_ptr, out_ptr,
                         batch, width, rows, padded, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # a pair row
    b, t = r // width, r % width
    pair = r < batch * width
    in_rows = r < rows
    token = tl.load(tokens_ptr + b * tokens_stride + t, mask=pair, other=0)
    base = tl.load(base_ptr + b, mask=pair, other=0)
    tl.store(out_ptr + r, tl.maximum(token, 0), mask=in_rows)
    tl.store(out_ptr + rows + r, tl.load(slots_ptr + r, mask=in_rows), mask=in_rows)
    tl.store(out_ptr + 2 * rows + r, tl.where(pair, base + t, 0), mask=in_rows)
    # (a chain per row index, the first padded ones)
    chain = r < batch
    in_chains = r < padded
    accepted = tl.load(accepted_ptr + r, mask=chain, other=0)
    first = tl.load(base_ptr + r, mask=chain, other=0)
    at = out_ptr + 3 * rows + r
    tl.store(at, tl.where(chain, r * width + accepted, 0), mask=in_chains)
    tl.store(at + padded, tl.load(slots_ptr + rows + r, mask=in_chains), mask=in_chains)
    tl.store(at + 2 * padded, tl.where(chain, first + accepted, 0), mask=in_chains)


def chain_inputs(tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                 slots: torch.Tensor, rows: int, padded: int) -> torch.Tensor:
    """int64 ``[3 * rows + 3 * padded]``: the module docstring's parts, from ``tokens`` (int64
    ``[batch, width]``), ``accepted`` and ``base`` (int64 ``[batch]``) and ``slots`` (int64
    ``[rows + padded]``), all on one device; ``rows >= batch * width``, ``padded >= batch``.
    One launch on CUDA (or under Triton's interpreter), else :func:`chain_inputs_reference`."""
    device = tokens.device
    if (not (device.type == "cuda" or _INTERPRETED)
            or any(t.device != device for t in (accepted, base, slots))):
        return chain_inputs_reference(tokens, accepted, base, slots, rows, padded)
    batch, width = tokens.shape
    tokens = tokens if tokens.stride(1) == 1 else tokens.contiguous()
    out = torch.empty(3 * (rows + padded), dtype=torch.long, device=device)
    block = min(triton.next_power_of_2(max(rows, padded)), 1024)
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        _chain_inputs_kernel[(triton.cdiv(max(rows, padded), block),)](
            tokens, tokens.stride(0), accepted.contiguous(), base.contiguous(),
            slots.contiguous(), out, batch, width, rows, padded, BLOCK=block)
    return out


def chain_inputs_reference(tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                           slots: torch.Tensor, rows: int, padded: int) -> torch.Tensor:
    """:func:`chain_inputs` in PyTorch."""
    batch, width = tokens.shape
    device = tokens.device
    pad, pad_b = rows - batch * width, padded - batch
    zeros = torch.zeros(max(pad, pad_b), dtype=torch.long, device=device)
    positions = (base[:, None] + torch.arange(width, device=device)).reshape(-1)
    newest = torch.arange(batch, device=device) * width + accepted
    return torch.cat([tokens.clamp_min(0).reshape(-1), zeros[:pad], slots[:rows], positions,
                      zeros[:pad], newest, zeros[:pad_b], slots[rows:], base + accepted,
                      zeros[:pad_b]])
