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


class _Table:
    """A slot table kept as the runner keeps it: the host path points every row it takes at
    its position; extend's and keep_paths' cells are pointed as returned."""

    def __init__(self, width: int) -> None:
        self.width, self.cells = width, {}

    def point(self, cells, rows) -> None:
        self.cells.update(zip(cells, rows, strict=True))

    def take(self, slot_rows: SlotRows, slot: int, n: int) -> None:
        first = len(slot_rows.rows(slot))
        taken = slot_rows.take(slot, n)
        self.point(range(slot * self.width + first, slot * self.width + first + n), taken)


def _check(rows: SlotRows, table: _Table, slots, total: int) -> None:
    """Every cached row and spare row sits where its slot's cell points; every row is
    exactly one of free, held or spare (or, with a prefix cache, the cache's: then no held
    or spare row is free)."""
    held = []
    for slot in slots:
        own, spare = rows.rows(slot), rows._spare.get(slot, [])
        for p, row in enumerate(own + spare):
            assert table.cells.get(slot * table.width + p) == row, (slot, p)
        held += own[rows.num_shared(slot):] + spare
    assert len(set(held)) == len(held)
    if rows.cache is not None:
        assert not set(held) & set(rows._free_rows)
        return
    assert sorted(held + rows._free_rows) == list(range(total))
    assert rows.num_free_tokens == total - sum(len(rows.rows(s)) for s in slots)


def test_extend_points_fresh_and_spare_rows_once_and_later_steps_reuse_them():
    """A slot fed from chains takes its rows with spare ones past them, pointed once: the
    next steps within them point nothing; a rollback puts the cut rows back in front of its
    spare rows, which the next step takes again without pointing them."""
    rows = SlotRows(max_num_seqs=2, max_num_tokens=40, table_width=21)
    table = _Table(21)
    a, b = rows.allocate(), rows.allocate()
    table.take(rows, a, 3)
    table.take(rows, b, 2)
    cells, taken = rows.extend([a, b], [5, 4], spare=4)
    # a: positions 3-4 and 4 spare (3..8); b: 2-3 and 4 spare (2..7)
    assert cells == [a * 21 + p for p in range(3, 9)] + [b * 21 + p for p in range(2, 8)]
    assert len(taken) == 12 and len(rows.rows(a)) == 5 and len(rows.rows(b)) == 4
    table.point(cells, taken)
    _check(rows, table, [a, b], 40)
    assert rows.extend([a, b], [7, 6], spare=4) == ([], [])  # (within the spare rows)
    rows.truncate(a, 4)  # (a rollback: its rows 4-6 go in front of its spare rows)
    assert rows.extend([a, b], [8, 8], spare=4) == ([], [])
    _check(rows, table, [a, b], 40)
    cells, taken = rows.extend([a], [10], spare=4)  # (past them: fresh rows and spare)
    assert cells == [a * 21 + p for p in range(9, 14)]
    table.point(cells, taken)
    _check(rows, table, [a, b], 40)
    rows.free(a)
    rows.free(b)
    assert rows.num_free_tokens == 40 and not rows._spare


def test_spare_rows_count_as_free_and_come_back_when_the_pool_runs_short():
    """A pool of 12 rows: two slots with spare rows leave 2 rows free; a take of 5 reclaims
    every spare row (their slots point their cells again when they next extend), and an
    extend that does not fit even then returns None."""
    rows = SlotRows(max_num_seqs=3, max_num_tokens=12, table_width=13)
    table = _Table(13)
    a, b, c = rows.allocate(), rows.allocate(), rows.allocate()
    table.point(*rows.extend([a, b], [1, 1], spare=4))
    assert rows.num_free_tokens == 10 and rows._num_spare == 8
    table.take(rows, c, 5)  # (only 2 free rows: the spare rows come back)
    assert rows._num_spare == 0 and rows.num_free_tokens == 5
    _check(rows, table, [a, b, c], 12)
    cells, taken = rows.extend([a, b], [3, 3], spare=4)  # (fresh again; no room for spare)
    assert len(taken) == 4 and rows._num_spare == 0
    table.point(cells, taken)
    _check(rows, table, [a, b, c], 12)
    assert rows.extend([a, b], [6, 6], spare=0) is None  # (6 needed, 3 free)
    _check(rows, table, [a, b, c], 12)


def test_spare_rows_come_from_the_free_rows_only_never_from_evicted_prefixes():
    """Most of the pool in the prefix cache (evictable), few rows free: an extend takes the
    rows its step needs (evicting where those run short) but no spare rows, which would evict
    cached prefixes for rows nobody may use; with free rows enough it takes them again."""
    rows = SlotRows(max_num_seqs=2, max_num_tokens=40, table_width=41, prefix_cache=True)
    table = _Table(41)
    a = rows.allocate()
    table.take(rows, a, 36)
    rows.free(a, list(range(100, 136)))  # (its 36 rows stay in the cache, evictable)
    assert rows.cache.num_evictable == 36
    b = rows.allocate()
    table.take(rows, b, 2)  # (2 rows free left)
    cells, taken = rows.extend([b], [4], spare=4)
    assert len(taken) == 2 and rows._num_spare == 0 and rows.cache.num_evictable == 36
    table.point(cells, taken)
    _check(rows, table, [b], 40)
    cells, taken = rows.extend([b], [8], spare=4)  # (4 rows short: only they are evicted)
    assert len(taken) == 4 and rows._num_spare == 0 and rows.cache.num_evictable < 36
    table.point(cells, taken)
    _check(rows, table, [b], 40)
    rows.truncate(b, 2)  # (6 rows back: a spare list of them)
    rows.forget_spare([b])  # (and back to the free rows)
    assert rows._num_spare == 0 and len(rows._free_rows) >= 6
    cells, taken = rows.extend([b], [3], spare=4)  # (free rows enough: spare ones again)
    assert len(taken) == 5 and rows._num_spare == 4
    table.point(cells, taken)
    _check(rows, table, [b], 40)


def test_idle_spare_rows_come_back_before_a_cached_prefix_is_evicted():
    """Free rows short, one slot holding spare rows, the prefix cache holding evictable ones:
    an extend of another slot takes the spare rows back first, and evicts nothing."""
    rows = SlotRows(max_num_seqs=3, max_num_tokens=40, table_width=41, prefix_cache=True)
    table = _Table(41)
    a = rows.allocate()
    table.take(rows, a, 30)
    rows.free(a, list(range(100, 130)))  # (its 30 rows stay in the cache, evictable)
    b = rows.allocate()
    table.take(rows, b, 2)
    cells, taken = rows.extend([b], [4], spare=4)  # (8 rows free: 2 and 4 spare)
    table.point(cells, taken)
    assert rows._num_spare == 4 and len(rows._free_rows) == 2
    c = rows.allocate()
    cells, taken = rows.extend([c], [4], spare=4)  # (4 rows: 2 free, then b's spare ones)
    table.point(cells, taken)
    assert len(taken) == 4 and rows._num_spare == 0 and rows.cache.num_evictable == 30
    _check(rows, table, [b, c], 40)


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_random_histories_keep_spare_rows_where_their_cells_point(prefix_cache):
    """Random extends (fed chains), host takes, one-row takes, rollbacks, tree paths and
    frees: every held and spare row stays where its slot's cell points, and no row is lost."""
    import random

    rng = random.Random(11)
    total, width = 60, 31
    for _ in range(40):
        rows = SlotRows(max_num_seqs=4, max_num_tokens=total, table_width=width,
                        prefix_cache=prefix_cache)
        table = _Table(width)
        slots = [rows.allocate() for _ in range(4)]
        for _ in range(25):
            op = rng.random()
            slot = rng.choice(slots)
            n = len(rows.rows(slot))
            if op < 0.35:
                batch = rng.sample(slots, rng.randint(1, 4))
                ends = [min(len(rows.rows(s)) + rng.randint(0, 4), width - 1) for s in batch]
                got = rows.extend(batch, ends, spare=rng.choice([0, 3, 8]))
                if got is not None:
                    table.point(*got)
            elif op < 0.5 and n + 2 < width and rows.num_free_tokens >= 2:
                table.take(rows, slot, 2)
            elif op < 0.6:
                batch = rng.sample(slots, rng.randint(1, 4))
                if len(batch) <= rows.num_free_tokens and all(
                        len(rows.rows(s)) + 1 < width for s in batch):
                    firsts = [len(rows.rows(s)) for s in batch]
                    taken = rows.take_each(batch)
                    table.point([s * width + f for s, f in zip(batch, firsts, strict=True)], taken)
            elif op < 0.8:
                rows.truncate(slot, rng.randint(rows.num_shared(slot), n))
            elif op < 0.9 and n >= 3:
                first = n - 3
                if first >= rows.num_shared(slot):
                    table.point(*rows.keep_paths([(slot, first, [2, 0])]))
                    rows.truncate(slot, first + 2)
            else:
                tokens = list(range(n)) if prefix_cache else None
                rows.free(slot, tokens)
                assert rows.allocate() == slot
            _check(rows, table, slots, total)
