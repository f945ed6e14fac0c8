"""The n-gram index of :mod:`proposers.ngram`: hashed keys and a vectorised hash table in numpy.

*Keys.* A *row* is one position ``p`` of one request's context; its n-grams are the ones ending at
``p - 1``. The key of an n-gram is a 63-bit hash of its tokens, of ``n`` and of the request's
``life`` id (a fresh number each time a request is indexed from scratch), so keys of different
sizes or requests do not meet. All rows of a step are hashed at once: a polynomial hash
``sum_i (t[p-1-i] + 1) * P**i mod 2**64`` for every ``n`` (one cumulative sum), salted, then
a multiply and xor-shift so that the low bits (the home slot) depend on all of them.

*Table.* Open addressing with linear probing in two flat arrays, ``keys`` and ``values``. A key
lives within ``window`` slots of its home slot ``key mod capacity``, so one gather of
``[num_keys, window]`` slots answers any batch of lookups or finds every insert's slot; the
table doubles (and drops the keys of removed requests) when it is half full or a window fills.
Storing the same key again overwrites its value, and within one batch a later duplicate wins, so
the value kept is the last position stored.
"""

from __future__ import annotations

import numpy as np

EMPTY = 0  # an empty slot; hashed keys are >= 1

_P = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SIZE_SALT = np.uint64(0xD6E8FEB86659FD93)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def ngram_keys(tokens: np.ndarray, ends: np.ndarray, lives: np.ndarray,
               sizes: list[int]) -> np.ndarray:
    """Hashed keys of the n-grams ending at flat index ``ends[r]`` of ``tokens``, for each n.

    ``tokens [num_flat]`` int64; ``ends [num_rows]`` and ``lives [num_rows]`` int64. The caller
    only uses the key of size ``n`` where ``n`` tokens exist before ``ends[r] + 1`` in the same
    request (others read tokens of a neighbour and are meaningless). Returns
    ``[num_rows, len(sizes)]`` int64 keys, each >= 1.
    """
    max_n = max(sizes)
    gather = np.maximum(ends[:, None] - np.arange(max_n), 0)  # [num_rows, max_n]
    weights = _P ** np.arange(max_n, dtype=np.uint64)  # [max_n]
    terms = (tokens[gather].astype(np.uint64) + np.uint64(1)) * weights  # [num_rows, max_n]
    poly = np.cumsum(terms, axis=1, dtype=np.uint64)[:, [n - 1 for n in sizes]]
    salt = np.asarray(sizes, dtype=np.uint64) * _SIZE_SALT  # [num_sizes]
    x = poly + lives.astype(np.uint64)[:, None] * _GOLDEN + salt  # [num_rows, num_sizes]
    x *= _MIX  # odd multiplier and xor-shift: a bijection that spreads every bit into the low ones
    x ^= x >> np.uint64(29)
    return (x >> np.uint64(1)).astype(np.int64) | 1


class NgramTable:
    """Hash table ``key (int64 >= 1) -> value (int32)`` with vectorised batch insert and lookup.

    Each entry also records its owner (a request's life id; a key always belongs to the same
    owner, the proposer salts keys with it): after :meth:`drop_owner` its entries are dead, and
    the next rebuild leaves them out.
    """

    def __init__(self, capacity: int = 1 << 16, window: int = 16) -> None:
        if capacity & (capacity - 1) or capacity < window:
            raise ValueError(f"capacity={capacity} is invalid: allowed a power of two >= "
                             f"window={window}")
        self.window = window
        self._probe = np.arange(window)  # [window]
        self._dead_owners: list[int] = []
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0  # occupied slots, live or not
        # The window of the last home slot runs past `capacity`: pad instead of wrapping.
        self.keys = np.zeros(capacity + self.window, dtype=np.int64)  # [capacity + window]
        # Values (context positions) and owners (life ids) fit 31 bits: 16 bytes per slot.
        self.values = np.zeros(capacity + self.window, dtype=np.int32)  # [capacity + window]
        self.owners = np.zeros(capacity + self.window, dtype=np.int32)  # [capacity + window]

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Values of ``keys [num_keys]`` (-1 where absent)."""
        home = keys & (self.capacity - 1)  # [num_keys]
        at_home = self.keys[home]  # [num_keys]
        out = np.where(at_home == keys, self.values[home], -1)  # [num_keys]
        # A key not at its home is further in its window, unless the home is empty.
        rest = np.flatnonzero((at_home != keys) & (at_home != EMPTY))
        if len(rest):
            slots = home[rest, None] + self._probe  # [num_rest, window]
            hit = self.keys[slots] == keys[rest, None]  # [num_rest, window]
            found = self.values[slots[np.arange(len(rest)), hit.argmax(axis=1)]]
            out[rest] = np.where(hit.any(axis=1), found, -1)
        return out

    def drop_owner(self, owner: int) -> None:
        """Forget the entries of ``owner`` (at the next rebuild; its keys are never asked again)."""
        self._dead_owners.append(owner)

    def put(self, keys: np.ndarray, values: np.ndarray, owners: np.ndarray) -> None:
        """Store ``keys -> values`` (all ``[num_keys]``, ``owners`` too); later duplicates win."""
        if self.size + len(keys) > self.capacity // 2:
            self._rebuild(len(keys))
        home = keys & (self.capacity - 1)  # [num_keys]
        seen = self.keys[home]  # [num_keys]
        keys, values, owners = self._claim(home, seen, keys, values, owners)
        while len(keys):  # the rest: the first slot of the window holding the key or empty
            slots = (keys & (self.capacity - 1))[:, None] + self._probe  # [num_keys, window]
            seen = self.keys[slots]  # [num_keys, window]
            usable = (seen == keys[:, None]) | (seen == EMPTY)
            if not usable.any(axis=1).all():  # a crowded window: make room and start over
                self._rebuild(len(keys))
                continue
            rows, first = np.arange(len(keys)), usable.argmax(axis=1)
            keys, values, owners = self._claim(slots[rows, first], seen[rows, first], keys,
                                               values, owners)

    def _claim(self, slot: np.ndarray, seen: np.ndarray, keys: np.ndarray, values: np.ndarray,
               owners: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Write each key whose ``slot`` holds ``seen`` = itself or EMPTY; return the others.

        A key already in its slot keeps its owner (keys are salted by owner) and gets the new
        value. Different keys may race for one empty slot: one wins, the others try again. Equal
        keys share their fate, and the later one writes last.
        """
        done = seen == keys  # [num_keys]
        self.values[slot[done]] = values[done]
        empty = np.flatnonzero(seen == EMPTY)
        if len(empty):
            self.keys[slot[empty]] = keys[empty]
            won = empty[self.keys[slot[empty]] == keys[empty]]
            self.values[slot[won]] = values[won]
            self.owners[slot[won]] = owners[won]
            self.size += len(won)  # duplicates overcount: safe
            done[won] = True
        if done.all():
            return keys[:0], values[:0], owners[:0]
        rest = ~done
        return keys[rest], values[rest], owners[rest]

    def _rebuild(self, incoming: int) -> None:
        """Re-insert the live entries into a table with room for ``incoming`` more."""
        occupied = (self.keys != EMPTY) & ~np.isin(self.owners, self._dead_owners)
        self._dead_owners = []
        keys, values, owners = self.keys[occupied], self.values[occupied], self.owners[occupied]
        capacity = self.capacity
        while (len(keys) + incoming) * 4 > capacity:
            capacity *= 2
        if capacity == self.capacity and self.size - len(keys) < len(keys) // 2:
            capacity *= 2  # few dead entries to drop: a crowded window needs a larger table
        self._allocate(capacity)
        self.put(keys, values, owners)
