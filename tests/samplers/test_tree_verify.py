"""Draft-tree verification (``samplers.tree_verify``): the kept token follows the target's
distribution whatever the candidates (chi-square on many rows at once, with the power to see a
1% error), greedy rows keep the argmax child, and the walk follows the kept children."""

from __future__ import annotations

import pytest
import torch

from samplers import tree_verify
from tests.engine.llm_helpers import chi_square_pvalue

P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])
ROWS = 200_000


def kept_tokens(probs: torch.Tensor, cands: list[int], seed: int) -> torch.Tensor:
    """The token each of ``ROWS`` identical rows keeps: its kept child's, or the drawn one."""
    tokens = torch.tensor([cands] * ROWS)  # [rows, width]
    choice, drawn = tree_verify.sample_rows(probs.expand(ROWS, -1), tokens,
                                            torch.Generator().manual_seed(seed))
    picked = tokens.gather(1, choice.clamp(min=0)[:, None])[:, 0]
    return torch.where(choice >= 0, picked, drawn)


@pytest.mark.parametrize("cands", [[1, 4, 0], [5], [3, 2], [0, 1, 2, 3, 4, 5], [2, -1, -1]])
def test_the_kept_token_follows_the_target(cands):
    counts = torch.bincount(kept_tokens(P, cands, seed=len(cands)), minlength=6)
    assert chi_square_pvalue(counts, P) > 1e-3


def test_the_test_sees_a_one_percent_error():
    counts = torch.bincount(kept_tokens(P, [1, 4, 0], seed=3), minlength=6)
    wrong = P + torch.tensor([0.01, -0.01, 0.0, 0.0, 0.0, 0.0])
    assert chi_square_pvalue(counts, wrong) < 1e-6


def test_children_tried_and_rejected_leave_the_residual():
    """Wrong on purpose (a child kept with p(c), not with its share of what is left): the
    chi-square sees it."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(ROWS, 2, generator=gen)
    first = u[:, 0] < P[1]
    second = ~first & (u[:, 1] < P[4])  # (should be P[4] / (1 - P[1]))
    rest = torch.multinomial(P.expand(ROWS, -1), 1, generator=gen)[:, 0]
    wrong = torch.where(first, 1, torch.where(second, 4, rest))
    counts = torch.bincount(wrong, minlength=6)
    assert chi_square_pvalue(counts, P) < 1e-6


def test_greedy_rows_keep_the_argmax_child():
    one_hot = torch.eye(6)[[2, 2, 5]]  # rows whose argmax is 2, 2, 5
    tokens = torch.tensor([[0, 2, -1], [1, 3, 4], [5, -1, -1]])
    choice, drawn = tree_verify.sample_rows(one_hot, tokens, torch.Generator().manual_seed(1))
    assert choice.tolist() == [1, -1, 0] and drawn[1].item() == 2


def test_the_walk_follows_the_kept_children():
    # root -> nodes 0, 1; node 0 -> 2, 3; node 1 -> 4; node 3 -> 5
    parents = [-1, -1, 0, 0, 1, 3]
    nodes = [10, 11, 12, 13, 14, 15]
    assert tree_verify.candidates(nodes, parents, 2) == [
        [10, 11], [12, 13], [14, -1], [-1, -1], [15, -1], [-1, -1], [-1, -1]]
    # sampled: the root keeps node 0, node 0 keeps node 3, node 3 keeps node 5 (a leaf): its
    # row's drawn token 7 ends the step
    choice = [0, 1, -1, -1, 0, 0, -1]
    drawn = [1, 2, 3, 4, 5, 6, 7]
    assert tree_verify.walk(parents, nodes, choice, drawn) == ([0, 3, 5], [10, 13, 15, 7])
    # greedy: argmax 11 at the root keeps node 1, whose argmax 9 (row 2) is no child
    argmax = [11, 0, 9, 0, 0, 0, 0]
    assert tree_verify.walk(parents, nodes, None, argmax) == ([1], [11, 9])
