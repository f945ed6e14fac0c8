"""Tree steps: every node of a draft tree scores exactly as a plain forward of its own branch,
and after ``keep_paths`` + ``truncate`` the slot continues as if only that branch had been fed."""

from __future__ import annotations

import random

import pytest
import torch

from engine.runner.model_runner import ModelRunner
from tests.conftest import TINY_FAMILIES, tiny_model
from tests.engine.runner.test_model_runner import ATOL, check_step, full_logits


def random_tree(rng: random.Random, num_nodes: int) -> list[int]:
    """Parents of ``num_nodes`` nodes (-1: the root), each an earlier node or the root."""
    return [rng.randrange(-1, j) for j in range(num_nodes)]


def branch(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_schedule(runner, model, seed: int, num_steps: int, vocab_size: int) -> int:
    """Random slots stepping by chains or trees (with a random kept branch), checked against
    full forwards every step; returns how many tree steps kept a branch other than node 0's."""
    rng = random.Random(seed)
    seqs = {runner.allocate_slot(): [rng.randrange(vocab_size) for _ in range(rng.randint(3, 9))]
            for _ in range(runner.max_num_seqs)}
    check_step(runner, model, {s: [] for s in seqs}, seqs)  # the prompts
    moved = 0
    for _ in range(num_steps):
        slots = rng.sample(list(seqs), rng.randint(1, len(seqs)))
        tokens, trees = [], []
        for _ in slots:
            context = [rng.randrange(vocab_size) for _ in range(rng.choice([1, 1, 2]))]
            if rng.random() < 0.7:
                parents = random_tree(rng, rng.randint(1, 7))
                tokens.append(context + [rng.randrange(vocab_size) for _ in parents])
                trees.append((len(context), parents))
            else:
                drafts = [rng.randrange(vocab_size) for _ in range(rng.randint(0, 3))]
                tokens.append(context + drafts)
                trees.append(None)
        if max(len(seqs[s]) + len(t) for s, t in zip(slots, tokens, strict=True)) \
                > runner.max_model_len:
            break
        out = runner.forward(slots, tokens, trees=trees).logits
        row = 0
        keeps = []  # (slot, first column, kept nodes): all the step's trees at once
        for slot, new, tree in zip(slots, tokens, trees, strict=True):
            start = len(seqs[slot])
            if tree is None:
                expected = full_logits(model, seqs[slot] + new)[start:]
                torch.testing.assert_close(out[row:row + len(new)], expected, atol=ATOL,
                                           rtol=ATOL)
                seqs[slot] += new
            else:
                first, parents = tree
                context = seqs[slot] + new[:first]
                expected = full_logits(model, context)[start:]
                torch.testing.assert_close(out[row:row + first], expected, atol=ATOL, rtol=ATOL)
                for j in range(len(parents)):  # each node: its branch alone, no other node
                    ids = context + [new[first + i] for i in branch(parents, j)]
                    torch.testing.assert_close(out[row + first + j],
                                               full_logits(model, ids)[-1], atol=ATOL,
                                               rtol=ATOL)
                kept = branch(parents, rng.randrange(len(parents)))[:rng.randint(0, 7)]
                moved += kept != list(range(len(kept)))
                keeps.append((slot, start + first, kept))
                seqs[slot] = context + [new[first + i] for i in kept]
            row += len(new)
        runner.keep_paths(keeps)
        for slot in slots:
            runner.truncate(slot, len(seqs[slot]))
            assert runner.seq_len(slot) == len(seqs[slot])
        assert runner.num_cached_tokens == sum(len(s) for s in seqs.values())
    # whatever was kept, the next plain steps see exactly the kept tokens
    check_step(runner, model, seqs, {s: [rng.randrange(vocab_size)] for s in seqs})
    return moved


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tree_steps_match_each_branch_alone(family):
    model = tiny_model(family, vocab_size=96, seed=2)
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=200, max_model_len=64)
    assert tree_schedule(runner, model, seed=5, num_steps=12, vocab_size=96) > 3


def test_tree_steps_in_graph_bucket_layout():
    """Padded to CUDA-graph buckets (batch, tokens and key length), here eagerly: still exact."""
    model = tiny_model("llama", vocab_size=96, seed=3)
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=200, max_model_len=64)
    runner.use_graph_buckets(10, capture=False)
    assert tree_schedule(runner, model, seed=6, num_steps=12, vocab_size=96) > 3
    assert runner.graphs.num_replays > 5


def test_one_sequence_tree_steps_leave_the_view_path_exact():
    """Batch 1 reads an ascending run of pool rows as a view; a kept branch other than the
    first nodes ends that (the slot's columns then point at rows out of order)."""
    model = tiny_model("qwen2", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=1, max_num_tokens=100, max_model_len=64)
    assert tree_schedule(runner, model, seed=7, num_steps=10, vocab_size=96) > 0


def test_bad_trees_raise_before_any_change():
    model = tiny_model("llama", vocab_size=96, seed=1)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=32)
    slot = runner.allocate_slot()
    for trees in ([(0, [-1])], [(1, [0])], [(1, [-1, -1, 5])], [(1, [-1])] * 2):
        with pytest.raises(ValueError, match="tree"):
            runner.forward([slot], [[1, 2]], trees=trees)
    assert runner.seq_len(slot) == 0 and runner.num_free_tokens == 64
    runner.forward([slot], [[1, 2, 3]], trees=[(1, [-1, -1])])
    for first, path in ((1, [2]), (1, [0, 0]), (4, [0])):
        with pytest.raises(ValueError, match="keep_path"):
            runner.keep_path(slot, first, path)
    assert runner.seq_len(slot) == 3
