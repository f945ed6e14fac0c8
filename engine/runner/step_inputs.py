"""The index tensors of one forward, laid out on the host.

A forward of ``batch_size`` rows of ``num_new`` tokens (a step's rows after
:mod:`engine.runner.step_layout`, padded to its CUDA-graph bucket when it has one) reads one long
tensor of ``LAYOUT_ROWS * batch_size * num_new + batch_size`` ints, shipped in one host-to-device
copy and, with graphs, copied into the graph's static input. Its parts, each ``[batch_size,
num_new]`` flattened:

0. input ids (padding: 0);
1. positions: ``start + t`` for a chain token; a tree node one past its parent (padding repeats
   the row's last position, so absolute position tables stay in range);
2. the pool row each token's keys and values are written to (padding: the scratch row);
3. the slot-table cell ``slot * table_width + position`` that points at that row (padding: the
   slot's scratch column);
4. mask limits: a token sees key columns up to its limit (its own position for a chain token;
   for a tree node, the last column before the tree);
5. ancestor bits: a tree node also sees column ``limit + 1 + b`` for each set bit ``b`` (its own
   and its ancestors' nodes); 0 for chain tokens and padding;

then the ``batch_size`` slots (the padding rows: the scratch slot). The mask itself is built on
the device from parts 4 and 5 (``Executor.mask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from engine.runner.step_layout import Tree

LAYOUT_ROWS = 6  # the per-token parts above, before the slots


@dataclass(frozen=True)
class Scratch:
    """Where padding goes in the KV cache: the scratch slot, the scratch pool row, and the
    slot table's width (its last column is the scratch column)."""

    slot: int
    row: int
    table_width: int

    @property
    def column(self) -> int:
        return self.table_width - 1


@dataclass(frozen=True)
class StepInputs:
    """One forward's layout: ``host`` (see the module docstring), ``token_rows [num_tokens]``
    the padded index of every new token (slot order then token order, increasing), and the
    padded sizes ``batch_size`` x ``num_new``. Lists, or int64 arrays (a fed-chains step's:
    :func:`lay_out_chains`)."""

    host: list[int] | np.ndarray
    token_rows: list[int] | np.ndarray
    batch_size: int
    num_new: int


def scratch_inputs(scratch: Scratch, batch_size: int, num_new: int) -> list[int]:
    """The layout of a forward of padding only: input id 0 at position 0, writing the scratch
    row through the scratch slot's scratch column (what a graph's capture runs on)."""
    padded = batch_size * num_new
    cell = scratch.slot * scratch.table_width + scratch.column
    return ([0] * (2 * padded) + [scratch.row] * padded + [cell] * padded
            + [0] * (2 * padded) + [scratch.slot] * batch_size)


def tree_columns(start: int, n: int, tree: Tree) -> tuple[list[int], list[int], list[int]]:
    """Positions, mask limits and ancestor bits of a row of ``n`` new tokens after ``start``
    cached ones whose tokens from ``first`` on are a draft tree ``(first, parents)``."""
    positions = [*range(start, start + n)]
    limits, ancestors = list(positions), [0] * n
    first, parents = tree
    root = start + first - 1  # the last column (and position) before the nodes
    for j, parent in enumerate(parents):
        up = ancestors[first + parent] if parent >= 0 else 0
        ancestors[first + j] = up | 1 << j
        positions[first + j] = (positions[first + parent] if parent >= 0 else root) + 1
        limits[first + j] = root
    return positions, limits, ancestors


def lay_out(slots: Sequence[int], token_ids: Sequence[Sequence[int]], starts: Sequence[int],
            pool_rows: Sequence[Sequence[int]], trees: Sequence[Tree | None], batch_size: int,
            num_new: int, scratch: Scratch) -> StepInputs:
    """The layout of a forward whose row ``b`` appends ``token_ids[b]`` to slot ``slots[b]``
    after its ``starts[b]`` cached tokens, into pool rows ``pool_rows[b]``, padded to
    ``batch_size`` rows (the extra ones: the scratch slot at position 0) of ``num_new`` tokens."""
    if num_new == 1 and not any(trees):
        return _lay_out_tokens(slots, token_ids, starts, pool_rows, batch_size, scratch)
    return _lay_out_rows(slots, token_ids, starts, pool_rows, trees, batch_size, num_new, scratch)


def _lay_out_tokens(slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                    starts: Sequence[int], pool_rows: Sequence[Sequence[int]], batch_size: int,
                    scratch: Scratch) -> StepInputs:
    """:func:`lay_out` of one new token a row (a decode step): each part built whole, not row
    by row (its host time is on an overlapped step's critical path: docs/design.md)."""
    pad = batch_size - len(slots)
    width = scratch.table_width
    positions = [*starts, *[0] * pad]  # (a chain token's mask limit is its own position)
    host = [*(ids[0] for ids in token_ids), *[0] * pad, *positions,
            *(rows[0] for rows in pool_rows), *[scratch.row] * pad,
            *(slot * width + start for slot, start in zip(slots, starts, strict=True)),
            *[scratch.slot * width + scratch.column] * pad, *positions, *[0] * batch_size,
            *slots, *[scratch.slot] * pad]
    return StepInputs(host, list(range(len(slots))), batch_size, 1)


def _lay_out_rows(slots: Sequence[int], token_ids: Sequence[Sequence[int]], starts: Sequence[int],
                  pool_rows: Sequence[Sequence[int]], trees: Sequence[Tree | None],
                  batch_size: int, num_new: int, scratch: Scratch) -> StepInputs:
    """:func:`lay_out` row by row (rows of several tokens, draft trees)."""
    width = scratch.table_width
    padded = batch_size * num_new
    host = scratch_inputs(scratch, batch_size, num_new)
    host[LAYOUT_ROWS * padded:LAYOUT_ROWS * padded + len(slots)] = slots
    token_rows: list[int] = []
    for b, (slot, ids, rows, tree) in enumerate(zip(slots, token_ids, pool_rows, trees,
                                                    strict=True)):
        start, n, base, pad = starts[b], len(ids), b * num_new, num_new - len(ids)
        if tree is None:  # (a chain token sees up to its own column; no tree bits)
            positions = limits = [*range(start, start + n)]
        else:
            positions, limits, ancestors = tree_columns(start, n, tree)
        host[base:base + n] = ids
        host[padded + base:padded + base + num_new] = positions + [positions[-1]] * pad
        host[2 * padded + base:2 * padded + base + n] = rows
        host[3 * padded + base:3 * padded + base + num_new] = [
            slot * width + p for p in range(start, start + n)] + [
            slot * width + scratch.column] * pad
        host[4 * padded + base:4 * padded + base + num_new] = limits + [limits[-1]] * pad
        if tree is not None:  # (the scratch layout's ancestor bits are 0 already)
            host[5 * padded + base:5 * padded + base + n] = ancestors
        token_rows.extend(range(base, base + n))
    return StepInputs(host, token_rows, batch_size, num_new)


@lru_cache(maxsize=64)
def _scratch_array(scratch: Scratch, batch_size: int, num_new: int) -> np.ndarray:
    """:func:`scratch_inputs` as an int64 array (read-only: callers copy it)."""
    array = np.array(scratch_inputs(scratch, batch_size, num_new), dtype=np.int64)
    array.flags.writeable = False
    return array


def lay_out_chains(slots: Sequence[int], width: int, batch_size: int, num_new: int,
                   scratch: Scratch) -> StepInputs:
    """The host's part of a fed-chains forward's layout (``ModelRunner.forward_chains``): chain
    ``b`` of ``width`` tokens in slot ``slots[b]``, padded to ``batch_size`` rows of
    ``num_new``. The chains' ids, positions, pool rows, cells and limits are written on the
    device (:func:`engine.runner.chain_layout.write_chains`: every column's positions and
    limits, the first ``width`` columns' ids, rows and cells), so the host's layout is the
    scratch layout with the slots and each chain's padding columns' cells (its own slot's
    scratch column, as :func:`lay_out` gives them): a copy and two array writes, no Python a
    row (the layout's host time is on an overlapped drafting step's critical path)."""
    host = _scratch_array(scratch, batch_size, num_new).copy()
    padded, n = batch_size * num_new, len(slots)
    chained = np.asarray(slots, dtype=np.int64)
    host[LAYOUT_ROWS * padded:LAYOUT_ROWS * padded + n] = chained
    if width < num_new:
        cells = host[3 * padded:3 * padded + n * num_new].reshape(n, num_new)
        cells[:, width:] = chained[:, None] * scratch.table_width + scratch.column
    token_rows = (np.arange(n)[:, None] * num_new + np.arange(width)).reshape(-1)
    return StepInputs(host, token_rows, batch_size, num_new)
