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
A step hashes and stores only the n-grams that the tokens arrived since the previous step
complete, and looks up every request's suffixes, in a few numpy operations over the whole batch;
no position of a context is looked at twice. Keys are 63-bit hashes: two different n-grams share
a key with probability about ``2**-63`` per pair, which could only cost a wrong guess
(verification rejects it), never a wrong output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proposers.base import Proposal, Proposer, ProposeRequest
from proposers.ngram_table import NgramTable, ngram_keys


class _NgramState:
    """One request: its life id in the table, and how many of its tokens are indexed."""

    __slots__ = ("life", "length", "last_token")

    def __init__(self, life: int) -> None:
        self.life = life
        self.length = 0
        self.last_token = -1


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
        self._sizes = np.arange(prompt_lookup_max, prompt_lookup_min - 1, -1)  # longest first
        self._table = NgramTable()
        self._states: dict[str | int, _NgramState] = {}
        self._next_life = 1

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        if not requests:
            return Proposal([], None)
        max_n = self.prompt_lookup_max
        tokens: list[int] = []  # per request, the context slice that its new n-grams read
        old_lengths, lengths, offsets, lives = [], [], [], []
        get_state = self._states.get
        for request in requests:
            context = request.token_ids
            length = len(context)
            state = get_state(request.req_id)
            # A request's context only grows while it lives (remove() resets it on preemption);
            # one that got shorter or changed its last indexed token is re-indexed from scratch.
            if state is None or state.length > length or (
                    state.length and context[state.length - 1] != state.last_token):
                state = self._new_state(request.req_id)
            old = state.length
            start = old - max_n if old > max_n else 0
            offsets.append(len(tokens) - start)  # flat index of context position 0
            tokens.extend(context[start:])
            old_lengths.append(old)
            lengths.append(length)
            lives.append(state.life)
            state.length = length
            state.last_token = context[length - 1]
        starts = self._lookup_and_index(np.asarray(tokens, dtype=np.int64), old_lengths, lengths,
                                        offsets, lives)
        drafts = [list(r.token_ids[s:s + r.num_spec_tokens]) if s >= 0 else []
                  for r, s in zip(requests, starts.tolist(), strict=True)]
        return Proposal(drafts, None)

    def _lookup_and_index(self, tokens: np.ndarray, old_lengths: list[int], lengths: list[int],
                          offsets: list[int], lives: list[int]) -> np.ndarray:
        """Store the n-grams completed by the new tokens; return each request's draft start.

        Request ``i`` gets one row per position ``p`` in ``[max(old, 1), L)`` (the n-grams
        ending at ``p - 1``, followed by ``p``) to store, and a last row ``p = L`` (its suffixes)
        to look up. Returns ``[batch_size]`` int64: the position after the chosen occurrence, or
        -1 when no n matches.
        """
        length = np.asarray(lengths, dtype=np.int64)  # [batch_size]
        first = np.maximum(np.asarray(old_lengths, dtype=np.int64), 1)  # [batch_size]
        counts = length + 1 - first  # [batch_size], rows per request
        row_request = np.repeat(np.arange(len(counts)), counts)  # [num_rows]
        row_offset = np.cumsum(counts) - counts  # [batch_size]
        positions = first[row_request] + np.arange(len(row_request)) - row_offset[row_request]
        ends = np.asarray(offsets, dtype=np.int64)[row_request] + positions - 1  # [num_rows]
        row_lives = np.asarray(lives, dtype=np.int64)[row_request]  # [num_rows]
        keys = ngram_keys(tokens, ends, row_lives, self._sizes)  # [num_rows, num_sizes]
        fits = self._sizes[None, :] <= positions[:, None]  # [num_rows, num_sizes]: n <= p

        lookup_rows = row_offset + counts - 1  # [batch_size]
        store = fits.copy()
        store[lookup_rows] = False
        num_sizes = len(self._sizes)
        self._table.put(keys[store], np.repeat(positions, num_sizes)[store.ravel()],
                        np.repeat(row_lives, num_sizes)[store.ravel()])

        found = self._table.get(keys[lookup_rows].ravel()).reshape(-1, num_sizes)
        found[~fits[lookup_rows]] = -1  # [batch_size, num_sizes]
        has = found >= 0
        best = found[np.arange(len(counts)), has.argmax(axis=1)]  # longest n that matched
        return np.where(has.any(axis=1), best, -1)

    def _new_state(self, req_id: str | int) -> _NgramState:
        old = self._states.get(req_id)
        if old is not None:
            self._table.drop_owner(old.life)
        state = self._states[req_id] = _NgramState(self._next_life)
        self._next_life += 1
        return state

    def remove(self, req_id: str | int) -> None:
        state = self._states.pop(req_id, None)
        if state is not None:
            self._table.drop_owner(state.life)
