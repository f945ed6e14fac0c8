"""The efficiency benchmark's batch-end ideal: decode steps until a closed batch is done."""

import math

import pytest

from benchmarks.efficiency import batch_steps


def test_batch_steps_is_every_token_at_alpha_zero_and_whole_steps_at_one():
    assert batch_steps(0.0, 4, 64, 8, trials=50) == 63.0
    assert batch_steps(1.0, 4, 64, 8, trials=50) == math.ceil(63 / 5)


def test_batch_steps_waits_for_the_slowest_sequence():
    """Two tokens to come after the prefill, one draft accepted half the time: a sequence is
    done in one step with probability 1/2, else in two (mean 1.5); two sequences are done in
    one step only when both drafts pass (1/4): mean 1.75."""
    assert batch_steps(0.5, 1, 3, 1, trials=40000) == pytest.approx(1.5, abs=0.01)
    assert batch_steps(0.5, 1, 3, 2, trials=40000) == pytest.approx(1.75, abs=0.01)
