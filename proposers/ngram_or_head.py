"""n-gram where the text repeats, the draft head elsewhere: one proposer for any prompt.

Each step every request is first looked up by n-gram (:mod:`proposers.ngram`); a request whose
suffix matches an earlier occurrence of at least ``MIN_MATCH`` tokens keeps the n-gram drafts
(copy-heavy text: a 4-token match led to 2.87 accepted drafts on the default model's copy
prompts), the others get the draft head's (:mod:`proposers.draft_head`, which drafts on any
text). The head is fed every verified position's features either way, so it is ready whenever a
request stops copying. Both are cheap on a GPU (a table lookup, one CUDA graph replay), so the
controller treats the pair as cheap when the head replays graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from proposers.base import FeatureUpdate, Proposal, Proposer, ProposerContext, ProposeRequest
from proposers.draft_head import DraftHeadProposer, build_draft_head
from proposers.ngram import NgramProposer
from proposers.registry import register_proposer

# an n-gram match this long wins over the head (a 1-token match backs 0.42 accepted drafts on
# the default model's copy prompts, under the head's 0.7-0.8 on open prompts)
MIN_MATCH = 2


class NgramOrHeadProposer(Proposer):
    needs_features = True
    observes = True

    def __init__(self, ngram: NgramProposer, head: DraftHeadProposer) -> None:
        self.ngram, self.head = ngram, head
        self.drafts_are_free = head.drafts_are_free

    @property
    def last_proposal_steady(self) -> bool:  # type: ignore[override]
        return self.head.last_proposal_steady

    def on_features(self, updates: Sequence[FeatureUpdate], features: torch.Tensor) -> None:
        self.head.on_features(updates, features)

    def observe(self, requests: Sequence[ProposeRequest]) -> None:
        self.ngram.observe(requests)

    def on_accepted(self, req_id: str | int, num_tokens: int) -> None:
        self.ngram.on_accepted(req_id, num_tokens)
        self.head.on_accepted(req_id, num_tokens)

    def remove(self, req_id: str | int) -> None:
        self.ngram.remove(req_id)
        self.head.remove(req_id)

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        self.head.last_proposal_steady = True
        copied = self.ngram.propose(requests)
        drafts = list(copied.draft_token_ids)
        backed = list(copied.num_backed or [len(d) for d in drafts])
        rest = [i for i, r in enumerate(requests)
                if r.num_spec_tokens > 0 and backed[i] < MIN_MATCH]
        parents: list[list[int] | None] = [None] * len(requests)
        if rest:
            guessed = self.head.propose([requests[i] for i in rest])
            trees = guessed.parents or [None] * len(rest)
            for i, row, tree in zip(rest, guessed.draft_token_ids, trees, strict=True):
                if row:  # (a head not ready for a request keeps n-gram's guess)
                    drafts[i], backed[i], parents[i] = row, len(row), tree
        return Proposal(drafts, None, backed, parents if any(parents) else None)


@register_proposer("ngram_eagle")
def build_ngram_or_head(config: Any, ctx: ProposerContext) -> NgramOrHeadProposer:
    """n-gram's ``prompt_lookup_min`` / ``prompt_lookup_max`` and the head's ``model`` (None:
    the one shipped for the default model)."""
    return NgramOrHeadProposer(NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max),
                               build_draft_head(config, ctx))
