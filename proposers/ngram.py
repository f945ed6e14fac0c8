"""N-gram prompt lookup: guess that the text continues the way it did after an earlier occurrence.

Rule (for one request with context ``t[0..L-1]`` = prompt + output so far and ``k`` tokens wanted):

1. For ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``, take the suffix
   ``t[L-n..L-1]`` and look for an *earlier* occurrence of it, one that is followed by at least one
   token of the context. The first ``n`` that has one wins (longer matches are more specific).
2. Among several earlier occurrences of that suffix, the **most recent** one wins (recent text is
   the likeliest to be copied next, and it is what an incremental index keeps in O(1)).
3. Propose the tokens that followed it, at most ``k`` of them: fewer when the context ends first.
   No match for any ``n`` (or ``k == 0``) gives no drafts.

Worked example, ``prompt_lookup_min=1``, ``prompt_lookup_max=3``::

    position  0  1  2  3  4  5  6  7  8
    token     5  7  9  2  7  9  4  7  9

- ``n=3``: suffix ``[4, 7, 9]`` has no earlier occurrence.
- ``n=2``: suffix ``[7, 9]`` occurs at 1-2 (followed by ``2 7 9 ...``) and at 4-5 (followed by
  ``4 7 9``). The most recent, 4-5, wins: with ``k=2`` the drafts are ``[4, 7]``; with ``k=5``
  only three tokens follow before the context ends, so the drafts are ``[4, 7, 9]``.

Cost: one hash table for the whole batch (:mod:`proposers.ngram_table`) maps each n-gram of
each request to the position after its most recent occurrence (one entry per position and ``n``).
A step reads only the tokens that arrived since the previous step (plus the ``prompt_lookup_max``
before them), hashes the n-grams they complete and every request's suffixes, stores the former
and looks up the latter: a fixed number of numpy operations for the whole batch, and no Python
loop over requests (the per-request reads and slices run in C through ``map``). No position of a
context is looked at twice. Keys are 63-bit hashes: two different n-grams share a key with
probability about ``2**-63`` per pair, which could only cost a wrong guess (verification rejects
it), never a wrong output.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter, getitem

import numpy as np

from proposers.base import Proposal, Proposer, ProposeRequest
from proposers.ngram_table import NgramTable, ngram_keys

PAD = -1  # stands before a context's first token: an n-gram holding it matches no real one
_TOKEN_IDS = attrgetter("token_ids")
_REQ_ID = attrgetter("req_id")
_NUM_SPEC = attrgetter("num_spec_tokens")


class NgramProposer(Proposer):
    """Prompt lookup decoding (one-hot drafts, no probabilities); see the module docstring."""

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4) -> None:
        for name, value in (("prompt_lookup_min", prompt_lookup_min),
                            ("prompt_lookup_max", prompt_lookup_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
        if prompt_lookup_max < prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max={prompt_lookup_max} is invalid: allowed "
                             f"[prompt_lookup_min={prompt_lookup_min}, inf)")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self._sizes = list(range(prompt_lookup_max, prompt_lookup_min - 1, -1))  # longest first
        self._table = NgramTable()
        # One row per request slot: tokens indexed, life id in the table, the last max_n indexed
        # tokens (PAD before the first); a step reads from the context only the new tokens.
        self._state = np.zeros((0, 2 + prompt_lookup_max), dtype=np.int64)  # [num_slots, 2+max_n]
        self._slot_of: dict[str | int, int] = {}
        self._free: list[int] = []
        self._next_life = 1

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        if not requests:
            return Proposal([], None)
        batch, max_n = len(requests), self.prompt_lookup_max
        contexts = list(map(_TOKEN_IDS, requests))
        length = np.fromiter(map(len, contexts), np.int64, batch)  # [batch_size]
        slots = np.fromiter(map(self._slot_of.get, map(_REQ_ID, requests), repeat(-1)),
                            np.int64, batch)  # [batch_size]
        if (slots < 0).any():
            slots = self._add_slots(requests, slots)
        state = self._state[slots]  # [batch_size, 2 + max_n]
        old, lives, history = state[:, 0], state[:, 1], state[:, 2:]
        if (old > length).any():  # shorter than what was indexed: not the same context
            self._restart(np.flatnonzero(old > length), slots)
            return self.propose(requests)

        # Read each context from its last indexed token (a fresh one: PAD, then all of it),
        # then prepend the max_n - 1 indexed tokens before it: each request's segment of `flat`
        # is its max_n tokens before `old` (PAD where the context has fewer), then the new ones.
        begin = np.maximum(old - 1, 0)  # [batch_size]
        read = length - begin  # [batch_size]
        flat = np.fromiter(chain.from_iterable(map(getitem, contexts, map(
            slice, begin.tolist(), repeat(None)))), np.int64, int(read.sum()))  # [num_read]
        read_start = np.cumsum(read) - read  # [batch_size]
        if (old == 0).any():
            fresh = np.flatnonzero(old == 0)
            flat = np.insert(flat, read_start[fresh], PAD)
            read_start += np.cumsum(old == 0) - (old == 0)
            read[fresh] += 1
        # A request's context only grows while it lives (remove() resets it on preemption);
        # one whose last indexed token changed is re-indexed from scratch.
        if (flat[read_start] != history[:, -1]).any():
            self._restart(np.flatnonzero(flat[read_start] != history[:, -1]), slots)
            return self.propose(requests)
        flat = np.insert(flat, np.repeat(read_start, max_n - 1), history[:, :-1].ravel())
        seg_end = np.cumsum(read + max_n - 1)  # [batch_size], flat index after each segment

        # Store the n-grams ending at positions old - 1 .. length - 2, each followed by the next
        # position; for a new request (old = 0) the first is all PAD and is never asked for.
        count = length - old  # [batch_size]
        ends = np.arange(count.sum()) + np.repeat(seg_end - 1 - np.cumsum(count), count)
        store_lives = np.repeat(lives, count)  # [num_stored]
        follower = ends + 1 - np.repeat(seg_end - length, count)  # [num_stored], position
        keys = ngram_keys(flat, np.concatenate([ends, seg_end - 1]),
                          np.concatenate([store_lives, lives]), self._sizes)
        num_stored = len(ends)  # keys [num_sizes, num_stored + batch_size]
        self._table.put(keys[:, :num_stored], follower, store_lives)
        state[:, 0] = length
        state[:, 2:] = flat[seg_end[:, None] - np.arange(max_n, 0, -1)]
        self._state[slots] = state

        # Look up every suffix (one ending at the last token per n; PAD ones find nothing).
        found = self._table.get(keys[:, num_stored:].ravel()).reshape(len(self._sizes), batch)
        has = found >= 0  # [num_sizes, batch_size]
        first = found[has.argmax(axis=0), np.arange(batch)]  # longest n that matched
        first = np.where(has.any(axis=0), first, length)  # [batch_size], length = no drafts
        k = np.fromiter(map(_NUM_SPEC, requests), np.int64, batch)  # [batch_size]
        stop = np.minimum(first + k, length)  # [batch_size]
        drafts = list(map(getitem, contexts, map(slice, first.tolist(), stop.tolist())))
        if set(map(type, drafts)) != {list}:  # slices of other sequences: copy into lists
            drafts = list(map(list, drafts))
        return Proposal(drafts, None)

    def _add_slots(self, requests: Sequence[ProposeRequest], slots: np.ndarray) -> np.ndarray:
        """Give each request without a slot a fresh one (nothing indexed, a new life id)."""
        slots = slots.copy()
        for i in np.flatnonzero(slots < 0).tolist():
            req_id = requests[i].req_id
            slot = self._slot_of.get(req_id)  # the same id twice in one batch: one slot
            if slot is None:
                if not self._free:
                    grown = max(16, 2 * len(self._state))
                    self._free = list(range(grown - 1, len(self._state) - 1, -1))
                    self._state = np.resize(self._state, (grown, self._state.shape[1]))
                slot = self._slot_of[req_id] = self._free.pop()
                self._reset(slot)
            slots[i] = slot
        return slots

    def _reset(self, slot: int) -> None:
        """Nothing indexed under a new life id."""
        self._state[slot] = PAD
        self._state[slot, :2] = (0, self._next_life)
        self._next_life += 1

    def _restart(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Index the requests at ``rows`` of the batch from scratch."""
        for slot in slots[rows].tolist():
            self._table.drop_owner(int(self._state[slot, 1]))
            self._reset(slot)

    def remove(self, req_id: str | int) -> None:
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._table.drop_owner(int(self._state[slot, 1]))
            self._free.append(slot)
