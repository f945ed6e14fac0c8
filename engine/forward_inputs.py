"""What a step's target forward gets from its records (``engine.step_records``), and which of
its logits rows come back to verification. Host-side lists only: the runner turns them into its
own layout (``engine.runner.step_layout``)."""

from __future__ import annotations

import torch

from engine.step_records import SeqStep


def forward_inputs(items: list[SeqStep]) -> tuple[list[int], list[list[int]], list[int], int,
                                                  list | None, list[tuple[int, int]]]:
    """Each sequence's slot and new tokens (uncached context, then drafts), the rows whose
    logits are kept (each sampling sequence's last context position and its drafts) followed
    by the rows of prompt positions whose logprobs were asked for; the number of kept rows;
    the trees (None: all chains); and (item index, rows) of each prompt-logprob span."""
    slots, tokens, kept, prompt, trees, prompt_rows = [], [], [], [], [], []
    offset = 0
    for i, item in enumerate(items):
        seq = item.seq
        start = seq.num_computed_tokens
        new = seq.all_token_ids[start:start + item.num_context_tokens] + item.drafts
        slots.append(seq.slot)
        tokens.append(new)
        trees.append(None if item.parents is None else (item.num_context_tokens, item.parents))
        if item.samples:
            kept.extend(range(offset + len(new) - len(item.drafts) - 1, offset + len(new)))
        first = seq.next_prompt_logprob_position  # (None: nothing asked, or all there)
        if first is not None and start <= first < start + item.num_context_tokens:
            last = min(start + item.num_context_tokens, seq.num_prompt_tokens - 1)
            prompt.extend(range(offset + first - start, offset + last - start))
            prompt_rows.append((i, last - first))
        offset += len(new)
    return (slots, tokens, kept + prompt, len(kept), trees if any(trees) else None,
            prompt_rows)


def non_finite_rows(logits: torch.Tensor, drafts: list[list[int]]) -> set[int]:
    """Sequences (indices into ``drafts``) with a NaN, +inf or all -inf logits row, off CUDA.

    Their rows are zeroed so that the others verify. On CUDA the kernels mark such a sequence
    with ``INVALID_TOKEN_ID`` instead, without a sync.
    """
    if logits.device.type == "cuda":
        return set()
    finite = torch.isfinite(logits.amax(dim=1))  # [num_rows]
    if bool(finite.all()):
        return set()
    bad, row = set(), 0
    for i, d in enumerate(drafts):
        rows = slice(row, row + len(d) + 1)
        if not bool(finite[rows].all()):
            bad.add(i)
            logits[rows] = 0.0
        row = rows.stop
    return bad
