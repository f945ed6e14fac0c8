"""An oracle proposer: drafts of a set acceptance, for free.

It drafts the target's own greedy continuation (``references``: prompt + the plain engine's
greedy output), each draft right with probability ``alpha`` and another token otherwise, so a
suite can measure how much of the ideal speedup the engine keeps (``examples/custom_proposer.py``
shows the same proposer as an example of registering one's own). Registered once, as
``oracle_bench``; the proposer registry builds it from :data:`ORACLE`'s settings at the time an
engine is built (the registry holds factories, so the settings live beside this one).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from proposers import Proposal, Proposer, ProposeRequest, register_proposer

METHOD = "oracle_bench"


class OracleProposer(Proposer):
    """Drafts ``references[i][len(context):]`` for the reference that extends the context, each
    token replaced by another with probability ``1 - alpha``; no drafts for an unknown context.
    The drafts are one-hot (no probabilities) and cost nothing to make."""

    drafts_are_free = True

    def __init__(self, references: Sequence[Sequence[int]], alpha: float, vocab_size: int,
                 seed: int = 0) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} is invalid: allowed [0, 1]")
        # the references by their first two tokens: a dict lookup per request and step, so that
        # the oracle's own host time stays negligible beside the engine's
        self.by_start: dict[tuple[int, ...], list[list[int]]] = {}
        for r in references:
            self.by_start.setdefault(tuple(r[:2]), []).append(list(r))
        self.alpha = alpha
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        return Proposal([self._drafts(list(r.token_ids), r.num_spec_tokens) for r in requests])

    def _drafts(self, context: list[int], k: int) -> list[int]:
        ref = next((r for r in self.by_start.get(tuple(context[:2]), ())
                    if r[:len(context)] == context), None)
        if ref is None:
            return []
        drafts = []
        for token in ref[len(context):len(context) + k]:
            if self.rng.random() >= self.alpha:
                token = (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
            drafts.append(token)
        return drafts


class OracleSettings:
    """What the next ``oracle_bench`` engine drafts from, and the last proposer built."""

    def __init__(self) -> None:
        self.references: list[list[int]] = []
        self.alpha = 0.0
        self.last: OracleProposer | None = None


ORACLE = OracleSettings()


@register_proposer(METHOD)
def _build(config, ctx) -> OracleProposer:  # (SpeculativeConfig, ProposerContext)
    ORACLE.last = OracleProposer(ORACLE.references, ORACLE.alpha, ctx.vocab_size)
    return ORACLE.last
