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
_VALUE_MASK = (1 << 32) - 1  # the low half of a slot's second word

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
    """Hash table ``key (int64 >= 1) -> value (31 bits)`` with vectorised batch insert and lookup.

    Each entry also records its owner (a request's life id, 31 bits; a key always belongs to the
    same owner, the proposer salts keys with it): after :meth:`drop_owner` its entries are dead,
    and the next rebuild leaves them out. A slot is one row ``[key, owner << 32 | value]``, so a
    lookup touches one cache line.
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
        self.slots = np.zeros((capacity + self.window, 2), dtype=np.int64)  # [capacity + window, 2]

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Values of ``keys [num_keys]`` (-1 where absent)."""
        home = keys & (self.capacity - 1)  # [num_keys]
        entry = self.slots[home]  # [num_keys, 2]
        out = np.where(entry[:, 0] == keys, entry[:, 1] & _VALUE_MASK, -1)  # [num_keys]
        # A key not at its home is further in its window, unless the home is empty.
        rest = np.flatnonzero((entry[:, 0] != keys) & (entry[:, 0] != EMPTY))
        if len(rest):
            window = self.slots[home[rest, None] + self._probe]  # [num_rest, window, 2]
            hit = window[:, :, 0] == keys[rest, None]  # [num_rest, window]
            found = window[np.arange(len(rest)), hit.argmax(axis=1), 1] & _VALUE_MASK
            out[rest] = np.where(hit.any(axis=1), found, -1)
        return out

    def drop_owner(self, owner: int) -> None:
        """Forget the entries of ``owner`` (at the next rebuild; its keys are never asked again)."""
        self._dead_owners.append(owner)

    def put(self, keys: np.ndarray, values: np.ndarray, owners: np.ndarray) -> None:
        """Store ``keys -> values`` (all ``[num_keys]``, ``owners`` too); later duplicates win."""
        self._put((owners.astype(np.int64) << 32) | values, keys)

    def _put(self, packed: np.ndarray, keys: np.ndarray) -> None:
        if self.size + len(keys) > self.capacity // 2:
            self._rebuild(len(keys))
        home = keys & (self.capacity - 1)  # [num_keys]
        keys, packed = self._claim(home, self.slots[home, 0], keys, packed)
        while len(keys):  # the rest: the first slot of the window holding the key or empty
            slots = (keys & (self.capacity - 1))[:, None] + self._probe  # [num_keys, window]
            seen = self.slots[slots, 0]  # [num_keys, window]
            usable = (seen == keys[:, None]) | (seen == EMPTY)
            if not usable.any(axis=1).all():  # a crowded window: make room and start over
                self._rebuild(len(keys))
                continue
            rows, first = np.arange(len(keys)), usable.argmax(axis=1)
            keys, packed = self._claim(slots[rows, first], seen[rows, first], keys, packed)

    def _claim(self, slot: np.ndarray, seen: np.ndarray, keys: np.ndarray,
               packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write each key whose ``slot`` holds ``seen`` = itself or EMPTY; return the others.

        A key already in its slot gets the new value (its owner is unchanged). Different keys
        may race for one empty slot: one wins, the others try again. Equal keys share their
        fate, and the later one writes last.
        """
        done = seen == keys  # [num_keys]
        self.slots[slot[done], 1] = packed[done]
        empty = np.flatnonzero(seen == EMPTY)
        if len(empty):
            self.slots[slot[empty], 0] = keys[empty]
            won = empty[self.slots[slot[empty], 0] == keys[empty]]
            self.slots[slot[won], 1] = packed[won]
            self.size += len(won)  # duplicates overcount: safe
            done[won] = True
        if done.all():
            return keys[:0], packed[:0]
        rest = ~done
        return keys[rest], packed[rest]

    def _rebuild(self, incoming: int) -> None:
        """Re-insert the live entries into a table with room for ``incoming`` more."""
        keys, packed = self.slots[:, 0], self.slots[:, 1]
        live = (keys != EMPTY) & ~np.isin(packed >> 32, self._dead_owners)
        keys, packed = keys[live], packed[live]
        self._dead_owners = []
        capacity = self.capacity
        while (len(keys) + incoming) * 4 > capacity:
            capacity *= 2
        if capacity == self.capacity and self.size - len(keys) < len(keys) // 2:
            capacity *= 2  # few dead entries to drop: a crowded window needs a larger table
        self._allocate(capacity)
        self._put(packed, keys)
