"""Applying grammar bitmasks to logits rows (before temperature, top-k/p and verification)."""

from __future__ import annotations

import numpy as np
import torch


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set ``logits[r, t] = -inf`` in place for every token ``t`` that row ``rows[i]``'s mask
    ``bitmask[i]`` refuses. ``logits [num_rows, vocab_size]`` float; ``bitmask [len(rows),
    ceil(vocab_size / 32)]`` int32 on the host (moved to the logits' device here)."""
    if not rows:
        return
    import xgrammar as xgr

    if len(rows) == logits.shape[0]:  # (every row masked, in order: the common case)
        full = bitmask
    else:  # (the other rows allow everything; one call over all rows beats row indices)
        full_np = np.full((logits.shape[0], bitmask.shape[1]), -1, dtype=np.int32)
        full_np[rows] = bitmask.numpy()  # (numpy: see walk_drafts)
        full = torch.from_numpy(full_np)
    xgr.apply_token_bitmask_inplace(logits, full.to(logits.device, non_blocking=True),
                                    vocab_size=logits.shape[1])
