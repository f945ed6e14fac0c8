"""Slot and pool-row bookkeeping on hand-built sequences of calls. No model."""

from __future__ import annotations

import pytest

from engine.runner.slot_rows import SlotRows


def test_rows_are_handed_out_lowest_first_and_come_back_on_rollback():
    rows = SlotRows(max_num_seqs=2, max_num_tokens=6, table_width=5)
    a, b = rows.allocate(), rows.allocate()
    assert (a, b) == (0, 1) and rows.num_free_slots == 0
    assert rows.take(a, 2) == [0, 1] and rows.run_start(a) == 0
    assert rows.take(b, 1) == [2]
    assert rows.take(a, 1) == [3]  # (not after a's last row: a's run is broken)
    assert rows.rows(a) == [0, 1, 3] and rows.run_start(a) is None
    assert (rows.num_free_tokens, rows.num_cached_tokens) == (2, 4)
    rows.truncate(a, 1)  # rows 1 and 3 come back, the lowest handed out first
    assert rows.take(b, 2) == [1, 3] and rows.rows(b) == [2, 1, 3]
    rows.truncate(a, 0)
    assert rows.run_start(a) is None and rows.take(a, 1) == [0] and rows.run_start(a) == 0
    rows.free(b)
    assert rows.num_free_slots == 1 and rows.allocate() == b and rows.rows(b) == []


def test_bad_calls_raise_before_any_change():
    rows = SlotRows(max_num_seqs=1, max_num_tokens=4, table_width=5)
    slot = rows.allocate()
    with pytest.raises(RuntimeError, match="slots are in use"):
        rows.allocate()
    with pytest.raises(ValueError, match="not allocated"):
        rows.rows(3)
    rows.take(slot, 2)
    with pytest.raises(ValueError, match="length"):
        rows.truncate(slot, 3)
    with pytest.raises(ValueError, match="keep_path"):
        rows.keep_paths([(slot, 1, [0, 1])])
    assert rows.rows(slot) == [0, 1]


def test_keep_paths_points_the_kept_nodes_cells_at_their_rows():
    """Slot 1 caches a context token (row 0) and a tree of three nodes (rows 1, 2, 3) from
    column 1; keeping nodes 2 then 0 puts rows 3 and 1 at columns 1 and 2 (cells 1 x 5 + 1 and
    1 x 5 + 2), the other node after them. A path of the first nodes changes nothing."""
    rows = SlotRows(max_num_seqs=2, max_num_tokens=8, table_width=5)
    rows.allocate()
    slot = rows.allocate()
    rows.take(slot, 4)
    assert rows.keep_paths([(slot, 1, [0, 1])]) == ([], [])
    assert rows.run_start(slot) == 0
    assert rows.keep_paths([(slot, 1, [2, 0])]) == ([6, 7], [3, 1])
    assert rows.rows(slot) == [0, 3, 1, 2] and rows.run_start(slot) is None
    rows.truncate(slot, 3)
    assert rows.rows(slot) == [0, 3, 1] and rows.num_free_tokens == 5


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_one_row_each_is_one_take_a_slot_in_order(prefix_cache):
    """take_each (a decode step's rows) against take of one row a slot, in order, on the same
    random histories: the rows handed out, each slot's rows and run, the free list, and the
    prefix cache's evictions when the free rows run short."""
    import random

    rng = random.Random(3)
    for _ in range(30):
        pair = [SlotRows(max_num_seqs=6, max_num_tokens=40, table_width=41,
                         prefix_cache=prefix_cache) for _ in range(2)]
        slots = [[r.allocate() for _ in range(6)] for r in pair][0]
        for _ in range(12):
            batch = rng.sample(slots, rng.randint(1, 6))
            if rng.random() < 0.3:  # (rollbacks fragment the pool)
                victim, keep = rng.choice(slots), rng.randint(0, 3)
                for r in pair:
                    r.truncate(victim, min(keep, len(r.rows(victim))))
            if prefix_cache and rng.random() < 0.2:  # (a sequence leaves its rows to the cache)
                leaving = rng.choice(slots)
                tokens = list(range(len(pair[0].rows(leaving))))
                for r in pair:
                    r.free(leaving, tokens)
                    assert r.allocate() == leaving
            if len(batch) > pair[0].num_free_tokens:
                break
            assert pair[0].take_each(batch) == [pair[1].take(slot, 1)[0] for slot in batch]
            for slot in slots:
                assert pair[0].rows(slot) == pair[1].rows(slot)
                assert pair[0].run_start(slot) == pair[1].run_start(slot)
            assert pair[0].num_free_tokens == pair[1].num_free_tokens
    rows = SlotRows(max_num_seqs=2, max_num_tokens=6, table_width=5)
    a, b = rows.allocate(), rows.allocate()
    assert rows.take_each([b, a]) == [0, 1] and rows.take_each([a]) == [2]
    assert rows.rows(a) == [1, 2] and rows.run_start(a) == 1 and rows.run_start(b) == 0
    with pytest.raises(RuntimeError, match="no free pool rows"):
        rows.take_each([a, b, a, b])  # (3 rows left: the caller's check was skipped)
    assert rows.num_free_tokens == 3 and rows.rows(a) == [1, 2]  # (nothing taken)
