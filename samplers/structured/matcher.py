"""A sample's grammar state during decoding, and the walk that masks a step's positions.

Each sample under a grammar holds one ``xgrammar.GrammarMatcher`` (:class:`GrammarState`) that
has accepted exactly the sample's output tokens. In a step that verifies drafts ``d_1..d_m``
the target scores ``m + 1`` positions; position ``j`` follows ``output + d_1..d_j``, so its
token mask is the matcher's after accepting ``d_1..d_j`` (:func:`walk_drafts`: step through
the drafts filling a bitmask row per position, then roll the matcher back). Drafts are cut at
the first one the grammar refuses: that draft's target probability is 0 under the mask, so it
is rejected for certain and the positions after it are never used. A draft that was sampled
(``draft_probs`` given) stays, refused, so that the rejection at its position draws from the
residual distribution as the lossless rule requires; a one-hot draft goes (its residual is the
target's masked distribution, which the position's own sample draws anyway). After
verification the matcher advances by the tokens the sample kept (:meth:`GrammarState.advance`).

Bitmasks are int32 ``[rows, ceil(vocab_size / 32)]``; bit ``t % 32`` of word ``t // 32`` set
means token ``t`` is allowed; a row of -1 (every bit set) allows every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    def accepts(self, token_ids: Sequence[int]) -> bool:
        """Whether the grammar accepts ``token_ids`` from here (state unchanged)."""
        done = 0
        for token in token_ids:
            if self.terminated or not self.matcher.accept_token(token):
                break
            done += 1
        if done:
            self.matcher.rollback(done)
        return done == len(token_ids)


def walk_drafts(states: Sequence[GrammarState], drafts: Sequence[Sequence[int]],
                keep_refused: Sequence[bool], batcher: Any) -> tuple[list[int], list[torch.Tensor]]:
    """Mask every position of a step for samples ``states`` with ``drafts`` (one list each).

    Returns how many of each sample's drafts stay (cut at the first refused one, kept when
    ``keep_refused``; cut after a stop token that ends the grammar) and each sample's bitmask
    ``[kept + 1, words]``: row ``j`` masks the position after ``kept`` drafts ``d_1..d_j``
    (rows the grammar never reaches — after a refused or a stop token — allow every token;
    those positions are never sampled). The matchers end as they began. Levels are filled in
    one batched call each of ``batcher``, an ``xgrammar.BatchGrammarMatcher`` (it spreads a
    batch over threads).
    """
    import xgrammar as xgr

    words = bitmask_words(states[0].vocab_size) if states else 0
    sizes = [len(d) + 1 for d in drafts]
    offsets = [0] * len(sizes)
    for i in range(1, len(sizes)):
        offsets[i] = offsets[i - 1] + sizes[i - 1]
    bitmask = torch.full((sum(sizes), words), -1, dtype=torch.int32)  # [rows, words]
    kept = [len(d) for d in drafts]
    accepted = [0] * len(states)
    going = list(range(len(states)))  # samples whose walk goes on at this level
    level = 0
    while going:
        going = [i for i in going if not states[i].terminated]
        for i in [i for i in range(len(states)) if i not in going and kept[i] > level]:
            kept[i] = level  # (terminated: a stop token was the last draft kept)
        if not going:
            break
        batcher.batch_fill_next_token_bitmask(
            [states[i].matcher for i in going], bitmask,
            [offsets[i] + level for i in going])
        going = [i for i in going if level < len(drafts[i])]
        if not going:
            break
        ok = xgr.BatchGrammarMatcher.batch_accept_token(
            [states[i].matcher for i in going], [drafts[i][level] for i in going])
        still = []
        for i, good in zip(going, ok, strict=True):
            if good:
                accepted[i] += 1
                still.append(i)
            else:
                kept[i] = level + 1 if keep_refused[i] else level
        going = still
        level += 1
    rolled = [i for i in range(len(states)) if accepted[i]]
    if rolled:
        xgr.BatchGrammarMatcher.batch_rollback([states[i].matcher for i in rolled],
                                               [accepted[i] for i in rolled])
    return kept, [bitmask[o:o + k + 1] for o, k in zip(offsets, kept, strict=True)]

