"""Which KV-pool rows hold each slot's cached tokens: the runner's host-side bookkeeping.

A *slot* is one sequence's place in the KV cache (a row of the device slot table,
:mod:`engine.runner.kv_cache`); it owns an ordered list of pool rows, one per cached token, the
row of the token at position ``p`` at index ``p``. Free rows and free slots are stacks handed out
lowest first, so a lone sequence's rows stay one ascending run of the pool through appends and
rollbacks (then the cache reads them as a view). Rollback (:meth:`SlotRows.truncate`) and
freeing only move rows back to the free list: no device work, and the rows in use are the
tokens kept. Nothing here touches the device: :meth:`SlotRows.keep_paths` returns the slot-table
cells to rewrite and the runner writes them.

A slot fed from chains on the device (``ModelRunner.forward_chains``) may take *spare* rows
(:meth:`SlotRows.extend`): rows past its cached tokens whose slot-table cells already point at
them, the row of position ``len(rows) + i`` at ``spare[i]``. Its next rows come from them first
(no cell to write, and a fed-chains layout that is the step before's again), and its rollbacks
put the rows they cut back in front of them (at most ``MAX_SPARE_ROWS`` kept). Spare rows count
as free: a take that finds too few free rows reclaims every slot's spare rows first (their cells
go stale, which nothing reads: a slot without spare rows points its cells before it writes).

With a prefix cache (:mod:`engine.runner.prefix_cache`) a slot may start with *shared* rows
(:meth:`SlotRows.attach`): the tree's rows of a cached prefix, locked while the slot holds them and
never written or freed by it. A slot freed with the tokens its rows hold gives them to the tree
instead of the free list; rows the tree holds unlocked count as free and are evicted when
:meth:`SlotRows.take` needs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.runner.prefix_cache import Node, RadixCache

EVICT_FRACTION = 64  # an eviction frees at least this share (1 / it) of the pool's rows
MAX_SPARE_ROWS = 32  # the most spare rows a slot keeps (see the module docstring)


class SlotRows:
    """``max_num_seqs`` slots over a pool of ``max_num_tokens`` rows; ``table_width``: the slot
    table's columns (``max_model_len + 1``), for the cells :meth:`keep_paths` returns."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, table_width: int,
                 prefix_cache: bool = False) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_tokens = max_num_tokens
        self.table_width = table_width
        self._free_rows: list[int] = list(range(max_num_tokens - 1, -1, -1))
        self._free_slots: list[int] = list(range(max_num_seqs - 1, -1, -1))
        self._rows: dict[int, list[int]] = {}  # slot -> pool row of each cached token
        self._ascending: dict[int, bool] = {}  # slot -> its rows are one ascending run
        self.cache = RadixCache() if prefix_cache else None
        # slot -> (the cache node its lock holds, how many of its first rows are shared)
        self._shared: dict[int, tuple[Node, int]] = {}
        # slot -> its spare rows, position order (only slots that took some: extend)
        self._spare: dict[int, list[int]] = {}
        self._num_spare = 0

    @property
    def num_free_tokens(self) -> int:
        """Rows a forward may take: free ones, spare ones and those the prefix cache would
        evict."""
        return (len(self._free_rows) + self._num_spare
                + (self.cache.num_evictable if self.cache else 0))

    @property
    def num_cached_tokens(self) -> int:
        """Rows held for live slots (their own and the cached prefixes they lock)."""
        return self.max_num_tokens - self.num_free_tokens

    @property
    def num_prefix_cached_tokens(self) -> int:
        """Rows the prefix cache holds (locked or not)."""
        return self.cache.num_rows if self.cache else 0

    def num_shared(self, slot: int) -> int:
        """The slot's first rows that belong to the prefix cache (never written by it)."""
        shared = self._shared.get(slot)
        return 0 if shared is None else shared[1]

    def cached_prefix(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(the longest cached prefix of ``tokens``, how many of its rows :meth:`attach` would
        take from the free space); (0, 0) without a cache."""
        return self.cache.match(tokens) if self.cache else (0, 0)

    def attach(self, slot: int, tokens: Sequence[int]) -> list[int]:
        """Make the cached rows of ``tokens`` (all cached) the first rows of an empty slot,
        locked until the slot lets them go; returns them."""
        if self.cache is None or self.rows(slot):
            raise ValueError(f"attach: slot {slot} must be empty and the prefix cache on")
        if not tokens:
            return []
        self._free_rows.extend(reversed(self._drop_spare(slot)))  # (they followed no rows)
        rows, node = self.cache.lock(tokens)
        self._rows[slot] = list(rows)
        self._shared[slot] = (node, len(rows))
        self._ascending[slot] = rows == list(range(rows[0], rows[0] + len(rows)))
        return rows

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def allocate(self) -> int:
        """A fresh, empty slot; RuntimeError when all max_num_seqs slots are in use."""
        if not self._free_slots:
            raise RuntimeError(f"all max_num_seqs={self.max_num_seqs} slots are in use")
        slot = self._free_slots.pop()
        self._rows[slot] = []
        self._ascending[slot] = True
        return slot

    def free(self, slot: int, tokens: Sequence[int] | None = None) -> None:
        """Release the slot and all its cached tokens. ``tokens``: what its first rows hold
        (committed tokens only); with a prefix cache those rows join the tree."""
        rows = self.rows(slot)
        node, shared = self._shared.pop(slot, (None, 0))
        if self.cache is not None and tokens is not None:
            n = min(len(tokens), len(rows))
            back = self.cache.insert(tokens[:n], rows[:n]) + rows[max(n, shared):]
        else:
            back = rows[shared:]
        back += self._drop_spare(slot)
        if node is not None:
            self.cache.unlock(node)
        self._free_rows.extend(sorted(back, reverse=True))
        del self._rows[slot], self._ascending[slot]
        self._free_slots.append(slot)

    def rows(self, slot: int) -> list[int]:
        """The slot's pool rows, position order (the list itself); ValueError if not allocated."""
        rows = self._rows.get(slot)
        if rows is None:
            raise ValueError(f"slot {slot!r} is not allocated (allocated: {sorted(self._rows)})")
        return rows

    def take(self, slot: int, n: int) -> list[int]:
        """Append ``n`` free rows to the slot (the caller checked that they are free): its
        spare rows first; returns them, ascending while the pool is unfragmented."""
        spare = self._spare.get(slot)
        if spare:
            rows = spare[:n]
            del spare[:n]
            self._num_spare -= len(rows)
            if len(rows) < n:
                rows += self._cut(n - len(rows))
        else:
            rows = self._cut(n)
        held = self._rows[slot]
        self._ascending[slot] = self._ascending[slot] and rows == list(
            range(held[-1] + 1 if held else rows[0], rows[-1] + 1))
        held.extend(rows)
        return rows

    def _cut(self, n: int, reclaim: bool = True) -> list[int]:
        """The ``n`` lowest free rows, off the free list; when the free rows run short, every
        slot's spare rows come back (``reclaim``), then rows the prefix cache holds unlocked
        are evicted (the caller counted them as free)."""
        if reclaim and n > len(self._free_rows) and self._num_spare:
            self.forget_spare(list(self._spare))
        if n > len(self._free_rows):
            # (in batches of a 64th of the pool at least: an eviction walks the whole tree)
            evicted = self.cache.evict(max(n - len(self._free_rows),
                                           self.max_num_tokens // EVICT_FRACTION))
            self._free_rows.extend(sorted(evicted, reverse=True))
        rows = self._free_rows[-n:][::-1]
        del self._free_rows[-n:]
        return rows

    def take_each(self, slots: Sequence[int]) -> list[int]:
        """One free row appended to each of ``slots`` (the caller checked that they are free),
        what :meth:`take` of one row a slot, in order, gives; returns them (a decode step's
        rows in one cut of the free list)."""
        if len(slots) > self.num_free_tokens:  # (before any change)
            raise RuntimeError(f"no free pool rows for {len(slots)} slots: "
                               f"{self.num_free_tokens} free")
        if self._num_spare and any(self._spare.get(slot) for slot in slots):
            return [self.take(slot, 1)[0] for slot in slots]
        rows: list[int] = []
        while len(rows) < len(slots):  # (the free rows, then evictions as take makes them)
            rows += self._cut(min(len(slots) - len(rows), len(self._free_rows)) or 1)
        for slot, row in zip(slots, rows, strict=True):
            held = self._rows[slot]
            if held and held[-1] + 1 != row:
                self._ascending[slot] = False
            held.append(row)
        return rows

    def extend(self, slots: Sequence[int], ends: Sequence[int], spare: int
               ) -> tuple[list[int], list[int]] | None:
        """Grow each of ``slots`` to ``ends[i]`` cached rows (at most ``table_width - 1``),
        from its spare rows first; where it needs fresh rows it also takes up to ``spare`` more
        as spare rows, while the pool has them past what every slot needs. Returns the
        slot-table cells of the fresh rows and those rows (``(cells, rows)``, for the caller
        to point), or None when the rows do not fit: nothing changed then but that every
        slot's spare rows may be free again."""
        need = self._needs(slots, ends)
        fresh = sum(max(n, 0) for n in need)
        # (free rows short: the idle spare rows come back before any cached prefix is evicted,
        # as in _cut; the loop below cuts without reclaiming)
        if fresh > len(self._free_rows) and self._num_spare:
            self.forget_spare(list(self._spare))
            need = self._needs(slots, ends)
            fresh = sum(max(n, 0) for n in need)
        if fresh > self._fresh_rows():
            return None
        if fresh + spare * sum(n > 0 for n in need) > len(self._free_rows):
            spare = 0  # (the pool is short: no spare rows, nor prefixes evicted for them)
        cells: list[int] = []
        rows: list[int] = []
        width = self.table_width
        for slot, end, n in zip(slots, ends, need, strict=True):
            held = self._rows[slot]
            if n > 0:  # (its spare rows, then fresh ones, and spare ones past them)
                own = self._spare.setdefault(slot, [])
                first = len(held) + len(own)
                taken = self._cut(min(n + spare, width - 1 - first), reclaim=False)
                own += taken
                self._num_spare += len(taken)
                cells += range(slot * width + first, slot * width + first + len(taken))
                rows += taken
            if end > len(held):
                self.take(slot, end - len(held))
        return cells, rows

    def _needs(self, slots: Sequence[int], ends: Sequence[int]) -> list[int]:
        """The fresh rows each slot needs to reach its end (negative: spare rows to spare)."""
        spare = self._spare
        return [end - len(self._rows[slot]) - len(spare.get(slot, ()))
                for slot, end in zip(slots, ends, strict=True)]

    def _fresh_rows(self) -> int:
        """Rows a take can have without reclaiming spare rows: free and evictable ones."""
        return len(self._free_rows) + (self.cache.num_evictable if self.cache else 0)

    def forget_spare(self, slots: Sequence[int]) -> None:
        """Each of ``slots``' spare rows back to the free rows: when the pool runs short, and
        after a step that raised between taking its rows and pointing their slot-table cells
        (the rows its caller's :meth:`truncate` gives back must not pass for spare rows,
        which a later step takes without pointing their cells)."""
        for slot in slots:
            self._free_rows.extend(self._drop_spare(slot))
        self._free_rows.sort(reverse=True)

    def _drop_spare(self, slot: int) -> list[int]:
        """The slot's spare rows, no longer its own."""
        spare = self._spare.pop(slot, [])
        self._num_spare -= len(spare)
        return spare

    def run_start(self, slot: int) -> int | None:
        """The slot's first pool row when its rows are one ascending run, else None."""
        return self._rows[slot][0] if self._ascending[slot] and self._rows[slot] else None

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of the slot; the rest is forgotten."""
        rows = self.rows(slot)
        if not isinstance(length, int) or not 0 <= length <= len(rows):
            raise ValueError(f"length must be an int in [0, {len(rows)}] for slot {slot}, "
                             f"got {length!r}")
        node, shared = self._shared.get(slot, (None, 0))
        if length < shared:  # (cut into the cached prefix: let go of the nodes past length)
            keep = node
            while keep.parent is not None and keep.start >= length:
                keep = keep.parent
            self.cache.unlock(node, keep)
            self._shared[slot] = (keep, length)
            if not length:
                del self._shared[slot]
        cut = rows[max(length, shared):]
        spare = self._spare.get(slot)
        if spare is not None and length >= shared:  # (in front of its spare rows, in order)
            spare[:0] = cut
            self._num_spare += len(cut)
            if len(spare) > MAX_SPARE_ROWS:
                cut = spare[MAX_SPARE_ROWS:]
                del spare[MAX_SPARE_ROWS:]
                self._num_spare -= len(cut)
            else:
                cut = []
        elif spare is not None:  # (a cut into the shared prefix: its spare rows go too)
            cut += self._drop_spare(slot)
        # (the lowest row is handed out first; shared rows stay the cache's)
        self._free_rows.extend(reversed(cut))
        del rows[length:]
        self._ascending[slot] = self._ascending[slot] or not rows

    def keep_paths(self, paths: Sequence[tuple[int, int, Sequence[int]]]
                   ) -> tuple[list[int], list[int]]:
        """After a tree step, for each ``(slot, first, path)``: the nodes ``path`` (node
        indices, root's child first) of the tree the slot caches from column ``first`` on
        become its tokens at columns ``first, first + 1, ...``; the other nodes follow them,
        for :meth:`truncate` to forget. Checks every path before changing anything. Returns
        the slot-table cells that change and the pool rows they must point at (no keys or
        values move)."""
        for slot, first, path in paths:
            rows = self.rows(slot)
            if (not isinstance(first, int) or not self.num_shared(slot) <= first <= len(rows)
                    or len(set(path)) != len(path)
                    or any(not 0 <= j < len(rows) - first for j in path)):
                raise ValueError(f"keep_path: slot {slot} caches {len(rows) - first} tokens "
                                 f"from column {first!r}; path must be distinct indices among "
                                 f"them, got {list(path)}")
        cells: list[int] = []
        moved: list[int] = []
        for slot, first, path in paths:
            if list(path) == list(range(len(path))):
                continue  # (the first nodes already: nothing moves)
            rows = self._rows[slot]
            # (the nodes after the kept ones move, their cells unchanged: spare rows would no
            # longer follow cells that point at them)
            self._free_rows.extend(reversed(self._drop_spare(slot)))
            nodes = rows[first:]
            kept = [nodes[j] for j in path]
            chosen = set(path)
            rows[first:] = kept + [r for j, r in enumerate(nodes) if j not in chosen]
            self._ascending[slot] = False
            start = slot * self.table_width + first
            cells += range(start, start + len(kept))
            moved += kept
        return cells, moved
