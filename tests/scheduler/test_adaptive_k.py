"""Adaptive k: the gain rule on hand-computed values, the acceptance estimate, probing."""

import random

import pytest

from scheduler.adaptive_k import (
    COST_WINDOW,
    MIN_FIT_STEPS,
    AcceptanceTracker,
    AdaptiveK,
    StepCostModel,
    best_k,
    expected_tokens,
)


def test_expected_tokens():
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 3) == 4.0


@pytest.mark.parametrize("a, cost, k", [
    (0.8, 0.1, 4),   # gains 1.64, 2.03, 2.27, 2.40
    (0.5, 0.1, 2),   # 1.36, 1.46, 1.44, 1.38
    (0.3, 0.1, 1),   # 1.18, 1.16
    (0.08, 0.1, 0),  # 1.08 / 1.1 < 1
    (0.9, 1.0, 0),   # drafting as costly as the target: (1 + 0.9) / 2 < 1
    (0.99, 0.0, 4),
])
def test_best_k(a, cost, k):
    assert best_k(a, 4, cost) == k


def test_batch_k_maximises_the_mean_expected_tokens_over_the_cost():
    """Against the rule written out: every k's mean over the batch, ties to the smaller k."""
    rng = random.Random(3)
    for _ in range(2000):
        rates = [rng.random() ** rng.choice([1, 3, 8]) for _ in range(rng.randrange(2, 40))]
        max_k, cost, fixed = rng.randrange(1, 8), rng.random() * 1.5, rng.random() * 0.5
        gains = [1.0] + [sum(expected_tokens(r, k) for r in rates) / len(rates)
                         / (1 + fixed + k * cost) for k in range(1, max_k + 1)]
        want = max(range(max_k + 1), key=lambda k: (gains[k] > 1.0 + 1e-9, gains[k], -k))
        want = want if gains[want] > 1.0 + 1e-9 else 0
        assert best_k(rates, max_k, cost, fixed) == want


def test_tracker_counts_tested_drafts():
    t = AcceptanceTracker(accepted=0.0, tested=0.0)
    t.update(4, 4)  # all accepted: 4 tested
    t.update(4, 1)  # one accepted, the second rejected: 2 tested
    t.update(0, 0)  # nothing drafted: no change
    assert t.tested == pytest.approx(0.8 * 4 + 2)
    assert t.accepted == pytest.approx(0.8 * 4 + 1)


def test_low_acceptance_switches_off_then_probes():
    adaptive = AdaptiveK(max_k=4, verify_cost_per_token=0.1, probe_interval=3)
    t = AcceptanceTracker()
    assert adaptive.choose_batch([t], 0.0) == 4  # the prior starts at full speed
    for _ in range(20):
        t.update(4, 0)
    ks = [adaptive.choose_batch([t], 0.0) for _ in range(50)]
    # probes after 3, then 6, then every 12 steps at most (the wait is bounded: acceptance that
    # comes back is found within 12 steps)
    assert [i + 1 for i, k in enumerate(ks) if k] == [3, 9, 21, 33, 45]
    for _ in range(10):
        t.update(1, 1)
    assert adaptive.choose_batch([t], 0.0) == 4


def test_one_k_for_a_batch_weighs_every_sequence():
    adaptive = AdaptiveK(max_k=4, verify_cost_per_token=0.3, probe_interval=3)
    good, bad = AcceptanceTracker(8.0, 10.0), AcceptanceTracker(0.0, 10.0)
    assert adaptive.choose_batch([good], 0.0) > 0 and adaptive.choose_batch([bad], 0.0) == 0
    # one copying request among 7 that never accept: the batch pays for the padding of all
    assert adaptive.choose_batch([good] + [bad] * 7, 0.0) == 0
    assert adaptive.choose_batch([good] * 7 + [bad], 0.0) > 0
    # mean tokens (7 E(0.8, k) + 1) / 8 over 1 + 0.3 k: gains 1.31, 1.41, 1.43, 1.39
    assert best_k([0.8] * 7 + [0.0], 4, 0.3) == 3


def test_cost_fit_asks_for_plain_steps_when_every_step_drafts():
    model = StepCostModel(prior=0.1)
    assert not model.wants_plain_step()  # nothing recorded: nothing to compare yet
    for _ in range(MIN_FIT_STEPS):
        model.record(32, 64, 0.3)
    assert model.wants_plain_step()
    for _ in range(MIN_FIT_STEPS):
        model.record(32, 0, 0.2)
    assert not model.wants_plain_step()
    for _ in range(COST_WINDOW - MIN_FIT_STEPS):  # drafting steps push the first 8 out
        model.record(32, 64, 0.3)
    assert not model.wants_plain_step()
    model.record(32, 64, 0.3)  # ... and this one the oldest plain step: 7 left
    assert model.wants_plain_step()


def test_disabled_keeps_k():
    t = AcceptanceTracker(accepted=0.0, tested=10.0)
    assert AdaptiveK(3, 0.1, 8, enabled=False).choose_batch([t], 0.0) == 3


def test_step_cost_model_recovers_the_costs():
    """Step times from a known cost model plus noise: the fitted v and f are the known ones."""
    rng = random.Random(0)
    model = StepCostModel(prior=0.1)
    assert model.costs(1) == (0.1, 0.0)  # nothing measured yet
    t0, t_seq, t_any, t_draft = 0.050, 0.001, 0.004, 0.002
    for _ in range(COST_WINDOW):
        seqs = rng.randint(1, 4)
        drafts = rng.choice([0, rng.randint(1, 16)])
        seconds = t0 + t_seq * seqs + t_any * (drafts > 0) + t_draft * drafts
        model.record(seqs, drafts, seconds + rng.gauss(0, 1e-4))
    v, f = model.costs(1)
    assert v == pytest.approx(0.002 / 0.051, rel=0.05)
    assert f == pytest.approx(0.004 / 0.051, rel=0.05)
    assert model.costs(32)[0] == pytest.approx(0.002 * 32 / 0.082, rel=0.05)


def test_step_cost_model_without_a_spread_of_drafts_charges_them_per_draft():
    model = StepCostModel(prior=0.1)
    for i in range(COST_WINDOW):  # every drafting step has 4 drafts: t_any and t_draft mix
        drafts = 4 * (i % 2)
        model.record(1, drafts, 0.010 + 0.003 * (drafts > 0) + 0.001 * drafts)
    v, f = model.costs(1)
    assert f == 0.0 and v == pytest.approx((0.003 + 0.004) / 4 / 0.010, rel=1e-6)


def test_step_cost_model_of_one_batch_size_does_not_extrapolate_a_per_sequence_cost():
    """Seen on CPU: after batch-1 steps only, least squares split a step evenly between t0 and
    t_seq, so a batch of 32 looked 16x dearer per step and its drafts 16x cheaper than that
    (v 0.235 where batch-32 steps then measured 0.4-0.5), and the first batch-32 steps drafted
    at a loss. With one batch size the step is all t0: no cheaper per sequence elsewhere."""
    model = StepCostModel(prior=0.1)
    for i in range(COST_WINDOW):
        drafts = (i % 2) * (1 + i % 4)  # plain steps, and 1-4 drafts
        model.record(1, drafts, 0.060 + 0.007 * drafts)
    v1, _ = model.costs(1)
    assert v1 == pytest.approx(0.007 / 0.060, rel=1e-6)
    assert model.costs(32)[0] == pytest.approx(min(32 * v1, 2.0), rel=1e-6)


def test_step_cost_model_keeps_its_fit_when_drafts_stop():
    model = StepCostModel(prior=0.1)
    for i in range(COST_WINDOW):  # compute-bound: every token costs the same
        model.record(8, i % 9, 0.01 * (8 + i % 9))
    fitted = model.costs(8)
    assert fitted[0] == pytest.approx(1.0, rel=1e-6) and fitted[1] == pytest.approx(0, abs=1e-9)
    for _ in range(COST_WINDOW):  # nobody drafts any more: nothing to compare, keep the fit
        model.record(8, 0, 0.5)
    assert model.costs(8) == fitted


def test_a_fixed_cost_of_drafting_raises_the_bar():
    assert best_k(0.3, 4, 0.05) == 2  # gains 1.24, 1.26, 1.23, 1.19
    assert best_k(0.3, 4, 0.05, fixed_cost=0.5) == 0  # 0.84, 0.87, 0.86, 0.84: below 1
    assert best_k(0.5, 4, 0.05, fixed_cost=0.5) == 4  # 0.97, 1.09, 1.14, 1.14: amortised


def test_costly_verification_probes_only_at_the_slowest_rate():
    adaptive = AdaptiveK(max_k=4, verify_cost_per_token=0.1, probe_interval=3)
    t = AcceptanceTracker()  # the prior acceptance (0.8) pays at v = 0.1 but not at v = 1
    assert adaptive.choose_batch([t], 0.0, verify_cost=0.1) == 4
    # at v = 1 even perfect acceptance gains at most 1.0: one probe of 1 draft per 12 steps only
    # (never none: costs measured at one batch size must not stop drafting for good)
    ks = [adaptive.choose_batch([t], 0.0, verify_cost=1.0) for _ in range(200)]
    assert set(ks) == {0, 1} and ks.count(1) == 200 // 12
    # a draft model nearly as slow as the target: at most 5 / (1 + 4 * 0.9) = 1.09 < 1.1
    ks = [adaptive.choose_batch([t], 0.8, verify_cost=0.1) for _ in range(200)]
    assert ks.count(1) <= 200 // 12 + 1
    for _ in range(20):  # the costs fall again, acceptance measured low: probes resume
        t.update(4, 0)
    assert any(adaptive.choose_batch([t], 0.0, verify_cost=0.1) for _ in range(200))


def test_new_requests_start_from_the_engines_recent_acceptance():
    adaptive = AdaptiveK(max_k=4, verify_cost_per_token=0.1, probe_interval=3)
    assert adaptive.new_tracker().acceptance == pytest.approx(0.8)  # nothing seen yet
    for _ in range(200):  # earlier requests: every draft rejected
        adaptive.update(AcceptanceTracker(), 4, 0)
    fresh = adaptive.new_tracker()
    assert fresh.acceptance < 0.05
    assert adaptive.choose_batch([fresh], 0.0) == 0  # no opening burst of rejected drafts


def test_free_drafts_probe_with_every_draft():
    """With drafts that cost nothing (n-gram, an oracle) a probe verifies max_k of them, so that
    acceptance that came back shows within one probe."""
    adaptive = AdaptiveK(max_k=4, verify_cost_per_token=0.1, probe_interval=2, probe_k=4)
    t = AcceptanceTracker(accepted=0.0, tested=10.0)
    ks = [adaptive.choose_batch([t], 0.0) for _ in range(4)]
    assert ks == [0, 4, 0, 0]
    t.update(4, 4)  # the probe's drafts were all accepted
    assert adaptive.choose_batch([t], 0.0) > 0
