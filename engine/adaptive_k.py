"""Adaptive speculation length: draft only as many tokens as pay for themselves, per request.

Cost model (Leviathan et al., arXiv 2211.17192, section 3.4), in units of one plain decode step:
a step with ``k`` drafts costs ``1 + k (c + v)`` where ``c`` is the cost of one draft step
(measured by the engine, or ``SpeculativeConfig.draft_cost_ratio``) and ``v`` the cost of scoring
one more token in the target forward (``verify_cost_per_token``). If each draft is accepted with
probability ``a``, the step yields ``(1 - a^(k+1)) / (1 - a)`` tokens on average. Each step the
engine gives a request the ``k`` in ``0..num_speculative_tokens`` that maximises

    gain(k) = (1 - a^(k+1)) / ((1 - a) (1 + k (c + v)))

so ``k = 0`` (plain decoding, gain 1) wins as soon as drafting is expected to lose time.

The acceptance ``a`` of a request is estimated from its own history as accepted / tested drafts
(a draft is tested when no earlier draft of its step was rejected: the maximum-likelihood estimate
of a geometric run), with counts decayed by ``DECAY`` per update so that it follows the text, and
a prior worth ``PRIOR_TESTED`` drafts at ``PRIOR_ACCEPTANCE``, so a new request starts speculating.
A request at ``k = 0`` drafts one token after ``adaptive_probe_interval`` steps to re-measure ``a``,
then waits twice as long before each further probe (at most ``MAX_PROBE_BACKOFF`` times the
interval) until a probe lifts ``a`` enough for ``k > 0``: ``k`` grows back when the text becomes
predictable again. Steps in which the proposer found nothing to draft (no n-gram match) cost
nothing and leave ``a`` unchanged.

Example: ``c = 0`` (n-gram), ``v = 0.1``, at most 4 drafts. At ``a = 0.8`` the gains are 1.64
(k=1), 2.03 (k=2), 2.27 (k=3), 2.40 (k=4): k = 4. At ``a = 0.5``: 1.36, 1.46, 1.44, 1.38: k = 2.
At ``a = 0.3``: 1.18, 1.16: k = 1. At ``a = 0.08``: 0.98 for k = 1, below plain decoding: k = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.8
PRIOR_ACCEPTANCE = 0.8
PRIOR_TESTED = 2.0
MAX_PROBE_BACKOFF = 8


def expected_tokens(a: float, k: int) -> float:
    """Mean tokens one step yields with ``k`` drafts each accepted with probability ``a``."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(a: float, max_k: int, step_cost_per_draft: float) -> int:
    """The ``k`` in ``0..max_k`` with the largest gain (ties go to the smaller k)."""
    best, best_gain = 0, 1.0
    for k in range(1, max_k + 1):
        gain = expected_tokens(a, k) / (1.0 + k * step_cost_per_draft)
        if gain > best_gain + 1e-9:
            best, best_gain = k, gain
    return best


@dataclass
class AcceptanceTracker:
    """One request's decayed acceptance counts and its probing clock."""

    accepted: float = PRIOR_ACCEPTANCE * PRIOR_TESTED
    tested: float = PRIOR_TESTED
    steps_at_zero: int = 0
    backoff: int = 1  # current probe interval, in units of adaptive_probe_interval

    @property
    def acceptance(self) -> float:
        return self.accepted / self.tested

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """Record one verified step (nothing when nothing was drafted)."""
        if num_drafted == 0:
            return
        tested = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.accepted = DECAY * self.accepted + num_accepted
        self.tested = DECAY * self.tested + tested


class AdaptiveK:
    """Chooses each request's k from its :class:`AcceptanceTracker` (see module docstring)."""

    def __init__(self, max_k: int, verify_cost_per_token: float, probe_interval: int,
                 enabled: bool = True) -> None:
        self.max_k = max_k
        self.verify_cost_per_token = verify_cost_per_token
        self.probe_interval = probe_interval
        self.enabled = enabled

    def choose(self, tracker: AcceptanceTracker, draft_cost_ratio: float) -> int:
        if not self.enabled or self.max_k == 0:
            return self.max_k
        k = best_k(tracker.acceptance, self.max_k, draft_cost_ratio + self.verify_cost_per_token)
        if k > 0:
            tracker.steps_at_zero, tracker.backoff = 0, 1
            return k
        tracker.steps_at_zero += 1
        if tracker.steps_at_zero >= self.probe_interval * tracker.backoff:
            tracker.steps_at_zero = 0
            tracker.backoff = min(2 * tracker.backoff, MAX_PROBE_BACKOFF)
            return 1
        return 0
