"""The n-gram index of :mod:`proposers.ngram`: hashed keys and a vectorised hash table in numpy.

*Keys.* A *row* is one position ``p`` of one request's context; its n-grams are the ones ending at
``p - 1``. The key of an n-gram is a 63-bit hash of its tokens, of ``n`` and of the request's
``life`` id (a fresh number each time a request is indexed from scratch), so keys of different
sizes or requests do not meet. All rows of a step are hashed at once: a polynomial hash
``sum_i (t[p-1-i] + 1) * P**i mod 2**64`` for every ``n`` (one running sum), salted, then
a multiply and xor-shift so that the low bits (the home slot) depend on all of them.

*Table.* Open addressing with linear probing in one array of ``(key, owner << 32 | value)`` slots
(one 16-byte record: a lookup touches one cache line; the records are a structured dtype because
numpy gathers those as whole elements, several times faster than rows of an ``[n, 2]`` array).
A key lives within ``window`` slots of its home slot ``key mod capacity``. A batch of lookups
or inserts probes one slot per key in a few rounds (a quarter to a half full, the table settles
almost every key within three slots), then gathers whole windows for the few others: a fixed
number of numpy calls. The table doubles (and drops the keys of removed requests) when it is
half full or a window fills.
Storing the same key again overwrites its value, and within one batch a later duplicate wins, so
the value kept is the last position stored.
"""

from __future__ import annotations

import numpy as np

EMPTY = 0  # an empty slot's key; hashed keys are >= 1
_VALUE_MASK = (1 << 32) - 1  # the low half of a slot's packed word
_ROUNDS = 3  # probes of one slot per key (most keys settle there) before whole windows
_SLOT = np.dtype([("key", np.int64), ("packed", np.int64)])  # packed: owner << 32 | value

_P = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SIZE_SALT = np.uint64(0xD6E8FEB86659FD93)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def ngram_keys(tokens: np.ndarray, ends: np.ndarray, lives: np.ndarray,
               sizes: list[int]) -> np.ndarray:
    """Hashed keys of the n-grams ending at flat index ``ends[r]`` of ``tokens``, for each n.

    ``tokens [num_flat]`` int64 (>= -1: the hash term of a token ``t`` is ``(t + 1) * P**i``);
    ``ends [num_rows]`` int64, each >= ``max(sizes) - 1``; ``lives [num_rows]`` int64; ``sizes``
    consecutive, longest first. Returns ``[len(sizes), num_rows]`` int64 keys, each >= 1 (one
    row per size: column-wise numpy work on a few long rows, not many rows of length n).
    """
    max_n, num_sizes = sizes[0], len(sizes)
    salted = lives.astype(np.uint64) * _GOLDEN  # [num_rows]
    x = np.empty((num_sizes, len(ends)), dtype=np.uint64)  # [num_sizes, num_rows]
    poly = np.zeros(len(ends), dtype=np.uint64)  # [num_rows]
    for i in range(max_n):  # poly becomes the hash of the (i + 1)-gram ending at `ends`
        term = (tokens[ends - i] + 1).astype(np.uint64)  # [num_rows]
        term *= _P ** np.uint64(i)
        poly += term
        if i + 1 > max_n - num_sizes:  # a size asked for: its row (longest first)
            np.add(poly, salted, out=x[max_n - 1 - i])
    x += (np.asarray(sizes, dtype=np.uint64) * _SIZE_SALT)[:, None]
    x *= _MIX  # odd multiplier and xor-shift: a bijection that spreads every bit into the low ones
    x ^= x >> np.uint64(29)
    x >>= np.uint64(1)
    keys = x.view(np.int64)
    keys |= 1
    return keys


class NgramTable:
    """Hash table ``key (int64 >= 1) -> value (31 bits)`` with vectorised batch insert and lookup.

    Each entry also records its owner (a request's life id, 31 bits; a key always belongs to the
    same owner, the proposer salts keys with it): after :meth:`drop_owner` its entries are dead,
    and the next rebuild leaves them out.
    """

    def __init__(self, capacity: int = 1 << 16, window: int = 16) -> None:
        if window < _ROUNDS:
            raise ValueError(f"window={window} is invalid: allowed >= {_ROUNDS}")
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
        self.slots = np.zeros(capacity + self.window, dtype=_SLOT)  # [capacity + window]
        self._keys, self._packed = self.slots["key"], self.slots["packed"]  # views

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Values of ``keys [num_keys]`` (-1 where absent)."""
        out = np.full(len(keys), -1, dtype=np.int64)  # [num_keys]
        rows, slot = np.arange(len(keys)), keys & (self.capacity - 1)  # [num_keys] each
        for _ in range(_ROUNDS):
            entry = self.slots[slot]  # [num_left]
            hit = entry["key"] == keys[rows]
            out[rows[hit]] = entry["packed"][hit] & _VALUE_MASK
            left = ~hit & (entry["key"] != EMPTY)  # an empty slot ends the search
            if not left.any():
                return out
            rows, slot = rows[left], slot[left] + 1
        home = keys[rows] & (self.capacity - 1)  # [num_left]: the rest, whole windows at once
        hit = self._keys[home[:, None] + self._probe] == keys[rows, None]  # [num_left, window]
        found = self._packed[home + hit.argmax(axis=1)] & _VALUE_MASK  # [num_left]
        out[rows] = np.where(hit.any(axis=1), found, -1)
        return out

    def drop_owner(self, owner: int) -> None:
        """Forget the entries of ``owner`` (at the next rebuild; its keys are never asked again)."""
        self._dead_owners.append(owner)

    def put(self, keys: np.ndarray, values: np.ndarray, owners: np.ndarray) -> None:
        """Store ``keys -> values``; later duplicates (in row-major order) win.

        ``keys [num_keys]`` or ``[num_rows, num_keys]`` (then ``values`` and ``owners``, both
        ``[num_keys]``, apply to every row).
        """
        packed = (owners.astype(np.int64) << 32) | values  # [num_keys]
        if keys.ndim == 2:
            packed = np.tile(packed, len(keys))
        self._put(packed, keys.ravel())

    def _put(self, packed: np.ndarray, keys: np.ndarray) -> None:
        if self.size + len(keys) > self.capacity // 2:
            self._rebuild(len(keys))
        slot = keys & (self.capacity - 1)  # [num_keys]
        for _ in range(_ROUNDS):
            keys, packed, slot = self._claim(slot, self._keys[slot], keys, packed)
            if not len(keys):
                return
            slot = slot + 1
        while len(keys):  # the rest: the first slot of the window holding the key or empty
            slots = (keys & (self.capacity - 1))[:, None] + self._probe  # [num_keys, window]
            seen = self._keys[slots]  # [num_keys, window]
            usable = (seen == keys[:, None]) | (seen == EMPTY)
            if not usable.any(axis=1).all():  # a crowded window: make room, start over
                self._rebuild(len(keys))
                self._put(packed, keys)
                return
            rows, first = np.arange(len(keys)), usable.argmax(axis=1)
            keys, packed, _ = self._claim(slots[rows, first], seen[rows, first], keys, packed)

    def _claim(self, slot: np.ndarray, seen: np.ndarray, keys: np.ndarray,
               packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Write each key whose ``slot`` holds ``seen`` = itself or EMPTY; return the others
        (keys, packed values, slots).

        A key already in its slot gets the new value (its owner is unchanged). Different keys
        may race for one empty slot: one wins, the others try again (further on: the winner is
        a different key, so theirs is not behind it). Equal keys share their fate, and the
        later one writes its value last.
        """
        done = seen == keys  # [num_keys]
        empty = np.flatnonzero(seen == EMPTY)
        if len(empty):
            self._keys[slot[empty]] = keys[empty]
            done[empty] = self._keys[slot[empty]] == keys[empty]
            self.size += len(empty)  # losers and duplicates overcount: safe
        self._packed[slot[done]] = packed[done]
        if done.all():
            return keys[:0], packed[:0], slot[:0]
        left = ~done
        return keys[left], packed[left], slot[left]

    def _rebuild(self, incoming: int) -> None:
        """Re-insert the live entries into a table with room for ``incoming`` more."""
        keys, packed = self._keys, self._packed
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
