"""Which KV-pool rows hold each slot's cached tokens: the runner's host-side bookkeeping.

A *slot* is one sequence's place in the KV cache (a row of the device slot table,
:mod:`engine.runner.kv_cache`); it owns an ordered list of pool rows, one per cached token, the
row of the token at position ``p`` at index ``p``. Free rows and free slots are stacks handed out
lowest first, so a lone sequence's rows stay one ascending run of the pool through appends and
rollbacks (then the cache reads them as a view). Rollback (:meth:`SlotRows.truncate`) and
freeing only move rows back to the free list: no device work, and the rows in use are the
tokens kept. Nothing here touches the device: :meth:`SlotRows.keep_paths` returns the slot-table
cells to rewrite and the runner writes them.
"""

from __future__ import annotations

from collections.abc import Sequence


class SlotRows:
    """``max_num_seqs`` slots over a pool of ``max_num_tokens`` rows; ``table_width``: the slot
    table's columns (``max_model_len + 1``), for the cells :meth:`keep_paths` returns."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, table_width: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_tokens = max_num_tokens
        self.table_width = table_width
        self._free_rows: list[int] = list(range(max_num_tokens - 1, -1, -1))
        self._free_slots: list[int] = list(range(max_num_seqs - 1, -1, -1))
        self._rows: dict[int, list[int]] = {}  # slot -> pool row of each cached token
        self._ascending: dict[int, bool] = {}  # slot -> its rows are one ascending run

    @property
    def num_free_tokens(self) -> int:
        return len(self._free_rows)

    @property
    def num_cached_tokens(self) -> int:
        return self.max_num_tokens - len(self._free_rows)

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

    def free(self, slot: int) -> None:
        """Release the slot and all its cached tokens."""
        self._free_rows.extend(reversed(self.rows(slot)))
        del self._rows[slot], self._ascending[slot]
        self._free_slots.append(slot)

    def rows(self, slot: int) -> list[int]:
        """The slot's pool rows, position order (the list itself); ValueError if not allocated."""
        rows = self._rows.get(slot)
        if rows is None:
            raise ValueError(f"slot {slot!r} is not allocated (allocated: {sorted(self._rows)})")
        return rows

    def take(self, slot: int, n: int) -> list[int]:
        """Append ``n`` free rows to the slot (the caller checked that they are free); returns
        them, ascending while the pool is unfragmented."""
        rows = self._free_rows[-n:][::-1]
        del self._free_rows[-n:]
        held = self._rows[slot]
        self._ascending[slot] = self._ascending[slot] and rows == list(
            range(held[-1] + 1 if held else rows[0], rows[-1] + 1))
        held.extend(rows)
        return rows

    def run_start(self, slot: int) -> int | None:
        """The slot's first pool row when its rows are one ascending run, else None."""
        return self._rows[slot][0] if self._ascending[slot] and self._rows[slot] else None

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of the slot; the rest is forgotten."""
        rows = self.rows(slot)
        if not isinstance(length, int) or not 0 <= length <= len(rows):
            raise ValueError(f"length must be an int in [0, {len(rows)}] for slot {slot}, "
                             f"got {length!r}")
        self._free_rows.extend(reversed(rows[length:]))  # the lowest row is handed out first
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
            if (not isinstance(first, int) or not 0 <= first <= len(rows)
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
            nodes = rows[first:]
            kept = [nodes[j] for j in path]
            chosen = set(path)
            rows[first:] = kept + [r for j, r in enumerate(nodes) if j not in chosen]
            self._ascending[slot] = False
            start = slot * self.table_width + first
            cells += range(start, start + len(kept))
            moved += kept
        return cells, moved
