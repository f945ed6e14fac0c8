"""N-gram prompt lookup: guess that the text continues the way it did after an earlier occurrence.

Rule (for one request with context ``t[0..L-1]`` = prompt + output so far and ``k`` tokens wanted):

1. For ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``, take the suffix
   ``t[L-n..L-1]`` and look for an *earlier* occurrence of it, one that is followed by at least one
   token of the context. The first ``n`` that has one wins (longer matches are more specific).
2. Among several earlier occurrences of that suffix, the **most recent** one wins (recent text is
   the likeliest to be copied next, and it is what an incremental index keeps in O(1)).
3. Propose the ``k`` tokens that followed it. When the context ends first, the occurrence
   overlaps the suffix: the text is repeating with period ``P = L - f`` (``f``: the position
   after the occurrence), and the drafts go on repeating it, ``d[j] = t[f + j mod P]`` (an
   overlapping copy, as in LZ77). No match for any ``n`` (or ``k == 0``) gives no drafts.

Worked example, ``prompt_lookup_min=1``, ``prompt_lookup_max=3``::

    position  0  1  2  3  4  5  6  7  8
    token     5  7  9  2  7  9  4  7  9

- ``n=3``: suffix ``[4, 7, 9]`` has no earlier occurrence.
- ``n=2``: suffix ``[7, 9]`` occurs at 1-2 (followed by ``2 7 9 ...``) and at 4-5 (followed by
  ``4 7 9``). The most recent, 4-5, wins: with ``k=2`` the drafts are ``[4, 7]``; with ``k=5``
  only three tokens follow before the context ends, so the period-3 repetition goes on:
  ``[4, 7, 9, 4, 7]``. In a loop such as ``... x x x`` the most recent ``[x, x]`` ends one token
  before the suffix does (``P = 1``), and the drafts are ``[x] * k``.

Cost: one hash table for the whole batch (:mod:`proposers.ngram_table`) maps each n-gram of
each request to the position after its most recent occurrence (one entry per position and ``n``),
and the proposer keeps its own copy of every context as a numpy array. A step reads only the
tokens that arrived since the previous step (and the last one before them, to check that the
context still starts the same), hashes the n-grams they complete and every request's suffixes,
stores the former and looks up the latter, and gathers the drafts from its copy: a fixed number of
numpy operations for the whole batch, and no Python loop over requests (the per-request reads run
in C through ``map``). No position of a context is looked at twice, except when the table fills:
then a table twice as large is built from the copies in one vectorised pass. Keys are 64-bit
hashes and the table compares 31 bits of them; two different n-grams pass for one with
probability about ``2**-31`` per slot probed, which could only cost a wrong guess (verification
rejects it), never a wrong output.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter, getitem

import numpy as np

from proposers.base import Proposal, Proposer, ProposeRequest
from proposers.ngram_table import MAX_N, MAX_VALUE, NgramTable, ngram_keys

_TOKEN_IDS = attrgetter("token_ids")
_REQ_ID = attrgetter("req_id")
_NUM_SPEC = attrgetter("num_spec_tokens")


class NgramProposer(Proposer):
    """Prompt lookup decoding (one-hot drafts, no probabilities); see the module docstring."""

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4,
                 table_capacity: int = 1 << 16) -> None:
        for name, value in (("prompt_lookup_min", prompt_lookup_min),
                            ("prompt_lookup_max", prompt_lookup_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
        if not prompt_lookup_min <= prompt_lookup_max <= MAX_N:
            raise ValueError(f"prompt_lookup_max={prompt_lookup_max} is invalid: allowed "
                             f"[prompt_lookup_min={prompt_lookup_min}, {MAX_N}]")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self._sizes = list(range(prompt_lookup_max, prompt_lookup_min - 1, -1))  # longest first
        self._table = NgramTable(table_capacity)
        # Per request slot: tokens indexed, life id in the table (0: slot free), and a copy of the
        # context whose column c holds token + 1 at position c - max_n (0 = PAD before position 0;
        # the hash takes token + 1).
        self._length = np.zeros(0, dtype=np.int64)  # [num_slots]
        self._life = np.zeros(0, dtype=np.int64)  # [num_slots]
        self._tokens = np.zeros((0, 2 * prompt_lookup_max), dtype=np.int64)  # [slots, width]
        self._slot_of: dict[str | int, int] = {}
        self._free: list[int] = []
        self._next_life = 1

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        if not requests:
            return Proposal([], None)
        batch = len(requests)
        contexts = list(map(_TOKEN_IDS, requests))
        length = np.fromiter(map(len, contexts), np.int64, batch)  # [batch_size]
        slots = np.fromiter(map(self._slot_of.get, map(_REQ_ID, requests), repeat(-1)),
                            np.int64, batch)  # [batch_size]
        if (slots < 0).any():
            slots = self._add_slots(requests, slots)
        old = self._length[slots]  # [batch_size]
        if (old > length).any():  # shorter than what was indexed: not the same context
            self._restart(slots[old > length])
            return self.propose(requests)
        if length.max() + self.prompt_lookup_max > self._tokens.shape[1]:
            self._widen(int(length.max()))

        # Read each context from its last indexed token (all of a fresh one) into the copy.
        begin = np.maximum(old - 1, 0)  # [batch_size]
        read = length - begin  # [batch_size]
        flat = np.fromiter(chain.from_iterable(map(getitem, contexts, map(
            slice, begin.tolist(), repeat(None)))), np.int64, int(read.sum()))  # [num_read]
        flat += 1  # stored as token + 1
        last = np.cumsum(read) - 1  # [batch_size]: each request's last token in `flat`
        copy = self._tokens.reshape(-1)  # [num_slots * width], a view
        row_base = slots * self._tokens.shape[1] + self.prompt_lookup_max  # [batch_size]
        at = np.repeat(row_base + begin - last - 1 + read, read) + np.arange(len(flat))
        # A request's context only grows while it lives (remove() resets it on preemption); one
        # whose last indexed token changed is indexed from scratch.
        changed = (old > 0) & (flat[last + 1 - read] != copy[row_base + old - 1])
        if changed.any():
            self._restart(slots[changed])
            return self.propose(requests)
        copy[at] = flat  # at [num_read]: where each token read goes in the copy
        self._length[slots] = length

        # Each token read ends n-grams (one key per n). A request's last token ends the n-grams
        # to look up; each other one ends n-grams to store, followed by the next token (the
        # value is the follower's index in the copy, so the drafts are read from there).
        keys = ngram_keys(copy, at, np.repeat(self._life[slots], read), self._sizes)
        stored = np.ones(len(flat), dtype=bool)  # [num_read]
        stored[last] = False
        stored = np.flatnonzero(stored)  # [num_stored]
        self._store(keys.take(stored, axis=1), at.take(stored) + 1)  # keys [num_sizes, num_read]
        found = self._table.get(keys.take(last, axis=1).ravel()).reshape(len(self._sizes), batch)
        has = found >= 0  # [num_sizes, batch_size]
        first = found[has.argmax(axis=0), np.arange(batch)]  # longest n that matched
        end = row_base + length  # [batch_size]
        first = np.where(has.any(axis=0), first, end)  # [batch_size], end = no drafts
        k = np.fromiter(map(_NUM_SPEC, requests), np.int64, batch)  # [batch_size]
        take = np.where(first < end, k, 0)  # [batch_size], drafts per request
        width_k = int(take.max())
        if width_k == 0:
            return Proposal([[] for _ in range(batch)], None)
        period = np.maximum(end - first, 1)[:, None]  # [batch_size, 1]
        drafts = (copy[first[:, None] + np.arange(width_k) % period] - 1).tolist()
        for i in np.flatnonzero(take < width_k).tolist():
            del drafts[i][take[i]:]
        return Proposal(drafts, None)

    def _store(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Put ``keys [num_sizes, num_stored] -> values [num_stored]``; when the table is full,
        index every live request again (from the copies, this step's tokens included) into a
        new one. Life ids stay, so keys computed before a rebuild stay valid."""
        if self._table.needs_room(keys.size):
            self._rebuild(self._table.capacity)
        elif not self._table.put(keys, values):  # a crowded window
            self._rebuild(2 * self._table.capacity)

    def _rebuild(self, capacity: int) -> None:
        """A table of at least ``capacity`` slots, an eighth full or less, holding every live
        request's n-grams that have a follower (they end at positions 0 .. length - 2)."""
        live = np.flatnonzero(self._life > 0)  # [num_live]
        count = np.maximum(self._length[live] - 1, 0)  # [num_live]
        while capacity < 8 * len(self._sizes) * int(count.sum()):
            capacity *= 2
        at = np.arange(count.sum()) + np.repeat(  # [num_ends]: where each end is in the copy
            live * self._tokens.shape[1] + self.prompt_lookup_max - (np.cumsum(count) - count),
            count)
        keys = ngram_keys(self._tokens.reshape(-1), at, np.repeat(self._life[live], count),
                          self._sizes)  # [num_sizes, num_ends]
        self._table = NgramTable(capacity, self._table.window)
        while not self._table.put(keys, at + 1):
            self._table = NgramTable(2 * self._table.capacity, self._table.window)

    def _widen(self, length: int) -> None:
        """Make the copies hold contexts of ``length`` tokens (doubling the width), and index
        them again: the table's values are indices into the copies."""
        width = self._tokens.shape[1]
        while width < length + self.prompt_lookup_max:
            width *= 2
        self._check_size(len(self._tokens), width)
        wider = np.zeros((len(self._tokens), width), dtype=np.int64)
        wider[:, :self._tokens.shape[1]] = self._tokens
        self._tokens = wider
        self._rebuild(self._table.capacity)

    def _check_size(self, num_slots: int, width: int) -> None:
        """The table's values index the copies: ``num_slots * width`` must fit in 32 bits."""
        if num_slots * width > MAX_VALUE:
            raise ValueError(f"{num_slots} requests with contexts of up to {width} tokens are too "
                             f"many for the n-gram proposer: allowed num_requests * context "
                             f"length <= {MAX_VALUE}")

    def _add_slots(self, requests: Sequence[ProposeRequest], slots: np.ndarray) -> np.ndarray:
        """Give each request without a slot a fresh one (nothing indexed, a new life id)."""
        slots = slots.copy()
        for i in np.flatnonzero(slots < 0).tolist():
            req_id = requests[i].req_id
            slot = self._slot_of.get(req_id)  # the same id twice in one batch: one slot
            if slot is None:
                if not self._free:
                    num_slots = len(self._length)
                    grown = max(16, 2 * num_slots)
                    self._check_size(grown, self._tokens.shape[1])
                    self._free = list(range(grown - 1, num_slots - 1, -1))
                    self._length = np.resize(self._length, grown)
                    self._life = np.resize(self._life, grown)
                    self._life[num_slots:] = 0
                    self._tokens = np.concatenate([self._tokens, np.zeros(
                        (grown - num_slots, self._tokens.shape[1]), np.int64)])
                slot = self._slot_of[req_id] = self._free.pop()
                self._reset(slot)
            slots[i] = slot
        return slots

    def _reset(self, slot: int) -> None:
        """Nothing indexed under a new life id (the old one's entries are never asked again)."""
        self._length[slot] = 0
        self._life[slot] = self._next_life
        self._next_life += 1

    def _restart(self, slots: np.ndarray) -> None:
        """Index the requests in ``slots`` from scratch."""
        for slot in slots.tolist():
            self._reset(slot)

    def remove(self, req_id: str | int) -> None:
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._length[slot] = self._life[slot] = 0
            self._free.append(slot)
