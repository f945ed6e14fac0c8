"""benchmarks/packed_step.py on CPU: the buckets' layout, eagerly (timings untested)."""

from __future__ import annotations

import json


def test_the_benchmark_times_padded_and_packed_steps(tmp_path):
    from benchmarks.packed_step import LAYOUTS, main
    from engine.runner import model_runner

    rule = model_runner.PACK_MIN_BATCH, model_runner.PACK_MAX_EXTRA
    out = tmp_path / "packed.json"
    main(["--model", "random-llama-tiny", "--device", "cpu", "--batch-sizes", "4,64",
          "--drafting", "1,8", "--widths", "3", "--context", "8", "--warmup", "1", "--iters",
          "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert [(r["batch"], r["drafting"], r["width"]) for r in result["rows"]] == [
        (4, 1, 3), (64, 1, 3), (64, 8, 3)]
    for row in result["rows"]:
        assert set(row["ms"]) == set(LAYOUTS) and all(v > 0 for v in row["ms"].values())
        assert row["packed_over_padded"] == row["ms"]["packed"] / row["ms"]["padded"]
        assert row["packed"]  # (forced: every step fit the rows and was packed)
    # the runner's own rule: padded below 64 sequences or past an eighth more rows
    assert [r["rule"] for r in result["rows"]] == ["padded", "packed", "padded"]
    assert (model_runner.PACK_MIN_BATCH, model_runner.PACK_MAX_EXTRA) == rule  # (restored)
    assert result["fold_rows"] == 128 and result["pack_min_batch"] == 64
