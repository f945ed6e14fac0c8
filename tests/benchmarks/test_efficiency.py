"""The efficiency suite: the batch-end ideal's decode steps, and a run whose numbers add up."""

import math

import pytest

from benchmarks.suites.efficiency import batch_steps
from tests.benchmarks.suite_helpers import run_suite


def test_batch_steps_is_every_token_at_alpha_zero_and_whole_steps_at_one():
    assert batch_steps(0.0, 4, 64, 8, trials=50) == 63.0
    assert batch_steps(1.0, 4, 64, 8, trials=50) == math.ceil(63 / 5)


def test_batch_steps_waits_for_the_slowest_sequence():
    """Two tokens to come after the prefill, one draft accepted half the time: a sequence is
    done in one step with probability 1/2, else in two (mean 1.5); two sequences are done in
    one step only when both drafts pass (1/4): mean 1.75."""
    assert batch_steps(0.5, 1, 3, 1, trials=40000) == pytest.approx(1.5, abs=0.01)
    assert batch_steps(0.5, 1, 3, 2, trials=40000) == pytest.approx(1.75, abs=0.01)


def test_the_suite_runs_and_its_numbers_add_up():
    """A tiny decisive model on CPU: every row's tokens matched the plain engine's (the suite
    raises otherwise), the batch-end ideal uses the timed prefill, and the drift's batches count
    the steps since the drift."""
    from benchmarks.suites.efficiency_drift import DRIFT_BATCHES

    record = run_suite("efficiency", "--model", "random-llama-tiny", "--device", "cpu",
                       "--batch-sizes", "2", "--alphas", "0.9", "--ks", "2", "--max-tokens", "8",
                       "--repeats", "1", "--drift")
    rows = {(r["alpha"], r["policy"]): r for r in record.rows}
    assert set(rows) == {(0.0, "k=2"), (0.0, "adaptive"), (0.9, "k=2"), (0.9, "adaptive")}
    # at alpha 0 both ideals reduce to a fixed k's own speedup (its cost ratio is measured
    # there, and the batch-end one adds the prefill to both sides of the same steps)
    assert rows[0.0, "k=2"]["efficiency"] == pytest.approx(1.0)
    assert rows[0.0, "k=2"]["efficiency_end"] == pytest.approx(1.0)
    assert all(r["prefill_s"] > 0 for r in rows.values())
    # one run's steps (not the engine's since it was built): at alpha 0 every draft fails, so
    # each of the 2 sequences takes its 8 tokens one a step: a prefill step and 7 decode
    # steps, each verifying the drafts that can still become output (2; 2, 2, 2, 2, 2, 1, 0)
    k2 = rows[0.0, "k=2"]
    assert (k2["steps"], k2["drafting_request_steps"]) == (8, 14)
    assert k2["mean_drafts"] == pytest.approx(13 / 7)
    # the controller's rows carry what it decided from: a cost per width (1 to k + 1 tokens a
    # sequence, plain first) and the engine's acceptance (k positions, unbacked, found)
    assert "controller_costs" not in k2
    adaptive = rows[0.9, "adaptive"]
    assert len(adaptive["controller_costs"]) == 3 and adaptive["controller_costs"][0] == 1.0
    assert len(adaptive["engine_acceptance"]) == 4
    # ... and the recent step times each cost is the median of (a width met: some samples)
    samples = adaptive["controller_samples_ms"]
    assert set(samples) == {1, 2, 3} and all(ms > 0 for v in samples.values() for ms in v)
    assert samples[3]  # at alpha 0.9 the controller verified both drafts after its first steps
    (drift,) = record.summary["drift"]
    steps = [b["steps_before"] for b in drift["batches"]]
    assert len(steps) == DRIFT_BATCHES and steps[0] == 0
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))
