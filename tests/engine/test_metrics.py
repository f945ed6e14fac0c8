"""Engine metrics: Leviathan's formula and the counters."""

import pytest

from engine.metrics import MetricsCollector, predicted_speedup


def test_predicted_speedup_formula():
    # (1 - 0.5^3) / ((1 - 0.5)(2 * 0.1 + 1)) = 0.875 / 0.6
    assert predicted_speedup(0.5, 2, 0.1) == pytest.approx(0.875 / 0.6)
    assert predicted_speedup(1.0, 4, 0.0) == 5.0
    assert predicted_speedup(0.0, 4, 0.0) == 1.0


def test_collector_snapshot():
    m = MetricsCollector(max_k=3)
    m.record_request_step(3, 3, 4)  # all accepted + bonus
    m.record_request_step(3, 1, 2)  # second draft rejected
    m.record_request_step(0, 0, 1)  # plain decoding step
    m.record_step(2.0, 0.0, 1.0, 3)
    s = m.snapshot(baseline_tokens_per_s=2.0)
    assert (s.num_drafted, s.num_accepted, s.num_tested, s.num_generated) == (6, 4, 5, 7)
    assert s.acceptance_rate == pytest.approx(4 / 6)
    assert s.token_acceptance == pytest.approx(4 / 5)
    assert s.mean_accepted_length == pytest.approx((4 + 2) / 2)
    assert s.acceptance_per_position == [1.0, 0.5, 0.5]
    assert s.tokens_per_s == pytest.approx(3.5)
    assert s.measured_speedup == pytest.approx(1.75)
    assert s.predicted_speedup == pytest.approx(predicted_speedup(0.8, 3.0, 0.0))
    m.reset()
    assert m.snapshot().num_generated == 0 and m.snapshot().predicted_speedup is None


@pytest.mark.parametrize("max_k", [2, 4])
def test_a_flights_requests_counted_at_once_count_as_one_at_a_time(max_k):
    """``record_request_steps`` (a drafting flight's commit) against ``record_request_step`` of
    each request: three drafts each (past ``max_k`` = 2: the positions counted stop there)."""
    accepted, kept = [0, 3, 1, 3, 2, 0], [1, 4, 2, 2, 3, 1]
    one, together = MetricsCollector(max_k=max_k), MetricsCollector(max_k=max_k)
    for a, n in zip(accepted, kept, strict=True):
        one.record_request_step(3, a, n)
    together.record_request_steps(3, accepted, sum(kept))
    assert vars(together) == vars(one)
    # by hand: position 0 accepted by 4 of 6, position 1 by 3, position 2 by 2
    assert together.accepted_at[:3] == [4, 3, 2][:max_k]
    assert together.drafted_at[:3] == [6, 6, 6][:max_k]
    assert (together.num_tested, together.num_spec_generated) == (9 + 4, 9 + 6)
