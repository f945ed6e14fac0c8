"""The n-gram index of :mod:`proposers.ngram`: hashed keys and a vectorised hash table in numpy.

*Keys.* A *row* is one position ``p`` of one request's context; its n-grams are the ones ending at
``p - 1``. The key of an n-gram is a 64-bit hash of its tokens, of ``n`` and of the request's
``life`` id (a fresh number each time a request is indexed from scratch), so keys of different
sizes or requests do not meet. All rows of a step are hashed at once: a polynomial hash
``sum_i (t[p-1-i] + 1) * P**i mod 2**64`` for every ``n`` (one running sum), salted, then
multiplies and xor-shifts so that every bit of the key depends on every bit of the sum.

*Table.* Open addressing with linear probing in one array of 8-byte slots. A key's low bits pick
its *home* slot ``key mod capacity``; its high 32 bits, the *tag* (lowest bit forced to 1, so no
slot in use reads 0), are stored beside a 32-bit value: ``tag << 32 | value``. Slots are compared
by tag, so two different keys pass for one when they meet in a probe window with equal tags:
about once in ``2**31`` foreign slots probed. That can only cost a wrong guess (verification
rejects it), never a wrong output, and it halves the table against storing whole keys. The table
keeps no keys, so it cannot rehash itself: when it fills, the proposer builds a new one from its
copies of the contexts (:meth:`NgramTable.needs_room`, and :meth:`NgramTable.put` returns False
when a window is full).

A key lives within ``window`` slots of its home slot. A batch of lookups or inserts probes one
slot per key left in each round: kept between an eighth and a quarter full, the table settles
about nine keys in ten at their home slot and almost all within three, so a batch costs a few
rounds of a dozen numpy calls each (and 32 to 64 bytes of table per key).
Storing the same key again overwrites its value, and within one batch a later duplicate wins, so
the value kept is the last position stored.
"""

from __future__ import annotations

import numpy as np

EMPTY = 0  # an empty slot; a slot in use holds a nonzero tag
MAX_VALUE = (1 << 32) - 1  # values are stored in the low 32 bits of a slot
_TAG_MASK = ~MAX_VALUE  # the high half of a slot or key: the tag
_TAG_BIT = 1 << 32  # forced into every tag: a slot in use is never EMPTY

_P = 0x100000001B3
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_SHIFTS = (np.uint64(29), np.uint64(32))
# Wrapping int64 constants (numpy's int64 array arithmetic wraps like uint64): P**i and the salt
# of each size n (index n - 1), for n up to MAX_N.
MAX_N = 64
_POWERS = np.array([_P ** i % (1 << 64) for i in range(MAX_N)], np.uint64).view(np.int64)
_SIZE_SALTS = np.array([0xD6E8FEB86659FD93 * n % (1 << 64) for n in range(1, MAX_N + 1)],
                       np.uint64).view(np.int64)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15).view(np.int64)


def ngram_keys(tokens: np.ndarray, ends: np.ndarray, lives: np.ndarray,
               sizes: list[int]) -> np.ndarray:
    """Hashed keys of the n-grams ending at flat index ``ends[r]`` of ``tokens``, for each n.

    ``tokens [num_flat]`` int64 holding *token + 1* (0 for PAD); ``ends [num_rows]`` int64, each
    >= ``max(sizes) - 1``; ``lives [num_rows]`` int64; ``sizes`` consecutive, longest first.
    Returns ``[len(sizes), num_rows]`` int64 keys, 64 hashed bits each (one row per size:
    column-wise numpy work on a few long rows, not many rows of length n).
    """
    max_n, num_sizes = sizes[0], len(sizes)
    if max_n > MAX_N:
        raise ValueError(f"n-gram size {max_n} is invalid: allowed <= {MAX_N}")
    salted = lives * _GOLDEN  # [num_rows]
    x = np.empty((num_sizes, len(ends)), dtype=np.int64)  # [num_sizes, num_rows]
    poly = tokens[ends]  # [num_rows]: the hash of the 1-gram ending at `ends`
    for i in range(max_n):  # then of the (i + 1)-gram
        if i:
            poly += tokens[ends - i] * _POWERS[i]
        if i + 1 >= sizes[-1]:  # a size asked for: its row (longest first)
            np.add(poly, salted + _SIZE_SALTS[i], out=x[max_n - 1 - i])
    x = x.view(np.uint64)
    for shift in _SHIFTS:  # odd multiplies and xor-shifts: bijections
        x *= _MIX
        x ^= x >> shift
    return x.view(np.int64)


class NgramTable:
    """Hash table ``key (64-bit int) -> value (0..MAX_VALUE)``, vectorised batch put and get.

    It never grows by itself: the owner checks :meth:`needs_room` before a put, and builds a
    larger table when that is true or when :meth:`put` returns False.
    """

    def __init__(self, capacity: int = 1 << 16, window: int = 16) -> None:
        if window < 1:
            raise ValueError(f"window={window} is invalid: allowed >= 1")
        if capacity & (capacity - 1) or capacity < window:
            raise ValueError(f"capacity={capacity} is invalid: allowed a power of two >= "
                             f"window={window}")
        self.window, self.capacity = window, capacity
        self.size = 0  # occupied slots (an upper bound: racing and duplicate keys overcount)
        # The window of the last home slot runs past `capacity`: pad instead of wrapping.
        self.slots = np.zeros(capacity + window, dtype=np.int64)  # [capacity + window]

    def needs_room(self, incoming: int) -> bool:
        """Whether ``incoming`` more keys would fill the table past a quarter."""
        return self.size + incoming > self.capacity // 4

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Values of ``keys [num_keys]`` int64 (-1 where absent)."""
        out = np.full(len(keys), -1, dtype=np.int64)  # [num_keys]
        tags = (keys & _TAG_MASK) | _TAG_BIT  # [num_keys]
        rows, slot = np.arange(len(keys)), keys & (self.capacity - 1)  # [num_keys] each
        for _ in range(self.window):  # probe one slot per key left
            seen = self.slots.take(slot)  # [num_left]
            other = ((seen ^ tags) & _TAG_MASK) != 0  # [num_left]
            hit = np.flatnonzero(~other)
            out[rows.take(hit)] = seen.take(hit) & MAX_VALUE
            left = np.flatnonzero(other & (seen != EMPTY))  # an empty slot ends the search
            if not len(left):
                break
            rows, slot, tags = rows.take(left), slot.take(left) + 1, tags.take(left)
        return out

    def put(self, keys: np.ndarray, values: np.ndarray) -> bool:
        """Store ``keys -> values``; later duplicates (in row-major order) win.

        ``keys [num_keys]`` or ``[num_rows, num_keys]`` int64 (then ``values [num_keys]`` applies
        to every row), values in ``0..MAX_VALUE``. False when a key found its whole window taken
        by other keys: some keys are then missing, and the table must be rebuilt larger.
        """
        words = ((keys & _TAG_MASK) | _TAG_BIT | values).ravel()  # [num_keys]: tag | value
        return self._put(words, (keys & (self.capacity - 1)).ravel())

    def _put(self, words: np.ndarray, home: np.ndarray) -> bool:
        """Write each of ``words [num_keys]`` (tag | value) to the first slot from its ``home``
        that holds its tag or is empty.

        Probes one slot per key left per round. Different tags may race for one empty slot:
        the last writer wins, and the losers, found when all are written, go again (behind a
        different key, so their own is not behind it). Equal tags share their fate, and the
        later one writes last.
        """
        rows, slot = np.arange(len(words)), home  # [num_left] each: keys left, their next slot
        written = []  # (rows, slots) of each round's writes
        for _ in range(self.window):
            seen = self.slots.take(slot)  # [num_left]
            empty = seen == EMPTY
            self.size += int(np.count_nonzero(empty))
            mine = empty | (((seen ^ words.take(rows)) & _TAG_MASK) == 0)  # [num_left]
            done = np.flatnonzero(mine)
            written.append((rows.take(done), slot.take(done)))
            self.slots[written[-1][1]] = words.take(written[-1][0])
            left = np.flatnonzero(~mine)
            if not len(left):
                break
            rows, slot = rows.take(left), slot.take(left) + 1
        else:
            return False
        rows, slot = (np.concatenate(parts) for parts in zip(*written, strict=True))
        lost = np.flatnonzero(((self.slots.take(slot) ^ words.take(rows)) & _TAG_MASK) != 0)
        if len(lost):  # in row order, so that a later duplicate still writes last
            lost = np.sort(rows.take(lost))
            return self._put(words.take(lost), home.take(lost))
        return True
