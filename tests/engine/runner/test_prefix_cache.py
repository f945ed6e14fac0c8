"""The prefix cache's radix tree and its rows in the slot bookkeeping, on hand-built calls. No
model: every expected row, count and eviction is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from engine.runner.prefix_cache import RadixCache
from engine.runner.slot_rows import SlotRows


def refs(cache: RadixCache) -> list[int]:
    return sorted(n.refs for n in cache._nodes())


def test_match_lock_split_and_insert_by_hand():
    cache = RadixCache()
    assert cache.insert([5, 6, 7, 8], [10, 11, 12, 13]) == []
    assert cache.match([5, 6, 7, 8, 9]) == (4, 4)
    assert cache.match([5, 6, 9]) == (2, 2)
    assert cache.match([9]) == (0, 0)
    rows, node = cache.lock([5, 6])  # splits the edge [5 6 7 8] after two tokens
    assert rows == [10, 11] and node.tokens == [5, 6]
    assert (cache.num_rows, cache.num_evictable) == (4, 2)  # rows 12, 13 unlocked
    assert cache.match([5, 6, 7]) == (3, 1)  # (only row 12 would be newly locked)
    # a second sequence shares [5 6] (its own copy of 6 under row 20 is not taken), then
    # diverges: [9] under row 21 joins the tree
    assert cache.insert([5, 6, 9], [10, 20, 21]) == [20]
    assert (cache.num_rows, cache.num_evictable) == (5, 3)
    cache.unlock(node)
    assert refs(cache) == [0, 0, 0] and cache.num_evictable == 5


def test_eviction_takes_unlocked_leaves_least_recently_used_first():
    cache = RadixCache()
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [0, 1, 3])  # splits after [1 2]: leaves [3] (row 2) and [4] (row 3)
    cache.insert([7], [4])
    cache.match([1, 2, 3])
    _, node = cache.lock([1, 2, 3])  # [1 2] and [3] locked and used last
    assert cache.evict(1) == [3]  # the older unlocked leaf [4]
    assert cache.evict(5) == [4]  # [7]; the locked path stays
    assert (cache.num_rows, cache.num_evictable) == (3, 0)
    cache.unlock(node)
    assert sorted(cache.evict(3)) == [0, 1, 2] and cache.num_rows == 0


def test_lock_of_uncached_tokens_is_refused():
    cache = RadixCache()
    cache.insert([1, 2], [0, 1])
    with pytest.raises(ValueError, match="only 2 of 3 tokens are cached"):
        cache.lock([1, 2, 3])


def test_a_slot_shares_cached_rows_and_never_frees_them():
    rows = SlotRows(max_num_seqs=2, max_num_tokens=8, table_width=9, prefix_cache=True)
    a = rows.allocate()
    assert rows.take(a, 4) == [0, 1, 2, 3]
    rows.free(a, [5, 6, 7, 8])  # its four committed tokens stay cached
    assert (rows.num_free_tokens, rows.num_cached_tokens, rows.num_prefix_cached_tokens) == \
        (8, 0, 4)
    b = rows.allocate()
    assert rows.cached_prefix([5, 6, 7, 9]) == (3, 3)
    assert rows.attach(b, [5, 6, 7]) == [0, 1, 2] and rows.num_shared(b) == 3
    assert rows.run_start(b) == 0 and rows.num_free_tokens == 5  # row 3 still evictable
    assert rows.take(b, 2) == [4, 5]
    rows.truncate(b, 3)  # a rollback to the shared prefix frees b's own rows only
    assert rows.rows(b) == [0, 1, 2] and rows.num_free_tokens == 5
    # below it: no shared row is freed; the slot shares one row, and its lock stays on the node
    # of [5 6 7] that holds it (locks are per node: rows 1, 2 stay locked)
    rows.truncate(b, 1)
    assert rows.num_shared(b) == 1 and rows.rows(b) == [0] and rows.num_free_tokens == 5
    assert rows.cache.num_rows == 4
    with pytest.raises(ValueError, match="keep_path"):
        rows.keep_paths([(b, 0, [0])])  # (a tree never starts inside a shared prefix)
    rows.free(b)  # (two nodes: [5 6 7], split off by the attach, and [8])
    assert rows.num_free_tokens == 8 and refs(rows.cache) == [0, 0]


def test_take_evicts_cached_rows_when_the_free_list_runs_short():
    rows = SlotRows(max_num_seqs=2, max_num_tokens=4, table_width=5, prefix_cache=True)
    a = rows.allocate()
    rows.take(a, 3)
    rows.free(a, [1, 2, 3])
    b = rows.allocate()
    assert rows.num_free_tokens == 4
    assert sorted(rows.take(b, 4)) == [0, 1, 2, 3]  # the whole cached path evicted
    assert rows.cache.num_rows == 0 and rows.num_free_tokens == 0


def test_a_slot_freed_after_sharing_adds_only_its_new_tokens():
    rows = SlotRows(max_num_seqs=2, max_num_tokens=8, table_width=9, prefix_cache=True)
    a = rows.allocate()
    rows.take(a, 2)
    rows.free(a, [1, 2])
    b = rows.allocate()
    rows.attach(b, [1, 2])
    rows.take(b, 2)  # rows 2, 3 for tokens 3, 4
    rows.free(b, [1, 2, 3, 4])
    assert rows.cache.num_rows == 4 and rows.cached_prefix([1, 2, 3, 4, 5]) == (4, 4)
    assert rows.num_free_tokens == 8 and refs(rows.cache) == [0, 0]


@pytest.mark.parametrize("cut", [1, 2, 63, 64, 65, 129, 199])
def test_match_finds_the_first_difference_inside_a_long_edge(cut):
    """One cached edge of 200 tokens 1000..1199; a context that follows it for ``cut`` tokens,
    then differs (token 7 is not among them), matches exactly ``cut``."""
    cache = RadixCache()
    cache.insert(list(range(1000, 1200)), list(range(200)))
    assert cache.match(list(range(1000, 1000 + cut)) + [7, 7]) == (cut, cut)
