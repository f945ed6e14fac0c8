"""Verification of a draft tree: which branch the target keeps, and the token after it.

A tree's rows are its root (the context's last position) and then its nodes, in node order
(``parents[j]``: node ``j``'s parent, -1 for the root; a parent before its children, siblings in
the proposer's order). Each row's target distribution ``p`` decides among that node's children:

- **greedy** (``p`` one-hot at the argmax): the child equal to the argmax is kept, else the
  argmax is the step's last token;
- **sampled**, for one-hot drafts (SpecInfer's multi-candidate rejection, Miao et al., arXiv
  2305.09781, with deterministic drafts): the children are tried in order; child ``c`` is kept
  with probability ``r(c) / sum(r)`` where ``r`` is ``p`` less the children rejected before it;
  when all are rejected the step's last token is drawn from ``r`` normalised. The kept token is
  distributed as ``p``: child ``c_i`` comes out with probability ``prod_{l<i} (1 - r_l(c_l) /
  R_l) * r_i(c_i) / R_i = p(c_i)`` (``R_l`` telescopes to ``1 - p(c_1) - ... - p(c_{l-1})``), and a
  token ``x`` that is no child with ``(1 - sum_i p(c_i)) * p(x) / (1 - sum_i p(c_i)) = p(x)``.

Every row's decision is drawn at once on the device (rows that the walk never reaches draw too,
and are ignored: each row's draws are its own, so the kept ones are independent of them); the
walk from the root then follows the kept children on the host. This module is the PyTorch
reference, and what the engine runs.
"""

from __future__ import annotations

import torch


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """Each node's children (the root is -1), in node order."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def candidates(nodes: list[int], parents: list[int], width: int) -> list[list[int]]:
    """For the root's row and each node's row, its children's tokens, padded with -1 to
    ``width``: ``[num_nodes + 1][width]``."""
    children = children_of(parents)
    return [[nodes[c] for c in children.get(row - 1, [])] + [-1] * (
        width - len(children.get(row - 1, []))) for row in range(len(nodes) + 1)]


def sample_rows(probs: torch.Tensor, tokens: torch.Tensor,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-candidate rejection for every row at once (see the module docstring).

    ``probs [rows, vocab_size]``: each row's processed distribution (float32; greedy rows
    one-hot); ``tokens [rows, width]``: its children's tokens, -1 padding. Returns ``choice
    [rows]`` (the kept child's column, -1: none) and ``drawn [rows]`` (a token drawn from what
    the rejected children left: the step's last token where ``choice`` is -1)."""
    rows, width = tokens.shape
    residual = probs.float().clone()  # [rows, vocab_size]
    uniform = torch.rand((rows, width), generator=generator, device=probs.device)
    choice = torch.full((rows,), -1, dtype=torch.long, device=probs.device)
    for i in range(width):
        token = tokens[:, i]  # [rows]
        column = token.clamp(min=0)[:, None]  # [rows, 1]
        mass = residual.gather(1, column)[:, 0]  # [rows]
        open_ = (token >= 0) & (choice < 0)
        keep = open_ & (uniform[:, i] * residual.sum(dim=1) < mass)
        choice = torch.where(keep, i, choice)
        # a rejected child leaves the residual (a padded column writes its own value back)
        residual.scatter_(1, column, torch.where(open_ & ~keep, 0.0, mass)[:, None])
    total = residual.sum(dim=1, keepdim=True)
    # (a row whose mass all went to its kept child draws from p instead: ignored)
    weights = torch.where(total > 0, residual, probs.float())  # [rows, vocab_size]
    # one draw per row from weights / sum: the exponential race, argmax(w_x / E_x) with E_x
    # ~ Exp(1) i.i.d. comes out x with probability w_x / sum(w) (no sort, no sync)
    race = torch.empty_like(weights).exponential_(generator=generator)
    drawn = (weights / race).argmax(dim=1)
    return choice, drawn


def walk(parents: list[int], nodes: list[int], choice: list[int] | None,
         tokens: list[int]) -> tuple[list[int], list[int]]:
    """The kept branch from the root: ``(path, new_tokens)``, the kept nodes and the step's
    tokens (theirs, then the last one). ``tokens[row]``: the row's argmax (``choice`` None:
    greedy, the child equal to it is kept) or its drawn token (``choice[row]``: the kept
    child's place among the row's children, -1 none)."""
    children = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        row = node + 1  # (row 0: the root; node c: row c + 1)
        kids = children.get(node, [])
        if choice is None:
            nxt = next((c for c in kids if nodes[c] == tokens[row]), None)
        else:
            nxt = kids[choice[row]] if choice[row] >= 0 else None
        if nxt is None:
            return path, [nodes[c] for c in path] + [tokens[row]]
        path.append(nxt)
        node = nxt
