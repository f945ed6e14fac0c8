"""benchmarks/mixed_step.py on CPU: the buckets' padded layout, eagerly (timings untested)."""

from __future__ import annotations

import json


def test_the_benchmark_times_every_layout_of_a_mixed_step(tmp_path):
    from benchmarks.mixed_step import LAYOUTS, main

    out = tmp_path / "mixed.json"
    main(["--model", "random-llama-tiny", "--device", "cpu", "--batch-sizes", "3",
          "--widths", "1,3", "--prompts", "10", "--context", "20", "--warmup", "1", "--iters",
          "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert [(r["batch"], r["width"], r["prompt"]) for r in result["rows"]] == [(3, 1, 10),
                                                                               (3, 3, 10)]
    for row in result["rows"]:
        assert set(row["ms"]) == set(LAYOUTS) and all(v > 0 for v in row["ms"].values())
        assert row["fold_over_split"] == row["ms"]["fold"] / row["ms"]["split"]
        # 2 decoding rows of w tokens and a 10-token prompt: w = 1 folds at 2 tokens a row (7
        # rows, bucket 8: 16 tokens, as 12 rows of 1 in a bucket of 16), w = 3 at 3; too
        # little padding saved for the split (2 x (16 - w) < 128): one padded forward
        assert row["fold_width"] == {1: 2, 3: 3}[row["width"]] and row["split"] is False
    assert result["graphs"] == [] and result["machine"] == "cpu"  # (nothing captured on CPU)
