"""The offline tree count of ``benchmarks/draft_trees.py``, on ranks written out by hand."""

from __future__ import annotations

import torch

from benchmarks.draft_trees import tokens_per_step


def test_a_tree_accepts_a_depth_while_every_rank_fits_its_branching():
    rank = torch.tensor([[0, 0, 5, 0],   # the chain: 2 accepted; [3, 2, 1, 1]: 2 (5 >= 1)
                         [1, 0, 0, 0],   # chain: 0; tree: 4
                         [2, 1, 0, 0]])  # chain: 0; tree: 4
    assert abs(tokens_per_step(rank, [1, 1, 1, 1]) - (1 + 2 / 3)) < 1e-6
    assert abs(tokens_per_step(rank, [3, 2, 1, 1]) - (1 + 10 / 3)) < 1e-6
    assert abs(tokens_per_step(rank, [2, 1]) - (1 + 4 / 3)) < 1e-6  # rows 0, 1: 2 each
