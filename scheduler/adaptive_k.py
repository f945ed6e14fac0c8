"""Adaptive speculation length: draft only as many tokens as pay for themselves, per request.

Cost model (Leviathan et al., arXiv 2211.17192, section 3.4), in units of one plain decode step:
a step with ``k`` drafts costs ``1 + k (c + v)`` where ``c`` is the cost of one draft step
(measured by the engine, or ``SpeculativeConfig.draft_cost_ratio``) and ``v`` the cost of scoring
one more token in the target forward (``verify_cost_per_token``). If each draft is accepted with
probability ``a``, the step yields ``(1 - a^(k+1)) / (1 - a)`` tokens on average. For one
request the best ``k`` in ``0..num_speculative_tokens`` maximises

    gain(k) = (1 - a^(k+1)) / ((1 - a) (1 + k (c + v)))

so ``k = 0`` (plain decoding, gain 1) wins as soon as drafting is expected to lose time. The
engine gives all the sequences of a step one ``k`` (:meth:`AdaptiveK.choose_batch`): the target
pads every sequence to the step's longest, so one sequence's drafts cost the whole batch, and the
gain is then the sequences' mean expected tokens over the same cost. (On a GPU the padding is
nearly free and ``v`` small; on a CPU at batch 32 every padded token costs, and one copying
request among many that are not no longer makes the whole batch pay for its drafts.)

The acceptance ``a`` of a request is estimated from its own history as accepted / tested drafts
(a draft is tested when no earlier draft of its step was rejected: the maximum-likelihood estimate
of a geometric run), with counts decayed by ``DECAY`` per update so that it follows the text, and
a prior worth ``PRIOR_TESTED`` drafts at the engine's recent acceptance over all requests
(decayed by ``RECENT_DECAY`` per update; ``PRIOR_ACCEPTANCE`` before any): a new request starts
speculating, unless the requests before it found drafting useless (then it starts at k = 0 and
probes, instead of paying a first burst of rejected drafts).
A request at ``k = 0`` drafts one token after ``adaptive_probe_interval`` steps to re-measure ``a``,
then waits twice as long before each further probe (at most ``MAX_PROBE_BACKOFF`` times the
interval) until a probe lifts ``a`` enough for ``k > 0``: ``k`` grows back when the text becomes
predictable again. Probes fall on engine steps that are multiples of the wait
(:meth:`AdaptiveK.tick` counts them), so requests waiting as long probe in the same step: the
target pads every sequence to the step's longest, and one probe would otherwise make the whole
batch pay for a longer step, request after request. Steps in which the proposer found nothing
to draft (no n-gram match) cost nothing and leave ``a`` unchanged.

The verify cost is measured too (unless ``SpeculativeConfig.verify_cost_per_token`` fixes it):
:class:`StepCostModel` fits the forward + verify time of recent decode steps (no prefill) as
``t = t0 + t_seq * sequences + t_any * [drafts > 0] + t_draft * drafts`` by least squares, where
``drafts`` counts the padded draft positions (sequences times the longest run of drafts).
While the window holds steps with drafts but too few without, every ``PLAIN_STEP_EVERY``-th step
(:mod:`scheduler.spec_policy`) drafts nothing, so that a batch started on the prior cost learns
what its drafts really cost.
``t_any`` is what a step pays once as soon as any request drafts (its sequences then have
different lengths: the runner builds a mask and attention takes its masked path). At batch
size ``B``, with ``plain = t0 + t_seq * B``: ``v = t_draft * B / plain`` (one more draft over one
sequence's share of a plain step) and ``f = t_any / plain``, and the gain becomes
``E(k) / (1 + f + k (c + v))`` for ``k > 0``. On a GPU at small batches a few more tokens are
nearly free (small ``v``, full k); a compute-bound forward (a CPU at batch 32) pays for every
token it scores (``v`` near 1), and there no acceptance short of perfect makes drafting pay, so
k goes to 0, and while even perfect acceptance would gain less than ``MIN_PROBE_GAIN`` (there,
or a draft model nearly as slow as the target) probes come at the slowest rate only. They never
stop altogether: costs measured at one batch size, or acceptance measured on one stretch of text,
must not switch drafting off for good (exploration that cannot starve: the wait is at most
``adaptive_probe_interval * MAX_PROBE_BACKOFF`` steps). With drafts that cost nothing (n-gram) a
probe verifies all ``num_speculative_tokens`` of them, so that one probe shows acceptance that
came back.

A request that samples with a ``seed`` keeps the configured k: its k would otherwise follow the
measured times, and a different k draws different (equally distributed) tokens, so the same
seed would not give the same output from run to run.

Example: ``c = 0`` (n-gram), ``v = 0.1``, at most 4 drafts. At ``a = 0.8`` the gains are 1.64
(k=1), 2.03 (k=2), 2.27 (k=3), 2.40 (k=4): k = 4. At ``a = 0.5``: 1.36, 1.46, 1.44, 1.38: k = 2.
At ``a = 0.3``: 1.18, 1.16: k = 1. At ``a = 0.08``: 0.98 for k = 1, below plain decoding: k = 0.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

DECAY = 0.8
PRIOR_ACCEPTANCE = 0.8
PRIOR_TESTED = 2.0
RECENT_DECAY = 0.95  # the engine-wide tracker: one update per request step
MAX_PROBE_BACKOFF = 4
# No probes while even perfect acceptance would gain less than this (a probe of a draft model
# also pays the draft's catch-up over every token since the last one).
MIN_PROBE_GAIN = 1.1
COST_WINDOW = 256  # decode steps in the verify-cost fit (engine-wide: a few requests' worth)
MIN_FIT_STEPS = 8  # steps with drafts, and steps without, before the fit is trusted
REFIT_EVERY = 8  # decode steps recorded between two fits (a fit is a 256 x 4 least squares)
MIN_DRAFT_SPREAD = 0.5  # the drafts-per-step standard deviation below which the fit is kept
MAX_VERIFY_COST = 2.0
DEFAULT_VERIFY_COST = 0.1  # verify_cost_per_token until the step times have measured it


def expected_tokens(a: float, k: float) -> float:
    """Mean tokens one step yields with ``k`` drafts each accepted with probability ``a``:
    ``(1 - a^(k+1)) / (1 - a)`` (Leviathan et al., arXiv 2211.17192, eq. 1)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(a: float | list[float], max_k: int, step_cost_per_draft: float,
           fixed_cost: float = 0.0) -> int:
    """The ``k`` in ``0..max_k`` with the largest gain (ties go to the smaller k);
    ``fixed_cost`` is paid once by any ``k > 0``. With several acceptances (one k for a batch),
    the gain is their mean expected tokens over the step's cost."""
    rates = a if isinstance(a, list) else [a]
    if len(rates) > 1 and best_k(max(rates), max_k, step_cost_per_draft, fixed_cost) == 0:
        return 0  # (expected tokens grow with acceptance: the mean cannot pay either)
    best, best_gain = 0, 1.0
    for k in range(1, max_k + 1):
        tokens = sum(expected_tokens(r, k) for r in rates) / len(rates)
        gain = tokens / (1.0 + fixed_cost + k * step_cost_per_draft)
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
    decay: float = DECAY

    @property
    def acceptance(self) -> float:
        return self.accepted / self.tested

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """Record one verified step (nothing when nothing was drafted)."""
        if num_drafted == 0:
            return
        tested = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.accepted = self.decay * self.accepted + num_accepted
        self.tested = self.decay * self.tested + tested


class StepCostModel:
    """Measured cost of scoring drafts: a least-squares fit over the last ``COST_WINDOW`` decode
    steps of ``time = t0 + t_seq * sequences + t_any * [drafts > 0] + t_draft * drafts`` (see
    the module docstring).

    A coefficient is fitted only when the window separates it: ``t_seq`` needs more than one
    batch size (else the whole step goes to ``t0``), ``t_any`` needs steps with and
    without drafts, ``t_draft`` a spread of draft counts among the steps with drafts (without
    it the whole cost of drafting is put on ``t_draft``, which errs towards smaller k). Until
    then, and while the steps stop varying, :meth:`costs` returns the last fit, at first
    ``(prior, 0)``. The fit is redone every ``REFIT_EVERY`` recorded steps (every step until the
first fit), not every step.
    """

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=COST_WINDOW)
        self._fit: tuple[float, float, float, float] | None = None  # t0, t_seq, t_any, t_draft
        self._new_steps = 0  # recorded since the last fit
        self._num_plain = 0  # steps without drafts in the window

    def record(self, num_seqs: int, num_drafts: int, seconds: float) -> None:
        """One decode step: ``num_seqs`` sequences scoring ``num_drafts`` drafts in all."""
        if len(self._steps) == COST_WINDOW and self._steps[0][1] == 0:
            self._num_plain -= 1  # the oldest step leaves the window
        self._steps.append((float(num_seqs), float(num_drafts), seconds))
        self._num_plain += int(num_drafts == 0)
        self._new_steps += 1

    def wants_plain_step(self) -> bool:
        """The window holds enough steps with drafts but too few without to compare them: a
        step without drafts now and then lets the fit see what drafting costs (otherwise a
        batch that keeps drafting on the prior cost never learns that it does not pay)."""
        return self._num_plain < MIN_FIT_STEPS <= len(self._steps) - self._num_plain

    def _refit(self) -> None:
        """Least squares over the window (only called when it holds MIN_FIT_STEPS steps with
        drafts and as many without)."""
        steps = np.array(self._steps)  # [num_steps, 3]: sequences, drafts, seconds
        drafts = steps[:, 1]
        drafting = drafts > 0
        # One batch size only: t0 and t_seq cannot be told apart (least squares would split
        # the step evenly between them and extrapolate that split to other sizes). Put it all
        # in t0: a larger batch then looks no dearer per step, so its drafts look dearer, and
        # adaptive k waits for steps of its own size before it drafts there.
        varied = np.ptp(steps[:, 0]) > 0
        columns = [np.ones(len(steps))] + ([steps[:, 0]] if varied else [])
        spread = drafts[drafting].std() >= MIN_DRAFT_SPREAD
        if spread:
            columns.append(drafting.astype(float))
        columns.append(drafts)
        coef = np.linalg.lstsq(np.column_stack(columns), steps[:, 2], rcond=None)[0]
        t_seq = float(coef[1]) if varied else 0.0
        t_any = float(coef[1 + varied]) if spread else 0.0
        self._fit = (float(coef[0]), t_seq, t_any, float(coef[-1]))

    def costs(self, num_seqs: int) -> tuple[float, float]:
        """``(v, f)`` at batch size ``num_seqs``: one more draft, and the once-per-step cost of
        drafting at all, over one sequence's share of a plain decode step; each clamped to
        ``[0, MAX_VERIFY_COST]``."""
        fittable = min(self._num_plain, len(self._steps) - self._num_plain) >= MIN_FIT_STEPS
        if fittable and (self._new_steps >= REFIT_EVERY or (self._fit is None
                                                            and self._new_steps)):
            self._new_steps = 0
            self._refit()
        if self._fit is None:
            return self.prior, 0.0
        t0, t_seq, t_any, t_draft = self._fit
        plain = t0 + t_seq * num_seqs
        if plain <= 0:
            return MAX_VERIFY_COST, 0.0
        return (min(max(t_draft * num_seqs / plain, 0.0), MAX_VERIFY_COST),
                min(max(t_any / plain, 0.0), MAX_VERIFY_COST))


class AdaptiveK:
    """Chooses each request's k from its :class:`AcceptanceTracker` (see module docstring)."""

    def __init__(self, max_k: int, verify_cost_per_token: float, probe_interval: int,
                 enabled: bool = True, probe_k: int = 1) -> None:
        self.max_k = max_k
        # drafts of a probe: 1, or all of them when drafts are free (more evidence per probe,
        # so acceptance that came back is seen within a probe or two)
        self.probe_k = min(probe_k, max_k)
        self.verify_cost_per_token = verify_cost_per_token
        self.probe_interval = probe_interval
        self.enabled = enabled
        self.recent = AcceptanceTracker(decay=RECENT_DECAY)  # every request's steps
        self.clock = 0  # engine steps (tick), which probes are aligned to
        self.batch = AcceptanceTracker()  # the probing clock of choose_batch

    def tick(self) -> None:
        """One engine step begins."""
        self.clock += 1

    def new_tracker(self) -> AcceptanceTracker:
        """A new request's tracker, its prior at the engine's recent acceptance."""
        return AcceptanceTracker(accepted=self.recent.acceptance * PRIOR_TESTED,
                                 tested=PRIOR_TESTED)

    def update(self, tracker: AcceptanceTracker, num_drafted: int, num_accepted: int) -> None:
        """Record one request's verified step in its tracker and the engine-wide one."""
        tracker.update(num_drafted, num_accepted)
        self.recent.update(num_drafted, num_accepted)

    def choose_batch(self, trackers: list[AcceptanceTracker], draft_cost_ratio: float,
                     verify_cost: float | None = None, fixed_cost: float = 0.0) -> int:
        """One k for all the sequences of a step; ``verify_cost`` (measured) overrides
        ``verify_cost_per_token``; ``fixed_cost`` is paid once by any k > 0. The runner pads
        every sequence to the step's longest, so one sequence's k costs the whole batch: the k
        that pays is the one whose mean expected tokens over the batch beat the step's cost.
        Probes then come for the whole batch at once (:attr:`batch` keeps their clock)."""
        rates = [t.acceptance for t in trackers] or [self.recent.acceptance]
        return self._choose(rates, self.batch, draft_cost_ratio, verify_cost, fixed_cost)

    def _choose(self, rates: list[float], tracker: AcceptanceTracker, draft_cost_ratio: float,
                verify_cost: float | None, fixed_cost: float) -> int:
        """The best k for acceptances ``rates``; ``tracker`` holds the probing clock."""
        if not self.enabled or self.max_k == 0:
            return self.max_k
        v = self.verify_cost_per_token if verify_cost is None else verify_cost
        cost = draft_cost_ratio + v
        k = best_k(rates, self.max_k, cost, fixed_cost)
        if k > 0:
            tracker.steps_at_zero, tracker.backoff = 0, 1
            return k
        best_case = max((j + 1) / (1 + fixed_cost + j * cost) for j in range(1, self.max_k + 1))
        if best_case < MIN_PROBE_GAIN:
            # even perfect acceptance could hardly pay at the costs measured: probe at the
            # slowest rate only, so that costs that changed (another batch size) are seen
            tracker.backoff = MAX_PROBE_BACKOFF
        tracker.steps_at_zero += 1
        wait = self.probe_interval * tracker.backoff
        if tracker.steps_at_zero >= wait and self.clock % wait == 0:
            tracker.steps_at_zero = 0
            tracker.backoff = min(2 * tracker.backoff, MAX_PROBE_BACKOFF)
            return self.probe_k
        return 0
