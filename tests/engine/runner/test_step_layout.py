"""The step-layout planner on hand-built steps: which steps are padded, folded, packed or split,
at which width, and how a split step's rows come back in order. No model."""

from __future__ import annotations

import numpy as np
import pytest

from engine.runner import step_layout
from engine.runner.step_layout import (
    LayoutLimits,
    StepPlan,
    cut_rows,
    fold_width,
    mixed_groups,
    pack_rows,
    packed_rows,
    plan_step,
    split_order,
)

# graph buckets of up to 5 tokens a row, 4 slots of up to 2000 tokens (2001 table columns)
GRAPHS = LayoutLimits(4, max_num_new=5, max_kv_len=2001)


@pytest.fixture
def pack_any(monkeypatch):
    """Packing at any batch and any number of extra rows."""
    monkeypatch.setattr(step_layout, "PACK_MIN_BATCH", 1)
    monkeypatch.setattr(step_layout, "PACK_MAX_EXTRA", 100)


def test_limits_bound_folded_rows_and_key_cells():
    assert GRAPHS.fold_rows == 64  # (at least FOLD_MIN_ROWS)
    assert GRAPHS.fold_cells == 2 * 4 * 2001  # twice a full batch at the longest context
    assert LayoutLimits(64).fold_rows == 128 and LayoutLimits(100).fold_rows == 208


def test_fold_width_takes_fewest_padded_tokens_then_fewest_rows():
    """3 decodes and a 40-token prompt: 1 token a row is 43 rows (bucket 48: 48 tokens), 2 is
    23 (24 x 2 = 48, fewer rows), 3 is 17 (24 x 3), 4 is 13 (16 x 4 = 64), 5 is 11 (80)."""
    assert fold_width([1, 1, 1, 40], [None] * 4, 60, GRAPHS) == 2
    assert fold_width([5, 40], [None] * 2, 60, GRAPHS) == 5  # the longest short row sets the least
    # more rows than fold_rows at every width (1 + 64): not folded
    assert fold_width([5, 320], [None] * 2, 60, GRAPHS) is None
    # key cells at most 2 x 4 x 2001: at 1536 key columns 8 rows fit
    assert fold_width([2, 15], [None] * 2, 1500, GRAPHS) == 5  # (2-4 a row: 9-5 rows)
    assert fold_width([2, 60], [None] * 2, 1500, GRAPHS) is None  # (16 rows at best)


def test_nothing_folds_without_graphs_a_prompt_a_decode_or_with_a_long_tree():
    assert fold_width([1, 40], [None] * 2, 60, LayoutLimits(4)) is None  # (no graphs)
    assert fold_width([1, 40], [None, (1, [-1] * 39)], 60, GRAPHS) is None  # a long tree
    assert fold_width([40, 40], [None] * 2, 60, GRAPHS) is None  # (prompts only)
    assert fold_width([1, 1], [None] * 2, 60, GRAPHS) is None  # (decodes only)
    # a short row's tree is fine: it stays whole
    assert fold_width([3, 40], [(1, [-1, 0]), None], 60, GRAPHS) == 3


def test_a_width_a_captured_graph_serves_comes_first():
    """With a graph of 16 rows x 5 tokens (128 keys) that covers every verification inside it:
    4 tokens a row (13 rows: covered) rather than 2 (24 rows: no graph, an eager first step)."""
    def ready(batch_size: int, num_new: int, kv_len: int) -> bool:
        return batch_size <= 16 and 1 < num_new <= 5 and kv_len <= 128

    limits = LayoutLimits(4, max_num_new=5, max_kv_len=2001, ready=ready)
    assert fold_width([1, 1, 1, 40], [None] * 4, 60, limits) == 4


def test_packed_rows_rule():
    """Packed (one token a row) with graph buckets only, at PACK_MIN_BATCH sequences or more
    whose drafts add at most PACK_MAX_EXTRA rows a sequence, within fold_rows; never equal
    rows, decodes, prompt chunks, or where the runner packs nothing."""
    limits = LayoutLimits(128, max_num_new=5, max_kv_len=101)
    assert limits.fold_rows == 256
    assert packed_rows(128, 5, 132, LayoutLimits(128)) is None  # (no graphs)
    # 128 sequences, one verifying 4 drafts: 132 rows against 128 rows of 5 tokens
    assert packed_rows(128, 5, 132, limits) == 132
    assert packed_rows(128, 5, 128 + 16, limits) == 144  # (an eighth more rows)
    assert packed_rows(128, 5, 128 + 17, limits) is None
    assert packed_rows(64, 5, 72, limits) == 72
    assert packed_rows(32, 5, 36, limits) is None  # (fewer than 64 sequences: padded)
    assert packed_rows(128, 5, 128 * 5, limits) is None  # (equal rows)
    assert packed_rows(128, 1, 128, limits) is None  # (decodes)
    assert packed_rows(128, 6, 133, limits) is None  # (a row past max_num_new: a prompt chunk)
    assert packed_rows(120, 2, 130, limits) == 130
    assert packed_rows(120, 2, 130, LayoutLimits(64, 5, 101)) is None  # (past fold_rows 128)
    assert packed_rows(128, 5, 132, LayoutLimits(128, 5, 101, pack=False)) is None


def test_a_packed_step_keeps_trees_whole_and_its_key_cells_bounded(pack_any):
    assert pack_rows([1, 1, 1, 5], [None] * 4, 60, GRAPHS) == 8
    assert pack_rows([1, 1, 1, 5], [None] * 3 + [(1, [-1] * 4)], 60, GRAPHS) is None
    # 13 rows (bucket 16) at 128 keys gather 2048 cells; at 1536 keys 24576 > 2 x 4 x 2001
    assert pack_rows([4, 4, 4, 1], [None] * 4, 60, GRAPHS) == 13
    assert pack_rows([4, 4, 4, 1], [None] * 4, 1500, GRAPHS) is None


def test_mixed_groups_split_when_the_short_rows_save_enough_padding():
    # without graphs a row is short up to SPLIT_SHORT = 16: 9 decodes save 9 x 19 = 171 tokens
    assert mixed_groups([1] * 9 + [20], LayoutLimits(16)) == (list(range(9)), [9])
    assert mixed_groups([1] * 6 + [20], LayoutLimits(16)) is None  # (6 x 19 = 114 < 128)
    assert mixed_groups([1, 16], LayoutLimits(16)) is None  # (no long row)
    assert mixed_groups([20], LayoutLimits(16)) is None  # (one sequence)
    assert mixed_groups([20, 30] * 8, LayoutLimits(16)) is None  # (no short row)
    # with graphs: short up to max_num_new, the long rows' width as their bucket's (40 -> 48)
    assert mixed_groups([1, 1, 1, 40], GRAPHS) == ([0, 1, 2], [3])  # (3 x 47 = 141)
    assert mixed_groups([1, 1, 40], GRAPHS) is None  # (2 x 47 = 94)
    assert mixed_groups([2, 40, 1, 1], GRAPHS) == ([0, 2, 3], [1])  # (3 x 46 = 138)


def test_plan_step_folds_then_packs_then_splits(pack_any):
    lens, starts, trees = [1, 1, 1, 40], [10, 10, 10, 0], [None] * 4
    assert plan_step([3, 1], [5, 9], [None] * 2, LayoutLimits(4)) == StepPlan(10)  # padded
    assert plan_step(lens, starts, trees, GRAPHS) == StepPlan(40, width=2)
    no_fold = LayoutLimits(4, 5, 2001, fold=False)
    assert plan_step(lens, starts, trees, no_fold) == StepPlan(40, groups=([0, 1, 2], [3]))
    assert plan_step(lens, starts, trees, no_fold, can_split=False) == StepPlan(40)
    assert plan_step(lens, starts, trees, LayoutLimits(4, 5, 2001, fold=False, split=False)) \
        == StepPlan(40)
    # a verification of unequal rows: packed (here at any size), one token a row
    assert plan_step([1, 3, 1, 1], [5] * 4, [None] * 4, GRAPHS) == StepPlan(8, 1, 6)
    assert plan_step([1, 3, 1, 1], [5] * 4, [None] * 4,
                     LayoutLimits(4, 5, 2001, pack=False)) == StepPlan(8)


def test_cut_rows_keeps_every_token_in_step_order():
    slots, ids, starts, trees = cut_rows(3, [3, 7, 5], [[1], list(range(10, 17)), [20, 21, 22]],
                                         [4, 0, 8], [None, None, (1, [-1, 0])])
    assert slots == [3, 7, 7, 7, 5]
    assert ids == [[1], [10, 11, 12], [13, 14, 15], [16], [20, 21, 22]]
    assert starts == [4, 0, 3, 6, 8]
    assert trees == [None, None, None, None, (1, [-1, 0])]  # (a whole row keeps its tree)
    assert cut_rows(1, [2], [[4, 5]], [1], [None]) == ([2, 2], [[4], [5]], [1, 2], [None] * 2)


def test_split_order_puts_the_groups_rows_back():
    """Sequences of 2, 3 and 1 new tokens (step rows 0-1, 2-4, 5) split as ([0, 2], [1]): the
    groups' rows are step rows 0, 1, 5 then 2, 3, 4."""
    order = split_order([2, 3, 1], ([0, 2], [1]), [4, 0, 5])
    # step row 4 is the second group's row 2; rows 0 and 5 are the first group's rows 0 and 2
    assert order.asked == [[0, 2], [2]]
    # the groups' logits come as step rows 0, 5, 4: the step asked for 4, 0, 5
    np.testing.assert_array_equal(order.logits, [2, 0, 1])
    np.testing.assert_array_equal(order.hidden, [0, 1, 3, 4, 5, 2])
    every = split_order([2, 3, 1], ([0, 2], [1]), None)
    assert every.asked == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_array_equal(every.logits, every.hidden)
    none = split_order([2, 3, 1], ([0, 2], [1]), [3])  # (only the second group is asked)
    assert none.asked == [[], [1]] and none.logits.tolist() == [0]
