"""The runner suite on CPU: the graph buckets' layouts, eagerly (timings untested)."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks.suite_helpers import run_suite

ONE_STEP = ("--model", "random-llama-tiny", "--device", "cpu", "--warmup", "1", "--iters", "1")


def test_mixed_times_every_layout_of_a_mixed_step():
    from benchmarks.suites.runner_mixed import LAYOUTS

    record = run_suite("runner", "mixed", *ONE_STEP, "--batch-sizes", "3", "--widths", "1,3",
                       "--prompts", "10", "--context", "20")
    assert [(r["batch"], r["width"], r["prompt"]) for r in record.rows] == [(3, 1, 10),
                                                                            (3, 3, 10)]
    for row in record.rows:
        assert set(row["ms"]) == set(LAYOUTS) and all(v > 0 for v in row["ms"].values())
        assert row["fold_over_split"] == row["ms"]["fold"] / row["ms"]["split"]
        # 2 decoding rows of w tokens and a 10-token prompt: w = 1 folds at 2 tokens a row (7
        # rows, bucket 8: 16 tokens, as 12 rows of 1 in a bucket of 16), w = 3 at 3; too
        # little padding saved for the split (2 x (16 - w) < 128): one padded forward
        assert row["fold_width"] == {1: 2, 3: 3}[row["width"]] and row["split"] is False
    assert record.summary["graphs"] == []  # (nothing captured on CPU)
    assert record.machine["device"] == "cpu" and record.model == "random-llama-tiny"


def test_packed_times_padded_and_packed_steps():
    from benchmarks.suites.runner_packed import LAYOUTS
    from engine.runner import step_layout

    rule = step_layout.PACK_MIN_BATCH, step_layout.PACK_MAX_EXTRA
    record = run_suite("runner", "packed", *ONE_STEP, "--batch-sizes", "4,64", "--drafting",
                       "1,8", "--widths", "3", "--context", "8")
    assert [(r["batch"], r["drafting"], r["width"]) for r in record.rows] == [
        (4, 1, 3), (64, 1, 3), (64, 8, 3)]
    for row in record.rows:
        assert set(row["ms"]) == set(LAYOUTS) and all(v > 0 for v in row["ms"].values())
        assert row["packed_over_padded"] == row["ms"]["packed"] / row["ms"]["padded"]
        assert row["packed"]  # (forced: every step fit the rows and was packed)
    # the runner's own rule: padded below 64 sequences or past an eighth more rows
    assert [r["rule"] for r in record.rows] == ["padded", "packed", "padded"]
    assert (step_layout.PACK_MIN_BATCH, step_layout.PACK_MAX_EXTRA) == rule  # (restored)
    assert record.summary["fold_rows"] == 128 and record.summary["pack_min_batch"] == 64


def test_vs_hf_times_decode_and_verify_steps_of_both(tmp_path):
    record = run_suite("runner", "vs-hf", "--model", "random-llama-tiny", "--device", "cpu",
                       "--batch-sizes", "1,2", "--context", "8", "-k", "2", "--warmup", "1",
                       "--iters", "1", "--profile", tmp_path / "profile.txt")
    assert [(r["batch"], r["step"], r["num_new"]) for r in record.rows] == [
        (1, "decode", 1), (1, "verify3", 3), (2, "decode", 1), (2, "verify3", 3)]
    assert all(r["runner_ms"] > 0 and r["hf_ms"] > 0 for r in record.rows)
    assert record.summary["kv_bytes_per_token"] > 0
    # (batch 1 under the profiler: each system's decode and verify step, their host ops)
    assert len(record.summary["profile"]) == 4
    assert "== runner decode" in (tmp_path / "profile.txt").read_text()


def test_products_needs_cuda_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the suite runs (timed on the device, not tested here)")
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        run_suite("runner", "products", "--rows", "1")
