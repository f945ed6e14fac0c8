"""The target's features a draft head reads (``Proposer.on_features``), cut from a forward."""

from __future__ import annotations

from collections.abc import Collection

import torch

from engine.step_records import SeqStep, Verified
from proposers import FeatureUpdate


def feature_updates(items: list[SeqStep], verified: list[Verified], hidden: torch.Tensor,
                    written: Collection[int] = ()) -> tuple[list[FeatureUpdate], torch.Tensor]:
    """Each running sequence's final hidden states at the positions the forward verified: a
    prefill chunk's, or the fed token's and its accepted drafts' (rows of the forward's token
    layout, :func:`engine.forward_inputs.forward_inputs`; with trees, the accepted branch's,
    gathered), but the sequences' ``written`` (ids) on the device already. ``hidden``:
    ``[total_new_tokens, hidden_size]``; returns the updates and the rows they name."""
    results = {id(r.item): r for r in verified}
    any_tree = any(r.path is not None or r.item.parents is not None for r in verified)
    updates, offset = [], 0
    gather: list[int] = []  # with trees: every update's rows, in update order
    for item in items:
        seq, start = item.seq, offset
        offset += item.num_new_tokens
        if seq.is_finished or id(seq) in written:
            continue
        result = results.get(id(item))
        count = item.num_context_tokens + (result.num_accepted if result else 0)
        # (a chunk that does not sample has already counted its tokens as computed)
        first = (result.num_tokens_before if result else seq.num_computed_tokens) \
            - item.num_context_tokens
        if any_tree:
            rows = list(range(start, start + item.num_context_tokens))
            if result is not None and result.path is not None:  # the accepted branch's
                rows += [start + item.num_context_tokens + c
                         for c in result.path[:result.num_accepted]]
            else:
                rows = list(range(start, start + count))
            start = len(gather)
            gather += rows
        updates.append(FeatureUpdate(seq.seq_id, first, count, seq.all_token_ids, start))
    if gather and gather != list(range(len(gather))):
        hidden = hidden.index_select(0, torch.tensor(gather, device=hidden.device))
    return updates, hidden
