"""The proposers suite on CPU: each case's rows on tiny models (timings untested)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.__main__ import main
from tests.benchmarks.suite_helpers import run_suite


def test_cost_times_each_proposer_beside_the_verification():
    record = run_suite("proposers", "cost", "--model", "random-llama-tiny", "--device", "cpu",
                       "--quick", "--methods", "ngram,early_exit:1,draft_model")
    assert [(r["batch"], r["method"]) for r in record.rows] == [
        (b, m) for b in (1, 4) for m in ("ngram", "early_exit:1", "draft_model")]
    for r in record.rows:
        assert r["propose_ms"] > 0 and r["verify_ms"] > 0
        assert r["ratio"] == pytest.approx(r["propose_ms"] / r["verify_ms"])
        assert (r["model"], r["k"], r["context_len"]) == ("random-llama-tiny", 4, 64)


def test_acceptance_decodes_each_task_exactly_as_greedy(tiny_dir):
    """Greedy verification keeps the target's own greedy text whatever the drafts."""
    record = run_suite("proposers", "acceptance", "--model", tiny_dir, "--device", "cpu",
                       "--methods", "ngram,early_exit:1,draft_model", "--prompts", "copy,open",
                       "--new-tokens", "8")
    assert [(r["prompt"], r["method"]) for r in record.rows] == [
        (p, m) for p in ("copy", "open") for m in ("ngram", "early_exit:1", "draft_model")]
    for r in record.rows:
        assert r["equals_greedy"], r
        assert 0 <= r["accepted"] <= r["drafted"] and 1.0 <= r["tokens_per_step"] <= 5.0


def test_early_exit_with_every_layer_is_the_target(tiny_dir):
    record = run_suite("proposers", "early-exit", "--model", tiny_dir, "--device", "cpu",
                       "--sweep-layers", "1,2", "--prompts", "code", "--new-tokens", "8")
    alpha = {r["num_layers"]: r["alpha"] for r in record.rows}
    assert set(alpha) == {1, 2} and alpha[2] == 1.0 and 0.0 <= alpha[1] <= 1.0


def test_ngram_scale_drafts_from_repeated_phrases():
    (row,) = run_suite("proposers", "ngram-scale", "--ngram-batch", "8", "--ngram-context",
                       "200", "--ngram-steps", "5").rows
    assert (row["batch"], row["context_len"]) == (8, 200)
    assert 0.0 < row["drafts_per_request"] <= 4  # (a phrase bank: matches occur)
    assert row["min_step_ms"] <= row["median_step_ms"]


def test_head_acceptance_reports_each_set_by_position(tiny_dir, tmp_path, capsys):
    """Two sets with short prompts (the real-text sets' long prompts would cost CI minutes
    under Triton's interpreter, which runs the head's fused kernels program by program: their
    prompts are checked without a model below)."""
    from transformers import AutoConfig

    from proposers.head_model import head_for

    head_for(AutoConfig.from_pretrained(tiny_dir)).save(tmp_path / "head")
    record = run_suite("proposers", "head-acceptance", "--model", tiny_dir, "--device", "cpu",
                       "--head", tmp_path / "head", "--sets", "held_out,bench_open",
                       "--num-prompts", "2", "--max-tokens", "12")
    rows = {r["set"]: r for r in record.rows}
    assert set(rows) == {"held_out", "bench_open"}
    for name, count in (("held_out", 2), ("bench_open", 8)):
        r = rows[name]
        assert len(r["per_position"]) == 4 and all(0.0 <= x <= 1.0 for x in r["per_position"])
        assert r["first_draft"] == r["per_position"][0]
        assert 0.0 <= r["mean_accepted"] <= 4.0
        assert len(r["per_prompt_mean_accepted"]) == count
        assert all(0.0 <= x <= 4.0 for x in r["per_prompt_mean_accepted"])
    assert "conditional per position" in capsys.readouterr().out


def test_head_acceptance_sets_hold_their_prompts():
    """The real-text sets are the held-out split's single user turns (32 open, 16 copy), the
    benchmark sets the workload's lists, the training-style sets ``--num-prompts`` long."""
    from benchmarks.real_text import heldout_prompts
    from benchmarks.suites.head_acceptance import SETS, prompt_sets
    from benchmarks.workloads import COPY_HEAVY, OPEN_ENDED

    sets = prompt_sets(list(SETS), 3)
    assert sets["real_copy"] == [p.turns[0] for p in heldout_prompts("copy")]
    assert sets["real_open"] == [p.turns[0] for p in heldout_prompts("open")]
    assert (len(sets["real_open"]), len(sets["real_copy"])) == (32, 16)
    assert sets["bench_open"] == OPEN_ENDED and sets["bench_copy"] == COPY_HEAVY
    assert len(sets["held_out"]) == len(sets["train"]) == 3
    assert not set(sets["held_out"]) & set(sets["train"])


def test_head_acceptance_names_an_unknown_set():
    with pytest.raises(SystemExit, match="poetry"):
        main(["proposers", "head-acceptance", "--sets", "held_out,poetry"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: head-cost needs a GPU")
def test_head_cost_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a GPU"):
        main(["proposers", "head-cost"])
