"""The target runner's CUDA-graph twin width, as the builder derives it from the config."""

from __future__ import annotations

from engine.builder import graph_max_new, twin_width
from engine.config import EngineConfig
from engine.draft_trees import TREE_MAX_SEQS


def test_trees_widen_the_twin_only_in_the_batches_that_draft_them():
    """With a draft tree, a decode bucket's twin is the tree step's width up to TREE_MAX_SEQS
    sequences and a chain's (k + 1) past them; without one, the runner's default (None)."""
    tree = EngineConfig(speculative_config={"method": "eagle", "num_speculative_tokens": 3,
                                            "draft_tree": [2, 2]})
    widest = graph_max_new(tree)
    assert widest == 1 + 2 + 4 + 4  # (the root's 2 children, their 4, one more level of 4)
    width = twin_width(tree)
    assert [width(b) for b in (1, TREE_MAX_SEQS, TREE_MAX_SEQS + 1, 32)] == [widest, widest, 4, 4]
    assert twin_width(EngineConfig(speculative_config={"method": "ngram"})) is None
    assert twin_width(EngineConfig()) is None
