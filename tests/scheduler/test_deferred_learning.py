"""An overlapped engine's controller learns a few steps together (``GoodputPolicy.learn`` with
``defer``) and repeats its last decision in between: what it learns is what learning each step
at once teaches, and it learns at once where a lag would cost (a probe, a sequence leaving)."""

import numpy as np

from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from samplers import SamplingParams
from scheduler import DraftPlan, StepOutcome, StepTiming, make_controller
from scheduler.spec_policy import LEARN_EVERY, LEARN_EVERY_MOST, learn_every

PARAMS = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)


def _policy():
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=4)
    return make_controller(spec, 4, 4096, drafts_are_free=False,
                           measured_draft_cost=lambda: 0.05)


def _decoding(policy, n):
    seqs = [Sequence(str(i), 0, None, list(range(20)), PARAMS, None, frozenset(), 0.0)
            for i in range(n)]
    for seq in seqs:
        seq.speculation = policy.new_tracker(seq)
        seq.num_computed_tokens = seq.num_tokens - 1  # (decoding: the prompt is cached)
    return seqs


def _measured(policy, n):
    """Step costs where drafting pays (plain 4 ms, four drafts 4.5 ms)."""
    for width in (1, 5):
        for _ in range(12):
            policy.controller.record(n, width, 0.004 if width == 1 else 0.0045, 4, 0.0002)


def _outcome(seqs, plan, accepted, kv, finished=()):
    timing = StepTiming(len(seqs), 5, 0.0045, 4, 0.0002, None, None, kv)
    return StepOutcome(seqs, [plan.drafts_for(s) for s in seqs], accepted,
                       [None] * len(seqs), None, timing, list(finished), plan.step)


def _run(defer, steps, n=3, seed=0):
    """``steps`` drafting steps of ``n`` sequences, each learnt after the next plan (as an
    overlapped engine does), deferred or not; the policy, its plans' widths and how many
    full decisions (``GoodputController.plan``) it made."""
    rng = np.random.default_rng(seed)
    policy = _policy()
    seqs = _decoding(policy, n)
    _measured(policy, n)
    full = []
    plan_full = policy.controller.plan

    def counting(*args, **kwargs):
        full.append(1)
        return plan_full(*args, **kwargs)

    policy.controller.plan = counting
    widths, last = [], None
    for step in range(steps):
        plan = policy.plan(seqs, False)
        widths.append(plan.width)
        if last is not None:
            policy.learn(last, defer)
        last = _outcome(seqs, plan, [int(a) for a in rng.integers(2, 5, n)], 100 + step)
    return policy, widths, len(full)


def test_outcomes_learnt_together_teach_what_each_learnt_at_once_does():
    steps = 1 + 4 * LEARN_EVERY  # (the last flush right after the last step's plan)
    alone, widths_alone, _ = _run(False, steps)
    together, widths_together, full = _run(True, steps)
    a, b = alone.controller, together.controller
    assert not together._pending
    np.testing.assert_allclose(b.acceptance.counts, a.acceptance.counts, rtol=1e-12)
    np.testing.assert_allclose(b.acceptance.engine, a.acceptance.engine, rtol=1e-12)
    # (each outcome learnt as at the engine step it came at: the evidence ages from there)
    assert b.acceptance.stamps.tolist() == a.acceptance.stamps.tolist()
    assert b.acceptance.stamp == a.acceptance.stamp == steps  # (the last learnt at the last
    # step's plan, the engine's step number `steps`)
    assert b.costs.version == a.costs.version
    assert b.step_cost(3).tolist() == a.step_cost(3).tolist()
    assert widths_together == widths_alone == [4] * steps  # (drafting pays throughout)
    # the full decision at the first step and at the one after each flush (flushes at steps
    # L, 2L, 3L and 4L, the last with no step after it): a repeat in between
    assert full == 4


def test_deferred_outcomes_wait_for_the_batch_and_a_leaving_sequence_flushes_it():
    policy = _policy()
    seqs = _decoding(policy, 2)
    _measured(policy, 2)
    plan = policy.plan(seqs, False)
    assert plan.width == 4 and policy.controller.drafting
    version = policy.controller.acceptance.version
    for _ in range(LEARN_EVERY - 2):
        policy.learn(_outcome(seqs, plan, [4, 4], 100), defer=True)
    assert policy.controller.acceptance.version == version  # (nothing learnt yet)
    assert len(policy._pending) == LEARN_EVERY - 2
    leaving = seqs[1]
    leaving.finish("length")
    policy.learn(_outcome(seqs, plan, [4, 4], 100, finished=[leaving]), defer=True)
    assert not policy._pending and policy.controller.acceptance.version > version
    assert leaving.speculation.row == -1  # (released after its drafts were learnt)
    # (every pending outcome learnt: LEARN_EVERY - 1 tries of the first draft, decayed)
    tries = policy.controller.acceptance.counts[seqs[0].speculation.row, 1, 0]
    assert tries > 1.0


def test_a_controller_that_stopped_drafting_learns_a_probe_at_once():
    policy = _policy()
    seqs = _decoding(policy, 1)
    _measured(policy, 1)
    plan = policy.plan(seqs, False)
    policy.controller.drafting = False  # (drafting stopped: the next drafts are a probe's)
    version = policy.controller.acceptance.version
    policy.learn(_outcome(seqs, plan, [4], 100), defer=True)
    assert not policy._pending and policy.controller.acceptance.version > version


def test_plain_outcomes_wait_while_drafting_stopped_and_a_probe_learns_them_all():
    """Drafting stopped: plain steps' outcomes (their costs) wait for the batch as drafting
    ones do, and a probe's is learnt at once with them."""
    policy = _policy()
    seqs = _decoding(policy, 2)
    for width in (1, 5):  # (drafting loses: plain 2 ms, four drafts 20 ms)
        for _ in range(12):
            policy.controller.record(2, width, 0.002 if width == 1 else 0.02, 4, 0.0002)
    plain = policy.plan(seqs, False)
    assert plain.width == 0 and not policy.controller.drafting
    samples = policy.controller.costs.version
    for _ in range(LEARN_EVERY - 1):
        policy.learn(_outcome(seqs, plain, [0, 0], 100), defer=True)
    assert len(policy._pending) == LEARN_EVERY - 1
    assert policy.controller.costs.version == samples  # (nothing learnt yet)
    probe = DraftPlan(4, policy.plan(seqs, False).step)
    version = policy.controller.acceptance.version
    policy.learn(_outcome(seqs, probe, [3, 1], 100), defer=True)
    assert not policy._pending and policy.controller.acceptance.version > version
    # learnt immediately (not deferred): each plain outcome at once
    policy.learn(_outcome(seqs, plain, [0, 0], 100), defer=False)
    assert not policy._pending


def test_a_larger_batch_learns_more_steps_together_and_the_same():
    """From 8 sequences the outcomes wait for half the batch's size in steps, at most
    ``LEARN_EVERY_MOST`` (an update's host time is mostly per call); what is learnt is what
    learning each step at once teaches."""
    assert [learn_every(n) for n in (1, 4, 8, 10, 16, 32, 64)] == [
        LEARN_EVERY, LEARN_EVERY, LEARN_EVERY, 5, 8, LEARN_EVERY_MOST, LEARN_EVERY_MOST]
    assert LEARN_EVERY_MOST == 16
    n, steps = 32, 1 + 2 * LEARN_EVERY_MOST
    alone, widths_alone, _ = _run(False, steps, n=n)
    together, widths_together, full = _run(True, steps, n=n)
    a, b = alone.controller, together.controller
    np.testing.assert_allclose(b.acceptance.counts, a.acceptance.counts, rtol=1e-12)
    np.testing.assert_allclose(b.acceptance.engine, a.acceptance.engine, rtol=1e-12)
    assert b.acceptance.stamps.tolist() == a.acceptance.stamps.tolist()
    assert widths_together == widths_alone == [4] * steps
    assert full == 2  # (the first step's decision and the one after the first flush, at 16)
    policy = _policy()
    seqs = _decoding(policy, n)
    _measured(policy, n)
    plan = policy.plan(seqs, False)
    version = policy.controller.acceptance.version
    for _ in range(LEARN_EVERY_MOST - 1):
        policy.learn(_outcome(seqs, plan, [2] * n, 100), defer=True)
    assert policy.controller.acceptance.version == version  # (15 waiting)
    policy.learn(_outcome(seqs, plan, [2] * n, 100), defer=True)
    assert not policy._pending and policy.controller.acceptance.version > version
