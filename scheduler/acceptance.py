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
    """A request's row in the :class:`AcceptanceModel`'s arrays (its counts live there, so that
    a step reads and updates the whole batch in a few array operations)."""

    __slots__ = ("row",)

    def __init__(self, row: int) -> None:
        self.row = row


class AcceptanceModel:
    """The engine's counts and every live request's, in rows of shared arrays."""

    def __init__(self, max_k: int, capacity: int = 64) -> None:
        self.max_k = max(max_k, 1)
        self.engine_accepted = np.full((2, self.max_k), START_ACCEPTANCE)  # [2, max_k]
        self.engine_tested = np.ones((2, self.max_k))  # [2, max_k]
        self.engine_found, self.engine_asked = 1.0, 1.0
        self.clock = 0  # engine steps (tick)
        self.stamp = 0  # the engine step of the engine counts' last update
        self.version = 0  # bumped by every change of the counts
        self.accepted = np.zeros((capacity, 2, self.max_k))  # [rows, 2, max_k] per request
        self.tested = np.zeros((capacity, 2, self.max_k))  # [rows, 2, max_k]
        self.found = np.zeros(capacity)  # [rows] proposals with drafts it backs (decayed)
        self.asked = np.zeros(capacity)  # [rows] proposals (decayed)
        self.stamps = np.zeros(capacity, dtype=np.int64)  # [rows] step of the last update
        self._free = list(range(capacity - 1, -1, -1))

    def tick(self) -> None:
        """One engine step begins."""
        self.clock += 1

    def new_request(self) -> RequestAcceptance:
        if not self._free:
            self._grow()
        row = self._free.pop()
        self.accepted[row] = 0.0
        self.tested[row] = 0.0
        self.found[row] = self.asked[row] = 0.0
        self.stamps[row] = self.clock
        return RequestAcceptance(row)

    def release(self, req: RequestAcceptance) -> None:
        """The request finished: its row is free for another."""
        if req.row >= 0:
            self._free.append(req.row)
            req.row = -1

    def _grow(self) -> None:
        old = len(self.found)
        for name in ("accepted", "tested", "found", "asked", "stamps"):
            array = getattr(self, name)
            setattr(self, name, np.concatenate([array, np.zeros_like(array)]))
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def _age(self, stamps: np.ndarray) -> np.ndarray:
        """The extra decay of evidence last updated at engine steps ``stamps``."""
        gap = np.maximum(self.clock - stamps - 1, 0)
        return DECAY ** (gap / IDLE_STEPS)

    @staticmethod
    def _rows(reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs)]`` the requests' rows."""
        return np.fromiter((r.row for r in reqs), dtype=np.int64, count=len(reqs))

    def rates(self, reqs: list[RequestAcceptance], backed: list[int] | None = None) -> np.ndarray:
        """``[len(reqs), max_k]`` conditional acceptance of each request's draft positions;
        positions past ``backed[i]`` read the pooled unbacked counts (None: all backed)."""
        rows = self._rows(reqs)
        engine = self.engine_accepted[BACKED] / self.engine_tested[BACKED]  # [max_k]
        acc, tested = self.accepted[rows], self.tested[rows]  # [n, 2, max_k]
        est = (acc[:, BACKED] + PRIOR_WEIGHT * engine) / (tested[:, BACKED] + PRIOR_WEIGHT)
        if backed is None:
            return est  # [n, max_k]
        pooled = self.engine_accepted[UNBACKED].sum() / self.engine_tested[UNBACKED].sum()
        guess = (acc[:, UNBACKED].sum(1) + PRIOR_WEIGHT * pooled) / (
            tested[:, UNBACKED].sum(1) + PRIOR_WEIGHT)  # [n]
        unbacked = np.arange(self.max_k)[None, :] >= np.asarray(backed)[:, None]  # [n, max_k]
        return np.where(unbacked, guess[:, None], est)

    def found_rates(self, reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs)]`` how often the proposer had drafts it backs for each request."""
        rows = self._rows(reqs)
        engine = self.engine_found / self.engine_asked
        return (self.found[rows] + PRIOR_WEIGHT * engine) / (self.asked[rows] + PRIOR_WEIGHT)

    def record_proposals(self, reqs: list[RequestAcceptance], found: list[int]) -> None:
        """One proposal for each of ``reqs``; ``found[i] > 0``: it had drafts it backs."""
        self.version += 1
        rows = self._rows(reqs)
        hits = np.asarray(found) > 0  # [n]
        self.found[rows] = DECAY * self.found[rows] + hits
        self.asked[rows] = DECAY * self.asked[rows] + 1.0
        decay = ENGINE_DECAY ** len(reqs)
        self.engine_found = decay * self.engine_found + float(hits.sum())
        self.engine_asked = decay * self.engine_asked + len(reqs)

    def update(self, reqs: list[RequestAcceptance], num_drafted: list[int],
               num_accepted: list[int], num_backed: list[int | None]) -> None:
        """One verified step of each of ``reqs``: drafts ``1..num_accepted`` were accepted and,
        when one was rejected, draft ``num_accepted + 1`` was tested and failed; later ones were
        not tested. Requests that drafted nothing are left alone."""
        keep = [i for i, d in enumerate(num_drafted) if d > 0]
        if not keep:
            return
        self.version += 1
        rows = np.array([reqs[i].row for i in keep], dtype=np.int64)  # [n]
        drafted = np.array([num_drafted[i] for i in keep])  # [n]
        accepted = np.minimum(np.array([num_accepted[i] for i in keep]), drafted)  # [n]
        backed = np.array([drafted[j] if num_backed[i] is None else num_backed[i]
                           for j, i in enumerate(keep)])  # [n]
        pos = np.arange(self.max_k)[None, :]  # [1, max_k]
        tested = pos < np.minimum(accepted + 1, drafted)[:, None]  # [n, max_k]
        hit = pos < accepted[:, None]  # [n, max_k]
        is_backed = pos < backed[:, None]  # [n, max_k]
        add_tested = np.stack([tested & is_backed, tested & ~is_backed], axis=1)  # [n, 2, max_k]
        add_hit = np.stack([hit & is_backed, hit & ~is_backed], axis=1)  # [n, 2, max_k]
        decay = (DECAY * self._age(self.stamps[rows]))[:, None, None]  # [n, 1, 1]
        self.accepted[rows] = decay * self.accepted[rows] + add_hit
        self.tested[rows] = decay * self.tested[rows] + add_tested
        self.stamps[rows] = self.clock
        engine_decay = ENGINE_DECAY ** len(keep) * float(self._age(np.array(self.stamp)))
        self.engine_accepted = engine_decay * self.engine_accepted + add_hit.sum(0)
        self.engine_tested = engine_decay * self.engine_tested + add_tested.sum(0)
        self.stamp = self.clock
