"""Applying grammar bitmasks to logits rows (before temperature, top-k/p and verification)."""

from __future__ import annotations

import torch


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set ``logits[r, t] = -inf`` in place for every token ``t`` that row ``rows[i]``'s mask
    ``bitmask[i]`` refuses. ``logits [num_rows, vocab_size]`` float; ``bitmask [len(rows),
    ceil(vocab_size / 32)]`` int32 on the host (moved to the logits' device here)."""
    if not rows:
        return
    import xgrammar as xgr

    full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)
    full[torch.tensor(rows, dtype=torch.long)] = bitmask
    xgr.apply_token_bitmask_inplace(logits, full.to(logits.device, non_blocking=True),
                                    vocab_size=logits.shape[1], indices=rows)
