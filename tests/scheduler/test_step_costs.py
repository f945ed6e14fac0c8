"""Step costs read at one context: a step's time grows with its context, and a plain step
measured early must not make every later, longer step look dear."""

import math

import pytest

from scheduler.step_costs import DRIFT_MIN_BATCH, KV_BAND, MIN_KV_SPAN, StepCostTable


def grown(base: float, kv: int, per_token: float = 0.001) -> float:
    """Seconds of a step of ``base`` seconds at context 0, at context ``kv``."""
    return base * math.exp(per_token * kv)


def test_a_plain_step_measured_at_a_short_context_is_read_at_the_current_one():
    """Plain steps measured at context 100 only (drafting ever since), a 5-token step measured
    from 100 to 400: its cost over the plain step's is read at the current context (1.2),
    not against the plain step's context (1.2 x e^0.3 = 1.62 at the end)."""
    costs = StepCostTable()
    for _ in range(5):  # (a cell's first sample is its warm-up)
        costs.record("step", 32, 1, grown(1.0, 100), kv=100)
    for kv in range(100, 401, 5):
        costs.record("step", 32, 5, grown(1.2, kv), kv=kv)
    assert costs.relative("step", 32, 5) == pytest.approx(1.2, rel=0.01)
    # without the contexts (every sample at 0) the same samples read dearer, and so they do
    # below DRIFT_MIN_BATCH sequences, where the contexts are not used
    for batch, kv_of in ((32, lambda kv: 0), (DRIFT_MIN_BATCH // 2, lambda kv: kv)):
        blind = StepCostTable()
        for _ in range(5):
            blind.record("step", batch, 1, grown(1.0, 100), kv=kv_of(100))
        for kv in range(100, 401, 5):
            blind.record("step", batch, 5, grown(1.2, kv), kv=kv_of(kv))
        assert blind.relative("step", batch, 5) > 1.5


def test_no_drift_without_context_spread_and_never_a_negative_one():
    """Samples all within MIN_KV_SPAN tokens give no drift; steps that get faster with their
    context (noise, a graph of its own after a cover) give none either."""
    costs = StepCostTable()
    for i in range(40):
        costs.record("step", 32, 1, 1.0 + 0.01 * (i % 3), kv=200 + i % (MIN_KV_SPAN - 1))
    assert costs._estimate_drift(32) == 0.0
    faster = StepCostTable()
    for kv in range(100, 400, 4):
        faster.record("step", 32, 3, grown(1.0, kv, per_token=-0.001), kv=kv)
    assert faster._estimate_drift(32) == 0.0


def test_answers_follow_the_reference_context_by_bands():
    """The reference context moves when a step comes KV_BAND tokens from it; the answers are
    then read there (and the table's version moves)."""
    costs = StepCostTable()
    for kv in range(0, 200, 4):
        costs.record("step", 32, 1, grown(1.0, kv), kv=kv)
    before = costs.version
    ref = costs._kv_ref[32]
    costs.record("step", 32, 1, grown(1.0, ref + KV_BAND), kv=ref + KV_BAND)
    assert costs._kv_ref[32] == ref + KV_BAND and costs.version > before
    # the plain cell's answer is its lower quartile read at the new reference
    assert costs.seconds("step", 32, 1) == pytest.approx(grown(1.0, ref + KV_BAND), rel=0.02)


def test_proposal_samples_are_not_read_at_a_context():
    """A drift scales whole steps only: a proposer's times, recorded without a context, are
    neither scaled nor left out as outliers."""
    costs = StepCostTable()
    for kv in range(100, 1200, 10):
        costs.record("step", 32, 5, grown(1.2, kv), kv=kv)
    assert costs._drift[32] > 0 and costs._kv_ref[32] > 1000
    for _ in range(12):
        costs.record("propose", 32, 4, 0.1, kv=500)
    assert costs.samples("propose", 32, 4) == [0.1] * 11  # (the first: its warm-up)
    assert costs.seconds("propose", 32, 4) == pytest.approx(0.1)
