"""The rotary embedding's cos and sin read from a table made once, inside the runner's forwards.

Why. Transformers' rotary module computes each forward's cos and sin from its positions: the
positions to float32, their product with the inverse frequencies, a concatenation, ``cos``,
``sin``, two scalings and two casts, about ten kernels of a few microseconds on every step (a
plain step of the default model at batch 1 is bound by its number of kernels: docs/design.md,
"Measured reasons behind the runner's choices"). Here they are computed once for every position
the runner can feed (by the module's own forward: the same arithmetic, element by element) and
a forward gathers its rows: one launch.

What. ``forward(x, position_ids)`` returns ``table[position_ids]``, the original forward's
``(cos, sin)`` of those positions, bit for bit (each element is a function of its position
alone). Only inside :func:`engine.runner.fused_ops.fused_forward` (elsewhere, and for positions
the table does not hold, transformers' code runs), and only for rotary types whose frequencies
never change (not ``dynamic`` or ``longrope``, which rescale them by the sequence's length).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from engine.runner.fused_ops import fused_active

__all__ = ["MAX_TABLE_BYTES", "install_rotary_table"]

MAX_TABLE_BYTES = 64 * 2**20  # a larger table (a very long max_model_len) is not made
_CHANGING = ("dynamic", "longrope")  # rotary types whose frequencies depend on the length


def _rope_type(module: nn.Module) -> str | None:
    return getattr(module, "rope_type", None)


def install_rotary_table(model: nn.Module, num_positions: int) -> int:
    """Give every rotary module of ``model`` (a module with ``inv_freq`` whose class name ends
    in ``RotaryEmbedding``, of a fixed-frequency type, without a forward of the instance's own:
    accelerate's hooks) a table of at least ``num_positions`` positions in the model's dtype
    (an earlier runner's smaller table is made again); returns how many have one."""
    dtype = next(model.parameters()).dtype
    taken = 0
    for module in model.modules():
        own = module.__dict__.get("forward")
        ours = getattr(own, "__func__", None) is _table_forward  # (an earlier runner's)
        if (not type(module).__name__.endswith("RotaryEmbedding")
                or not isinstance(getattr(module, "inv_freq", None), torch.Tensor)
                or _rope_type(module) in _CHANGING or (own is not None and not ours)):
            continue
        if ours and module._specdec_table.shape[0] >= num_positions:
            taken += 1
            continue
        width = 2 * module.inv_freq.shape[-1]
        if 2 * num_positions * width * dtype.itemsize > MAX_TABLE_BYTES:
            continue
        original = module._specdec_original if ours else module.forward
        device = module.inv_freq.device
        positions = torch.arange(num_positions, device=device)[None]  # [1, num_positions]
        with torch.no_grad():
            cos, sin = original(torch.empty(0, dtype=dtype, device=device), positions)
        # [num_positions, 2, width]: one gather gives a position's cos and sin
        module._specdec_table = torch.stack([cos[0], sin[0]], dim=1).contiguous()
        module._specdec_original = original
        module.forward = types.MethodType(_table_forward, module)
        taken += 1
    return taken


def _table_forward(self: nn.Module, x: torch.Tensor,
                   position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[batch, seq, width]`` in ``x``'s dtype for ``position_ids [batch,
    seq]`` (see the module docstring); transformers' forward outside the runner's forwards,
    for another dtype or device, or past the table (checked without reading the device: the
    runner never feeds a position past ``max_model_len``)."""
    table = self._specdec_table
    if (not fused_active() or x.dtype != table.dtype or position_ids.device != table.device
            or position_ids.dim() != 2):
        return self._specdec_original(x, position_ids)
    rows = table.index_select(0, position_ids.reshape(-1))  # [batch * seq, 2, width]
    rows = rows.view(*position_ids.shape, 2, table.shape[-1])
    return rows[:, :, 0], rows[:, :, 1]
