"""The payoff guard: drafting must pay in realised tokens per second, per batch size.

The goodput controller (:mod:`scheduler.goodput`) drafts where its *model* says drafting pays:
acceptance estimates times measured relative costs. A model can be wrong in ways its own
estimates do not show (a cost measured in a quiet stretch, acceptance that drifts between
steps, host work the step's timing leaves out), and then speculation makes users slower than
plain decoding. The guard checks the outcome instead of the model: for each batch-size bucket it
compares the tokens its drafting steps produced, and the seconds they took (the step and its
proposal), with what plain decoding would have produced in those seconds, read off the same
engine's measured plain step at each step's context. Plain decoding makes ``b`` tokens per plain
step of ``b`` sequences, so a drafting step worth ``tokens`` tokens is worth ``tokens / b`` plain
steps; the realised payoff is ``sum(plain-step equivalents * plain seconds) / sum(seconds)``,
over an exponentially decayed window of ``HALF_LIFE`` drafting steps. In a *closed* batch (its
caller waits for all of it: ``scheduler.spec_policy``) plain decoding's call lasts as many steps
as its sequence with the most tokens left needs, so there a drafting step is worth as many plain
steps as it brought that end nearer (``spec_policy.front_advance``, at least one): tokens that go
to the other sequences make them finish sooner, not the call. (Counting tokens, the guard let
drafting run on large closed batches whose calls took barely fewer steps than plain decoding's,
each longer: docs/performance.md, "End to end on the held-out real-text workload".)

When the payoff falls below ``1 - MARGIN`` with at least ``MIN_EVIDENCE`` drafting steps of
evidence, the bucket *backs off*: its next ``backoff`` steps are plain, probes included. The
back-off starts at ``FIRST_BACKOFF`` steps and doubles each time the drafting that follows it
loses again (at most ``MAX_BACKOFF``), and is reset when drafting pays; the window starts empty
after each back-off, so drafting is judged afresh. A back-off ends early once as many new
requests have arrived as half the batch: new text may be text that drafts well (a copy task
after stories), and the controller's own probes find it.

The guard's overhead is bounded: after a back-off, at most ``MIN_EVIDENCE`` losing steps come
before the next, which is twice as long. It judges only with measured costs (a configuration
that fixes ``verify_cost_per_token`` asked for the model's costs, not the clock's).

It needs a plain step measured at the bucket. A batch that drafts from its first step on (a
closed batch of requests admitted together, every one drafting) never makes one, and the
controller's model then prices its drafting steps from another batch size's costs, where a
verification step costs less beside a plain one, and drafting that loses goes on unjudged
(docs/performance.md, "Penalties in drafting flights"). So after ``MIN_EVIDENCE`` drafting
steps without that price, the bucket's next ``PRICE_STEPS`` steps are plain (enough for a
first step and a graph's capture, which are not steady, and two kept samples), not counted
as a back-off.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.step_costs import StepCostTable

MARGIN = 0.02  # drafting that realises less than 1 - MARGIN of plain decoding's rate backs off
HALF_LIFE = 32  # drafting steps over which the evidence's weight halves
MIN_EVIDENCE = 12.0  # the window's weight (drafting steps) before it is judged
FIRST_BACKOFF = 64  # steps of the bucket made plain at the first back-off ...
MAX_BACKOFF = 2048  # ... doubling each time drafting loses again, up to this many
PRICE_STEPS = 8  # plain steps planned where drafting ran without a plain step to compare with
_DECAY = 0.5 ** (1.0 / HALF_LIFE)


@dataclass
class BucketPayoff:
    """One batch bucket's evidence: decayed sums of drafting steps' seconds, of what plain
    decoding would have taken for their tokens, and of their count; the back-off's state."""

    seconds: float = 0.0
    plain_seconds: float = 0.0
    weight: float = 0.0
    backoff: int = FIRST_BACKOFF  # the next back-off's length, in steps
    until: int = -1  # the step clock at which the current back-off ends (-1: none)
    admitted_at: int = 0  # requests admitted when the current back-off began
    batch: int = 1  # the batch size that began it
    unpriced: int = 0  # drafting steps recorded since the last plain stretch, none measured

    def payoff(self) -> float:
        return self.plain_seconds / self.seconds if self.seconds > 0 else 1.0


class PayoffGuard:
    """Per batch bucket, whether drafting may run (see the module docstring). ``costs``: the
    controller's measured step costs (the plain step, per bucket and context)."""

    def __init__(self, costs: StepCostTable) -> None:
        self.costs = costs
        self.buckets: dict[int, BucketPayoff] = {}
        self.clock = 0  # steps planned
        self.admitted = 0  # requests admitted
        self.backoffs = 0  # back-offs begun (a metric)

    def _bucket(self, batch_size: int) -> BucketPayoff:
        key = self.costs.batch_bucket(batch_size)
        state = self.buckets.get(key)
        if state is None:
            state = self.buckets[key] = BucketPayoff()
        return state

    def admit(self) -> None:
        """A request joined the engine (a back-off ends early after enough: see above)."""
        self.admitted += 1

    def allows(self, batch_size: int) -> bool:
        """One step planned: whether a step of ``batch_size`` sequences may draft."""
        self.clock += 1
        state = self.buckets.get(self.costs.batch_bucket(batch_size))
        if state is None or state.until < 0:
            return True
        fresh = self.admitted - state.admitted_at
        if self.clock > state.until or 2 * fresh >= state.batch:
            state.until = -1
            return True
        return False

    def record(self, batch_size: int, tokens: int, seconds: float, kv: int = 0) -> None:
        """A steady drafting step of ``batch_size`` sequences was worth ``tokens`` tokens of
        plain decoding (``tokens / batch_size`` plain steps; in a closed batch, ``batch_size``
        times its front's advance) in ``seconds`` (the step and its proposal); ``kv``: its
        longest context."""
        if seconds <= 0 or batch_size <= 0:
            return
        plain = self.costs.plain_seconds(batch_size, kv)
        state = self._bucket(batch_size)
        if plain is None:  # (no plain step measured at this bucket: a few plain steps first)
            state.unpriced += 1
            if state.unpriced >= MIN_EVIDENCE:
                state.unpriced = 0
                state.until = self.clock + PRICE_STEPS
                state.admitted_at, state.batch = self.admitted, batch_size
            return
        state.seconds = state.seconds * _DECAY + seconds
        state.plain_seconds = state.plain_seconds * _DECAY + plain * tokens / batch_size
        state.weight = state.weight * _DECAY + 1.0
        if state.weight < MIN_EVIDENCE:
            return
        if state.payoff() < 1.0 - MARGIN:
            self._back_off(state, batch_size)
        elif state.payoff() >= 1.0:
            state.backoff = FIRST_BACKOFF

    def _back_off(self, state: BucketPayoff, batch_size: int) -> None:
        state.until = self.clock + state.backoff
        state.admitted_at, state.batch = self.admitted, batch_size
        state.backoff = min(2 * state.backoff, MAX_BACKOFF)
        state.seconds = state.plain_seconds = state.weight = 0.0
        self.backoffs += 1
