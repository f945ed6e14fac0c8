"""The draft head's drafting computation: a chain or a tree of drafts from the pending pairs.

One proposal of :class:`proposers.draft_head.DraftHeadProposer` is one call of
:func:`draft_chain` or :func:`draft_tree`: the requests' pending (feature, token) pairs are
written into the head's KV cache (:mod:`proposers.head_cache`), then each request's newest pair
queries the head, and every predicted feature is read out into a draft and fed back, one
position further. The functions take tensors only (no host lists, no syncs), so that the same
code runs eagerly and as the body of a CUDA graph (:mod:`samplers.keyed_graphs`); the proposer
owns the bookkeeping around them (which pairs are pending, the layouts, the padding).

A chain's drafts write their own keys and values into the cache, past each request's newest
pair: the cache's committed pairs are never touched, and the next verified pairs overwrite the
drafts' before anything reads there, so a rejected draft needs no rollback (the engine's
drafting flights write past the accepted pairs the same way). A tree's nodes go into a copy of
the requests' keys and values, made once a proposal: their columns are not their positions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from proposers.head_cache import HeadKVCache
from proposers.head_kernels import fused_rotate_write, rotate_write_applies
from proposers.head_model import (  # (or an Eagle3Head: the same methods)
    ChainView,
    DraftHead,
    rotated,
)

# readout(feature [batch, hidden_size]) -> the greedy draft [batch] (full token ids)
Readout = Callable[[torch.Tensor], torch.Tensor]
# candidates(feature [..., hidden_size], count) -> the count likeliest drafts [..., count]
Candidates = Callable[[torch.Tensor, int], torch.Tensor]


class DraftTree:
    """The static layout of a full draft tree of ``depth`` levels, ``branching[d]`` children
    per node at level ``d`` (1 past the list), nodes numbered level by level, a parent's
    children together, likeliest first: ``parents`` (-1: the root), ``sizes[k]`` (nodes in
    the first ``k`` levels: a prefix), ``chain`` (each level's first node: the likeliest
    chain), ``levels[d]`` (the node indices at depth ``d + 1``, a tensor) and ``ancestors
    [num_nodes, num_nodes]`` (bool: node ``j`` is node ``i`` or one of its ancestors)."""

    def __init__(self, branching: list[int], depth: int, device: torch.device) -> None:
        self.branching = [branching[d] if d < len(branching) else 1 for d in range(depth)]
        self.parents: list[int] = []
        self.sizes = [0]
        self.chain: list[int] = []
        levels, above = [], [-1]
        for b in self.branching:
            first = len(self.parents)
            self.parents += [p for p in above for _ in range(b)]
            above = list(range(first, len(self.parents)))
            levels.append(above)
            self.sizes.append(len(self.parents))
            self.chain.append(first)
        self.num_nodes = len(self.parents)
        anc = torch.zeros((self.num_nodes, self.num_nodes), dtype=torch.bool)
        for j, p in enumerate(self.parents):
            anc[j, j] = True
            if p >= 0:
                anc[j] |= anc[p]
        self.ancestors = anc.to(device)
        self.levels = [torch.tensor(nodes, device=device) for nodes in levels]


def write_pairs(head: DraftHead, cache: HeadKVCache, embed: nn.Module, features: torch.Tensor,
                tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor
                ) -> torch.Tensor:
    """Write the pairs (``features [rows, hidden_size]``, each with the token after it,
    ``tokens [rows]``) into the cache at (``slots``, ``positions [rows]``); returns the head's
    inputs of the pairs ``[rows, hidden_size]``."""
    x = head.inputs(features, embed(tokens))  # [rows, hidden_size]
    write_keys_values(head, x, positions, cache.keys, cache.values, slots)
    return x


def write_keys_values(head: DraftHead, x: torch.Tensor, positions: torch.Tensor,
                      keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
    """The pairs' keys (rotated to ``positions [rows]``) and values, from their inputs ``x
    [rows, ...]``, into ``keys``/``values [slots, capacity, kv_heads, head_dim]`` at
    (``slots [rows]``, ``positions``): one launch where the fused kernel applies
    (:func:`proposers.head_kernels.fused_rotate_write`)."""
    k, v = head.unrotated_keys_values(x)  # [rows, kv_heads, head_dim] each
    if rotate_write_applies(k, v, keys, values, positions, slots):
        fused_rotate_write(k, v, positions, head.inv_freq, keys, values, slots)
    else:
        keys[slots, positions] = rotated(k, positions, head.inv_freq)
        values[slots, positions] = v


def draft_chain(head: DraftHead, cache: HeadKVCache, embed: nn.Module, readout: Readout,
                features: torch.Tensor, tokens: torch.Tensor, row_slots: torch.Tensor,
                row_pos: torch.Tensor, last_rows: torch.Tensor, slots: torch.Tensor,
                last_pos: torch.Tensor, steps: int, num_keys: int) -> torch.Tensor:
    """Write the pending pairs (``features [rows, hidden_size]``, ``tokens``, ``row_slots``,
    ``row_pos [rows]``) into the cache, then draft ``steps`` tokens for each request from its
    newest pair (``last_rows``, ``slots``, ``last_pos [batch]``), reading keys
    ``0 .. num_keys - 1``: ``[batch, steps]``."""
    x = write_pairs(head, cache, embed, features, tokens, row_slots, row_pos)
    x, pos = x[last_rows], last_pos  # [batch, hidden_size], [batch]
    # The drafts' own pairs go into the cache itself, past each request's newest pair: where
    # the next verified pairs overwrite them before anything reads there (a proposal writes
    # its pending pairs first, and reads up to its newest); nothing is copied.
    out = []
    for s in range(steps):
        # (each row sees its slot's keys up to its own position: one fused launch where it
        # applies, the keys up to num_keys gathered otherwise)
        view = ChainView(slots, pos)
        feature = head.attend(x[:, None], pos[:, None], cache.keys[:, :num_keys],
                              cache.values[:, :num_keys], view)[:, 0]  # [batch, hidden_size]
        token = readout(feature)  # [batch]
        out.append(token)
        if s + 1 < steps:
            x, pos = head.chained(feature, embed(token)), pos + 1
            write_keys_values(head, x, pos, cache.keys, cache.values, slots)
    return torch.stack(out, dim=1)  # [batch, steps]


def draft_tree(head: DraftHead, cache: HeadKVCache, embed: nn.Module, candidates: Candidates,
               features: torch.Tensor, tokens: torch.Tensor, row_slots: torch.Tensor,
               row_pos: torch.Tensor, last_rows: torch.Tensor, slots: torch.Tensor,
               last_pos: torch.Tensor, steps: int, num_keys: int,
               tree: DraftTree) -> torch.Tensor:
    """:func:`draft_chain` for a tree of ``steps`` levels: the same writes, then level by
    level every node of the level queries the head (seeing the verified pairs and its own
    ancestors) and its children are its likeliest drafts. Node ``j``'s key is written at
    column ``last_pos + 1 + j`` of the proposal's copy of the keys (not the cache), rotated
    to its own position ``last_pos + depth``: ``[batch, num_nodes]`` tokens in level order."""
    x = write_pairs(head, cache, embed, features, tokens, row_slots, row_pos)
    batch = slots.shape[0]
    x = x[last_rows][:, None]  # [batch, 1, hidden_size]: the newest pair queries first
    key_pos = torch.arange(num_keys, device=x.device)  # [num_keys]
    rel = key_pos[None, :] - last_pos[:, None] - 1  # [batch, num_keys] node of a column
    in_tree = (rel >= 0) & (rel < tree.num_nodes)  # [batch, num_keys]
    rel = rel.clamp(0, tree.num_nodes - 1)[:, None, :]  # [batch, 1, num_keys]
    # each [batch, num_keys, kv_heads, head_dim], copied once (see draft_chain)
    keys, values = cache.keys[slots, :num_keys], cache.values[slots, :num_keys]
    rows = torch.arange(batch, device=x.device)[:, None]  # [batch, 1]
    out, queries = [], None  # queries: the level's node indices (None: the root)
    for level in range(steps):
        if queries is None:
            mask = key_pos[None, None, :] <= last_pos[:, None, None]  # [batch, 1, keys]
        else:
            anc = tree.ancestors[queries]  # [q, num_nodes] own column and ancestors'
            seen = anc[None].expand(batch, -1, -1).gather(
                2, rel.expand(-1, len(queries), -1))  # [batch, q, num_keys]
            mask = (key_pos[None, None, :] <= last_pos[:, None, None]) | (
                seen & in_tree[:, None])
        pos = last_pos[:, None] + level  # [batch, 1]: the queries' position
        feature = head.attend(x, pos.expand(-1, x.shape[1]), keys, values,
                              mask)  # [batch, q, hidden_size]
        branch = tree.branching[level]
        children = candidates(feature, branch)  # [batch, q, branch]
        out.append(children.flatten(1))
        if level + 1 == steps:
            break
        x = head.chained(feature.repeat_interleave(branch, dim=1),
                         embed(children.flatten(1)))  # [batch, q * branch, hidden]
        nodes = tree.levels[level]  # the children's node indices
        cols = last_pos[:, None] + 1 + nodes[None, :]  # [batch, q * branch]
        # (into the copies only: a node's column is not its position)
        keys[rows, cols], values[rows, cols] = head.keys_values(x, pos + 1)
        queries = nodes
    return torch.cat(out, dim=1)  # [batch, num_nodes]
