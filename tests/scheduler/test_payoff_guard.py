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
from scheduler.payoff_guard import FIRST_BACKOFF, MARGIN, MIN_EVIDENCE, PayoffGuard
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


def test_nothing_is_judged_before_a_plain_step_is_measured():
    guard = PayoffGuard(StepCostTable())
    assert all(feed(guard, 100, 8, 1.0, 3.0))
    assert guard.backoffs == 0


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
