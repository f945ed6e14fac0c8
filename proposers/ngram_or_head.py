"""n-gram where the text repeats, the draft head elsewhere: one proposer for any prompt.

Each step every request is first looked up by n-gram (:mod:`proposers.ngram`); a request whose
suffix matches an earlier occurrence of at least ``MIN_MATCH`` tokens keeps the n-gram drafts
(copy-heavy text: a 4-token match led to 2.87 accepted drafts on the default model's copy
prompts), the others get the draft head's (:mod:`proposers.draft_head`, which drafts on any
text). The head is fed every verified position's features either way, so it is ready whenever a
request stops copying. Both are cheap on a GPU (a table lookup, one CUDA graph replay), so the
controller treats the pair as cheap when the head replays graphs.

A shorter match (one token) is the close call, and it is decided per request, from what each
source's drafts of that request were accepted: a decayed mean of accepted drafts per proposal
for its one-token matches and for the head's drafts (starting from the default model's
measured means, ``SHORT_PRIOR`` and ``HEAD_PRIOR``: the head first). The n-gram guess is kept
when it has done at least as well: it costs nothing, where the head's proposal costs a forward
of its own. A fixed rule that gives the head every one-token match takes as many steps as
n-gram alone on copy text, each with the head's proposal in it (docs/design.md, "Measured
reasons behind the runner's choices"). The head's mean keeps learning from the steps with
no match at all, so a request whose text stops copying goes back to the head. The means learn
only from proposals whose drafts were verified (a step the controller left without drafts
teaches nothing), and the source not chosen is not explored: a one-token match's mean moves
only while it is kept.
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
SHORT_PRIOR = 0.42  # accepted drafts per proposal of a one-token match, before any is seen
HEAD_PRIOR = 0.75  # ... of the head's drafts
DECAY = 0.25  # the weight of each new proposal's outcome in a request's means


class NgramOrHeadProposer(Proposer):
    needs_features = True
    observes = True

    def __init__(self, ngram: Proposer, head: DraftHeadProposer) -> None:
        """``ngram``: a free proposer whose ``num_backed`` says how strong its drafts are
        (n-gram's match length; suffix decoding's drafts above its probability floor)."""
        self.ngram, self.head = ngram, head
        self.observe_every = min(ngram.observe_every, head.observe_every)
        self.drafts_are_free = head.drafts_are_free
        # request -> [one-token matches' mean, the head's mean] accepted drafts per proposal
        self._means: dict[str | int, list[float]] = {}
        # request -> (the source of its last proposal's drafts: 0 short match, 1 head; its
        # context's length then), until its outcome is known
        self._last: dict[str | int, tuple[int, int]] = {}

    @property
    def last_proposal_steady(self) -> bool:  # type: ignore[override]
        return self.head.last_proposal_steady

    def on_features(self, updates: Sequence[FeatureUpdate], features: torch.Tensor) -> None:
        self.head.on_features(updates, features)

    def observe(self, requests: Sequence[ProposeRequest]) -> None:
        self.ngram.observe(requests)
        self.head.observe(requests)

    def on_accepted(self, req_id: str | int, num_tokens: int) -> None:
        self.ngram.on_accepted(req_id, num_tokens)
        self.head.on_accepted(req_id, num_tokens)
        last = self._last.pop(req_id, None)
        if last is not None:  # (num_tokens: the context before the step and its accepted drafts)
            source, length = last
            means = self._means[req_id]
            means[source] += DECAY * (num_tokens - length - means[source])

    def remove(self, req_id: str | int) -> None:
        self.ngram.remove(req_id)
        self.head.remove(req_id)
        self._means.pop(req_id, None)
        self._last.pop(req_id, None)

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        self.head.last_proposal_steady = True
        copied = self.ngram.propose(requests)
        drafts = list(copied.draft_token_ids)
        backed = list(copied.num_backed or [len(d) for d in drafts])
        rest: list[int] = []  # the requests the head drafts for
        for i, r in enumerate(requests):
            if r.num_spec_tokens == 0 or backed[i] >= MIN_MATCH:
                self._last.pop(r.req_id, None)
                continue
            means = self._means.setdefault(r.req_id, [SHORT_PRIOR, HEAD_PRIOR])
            if backed[i] and drafts[i] and means[0] >= means[1]:  # (a tie: n-gram's, free)
                self._last[r.req_id] = (0, len(r.token_ids))
            else:
                rest.append(i)
        parents: list[list[int] | None] = [None] * len(requests)
        if rest:
            guessed = self.head.propose([requests[i] for i in rest])
            trees = guessed.parents or [None] * len(rest)
            for i, row, tree in zip(rest, guessed.draft_token_ids, trees, strict=True):
                req_id = requests[i].req_id
                if row:  # (a head not ready for a request keeps n-gram's guess)
                    drafts[i], backed[i], parents[i] = row, len(row), tree
                    self._last[req_id] = (1, len(requests[i].token_ids))
                else:
                    self._last.pop(req_id, None)
        return Proposal(drafts, None, backed, parents if any(parents) else None)


@register_proposer("ngram_eagle")
def build_ngram_or_head(config: Any, ctx: ProposerContext) -> NgramOrHeadProposer:
    """n-gram's ``prompt_lookup_min`` / ``prompt_lookup_max`` and the head's ``model`` (None:
    the one shipped for the default model)."""
    return NgramOrHeadProposer(NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max),
                               build_draft_head(config, ctx))
