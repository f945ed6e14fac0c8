"""The payoff guard on synthetic cost and yield streams: drafting that realises fewer tokens per
second than plain decoding on the same engine backs off, per batch size; drafting that pays,
or loses less than the margin, does not; the back-off doubles while drafting keeps losing,
resets when it pays, and ends early when new requests arrive."""

import pytest

from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from proposers import Proposal
from samplers import SamplingParams
from scheduler import ScheduledSequence, StepOutcome, StepTiming, make_controller
from scheduler.payoff_guard import (
    FIRST_BACKOFF,
    MARGIN,
    MIN_EVIDENCE,
    PRICE_STEPS,
    PayoffGuard,
)
from scheduler.step_costs import StepCostTable

PLAIN_S = 0.010  # a plain step's seconds in these streams


def guard_with_plain(batch_sizes=(8,)):
    costs = StepCostTable()
    for b in batch_sizes:
        for _ in range(5):  # (the first sample of a cell is a warm-up and is not kept)
            costs.record("step", b, 1, PLAIN_S)
    return PayoffGuard(costs)


def feed(guard, steps, batch_size, tokens_per_seq, cost_over_plain):
    """``steps`` steps planned (``allows``); each allowed one drafts and is recorded."""
    allowed = []
    for _ in range(steps):
        allowed.append(guard.allows(batch_size))
        if allowed[-1]:
            guard.record(batch_size, round(tokens_per_seq * batch_size),
                         cost_over_plain * PLAIN_S)
    return allowed


def test_drafting_that_loses_backs_off_for_its_batch_size_only():
    guard = guard_with_plain((8, 1))
    # 1.2 tokens a sequence for 1.5 plain steps: 0.8 of plain decoding's rate
    allowed = feed(guard, 40, 8, 1.2, 1.5)
    first_refusal = allowed.index(False)
    assert MIN_EVIDENCE <= first_refusal <= MIN_EVIDENCE + 4  # judged once evidence suffices
    assert guard.backoffs == 1
    assert not any(allowed[first_refusal:])
    # the back-off lasts FIRST_BACKOFF planned steps of the engine, then drafting is tried again
    waited = len(allowed) - first_refusal
    while not guard.allows(8):
        waited += 1
    assert waited == FIRST_BACKOFF
    feed(guard, 20, 8, 1.2, 1.5)  # backs off again (for twice as long) ...
    assert not guard.allows(8)
    assert guard.allows(1)  # ... while another batch size keeps drafting


def test_drafting_that_pays_or_loses_within_the_margin_is_never_stopped():
    guard = guard_with_plain()
    assert all(feed(guard, 200, 8, 2.0, 1.3))  # 1.54x plain
    assert all(feed(guard, 200, 8, 1.0, 1.0 + MARGIN / 2))  # 0.99x: within the margin
    assert guard.backoffs == 0


def test_the_back_off_doubles_while_drafting_loses_and_resets_when_it_pays():
    guard = guard_with_plain()
    lengths = []
    for _ in range(3):
        allowed = feed(guard, 20, 8, 1.0, 1.5)  # (backs off within them: the rest refused)
        waited = allowed.count(False)
        while not guard.allows(8):
            waited += 1
        lengths.append(waited)
    assert lengths == [FIRST_BACKOFF, 2 * FIRST_BACKOFF, 4 * FIRST_BACKOFF]
    feed(guard, 40, 8, 2.0, 1.2)  # drafting pays again
    assert guard.buckets[8].backoff == FIRST_BACKOFF


def test_new_requests_end_a_back_off_early():
    guard = guard_with_plain()
    feed(guard, 20, 8, 1.0, 1.5)
    assert not guard.allows(8)
    for _ in range(3):
        guard.admit()
    assert not guard.allows(8)  # three new requests: fewer than half of the batch of 8
    guard.admit()
    assert guard.allows(8)


def test_drafting_without_a_plain_step_to_compare_with_makes_room_for_one():
    """Nothing is judged before a plain step is measured at the bucket; every MIN_EVIDENCE
    drafting steps without one, PRICE_STEPS plain steps follow (not a back-off). Once they are
    measured, the drafting is judged: here it loses, and backs off."""
    costs = StepCostTable()
    guard = PayoffGuard(costs)
    allowed = feed(guard, 3 * (int(MIN_EVIDENCE) + PRICE_STEPS), 8, 1.0, 3.0)
    cycle = [True] * int(MIN_EVIDENCE) + [False] * PRICE_STEPS
    assert allowed == cycle * 3 and guard.backoffs == 0
    assert all(feed(guard, 2, 1, 1.0, 3.0))  # (another bucket: its own count)
    for _ in range(3):  # the plain steps measured (the first one a warm-up)
        costs.record("step", 8, 1, PLAIN_S)
    allowed = feed(guard, 40, 8, 1.0, 3.0)
    assert guard.backoffs == 1 and allowed.index(False) <= MIN_EVIDENCE + 4


def test_a_step_is_compared_with_a_plain_step_at_its_own_context():
    """At batch sizes whose costs drift with the context, a drafting step at a long context is
    compared with the plain step read at that context, not at the reference one."""
    costs = StepCostTable()
    b = 32
    for i in range(40):  # plain steps whose seconds grow 1% per 16 tokens of context
        kv = 100 + 16 * i
        costs.record("step", b, 1, PLAIN_S * 1.01 ** (i), kv)
    at_start, at_end = costs.plain_seconds(b, 100), costs.plain_seconds(b, 100 + 16 * 39)
    assert at_end / at_start == pytest.approx(1.01 ** 39, rel=0.02)


# ---- through the goodput policy: its model says drafting pays, the clock says it does not ----

def running_policy(guard):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive_guard=guard)
    policy = make_controller(spec, 4, 4096, drafts_are_free=True,
                             measured_draft_cost=lambda: 0.0)
    params = SamplingParams(temperature=0, max_tokens=None)
    items = []
    for name in "abcd":
        seq = Sequence(name, 0, None, [1, 2, 3], params, None, frozenset(), 0.0)
        seq.append_token(7, with_text=False)
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.speculation = policy.new_tracker(seq)
        items.append(ScheduledSequence(seq, 1, True, 4))
    return policy, items


def drafting_steps(policy, items, steps=400):
    """Steps of 4 sequences whose drafts are mostly accepted (3 of 4), but whose proposal takes
    4 plain steps of host time that the model's cost table never sees (not a typical proposal):
    realised 4 tokens per sequence in about 5.2 plain steps. Returns how many steps drafted."""
    seqs = [i.seq for i in items]
    drafted = 0
    for _ in range(steps):
        plan = policy.plan(seqs)
        if plan.width:
            proposal = Proposal([[5, 6, 7, 8]] * 4, None, [4] * 4)
            kept = policy.trim(items, [4] * 4, proposal.num_backed, (0, 0, 0))
            timing = StepTiming(4, 1 + max(kept), PLAIN_S * 1.2, 0, None, None, None, 0,
                                proposal_s=4 * PLAIN_S)
            policy.learn(StepOutcome(seqs, kept, [min(3, k) for k in kept], [4] * 4,
                                     timing=timing, step=plan.step))
            drafted += max(kept) > 0
        else:
            timing = StepTiming(4, 1, PLAIN_S, 0, None, None, None, 0)
            policy.learn(StepOutcome(timing=timing, step=plan.step))
    return drafted


def test_the_guard_stops_drafting_that_the_model_wrongly_thinks_pays():
    unguarded = drafting_steps(*running_policy(guard=False))
    guarded = drafting_steps(*running_policy(guard=True))
    assert unguarded >= 300  # the model alone keeps drafting (its costs miss the proposal)
    # the guard: a first judgement, then back-offs of 64, 128 and 256 steps with a few losing
    # steps between them
    assert guarded <= 80


# ---- a closed batch: a drafting step is worth how far it brings the call's end nearer ----

def one_drafting_step(closed, in_flight=False):
    """Four sequences of a batch whose caller waits for all of them (``closed``) or not, plain
    steps until the controller drafts, then one drafting step in which three sequences accept 3
    drafts and the one with the most tokens left accepts none. Returns the guard's evidence of
    that step, in plain steps (its plain-equivalent seconds over a plain step's)."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    policy = make_controller(spec, 4, 4096, drafts_are_free=True,
                             measured_draft_cost=lambda: 0.0)
    params = SamplingParams(temperature=0, max_tokens=100)
    seqs = []
    for name, prompt_len in zip("abcd", (3, 3, 3, 2), strict=True):  # (d has the most left)
        seq = Sequence(name, 0, None, list(range(1, prompt_len + 1)), params, None,
                       frozenset(), 0.0)
        seq.speculation = policy.new_tracker(seq, together=closed)
        seqs.append(seq)

    def advance(gains):
        for seq, gain in zip(seqs, gains, strict=True):
            for _ in range(gain):
                seq.append_token(7, with_text=False)
            seq.num_computed_tokens = seq.num_tokens - 1

    for _ in range(5):  # plain steps measured (the first sample of a cell is not kept)
        policy.controller.costs.record("step", 4, 1, PLAIN_S)
    advance([1] * 4)
    for _ in range(100):
        plan = policy.plan(seqs)
        if in_flight:  # (an overlapped engine plans before the step in flight commits)
            advance([1] * 4)
            if plan.width:
                policy.refresh(plan, seqs)  # (taken by the synchronous step that follows)
                break
        elif plan.width:
            break
        else:
            advance([1] * 4)
        policy.learn(StepOutcome(timing=StepTiming(4, 1, PLAIN_S, 0, None, None, None, 0),
                                 step=plan.step))
    else:
        raise AssertionError("the controller never drafted")
    items = [ScheduledSequence(seq, 1, True, 4) for seq in seqs]
    kept = policy.trim(items, [4] * 4, [4] * 4, (0, 0, 0))
    assert kept == [4] * 4
    accepted = [3, 3, 3, 0]
    advance([a + 1 for a in accepted])
    timing = StepTiming(4, 5, 1.3 * PLAIN_S, 0, None, None, None, 0)
    policy.learn(StepOutcome(seqs, kept, accepted, [4] * 4, timing=timing, step=plan.step))
    (bucket,) = policy.guard.buckets.values()
    return bucket.plain_seconds / PLAIN_S


def test_a_closed_batch_step_is_worth_its_front_advance_not_its_tokens():
    # not closed: 13 tokens of 4 sequences, 3.25 plain steps' worth
    assert one_drafting_step(closed=False) == pytest.approx(13 / 4, rel=1e-3)
    # closed: the sequence with the most tokens left made one token, so the call's end came one
    # plain step nearer, whatever the others made
    assert one_drafting_step(closed=True) == pytest.approx(1.0, rel=1e-3)
    # planned while the step before was in flight (every sequence one token short): credited
    # as planned after it, once refreshed (the stale front read 2 plain steps)
    assert one_drafting_step(closed=True, in_flight=True) == pytest.approx(1.0, rel=1e-3)


def test_front_advance_counts_the_most_tokens_left_of_the_batch_bounded_by_the_step():
    from scheduler.spec_policy import closed_front, front_advance

    class Seq:
        def __init__(self, end, num_tokens, closes=True, is_finished=False):
            self.speculation = type("S", (), {"end": end, "closes": closes})()
            self.num_tokens, self.is_finished = num_tokens, is_finished

    running = [Seq(20, 10), Seq(30, 25), Seq(40, 38)]
    assert closed_front(running) == 10  # 20 - 10 is the most left
    assert closed_front([Seq(20, 10), Seq(30, 25, closes=False)]) is None
    running[0].num_tokens, running[1].num_tokens = 13, 29  # a step: 3 and 4 tokens
    assert front_advance(10, running, most_made=4) == 3  # the front went from 10 left to 7
    running[0].is_finished = True  # (it stopped: EOS) the next front has 1 left ...
    assert front_advance(10, running, most_made=4) == 4  # ... but no more than the step made
    running[1].num_tokens = 25  # the others made nothing (left out of the step: preempted)
    running[0].is_finished, running[0].num_tokens = False, 10
    assert front_advance(10, running, most_made=4) == 0
    for seq in running:
        seq.is_finished = True
    assert front_advance(2, running, most_made=4) == 3  # all finished: the call is over
