"""The reuse suite on a tiny model: every case runs, its systems' greedy outputs agree and the
cached systems read the cache (what suffix decoding accepts: tests/proposers/test_suffix.py)."""

from tests.benchmarks.suite_helpers import run_suite


def test_prefix_case(tiny_dir):
    record = run_suite("reuse", "prefix", "--model", tiny_dir, "--device", "cpu",
                       "--prompt-tokens", "64", "--num-requests", "2", "--max-tokens", "4")
    rows = {r["system"]: r for r in record.rows}
    assert record.summary["outputs_equal"]
    # a 90%-shared prompt: at least 57 of each timed request's 63 looked-up tokens are hits
    assert rows["cache"]["prefix_cache_hit_rate"] >= 57 / 63
    assert rows["no_cache"]["prefix_cache_hit_rate"] == 0.0


def test_chat_case(tiny_dir):
    record = run_suite("reuse", "chat", "--model", tiny_dir, "--device", "cpu",
                       "--conversations", "2", "--turns", "2", "--system-tokens", "16",
                       "--user-tokens", "4", "--max-tokens", "4")
    rows = {r["system"]: r for r in record.rows}
    assert record.summary["outputs_equal"] and rows["cache"]["prefix_cache_hit_rate"] > 0.5


def test_agent_case(tiny_dir):
    record = run_suite("reuse", "agent", "--model", tiny_dir, "--device", "cpu",
                       "--batch-sizes", "1,2", "--num-requests", "4", "--file-tokens", "32",
                       "--max-tokens", "8", "-k", "4")
    assert record.summary["b1:outputs_equal"] and record.summary["b2:outputs_equal"]
    assert {(r["system"], r["batch_size"]) for r in record.rows} == {
        (m, b) for m in ("suffix", "ngram", "none") for b in (1, 2)}
