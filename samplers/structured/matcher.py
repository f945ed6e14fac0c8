"""A sample's grammar state during decoding, and the walk that masks a step's positions.

Each sample under a grammar holds one ``xgrammar.GrammarMatcher`` (:class:`GrammarState`) that
has accepted exactly the sample's output tokens. In a step that verifies drafts ``d_1..d_m``
the target scores ``m + 1`` positions; position ``j`` follows ``output + d_1..d_j``, so its
token mask is the matcher's after accepting ``d_1..d_j`` (:func:`walk_drafts`: step through
the drafts filling a bitmask row per position, then roll the matcher back). A draft the
grammar refuses stays where it is: its masked target probability is 0, so verification rejects
it for certain and draws that position's token from normalize(max(p - q, 0)), the masked target
itself for a one-hot draft, exactly as the lossless rule requires; the positions after it are
never used. So the walk needs the drafts, not the forward's result, and runs while a GPU runs
the forward. After verification the matcher advances by the tokens the sample kept
(:meth:`GrammarState.advance`).

Bitmasks are int32 ``[rows, ceil(vocab_size / 32)]``; bit ``t % 32`` of word ``t // 32`` set
means token ``t`` is allowed; a row of -1 (every bit set) allows every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one bitmask row over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarState:
    """One sample's matcher over a compiled grammar (never asked for a mask once terminated:
    it then accepted a stop token, or the grammar cannot continue)."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        # (a walk accepts up to MAX_SPEC_LEN drafts and rolls them back: the library's
        # rollback is unbounded)
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar admits as the only continuation (the jump-forward
        string, tokenized by the library's longest match; state unchanged). [] when none."""
        if limit <= 0 or self.terminated:
            return []
        return list(self.matcher.find_jump_forward_tokens()[:limit])

    def advance(self, token_ids: Sequence[int]) -> bool:
        """Accept the sample's kept tokens; False when the grammar refuses one (the mask was
        not applied to it: a bug upstream). Tokens after termination are ignored."""
        for token in token_ids:
            if self.terminated:
                return True
            if not self.matcher.accept_token(token):
                return False
        return True


def walk_drafts(states: Sequence[GrammarState], drafts: Sequence[Sequence[int]],
                batcher: Any) -> tuple[list[int], list[torch.Tensor]]:
    """Mask every position of a step for samples ``states`` with ``drafts`` (one list each).

    Returns how many of each sample's drafts the grammar accepts in a row (up to the first
    refused one, or through a stop token that ends the grammar) and each sample's bitmask
    ``[len(drafts) + 1, words]``: row ``j`` masks the position after ``d_1..d_j``; rows past
    the first refused draft, or past a stop token, allow every token (those positions are never
    sampled: the refused draft's masked probability is 0, the stop token ends the sample). The
    matchers end as they began. Each level is one batched fill of ``batcher``, an
    ``xgrammar.BatchGrammarMatcher``.
    """
    words = bitmask_words(states[0].vocab_size) if states else 0
    sizes = [len(d) + 1 for d in drafts]
    offsets = [0] * len(sizes)
    for i in range(1, len(sizes)):
        offsets[i] = offsets[i - 1] + sizes[i - 1]
    # [rows, words] (numpy's fill: torch's spreads a fill this size over threads, which costs
    # milliseconds when the cores are busy)
    bitmask = torch.from_numpy(np.full((sum(sizes), words), -1, dtype=np.int32))
    accepted = [0] * len(states)
    going = [i for i in range(len(states)) if not states[i].terminated]
    level = 0
    while going:
        batcher.batch_fill_next_token_bitmask([states[i].matcher for i in going], bitmask,
                                              [offsets[i] + level for i in going])
        going = [i for i in going if level < len(drafts[i])]
        if not going:
            break
        ok = batcher.batch_accept_token([states[i].matcher for i in going],
                                        [drafts[i][level] for i in going])
        going = [i for i, good in zip(going, ok, strict=True) if good]
        for i in going:
            accepted[i] += 1
        going = [i for i in going if not states[i].terminated]
        level += 1
    rolled = [i for i in range(len(states)) if accepted[i]]
    if rolled:
        batcher.batch_rollback([states[i].matcher for i in rolled],
                               [accepted[i] for i in rolled])
    return accepted, [bitmask[o:o + n] for o, n in zip(offsets, sizes, strict=True)]
