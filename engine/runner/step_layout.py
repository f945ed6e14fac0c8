"""How a step's sequences become the rows of a forward: padded, folded, packed or split.

A step brings sequence ``i`` ``lens[i]`` new tokens after its ``starts[i]`` cached ones
(``lens``, ``starts``: ``[batch_size]``). The model runs a padded batch ``[rows, width]``, so the
runner first decides how the sequences fill those rows:

- *padded* (the default): a row per sequence, each padded to the longest (with CUDA graphs, to
  its bucket's batch and width: :mod:`engine.runner.cuda_graphs`);
- *folded* (graphs only): a step of short rows (decodes, verifications: at most the graphs'
  ``max_num_new`` tokens) and long ones (prompt chunks) runs as one forward in one graph bucket,
  each long row cut into consecutive rows of the step's width on its own slot (:func:`cut_rows`).
  Exact: a layer writes every row's keys and values before any row gathers its slot's columns,
  and each token's mask limit is its own position. Two forwards cost about two steps where a step
  is mostly kernel launches; the folded one about one;
- *packed* (graphs only): a verification step whose sequences verify unequal numbers of drafts,
  each new token a row of its own on its slot (the fold's layout at width 1), in the decode
  bucket of that many rows: one sequence's drafts then cost no other sequence a padded row;
- *split*: a step of short and long rows that is not folded runs as two forwards, the short rows
  first, padded only among themselves, when that saves at least ``SPLIT_MIN_SAVED`` padded tokens
  (:func:`split_order` puts the two forwards' rows back in the step's order).

Everything here is host-side and pure: it reads the step's sizes and the runner's
:class:`LayoutLimits` and changes nothing. Where each threshold comes from: docs/design.md,
"Measured reasons behind the runner's choices" (mixed steps folded, else split; unequal drafts
packed from 64 sequences).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.runner.cuda_graphs import batch_bucket, kv_bucket, new_bucket

# A draft tree among one slot's new tokens: ``(first, parents)``; the tokens from index ``first``
# on are its nodes, in an order where a parent comes before its children; ``parents[j]`` is the
# node index of node ``j``'s parent, -1 for the token at ``first - 1`` (the tree's root).
Tree = tuple[int, Sequence[int]]
MAX_TREE_NODES = 62  # a node's ancestors are bits of an int64 (and the shift stays defined)
# A step is split when padding its short rows to the longest (to its bucket's width with graphs)
# would cost at least this many tokens; without graphs a row is short up to SPLIT_SHORT new
# tokens (with them: the graphs' max_num_new).
SPLIT_MIN_SAVED = 128
SPLIT_SHORT = 16
# A folded step takes at most FOLD_MIN_ROWS rows, or twice the slots' batch bucket where that is
# more, and gathers at most twice the key cells of a full batch at the longest context.
FOLD_MIN_ROWS = 64
# A step is packed from PACK_MIN_BATCH sequences, when their drafts add at most PACK_MAX_EXTRA
# rows a sequence (the fold's limits apply); below, padding every row to the longest is cheaper.
PACK_MIN_BATCH = 64
PACK_MAX_EXTRA = 0.125


def _never(batch_size: int, num_new: int, kv_len: int) -> bool:
    return False


@dataclass(frozen=True)
class LayoutLimits:
    """What a step's layout may use. ``max_num_new``: the CUDA graphs' widest decode or
    verification bucket (None: no graph buckets, so nothing is folded or packed);
    ``max_kv_len``: their longest key length; ``ready(batch_size, num_new, kv_len)``: whether a
    step of those sizes would replay a captured graph now (``CudaGraphs.ready``); ``fold``,
    ``split``, ``pack``: the layouts the runner allows (none under tensor parallelism, where the
    other ranks replay each forward as sent)."""

    max_num_seqs: int
    max_num_new: int | None = None
    max_kv_len: int = 0
    ready: Callable[[int, int, int], bool] = _never
    fold: bool = True
    split: bool = True
    pack: bool = True

    @property
    def fold_rows(self) -> int:
        """The most rows a folded or packed step may take."""
        return max(FOLD_MIN_ROWS, 2 * batch_bucket(self.max_num_seqs))

    @property
    def fold_cells(self) -> int:
        """The most key cells (rows x key length) a folded or packed step may gather: twice a
        full batch's at the longest context."""
        return 2 * batch_bucket(self.max_num_seqs) * self.max_kv_len


@dataclass(frozen=True)
class StepPlan:
    """A step's layout. ``kv_len``: its longest sequence's tokens, new ones included.
    ``width``: every row longer than this is cut into rows of this many tokens (folded; 1:
    packed), None: rows stay whole. ``packed_rows``: the rows of a packed step. ``groups``:
    ``(short, long)`` sequence indices of a split step, each group one forward."""

    kv_len: int
    width: int | None = None
    packed_rows: int | None = None
    groups: tuple[list[int], list[int]] | None = None


def plan_step(lens: Sequence[int], starts: Sequence[int], trees: Sequence[Tree | None],
              limits: LayoutLimits, can_split: bool = True) -> StepPlan:
    """The layout of a step (see the module docstring): folded if it can be, else packed, else
    split (unless ``can_split`` is False: rows asked for by a device tensor), else padded."""
    kv_len = max(start + n for start, n in zip(starts, lens, strict=True))
    width = fold_width(lens, trees, kv_len, limits) if limits.fold else None
    if width is not None:
        return StepPlan(kv_len, width)
    rows = pack_rows(lens, trees, kv_len, limits)
    if rows is not None:
        return StepPlan(kv_len, 1, rows)
    groups = mixed_groups(lens, limits) if limits.split and can_split else None
    return StepPlan(kv_len, groups=groups)


def packed_rows(num_seqs: int, longest: int, total: int, limits: LayoutLimits) -> int | None:
    """The rows of a verification step of ``num_seqs`` sequences bringing ``total`` new tokens,
    ``longest`` the most of one, when it is packed (None: every sequence is padded to
    ``longest``): with graph buckets only (each row gathers its slot's keys: without graphs a
    step is not mostly launches), at most ``fold_rows`` rows, from ``PACK_MIN_BATCH`` sequences
    whose drafts add at most ``PACK_MAX_EXTRA`` rows a sequence. The speculation controller
    reads this rule to price a step before it runs."""
    if (limits.max_num_new is None or not limits.pack or longest < 2
            or longest > limits.max_num_new or total > limits.fold_rows
            or num_seqs < PACK_MIN_BATCH or total >= num_seqs * longest):
        return None
    return total if total - num_seqs <= PACK_MAX_EXTRA * num_seqs else None


def pack_rows(lens: Sequence[int], trees: Sequence[Tree | None], kv_len: int,
              limits: LayoutLimits) -> int | None:
    """The rows of the step when it is packed (:func:`packed_rows`), else None: never a step
    with a draft tree (a tree keeps its row), nor one whose rows would gather more key cells
    than ``fold_cells``."""
    rows = packed_rows(len(lens), max(lens), sum(lens), limits)
    if rows is None or any(tree is not None for tree in trees):
        return None
    if batch_bucket(rows) * kv_bucket(kv_len, limits.max_kv_len) > limits.fold_cells:
        return None
    return rows


def fold_width(lens: Sequence[int], trees: Sequence[Tree | None], kv_len: int,
               limits: LayoutLimits) -> int | None:
    """The width of a folded step, or None (no graphs, no short row or no long one, or a long
    row that is a tree). Of the widths from the longest short row to ``max_num_new`` whose rows
    fit ``fold_rows`` and ``fold_cells``: one whose bucket a captured graph serves (its own or a
    cover: a bucket met first runs eager, about ten graph steps, and is captured the next
    time), then the fewest padded tokens in its bucket, then the fewest rows."""
    limit = limits.max_num_new
    if limit is None:
        return None
    short = [n for n in lens if n <= limit]
    long = [n for n, tree in zip(lens, trees, strict=True) if n > limit and tree is None]
    if not short or not long or len(short) + len(long) < len(lens):
        return None
    kv = kv_bucket(kv_len, limits.max_kv_len)
    best: tuple[bool, int, int, int] | None = None  # (no graph, padded tokens, rows, width)
    for width in range(max(short), limit + 1):
        rows = len(short) + sum(-(-n // width) for n in long)
        if rows > limits.fold_rows or batch_bucket(rows) * kv > limits.fold_cells:
            continue
        option = (not limits.ready(rows, width, kv_len), batch_bucket(rows) * width, rows, width)
        best = option if best is None or option < best else best
    return None if best is None else best[3]


def mixed_groups(lens: Sequence[int], limits: LayoutLimits) -> tuple[list[int], list[int]] | None:
    """``(short, long)`` sequence indices of a step split in two forwards, or None (one
    forward): short rows have at most ``max_num_new`` new tokens (``SPLIT_SHORT`` without
    graphs), and the split must save at least ``SPLIT_MIN_SAVED`` padded tokens."""
    limit = limits.max_num_new if limits.max_num_new is not None else SPLIT_SHORT
    longest = max(lens)
    if longest <= limit or len(lens) < 2:
        return None
    short = [i for i, n in enumerate(lens) if n <= limit]
    if not short:
        return None
    long = [i for i, n in enumerate(lens) if n > limit]
    width = longest if limits.max_num_new is None else new_bucket(longest, limit)
    saved = len(short) * (width - max(lens[i] for i in short))
    return (short, long) if saved >= SPLIT_MIN_SAVED else None


def cut_rows(width: int, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
             starts: Sequence[int], trees: Sequence[Tree | None]
             ) -> tuple[list[int], list[list[int]], list[int], list[Tree | None]]:
    """The rows of a folded or packed step: every row longer than ``width`` cut into rows of
    ``width`` tokens (the last one shorter) on its slot, in place, so that every new token's
    place stays in slot order then token order. A row that stays whole keeps its tree; a longer
    one is a prompt chunk, never a tree (:func:`fold_width`, :func:`pack_rows`)."""
    out: tuple[list, list, list, list] = ([], [], [], [])  # slots, ids, starts, trees
    for slot, ids, start, tree in zip(slots, token_ids, starts, trees, strict=True):
        cuts = [(ids, start, tree)] if len(ids) <= width else [
            (ids[at:at + width], start + at, None) for at in range(0, len(ids), width)]
        for piece, first, piece_tree in cuts:
            for column, value in zip(out, (slot, list(piece), first, piece_tree), strict=True):
                column.append(value)
    return out


@dataclass(frozen=True)
class SplitOrder:
    """How a split step's two forwards map back to the step's rows. ``asked[g]``: the rows group
    ``g``'s forward is asked for, in its own rows (the step's asked rows that are the group's, in
    the step's order); ``logits [num_logits]``: for each row the step asked for, its row in the
    groups' logits put one after the other; ``hidden [num_tokens]``: for each new token of the
    step, its row in the groups' hidden states put one after the other."""

    asked: list[list[int]]
    logits: np.ndarray
    hidden: np.ndarray


def split_order(lens: Sequence[int], groups: tuple[list[int], list[int]],
                logits_indices: Sequence[int] | None) -> SplitOrder:
    """The :class:`SplitOrder` of a step of ``lens`` new tokens a sequence split in ``groups``
    (:func:`mixed_groups`), asked for rows ``logits_indices`` of its tokens (None: all)."""
    first = np.cumsum([0] + list(lens[:-1]))  # [batch_size]: each sequence's first row
    order = np.concatenate([np.arange(first[i], first[i] + lens[i])
                            for group in groups for i in group])  # [num_tokens]
    where = np.empty_like(order)  # [num_tokens]: each row's place in the groups' rows
    where[order] = np.arange(len(order))
    wanted = np.arange(len(order)) if logits_indices is None else np.asarray(
        logits_indices, dtype=np.int64)  # [num_logits] rows asked for
    at = where[wanted]  # [num_logits]: their places in the groups' rows
    sizes = [sum(lens[i] for i in group) for group in groups]
    ends = np.cumsum(sizes)
    mine = [np.flatnonzero((at >= end - size) & (at < end))  # each group's asked-for rows
            for size, end in zip(sizes, ends, strict=True)]
    taken = np.concatenate(mine)  # [num_logits]: the asked-for place of each logits row
    back = np.empty_like(taken)  # [num_logits]: each asked-for row's place in the logits
    back[taken] = np.arange(len(taken))
    asked = [(at[rows] - (end - size)).tolist()
             for rows, end, size in zip(mine, ends, sizes, strict=True)]
    return SplitOrder(asked, back, where)
