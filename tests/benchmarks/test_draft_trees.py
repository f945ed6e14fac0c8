"""The draft_trees suite: the offline tree count on ranks written out by hand, and a run."""

from __future__ import annotations

import torch

from benchmarks.suites.draft_trees import tokens_per_step
from tests.benchmarks.suite_helpers import run_suite


def test_a_tree_accepts_a_depth_while_every_rank_fits_its_branching():
    rank = torch.tensor([[0, 0, 5, 0],   # the chain: 2 accepted; [3, 2, 1, 1]: 2 (5 >= 1)
                         [1, 0, 0, 0],   # chain: 0; tree: 4
                         [2, 1, 0, 0]])  # chain: 0; tree: 4
    assert abs(tokens_per_step(rank, [1, 1, 1, 1]) - (1 + 2 / 3)) < 1e-6
    assert abs(tokens_per_step(rank, [3, 2, 1, 1]) - (1 + 10 / 3)) < 1e-6
    assert abs(tokens_per_step(rank, [2, 1]) - (1 + 4 / 3)) < 1e-6  # rows 0, 1: 2 each


def test_a_wider_tree_never_counts_fewer_tokens(tiny_dir, tmp_path):
    from transformers import AutoConfig

    from proposers.head_model import head_for

    head_for(AutoConfig.from_pretrained(tiny_dir)).save(tmp_path / "head")
    record = run_suite("draft_trees", "--model", tiny_dir, "--head", tmp_path / "head",
                       "--kinds", "open", "--max-tokens", "12", "--trees", "11,21,31")
    tokens = {"".join(map(str, r["tree"])): r["tokens_per_step"] for r in record.rows}
    assert [r["nodes"] for r in record.rows] == [2, 4, 6]
    assert 1.0 <= tokens["11"] <= tokens["21"] <= tokens["31"] <= 3.0
