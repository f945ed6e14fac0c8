"""The combined proposer's per-request choice between a one-token n-gram match and the head.

The two sources are stand-ins that return fixed drafts (what is tested is which one the
combined proposer keeps, from the outcomes it is told); the combined proposer over the real
n-gram proposer and a real head is tested for losslessness in ``test_draft_head.py``.
"""

from __future__ import annotations

from engine import SamplingParams
from proposers.base import Proposal, Proposer, ProposeRequest
from proposers.ngram_or_head import DECAY, HEAD_PRIOR, SHORT_PRIOR, NgramOrHeadProposer

NGRAM_DRAFTS, HEAD_DRAFTS = [7, 7, 7], [9, 9, 9]


class _Fixed(Proposer):
    """Drafts ``drafts`` for every request asked (``backed`` of them backed: None for all);
    records who asked."""

    observes = True

    def __init__(self, drafts: list[int], backed: int | None) -> None:
        self.drafts, self.backed, self.asked, self.observed = drafts, backed, [], []
        self.drafts_are_free = True

    def observe(self, requests):
        self.observed.append([r.req_id for r in requests])

    def propose(self, requests):
        self.asked.append([r.req_id for r in requests])
        drafts = [list(self.drafts) for _ in requests]
        backed = None if self.backed is None else [self.backed] * len(requests)
        return Proposal(drafts, None, backed)


def make(backed: int = 1) -> tuple[NgramOrHeadProposer, _Fixed, _Fixed]:
    ngram, head = _Fixed(NGRAM_DRAFTS, backed), _Fixed(HEAD_DRAFTS, None)
    return NgramOrHeadProposer(ngram, head), ngram, head


def step(proposer: NgramOrHeadProposer, context: list[int], accepted: int) -> list[int]:
    """One proposal for request "r" and its outcome: ``accepted`` of its drafts kept."""
    request = ProposeRequest("r", context, 3, SamplingParams(temperature=0))
    (drafts,) = proposer.propose([request]).draft_token_ids
    proposer.on_accepted("r", len(context) + accepted)
    context.extend(drafts[:accepted] + [1])
    return drafts


def test_a_one_token_match_goes_to_the_head_until_the_heads_drafts_do_worse():
    assert HEAD_PRIOR > SHORT_PRIOR  # (the head first: it accepts more on the default model)
    proposer, ngram, head = make()
    context = [3, 4, 5]
    sources = [step(proposer, context, 0) for _ in range(8)]  # the head's drafts all rejected
    assert sources[0] == HEAD_DRAFTS
    switched = sources.index(NGRAM_DRAFTS)  # within a few rejected proposals
    assert 1 <= switched <= 4
    asked = len(head.asked)
    assert asked == switched + sum(d == HEAD_DRAFTS for d in sources[switched:])
    # with every draft of both rejected, the choice goes back and forth near their means,
    # n-gram's kept at least as often from here on (it is free)
    assert sources[switched:].count(NGRAM_DRAFTS) >= sources[switched:].count(HEAD_DRAFTS)
    assert len(ngram.asked) == 8  # (n-gram is always looked up)


def test_a_head_that_does_better_keeps_the_requests_one_token_matches():
    proposer, _, head = make()
    context = [3, 4, 5]
    sources = [step(proposer, context, 3) for _ in range(6)]  # the head's drafts all accepted
    assert sources == [HEAD_DRAFTS] * 6 and len(head.asked) == 6


def test_n_gram_drafts_that_stop_paying_send_the_request_back_to_the_head():
    proposer, _, head = make()
    context = [3, 4, 5]
    while step(proposer, context, 0) != NGRAM_DRAFTS:  # the head loses the request ...
        pass
    sources = [step(proposer, context, 0) for _ in range(4)]  # ... then n-gram's fail too
    assert HEAD_DRAFTS in sources
    # and a head that then does well keeps it
    while step(proposer, context, 3) != HEAD_DRAFTS:
        pass
    assert [step(proposer, context, 3) for _ in range(3)] == [HEAD_DRAFTS] * 3


def test_long_matches_and_no_match_are_not_a_choice_and_removal_forgets():
    proposer, ngram, head = make(backed=3)  # a 3-token match: n-gram's, always
    context = [3, 4, 5]
    assert [step(proposer, context, 0) for _ in range(5)] == [NGRAM_DRAFTS] * 5
    assert head.asked == []
    proposer, ngram, head = make(backed=0)  # no match: the head's, always
    ngram.drafts = []
    assert [step(proposer, context, 0) for _ in range(5)] == [HEAD_DRAFTS] * 5
    request = ProposeRequest("r", context, 3, SamplingParams(temperature=0))
    proposer.propose([request])  # (its outcome not told: the controller verified none)
    assert "r" in proposer._means and "r" in proposer._last
    proposer.remove("r")
    assert "r" not in proposer._means and "r" not in proposer._last


def test_a_proposal_whose_drafts_were_not_verified_teaches_nothing():
    """A step whose drafts the controller cut to none has no outcome (``on_accepted`` is not
    called); the next proposal's outcome is counted from its own context, not the old one."""
    proposer, _, _ = make()
    context = [3, 4, 5]
    request = ProposeRequest("r", list(context), 3, SamplingParams(temperature=0))
    proposer.propose([request])  # the head's drafts, never verified
    context.append(1)  # (a plain step)
    before = list(proposer._means["r"])
    step(proposer, context, 3)  # all of the next proposal's drafts accepted
    head = before[1] + DECAY * (3 - before[1])
    assert proposer._means["r"] == [before[0], head]


def test_observe_reaches_both_sources():
    proposer, ngram, head = make()
    requests = [ProposeRequest("r", [3, 4], 0, SamplingParams(temperature=0))]
    proposer.observe(requests)
    assert ngram.observed == [["r"]] and head.observed == [["r"]]
