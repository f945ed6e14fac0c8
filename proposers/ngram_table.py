"""The n-gram index of :mod:`proposers.ngram`: hashed keys and a vectorised hash table in numpy.

*Keys.* A *row* is one position ``p`` of one request's context; its n-grams are the ones ending
at ``p``. The key of an n-gram is a 64-bit hash of its tokens, of ``n`` and of a salt from the
request's ``life`` id (a fresh number each time a request is indexed from scratch), so keys of
different sizes or requests do not meet: ``sum_d t[p-d] * Q_d`` over the n-gram's tokens
(``Q_d = 2 * P**d * M mod 2**64`` with ``P`` and ``M`` odd: a multiplicative hash of the
polynomial), plus an even salt for the life and an odd one for ``n``, so every key is odd. All
rows and sizes of a step are hashed at once, the n-gram of size ``n`` adding one term to the one
of size ``n - 1``.

*Table.* Open addressing with linear probing in one array of 8-byte slots. A key's high bits pick
its *home* slot (a multiplicative hash is best in its high bits); its low 32 bits, the *tag*
(lowest bit 1, so no slot in use reads 0), are stored beside a 32-bit value: ``tag << 32 |
value``. Slots are compared by tag, so two different keys pass for one when they meet in a probe
window with equal tags: about once in ``2**31`` foreign slots probed. That can only cost a wrong
guess (verification rejects it), never a wrong output, and it halves the table against storing
whole keys. The table keeps no keys, so it cannot rehash itself: when it fills, the proposer
builds a new one from its copies of the contexts (:meth:`NgramTable.needs_room`, and
:meth:`NgramTable.update` returns None when a window is full).

*One operation.* :meth:`NgramTable.update` stores and looks up in one pass: each key keeps the
largest value it was ever given (values are positions, so the largest is the most recent one),
and the call returns every key's value once all of the batch is in. Value 0 means *absent*: a
lookup is an update with value 0, which leaves a key's value as it is, or takes an empty slot
for it holding 0 (the proposer looks up a request's suffixes, and stores them with their
follower at the next step). Because a value only ever grows, the order of the keys in a batch
does not matter.

*Cost.* A key lives within ``window`` slots of its home slot. Kept between an eighth and a quarter
full (an upper bound: most n-grams of a text recur, so it is often much emptier), the table
settles nearly all keys at their home slot. Round one probes the home slot of every key, round
two the next few slots of every key left as one ``[span, num_left]`` gather (mostly the home
slot's cache line), and a rare round three the rest of the window. Two different keys that
claimed one empty slot are found by reading every key's slot back at the end, and the losers go
again (rare). A batch costs about 25 numpy calls, whatever its size.
"""

from __future__ import annotations

import numpy as np

EMPTY = 0  # an empty slot
MAX_VALUE = (1 << 32) - 1  # values are stored in the low 32 bits of a slot
_VALUE_MASK = np.uint64(MAX_VALUE)
_TAG_SHIFT = np.uint64(32)
_TAG_BIT = np.uint64(1 << 32)  # the lowest bit of a tag (1 in every key), as in a word
_NEAR = 4  # round two probes the home slot's window this far first (a cache line, mostly)

MAX_N = 64
_P = 0x100000001B3
_M = 0xBF58476D1CE4E5B9
_BACK = np.arange(MAX_N)[:, None]  # [MAX_N, 1]: how many places before the row's position
# Q_d = 2 * P**d * M (mod 2**64) for the token d places before the row's position (even).
_POWERS = np.array([2 * _P ** d * _M % (1 << 64) for d in range(MAX_N)], np.uint64)[:, None]
# The salt of each size n (index n - 1), n up to MAX_N (odd).
_SIZE_SALTS = np.array([(0xD6E8FEB86659FD93 * n | 1) % (1 << 64) for n in range(1, MAX_N + 1)],
                       np.uint64)[:, None]
_GOLDEN = 0x9E3779B97F4A7C15


def life_salt(life: int) -> int:
    """The salt of the keys of a request indexed under ``life`` (a uint64 value, even)."""
    return 2 * life * _GOLDEN % (1 << 64)


def ngram_keys(tokens: np.ndarray, ends: np.ndarray, salts: np.ndarray, min_n: int,
               max_n: int) -> np.ndarray:
    """Hashed keys of the n-grams ending at flat index ``ends[r]`` of ``tokens``, for ``n`` from
    ``min_n`` to ``max_n``.

    ``tokens [num_flat]`` int64 (PAD -1 before each context); ``ends [num_rows]`` int64, each
    >= ``max_n - 1``; ``salts [num_rows]`` uint64 (:func:`life_salt`). Returns ``[num_sizes,
    num_rows]`` uint64 keys, row ``n - min_n`` for size ``n`` (column-wise numpy work on a few
    long rows, not many rows of length n).
    """
    if not 1 <= min_n <= max_n <= MAX_N:
        raise ValueError(f"n-gram sizes {min_n}..{max_n} are invalid: allowed 1 <= min_n <= "
                         f"max_n <= {MAX_N}")
    keys = tokens.take(ends - _BACK[:max_n]).view(np.uint64)  # [max_n, num_rows]
    keys *= _POWERS[:max_n]
    keys[0] += salts
    for n in range(1, max_n):  # row n - 1 becomes the salted polynomial of the n-gram
        keys[n] += keys[n - 1]
    keys = keys[min_n - 1:]  # [num_sizes, num_rows]
    keys += _SIZE_SALTS[min_n - 1:max_n]
    return keys


class NgramTable:
    """Hash table ``key (odd 64-bit) -> value (1..MAX_VALUE, 0 = absent)``, vectorised update.

    It never grows by itself: the owner checks :meth:`needs_room` before an update, and builds a
    larger table when that is true or when :meth:`update` returns None.
    """

    def __init__(self, capacity: int = 1 << 16, window: int = 16) -> None:
        if window < 1:
            raise ValueError(f"window={window} is invalid: allowed >= 1")
        if capacity & (capacity - 1) or capacity < window:
            raise ValueError(f"capacity={capacity} is invalid: allowed a power of two >= "
                             f"window={window}")
        self.window, self.capacity = window, capacity
        self.size = 0  # occupied slots (an upper bound: racing keys overcount)
        self._home_shift = np.uint64(65 - capacity.bit_length())  # key >> it: the home slot
        # The window of the last home slot runs past `capacity`: pad instead of wrapping.
        self.slots = np.zeros(capacity + window, dtype=np.uint64)  # [capacity + window]
        self._window = np.arange(window)[:, None]  # [window, 1]: a window's offsets

    def needs_room(self, incoming: int) -> bool:
        """Whether ``incoming`` more keys would fill the table past a quarter."""
        return self.size + incoming > self.capacity // 4

    def update(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """Give each key of ``keys`` (odd uint64, any shape) the larger of its value and ``values``
        (int64 in 0..MAX_VALUE, broadcast to ``keys``), and return every key's value once all
        are in (int64, shaped as ``keys``, 0 = absent). None when a key found its whole window
        taken by other keys: some keys are then missing, and the table must be rebuilt larger.
        """
        words = keys << _TAG_SHIFT  # shaped as keys: tag | value
        words |= values.view(np.uint64)
        where = keys >> self._home_shift  # shaped as keys
        stored = self._update(words.reshape(-1), where.reshape(-1).view(np.int64),
                              keys.reshape(-1))
        if stored is None:
            return None
        stored &= _VALUE_MASK
        return stored.view(np.int64).reshape(keys.shape)

    def _update(self, words: np.ndarray, where: np.ndarray, keys: np.ndarray) -> np.ndarray | None:
        """Write each of ``words [num_keys]`` (tag | value) to the first slot from its home slot
        (``where [num_keys]`` int64, overwritten with the slot found; ``keys [num_keys]``) that
        holds its tag or is empty, keeping the larger word, and return what each key's slot
        holds at the end.

        Different tags may claim one empty slot in one round: the largest word stays, and the
        others, found by reading every key's slot back, go again from home (their own tag is
        not behind the winner). Equal keys take the same path and share their slot.
        """
        seen = self.slots.take(where)  # [num_keys]
        # 0 where the slot is empty, or < TAG_BIT where it holds the key's tag: the key stops.
        probe = seen ^ words  # [num_keys]
        np.minimum(probe, seen, out=probe)
        self.size += len(probe) - np.count_nonzero(probe)  # empty slots taken (and exact repeats)
        go_on = probe >= _TAG_BIT  # [num_keys]
        np.maximum.at(self.slots, where, np.where(go_on, EMPTY, words))
        left = go_on.nonzero()[0]  # [num_left]
        if len(left):  # round two: the next few slots of the window at once
            start = where.take(left)  # [num_left]
            mine = words.take(left)  # [num_left]
            offset = self._first_stop(start, mine, _NEAR)  # [num_left]
            if np.count_nonzero(offset) < len(left):  # rare: the rest of the window
                far = (offset == 0).nonzero()[0]
                offset[far] = self._first_stop(start.take(far), mine.take(far), self.window)
                if np.count_nonzero(offset) < len(left):
                    return None
            start += offset
            np.maximum.at(self.slots, start, mine)
            self.size += len(left)
            where[left] = start
        stored = self.slots.take(where)  # [num_keys]
        lost = ((stored ^ words) >= _TAG_BIT).nonzero()[0]  # another tag took the slot
        if len(lost):
            keys = keys.take(lost)
            again = self._update(words.take(lost), (keys >> self._home_shift).view(np.int64),
                                 keys)
            if again is None:
                return None
            stored[lost] = again
        return stored

    def _first_stop(self, home: np.ndarray, words: np.ndarray, span: int) -> np.ndarray:
        """For each of ``words [num_keys]`` whose ``home [num_keys]`` slot holds another tag,
        the offset from home of the first of its next ``span - 1`` slots that is empty or holds
        its tag (``[num_keys]``; 0: none)."""
        seen = self.slots.take(home + self._window[:span])  # [span, num_keys]
        probe = seen ^ words  # [span, num_keys]
        np.minimum(probe, seen, out=probe)
        return (probe < _TAG_BIT).argmax(axis=0)
