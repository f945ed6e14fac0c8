"""The overlap suite on a tiny random LLaMA on the CPU: four engines a kind, every prompt's
tokens made, ratios over the engine without speculation, steps counted."""

import pytest

from tests.benchmarks.suite_helpers import run_suite


def test_four_engines_a_kind_each_make_every_token():
    record = run_suite("overlap", "--device", "cpu", "--model", "random-llama-tiny",
                       "--method", "ngram", "--prompt-set", "bench", "--kinds", "copy,open",
                       "--num-prompts", "2", "--max-tokens", "8", "--rounds", "1")
    assert [(r["kind"], r["engine"]) for r in record.rows] == [
        (kind, engine) for kind in ("copy", "open")
        for engine in ("none", "fixed_sync", "fixed_overlap", "controller_overlap")]
    for r in record.rows:
        assert r["tokens"] == 2 * 8 and r["steps"] >= 1
        if r["engine"] == "none":
            assert r["vs_none"] == 1.0 and r["steps"] == 2 * 8  # (one token a step)
        if r["engine"] in ("none", "fixed_sync"):  # (nothing overlapped, or no drafting)
            assert r["steps_from_device"] == 0
    # (overlapped, n-gram drafts on the device: drafting steps launched from there)
    assert sum(r["steps_from_device"] for r in record.rows if r["engine"] == "fixed_overlap")


def test_a_batch_gets_as_many_prompts_and_fewer_are_refused():
    record = run_suite("overlap", "--device", "cpu", "--model", "random-llama-tiny",
                       "--method", "ngram", "--prompt-set", "bench", "--kinds", "copy",
                       "--batch-size", "3", "--max-tokens", "4", "--rounds", "1")
    assert all(r["tokens"] == 3 * 4 for r in record.rows)  # (3 prompts: the batch size)
    none = next(r for r in record.rows if r["engine"] == "none")
    assert none["steps"] == 4  # (the three decode together, one token a step)
    with pytest.raises(SystemExit, match="--num-prompts 2 is below --batch-size 3"):
        run_suite("overlap", "--device", "cpu", "--model", "random-llama-tiny", "--method",
                  "ngram", "--prompt-set", "bench", "--kinds", "copy", "--batch-size", "3",
                  "--num-prompts", "2", "--max-tokens", "4", "--rounds", "1")
