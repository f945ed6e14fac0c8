"""A fed-chains forward's layout rows written on the device, in one launch.

Why. An overlapped drafting step (:class:`~engine.runner.forward_output.FedChains`) knows its
chains' tokens and first positions only on the device, so the layout's rows of those chains
(:mod:`engine.runner.step_inputs`) are written there: positions, slot-table cells, the pool rows
those cells point at, mask limits and input ids. In PyTorch that was about fifteen small kernels
(:func:`write_chains_reference`), replayed from a CUDA graph with four input copies; a drafting
step at batch 1 is bound by its number of kernels (docs/design.md, "The drafting step's GPU
time"), so here it is one launch of one program a chain, and no graph.

What. For chain ``b < len(base)`` of a layout of ``[batch_size, num_new]`` parts whose slot is
the layout's ``slots[b]``, ``width = tokens.shape[1]`` (at most ``num_new``):

- positions ``[b, t] = base[b] + min(t, width - 1)`` for every ``t < num_new`` (padding columns
  repeat the last position, as the host's layout does), and the mask limits equal them;
- input ids ``[b, t] = max(tokens[b, t], 0)`` (a negative token, a row the sampling kernels
  marked invalid, goes in as id 0: its sequence fails at the commit), slot-table cells
  ``[b, t] = slots[b] * table_width + positions[b, t]`` and pool rows ``[b, t] =
  slot_table[cells[b, t]]`` for ``t < width``; the padding columns keep the host's (id 0, the
  scratch column and row).

The other rows (padding sequences) keep the host's scratch layout. Integer arithmetic only:
:func:`write_chains` and :func:`write_chains_reference` write the same values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runner.fused_ops import _INTERPRETED, _on
from engine.runner.step_inputs import LAYOUT_ROWS

__all__ = ["write_chains", "write_chains_reference"]


# (one compiled kernel for every step: its integers change from step to step, and a launch
# outside any CUDA graph that met a new specialisation of one compiled again inside a request's
# decoding, a stall of every running request: docs/performance.md, "One-off costs inside timed
# runs")
@triton.jit(do_not_specialize=["tokens_stride", "part", "slots_at", "num_new", "width",
                               "table_width"])
def _chain_layout_kernel(layout_ptr, tokens_ptr, base_ptr, table_ptr, tokens_stride, part,
                         slots_at, num_new, width, table_width, BLOCK: tl.constexpr):
    """Chain ``b``'s row of every layout part (``part``: a part's length, ``batch_size *
    num_new``; ``slots_at``: where the slots start)."""
    b = tl.program_id(0)
    t = tl.arange(0, BLOCK)
    columns = t < num_new
    real = t < width
    base = tl.load(base_ptr + b)
    slot = tl.load(layout_ptr + slots_at + b)
    positions = base + tl.minimum(t, width - 1)
    row = b * num_new + t
    cells = slot * table_width + positions
    tl.store(layout_ptr + row,
             tl.maximum(tl.load(tokens_ptr + b * tokens_stride + t, mask=real, other=0), 0),
             mask=real)
    tl.store(layout_ptr + part + row, positions, mask=columns)
    tl.store(layout_ptr + 2 * part + row, tl.load(table_ptr + cells, mask=real), mask=real)
    tl.store(layout_ptr + 3 * part + row, cells, mask=real)
    tl.store(layout_ptr + 4 * part + row, positions, mask=columns)


_MIN_BLOCK = 8  # columns a program covers at least: one compiled kernel for chains up to 8 wide


def write_chains(layout: torch.Tensor, batch_size: int, num_new: int, tokens: torch.Tensor,
                 base: torch.Tensor, slot_table: torch.Tensor) -> None:
    """Write chains ``tokens`` (int64 ``[n, width]``, ``width <= num_new``, ``n <=
    batch_size``) at first positions ``base`` (int64 ``[n]``) into ``layout`` (int64, the
    :mod:`~engine.runner.step_inputs` layout of ``batch_size x num_new``, contiguous) in one
    launch on CUDA (or under Triton's interpreter), else in PyTorch; ``slot_table``: int64
    ``[num_slots, table_width]``, contiguous."""
    n, width = tokens.shape
    device = layout.device
    if (not n or not (device.type == "cuda" or _INTERPRETED)
            or any(t.device != device for t in (tokens, base, slot_table))):
        write_chains_reference(layout, batch_size, num_new, tokens, base, slot_table)
        return
    tokens = tokens if tokens.stride(1) == 1 else tokens.contiguous()
    part = batch_size * num_new
    with _on(layout):
        _chain_layout_kernel[(n,)](layout, tokens, base.contiguous(), slot_table,
                                   tokens.stride(0), part, LAYOUT_ROWS * part, num_new, width,
                                   slot_table.shape[1],
                                   BLOCK=max(_MIN_BLOCK, triton.next_power_of_2(num_new)))


def write_chains_reference(layout: torch.Tensor, batch_size: int, num_new: int,
                           tokens: torch.Tensor, base: torch.Tensor,
                           slot_table: torch.Tensor) -> None:
    """:func:`write_chains` in PyTorch (the CPU path, and the kernel's reference)."""
    n, width = tokens.shape
    parts = layout[:LAYOUT_ROWS * batch_size * num_new].view(LAYOUT_ROWS, batch_size, num_new)
    slots = layout[LAYOUT_ROWS * batch_size * num_new:][:n]  # [n]
    columns = torch.arange(num_new, device=layout.device).clamp_max(width - 1)
    positions = base[:, None] + columns  # [n, num_new]
    cells = slots[:, None] * slot_table.shape[1] + positions[:, :width]  # [n, width]
    parts[0, :n, :width] = tokens.clamp_min(0)
    parts[1, :n] = positions
    parts[2, :n, :width] = slot_table.view(-1)[cells]
    parts[3, :n, :width] = cells
    parts[4, :n] = positions
