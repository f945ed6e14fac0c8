"""The structured suite on a tiny random model with a character-level vocabulary: it runs every
system, and greedy output under the grammar is the same with and without speculation."""

from __future__ import annotations

from tests.benchmarks.suite_helpers import run_suite
from tests.engine.structured_helpers import save_char_model


def test_structured_quick_on_a_tiny_model(tmp_path):
    model = save_char_model(tmp_path / "char")
    record = run_suite("structured", "--model", model, "--device", "cpu", "--quick",
                       "--warmup-rounds", "0")
    rows = record.rows
    assert {(r["system"], r["kind"]) for r in rows} == {
        (s, k) for s in ("grammar", "forced", "ngram", "ngram_forced", "free")
        for k in ("extract", "generate")}
    for kind in ("extract", "generate"):
        samples = {r["system"]: r["sample"] for r in rows if r["kind"] == kind}
        grammar = samples.pop("grammar")
        samples.pop("free")
        assert grammar.startswith("{") and set(samples.values()) == {grammar}
        by = {r["system"]: r for r in rows if r["kind"] == kind}
        assert by["grammar"]["vs_grammar"] == 1.0 and by["grammar"]["acceptance"] is None
        assert by["forced"]["acceptance"] is not None  # forced tokens were drafted
        assert by["free"]["grammar_ms_per_step"] < by["grammar"]["grammar_ms_per_step"]


def test_walk_only_and_library_comparison_run(tmp_path):
    model = save_char_model(tmp_path / "char")
    walk = run_suite("structured", "--model", model, "--device", "cpu", "--walk-only",
                     "--batch-sizes", "1,3", "--steps", "2")
    assert [r["batch_size"] for r in walk.rows] == [1, 3]
    assert all(r["total_us"] > 0 for r in walk.rows)
    libs = run_suite("structured", "--model", model, "--compare-libraries", "--steps", "1")
    assert "xgrammar" in {r["library"] for r in libs.rows}
