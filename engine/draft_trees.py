"""Draft trees on the engine's side: which steps get them, their depth, and their pruning.

A tree is given by its nodes' parents (``Proposal.parents``): ``parents[j]`` is node ``j``'s
parent among the nodes, -1 for a child of the context's last token, a parent before its children,
siblings likeliest first. Its *depth* is what the speculation controller counts as its drafts
(a tree of depth ``d`` accepts at most ``d`` tokens). Verification's math lives in
:mod:`samplers.tree_verify`; the runner's attention mask in ``engine.runner``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from engine.sequence import Sequence
from engine.step_records import SeqStep
from samplers import INVALID_TOKEN_ID, SamplingTensors, tree_verify
from samplers.logits_processing import logits_to_probs

# A step verifies draft trees only when it runs at most this many sequences (a larger batch
# drafts chains): each tree node is a token of the target's forward and a query of the head, and
# a tree step's host work grows with the batch; trees won at batch 1 and 2 and lost from batch 4
# on (docs/performance.md, "Draft trees").
TREE_MAX_SEQS = 2


def tree_depth(parents: list[int]) -> int:
    """Levels of a tree given by its nodes' parents (a parent before its children)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return max(depths, default=0)


def pruned_tree(drafts: list[int], parents: list[int], depth: int,
                max_nodes: int) -> tuple[list[int], list[int]]:
    """The best ``max_nodes`` nodes of a draft tree within ``depth`` levels, renumbered (a
    parent still before its children). Siblings come likeliest first (``Proposal.parents``),
    so a node's *rank* is the sum of its own and its ancestors' places among their siblings:
    the likeliest chain ranks 0 and is kept first, then the branches one step off it, and so
    on (ties: the shallower first). A node never ranks below its parent: what is kept is a
    tree."""
    depths: list[int] = []
    ranks: list[int] = []
    seen: dict[int, int] = {}  # parent -> children so far
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
        place = seen.get(p, 0)
        seen[p] = place + 1
        ranks.append(place + (ranks[p] if p >= 0 else 0))
    order = sorted((j for j in range(len(parents)) if depths[j] <= depth),
                   key=lambda j: (ranks[j], depths[j], j))
    chosen = sorted(order[:max(max_nodes, 0)])
    index = {j: n for n, j in enumerate(chosen)}
    return ([drafts[j] for j in chosen],
            [-1 if parents[j] < 0 else index[parents[j]] for j in chosen])


def keep_trees(items: list[SeqStep], trees: dict[int, tuple[list[int], list[int], int]],
               free_kv_tokens: int | None, max_num_batched_tokens: int,
               max_model_len: int) -> None:
    """Give each item of ``trees`` (item index -> its proposed nodes, parents and the levels
    the controller kept) the best nodes (:func:`pruned_tree`) within those levels, within the
    KV cache's spare rows and the step's token budget after every chain's drafts, and within
    the sequence's columns (``max_model_len``: every node takes one until verification)."""
    step_tokens = sum(item.num_new_tokens for item in items)
    free = free_kv_tokens if free_kv_tokens is not None else 1 << 62
    spare = min(free, max_num_batched_tokens) - step_tokens
    for i, (drafts, parents, depth) in trees.items():
        room = max_model_len - items[i].seq.num_tokens
        nodes, kept = pruned_tree(drafts, parents, depth, min(spare, room))
        spare -= len(nodes)
        if nodes:
            items[i].drafts, items[i].parents = nodes, kept
            items[i].depth = tree_depth(kept)


def verify_trees(logits: torch.Tensor, items: list[SeqStep],
                 verify_chains: Callable[[list[int], torch.Tensor], list[list[int]]],
                 sampling: Callable[[list[SeqStep]], SamplingTensors],
                 generator: torch.Generator | None
                 ) -> tuple[list[list[int]], list[list[int] | None]]:
    """Verify a step whose sampling ``items`` include trees: the chains' rows through
    ``verify_chains(chain indices, their rows)`` (the sampler, as in a step without trees);
    each tree keeps the branch that :mod:`samplers.tree_verify` walks (greedy: the longest whose
    every node is the target's argmax after its parent; sampled: SpecInfer's multi-candidate
    rejection, lossless for one-hot drafts), then the token after it. ``logits``: the kept rows
    ``[sum(len(drafts) + 1), vocab_size]``. Returns each item's tokens and its tree's path."""
    bounds, row = [], 0
    for item in items:  # (each one's rows: its last context position, then its drafts)
        bounds.append((row, row + len(item.drafts) + 1))
        row += len(item.drafts) + 1
    out: list[list[int]] = [[] for _ in items]
    paths: list[list[int] | None] = [None] * len(items)
    chains = [j for j, item in enumerate(items) if item.parents is None]
    if chains:
        rows = torch.tensor([r for j in chains for r in range(*bounds[j])], device=logits.device)
        for j, tokens in zip(chains, verify_chains(chains, logits.index_select(0, rows)),
                             strict=True):
            out[j] = tokens
    tree_js = [j for j, item in enumerate(items) if item.parents is not None]
    picked = logits  # [tree rows, vocab_size]
    if chains:
        picked = logits.index_select(0, torch.tensor(
            [r for j in tree_js for r in range(*bounds[j])], device=logits.device))
    finite = torch.isfinite(picked.amax(dim=1)).long()  # [tree rows] usable rows
    choice = None
    trees = [items[j] for j in tree_js]
    if all(item.seq.params.greedy for item in trees):
        # (one sync: each row's argmax and whether the row is usable)
        tokens, finite = torch.stack([picked.argmax(dim=1), finite]).tolist()
    else:  # (sampled trees: every row's multi-candidate rejection at once, one sync)
        width = max(max(Counter(item.parents).values()) for item in trees)
        cands = torch.tensor([c for item in trees
                              for c in tree_verify.candidates(item.drafts, item.parents, width)],
                             device=picked.device)  # [tree rows, width]
        probs = logits_to_probs(torch.where(finite[:, None].bool(), picked, 0.0),
                                sampling(trees), [len(item.drafts) + 1 for item in trees])
        chosen, drawn = tree_verify.sample_rows(probs, cands, generator)
        choice, tokens, finite = torch.stack([chosen, drawn, finite]).tolist()
    offset = 0
    for j, item in zip(tree_js, trees, strict=True):
        n = len(item.drafts) + 1
        if not all(finite[offset:offset + n]):
            out[j] = [INVALID_TOKEN_ID]
        else:
            paths[j], out[j] = tree_verify.walk(
                item.parents, item.drafts, None if choice is None else choice[offset:offset + n],
                tokens[offset:offset + n])
        offset += n
    return out, paths


def tree_ok(seq: Sequence, spec: Any) -> bool:
    """Whether ``seq`` may verify a draft tree (``spec``: the ``SpeculativeConfig``): trees
    configured, nothing that makes a position's logits depend on the drafts before it
    (penalties, bias, bad words, min tokens), no logprobs (their rows would be the tree's),
    and greedy, or (``draft_tree_sampling``) sampled without a seed under the lossless
    rejection sampler (a seeded sample verifies chains against its keyed samples)."""
    params = seq.params
    return (spec is not None and spec.draft_tree is not None and not seq.adjuster.active
            and params.logprobs is None
            and (params.greedy or (spec.draft_tree_sampling and params.seed is None
                                   and spec.acceptance_method == "rejection_sampler")))
