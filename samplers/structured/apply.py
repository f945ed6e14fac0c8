"""Applying grammar bitmasks to logits rows (before temperature, top-k/p and verification)."""

from __future__ import annotations

import torch


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[r, t] = -inf`` in place for every token ``t`` that row ``r``'s mask refuses,
    in one op over all rows (xgrammar's kernel on a GPU, its C++ loop on the CPU). ``logits
    [num_rows, vocab_size]`` float; ``bitmask [num_rows, ceil(vocab_size / 32)]`` int32 on the
    logits' device (a row of -1 allows every token)."""
    import xgrammar as xgr

    if bitmask.shape[0] != logits.shape[0] or bitmask.device != logits.device:
        raise ValueError(f"bitmask {tuple(bitmask.shape)} on {bitmask.device} does not match "
                         f"logits {tuple(logits.shape)} on {logits.device}")
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1])
