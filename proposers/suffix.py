"""Suffix decoding (``suffix``): drafts from every request's prompt and output seen so far.

Agents and chat loops repeat themselves: a file edited again, a tool's output pasted back, a
request sent twice. Each step the context's longest earlier occurrence is found in the token
store (:mod:`proposers.suffix_index`: earlier requests' prompts and outputs, the running
requests' and the current one's own) and its most frequent continuation is drafted, as long as
its estimated probability (occurrence counts along the path) stays at least
``suffix_decoding_min_token_prob`` and for at most ``suffix_decoding_max_spec_factor`` times the
match's length (vLLM's and Arctic Inference's options; ``suffix_decoding_max_tree_depth``
bounds match + draft, ``suffix_decoding_max_cached_requests`` the requests kept after they
leave). Drafts are one-hot and cost a lookup: free for the speculation controller, which gets
every draft as backed evidence.

``suffix_eagle`` mixes it with the draft head as ``ngram_eagle`` mixes n-gram
(:mod:`proposers.ngram_or_head`): suffix drafts where at least two of them pass the probability
floor (a strong match), the head's where none do, and per request for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proposers.base import Proposal, Proposer, ProposerContext, ProposeRequest
from proposers.draft_head import build_draft_head
from proposers.ngram_or_head import NgramOrHeadProposer
from proposers.registry import register_proposer
from proposers.suffix_index import SuffixIndex, draft_from


class SuffixProposer(Proposer):
    drafts_are_free = True
    observes = True

    def __init__(self, max_depth: int = 24, max_cached: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1) -> None:
        self.store = SuffixIndex(max_depth, max_cached)
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.last_scores: list[float] = []  # each request's last draft's score (for a mix)

    def observe(self, requests: Sequence[ProposeRequest]) -> None:
        for r in requests:
            self.store.extend(r.req_id, r.token_ids)

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        drafts, self.last_scores = [], []
        for r in requests:
            self.store.extend(r.req_id, r.token_ids)  # (the verified context only: no drafts)
            draft, score = [], 0.0
            if r.num_spec_tokens:
                draft, score = draft_from(self.store.candidates(r.token_ids), r.num_spec_tokens,
                                          self.store.max_depth, self.max_spec_factor,
                                          self.min_token_prob)
            drafts.append(draft)
            self.last_scores.append(score)
        return Proposal(drafts, None, [len(d) for d in drafts])

    def remove(self, req_id: str | int) -> None:
        self.store.leave(req_id)


def build_suffix(config: Any) -> SuffixProposer:
    return SuffixProposer(config.suffix_decoding_max_tree_depth,
                          config.suffix_decoding_max_cached_requests,
                          config.suffix_decoding_max_spec_factor,
                          config.suffix_decoding_min_token_prob)


@register_proposer("suffix")
def _build(config: Any, ctx: ProposerContext) -> SuffixProposer:
    return build_suffix(config)


@register_proposer("suffix_eagle")
def _build_with_head(config: Any, ctx: ProposerContext) -> NgramOrHeadProposer:
    """The suffix options and the head's ``model`` (None: the head shipped for the default
    model)."""
    return NgramOrHeadProposer(build_suffix(config), build_draft_head(config, ctx))
