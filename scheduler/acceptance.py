"""Acceptance per request and per draft position, with the proposer's evidence.

The controller (:mod:`scheduler.goodput`) needs, for each sequence of a step and each draft
position ``j``, the probability that draft ``j`` is accepted given that drafts ``1..j-1`` were:
the *conditional* acceptance ``a[j]``. The expected tokens of a step with ``w`` drafts are then
``1 + a[1] + a[1] a[2] + ... + a[1]...a[w]`` (with one ``a`` for all positions this is
Leviathan et al.'s ``(1 - a^(w+1)) / (1 - a)``, arXiv 2211.17192, eq. 1).

Evidence: a proposer may say how many of its leading drafts its own evidence backs
(``Proposal.num_backed``: an n-gram match of n tokens backs n drafts); backed and unbacked drafts
are counted apart, so that a long match predicts more accepted drafts than a guess past it.

Counts, per (backed, position): each request keeps its own, decayed by ``DECAY`` at each of its
verified steps so that they follow the text; the engine keeps the sum over all requests, decayed
by ``ENGINE_DECAY`` per request step. Evidence also ages while nobody drafts: an update after a
gap of ``g`` engine steps decays by a further ``DECAY ** ((g - 1) / IDLE_STEPS)``, so that a long
stretch of rejected drafts does not outweigh the probe that finds them accepted again. Positions
past the proposer's evidence are pooled (one rate for every unbacked draft). A request's
estimate is its own counts plus ``PRIOR_WEIGHT`` tested drafts at the engine's *current* rate: a
new request starts where the others are, and when a probe finds that drafts pay again, every
request sees it at once. ``found``: how often the proposer had a draft that its evidence backs
for the request (an n-gram proposer often has none), tracked the same way.
"""

from __future__ import annotations

import numpy as np

DECAY = 0.8  # per verified step of the request
ENGINE_DECAY = 0.95  # per request step, engine-wide
PRIOR_WEIGHT = 1.0  # tested drafts' worth of the engine's rate in a request's estimate
START_ACCEPTANCE = 0.8  # the engine's rate before anything was verified (optimistic: it drafts)
IDLE_STEPS = 4  # engine steps without an update that age the evidence like one update
BACKED, UNBACKED = 0, 1  # rows of the counts


def expected_tokens(a: float, k: float) -> float:
    """Mean tokens one step yields with ``k`` drafts each accepted with probability ``a``:
    ``(1 - a^(k+1)) / (1 - a)`` (Leviathan et al., arXiv 2211.17192, eq. 1)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class RequestAcceptance:
    """One request's decayed counts (see the module docstring)."""

    __slots__ = ("accepted", "tested", "found", "asked", "stamp")

    def __init__(self, max_k: int) -> None:
        self.accepted = np.zeros((2, max(max_k, 1)))  # [2 (backed, unbacked), max_k]
        self.tested = np.zeros((2, max(max_k, 1)))  # [2, max_k]
        self.found = 0.0  # proposals that had drafts (decayed)
        self.asked = 0.0  # proposals (decayed)
        self.stamp = 0  # the engine step of the last update


class AcceptanceModel:
    """The engine's counts and every request's estimate."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max(max_k, 1)
        self.accepted = np.full((2, self.max_k), START_ACCEPTANCE)  # [2, max_k]
        self.tested = np.ones((2, self.max_k))  # [2, max_k]
        self.found, self.asked = 1.0, 1.0
        self.clock = 0  # engine steps (tick)
        self.stamp = 0  # the engine step of the last update

    def tick(self) -> None:
        """One engine step begins."""
        self.clock += 1

    def _age(self, stamp: int) -> float:
        """The extra decay of evidence last updated at engine step ``stamp``."""
        gap = self.clock - stamp
        return DECAY ** ((gap - 1) / IDLE_STEPS) if gap > 1 else 1.0

    def new_request(self) -> RequestAcceptance:
        return RequestAcceptance(self.max_k)

    def rates(self, reqs: list[RequestAcceptance], backed: list[int] | None = None) -> np.ndarray:
        """``[len(reqs), max_k]`` conditional acceptance of each request's draft positions;
        positions past ``backed[i]`` read the unbacked counts (``backed=None``: all backed)."""
        engine = self.accepted / self.tested  # [2, max_k]
        acc = np.stack([r.accepted for r in reqs])  # [n, 2, max_k]
        tested = np.stack([r.tested for r in reqs])  # [n, 2, max_k]
        est = (acc[:, BACKED] + PRIOR_WEIGHT * engine[BACKED]) / (
            tested[:, BACKED] + PRIOR_WEIGHT)  # [n, max_k]
        if backed is None:
            return est
        pooled = self.accepted[UNBACKED].sum() / self.tested[UNBACKED].sum()
        guess = (acc[:, UNBACKED].sum(1) + PRIOR_WEIGHT * pooled) / (
            tested[:, UNBACKED].sum(1) + PRIOR_WEIGHT)  # [n]
        pos = np.arange(self.max_k)
        unbacked = pos[None, :] >= np.asarray(backed)[:, None]  # [n, max_k]
        return np.where(unbacked, guess[:, None], est)

    def found_rates(self, reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs)]`` how often the proposer had drafts for each request."""
        engine = self.found / self.asked
        return np.array([(r.found + PRIOR_WEIGHT * engine) / (r.asked + PRIOR_WEIGHT)
                         for r in reqs])

    def record_proposal(self, req: RequestAcceptance, had_drafts: bool) -> None:
        req.found = DECAY * req.found + had_drafts
        req.asked = DECAY * req.asked + 1.0
        self.found = ENGINE_DECAY * self.found + had_drafts
        self.asked = ENGINE_DECAY * self.asked + 1.0

    def update(self, req: RequestAcceptance, num_drafted: int, num_accepted: int,
               num_backed: int | None = None) -> None:
        """One verified step: drafts ``1..num_accepted`` were accepted and, when one was
        rejected, draft ``num_accepted + 1`` was tested and failed; later ones were not tested.
        Nothing happens when nothing was drafted."""
        if num_drafted <= 0:
            return
        tested_n = min(num_drafted, num_accepted + 1, self.max_k)
        accepted_n = min(num_accepted, tested_n)
        backed = num_drafted if num_backed is None else num_backed
        decay = DECAY * self._age(req.stamp)
        req.accepted *= decay
        req.tested *= decay
        req.stamp = self.clock
        engine_decay = ENGINE_DECAY * self._age(self.stamp)
        self.accepted *= engine_decay
        self.tested *= engine_decay
        self.stamp = self.clock
        for j in range(tested_n):
            row = BACKED if j < backed else UNBACKED
            hit = 1.0 if j < accepted_n else 0.0
            req.tested[row, j] += 1.0
            req.accepted[row, j] += hit
            self.tested[row, j] += 1.0
            self.accepted[row, j] += hit
