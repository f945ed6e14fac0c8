"""A sample's grammar state during decoding, and the walk that masks a step's positions.

Each sample under a grammar holds one ``xgrammar.GrammarMatcher`` (:class:`GrammarState`) that
has accepted the sample's output tokens and, between a step's walk and its commit, the drafts
the walk accepted (``GrammarState.walked``). In a step that verifies drafts ``d_1..d_m`` the
target scores ``m + 1`` positions; position ``j`` follows ``output + d_1..d_j``, so its token
mask is the matcher's after accepting ``d_1..d_j`` (:func:`walk_drafts`: step through the
drafts filling a bitmask row per position). A draft the grammar refuses stays where it is: its
masked target probability is 0, so verification rejects it for certain and draws that
position's token from normalize(max(p - q, 0)), the masked target itself for a one-hot draft,
exactly as the lossless rule requires; the positions after it are never used. So the walk needs
the drafts, not the forward's result, and runs while a GPU runs the forward. At commit the
matcher keeps the walked drafts that were accepted, rolls back the rest and accepts the
recovered or bonus token (:meth:`GrammarState.advance`): the accepted drafts are not accepted
twice.

Bitmasks are int32 ``[rows, ceil(vocab_size / 32)]``; bit ``t % 32`` of word ``t // 32`` set
means token ``t`` is allowed; a row of -1 (every bit set) allows every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one bitmask row over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarState:
    """One sample's matcher over a compiled grammar (never asked for a mask once terminated:
    it then accepted a stop token, or the grammar cannot continue). ``walked``: the drafts the
    last walk left accepted beyond the output (empty after :meth:`advance`)."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        # (a walk accepts up to MAX_SPEC_LEN drafts and rolls them back: the library's
        # rollback is unbounded)
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.walked: list[int] = []

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def settle(self) -> None:
        """Roll back what a walk accepted, so that the matcher holds the output alone (a walk
        whose step did not commit: preemption, an error)."""
        if self.walked:
            self.matcher.rollback(len(self.walked))
            self.walked = []

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar admits as the only continuation (the jump-forward
        string, tokenized by the library's longest match; state unchanged). [] when none."""
        self.settle()
        if limit <= 0 or self.terminated:
            return []
        # (most positions force nothing: the string is a fifth of the tokens' cost to find)
        if not self.matcher.find_jump_forward_string():
            return []
        return list(self.matcher.find_jump_forward_tokens()[:limit])

    def advance(self, token_ids: Sequence[int]) -> bool:
        """Accept the sample's kept tokens: the walked drafts they begin with stay accepted,
        the other walked drafts roll back; False when the grammar refuses a token (the mask was
        not applied to it: a bug upstream). Tokens after termination are ignored."""
        same = 0
        for token, walked in zip(token_ids, self.walked, strict=False):
            if token != walked:
                break
            same += 1
        if len(self.walked) > same:
            self.matcher.rollback(len(self.walked) - same)
        self.walked = []
        for token in token_ids[same:]:
            if self.terminated:
                return True
            if not self.matcher.accept_token(token):
                return False
        return True


def walk_drafts(states: Sequence[GrammarState], drafts: Sequence[Sequence[int]], batcher: Any,
                bitmask: np.ndarray, offsets: Sequence[int]) -> list[int]:
    """Mask every position of a step for samples ``states`` with ``drafts`` (one list each),
    into ``bitmask [rows, words]`` (int32, filled in place): sample ``i``'s row ``offsets[i] +
    j`` masks the position after ``d_1..d_j``.

    Returns how many of each sample's drafts the grammar accepts in a row (up to the first
    refused one, or through a stop token that ends the grammar); the matchers keep them
    (``GrammarState.walked``) until :meth:`GrammarState.advance`. Rows past the first refused
    draft, or past a stop token, allow every token (those positions are never sampled: the
    refused draft's masked probability is 0, the stop token ends the sample). Each level is one
    batched fill of ``batcher``, an ``xgrammar.BatchGrammarMatcher`` (its calls release the
    GIL, so a walk in a worker thread runs beside the forward's launch).
    """
    for s in states:
        s.settle()
    filled = [0] * len(states)
    accepted = [0] * len(states)
    going = [i for i in range(len(states)) if not states[i].terminated]
    level = 0
    try:
        while going:
            batcher.batch_fill_next_token_bitmask([states[i].matcher for i in going], bitmask,
                                                  [offsets[i] + level for i in going])
            for i in going:
                filled[i] += 1
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
    finally:
        # (also when xgrammar raised mid-walk: what each matcher accepted is recorded, so the
        # next settle() rolls it back and no later step masks from a half-walked state)
        for i, s in enumerate(states):
            s.walked = list(drafts[i][:accepted[i]])
    for i in range(len(states)):
        if filled[i] <= len(drafts[i]):  # (rows never asked of the grammar: allow everything)
            bitmask[offsets[i] + filled[i]:offsets[i] + len(drafts[i]) + 1] = -1
    return accepted
