"""The samplers suite on CPU: small shapes, eager only, seeded or not (timings untested)."""

import pytest

from tests.benchmarks.suite_helpers import run_suite


@pytest.mark.parametrize("seeded", [False, True])
def test_every_shape_is_timed_against_its_memory_floor(seeded):
    record = run_suite("samplers", "--device", "cpu", "--batch", "1", "3", "--vocab", "64",
                       "-k", "2", *(["--seeded"] if seeded else []))
    assert [(r["batch"], r["draft_probs"]) for r in record.rows] == [
        (1, False), (1, True), (3, False), (3, True)]
    for r in record.rows:
        assert r["eager_us"] > 0 and r["graph_us"] is None  # (no CUDA graph on CPU)
        # the floor reads the logits, and the draft probs when given, once
        assert r["bytes_read_floor"] == 4 * 64 * (r["batch"] * 3 + r["draft_probs"]
                                                  * r["batch"] * 2)
    assert record.summary["seeded"] is seeded
