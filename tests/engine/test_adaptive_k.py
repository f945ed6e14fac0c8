"""Adaptive k: the gain rule on hand-computed values, the acceptance estimate, probing."""

import pytest

from engine.adaptive_k import AcceptanceTracker, AdaptiveK, best_k, expected_tokens


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
    assert adaptive.choose(t, 0.0) == 4  # the prior starts at full speed
    for _ in range(20):
        t.update(4, 0)
    ks = [adaptive.choose(t, 0.0) for _ in range(40)]
    # probes after 3, then 6, 12 and at most 24 steps while they fail
    assert [i + 1 for i, k in enumerate(ks) if k] == [3, 9, 21]
    for _ in range(10):
        t.update(1, 1)
    assert adaptive.choose(t, 0.0) == 4


def test_disabled_keeps_k():
    t = AcceptanceTracker(accepted=0.0, tested=10.0)
    assert AdaptiveK(3, 0.1, 8, enabled=False).choose(t, 0.0) == 3
