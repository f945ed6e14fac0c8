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
4. A match of ``n`` tokens *backs* its first ``n`` drafts (``Proposal.num_backed``): on the
   default model's copy prompts a 1-token match led to 0.42 accepted drafts on average, a
   4-token one to 2.87, so an adaptive engine verifies past ``n`` only where it is free.

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
each request to its most recent occurrence (one entry per position and ``n``: the copy index of
the occurrence's last token), and the proposer keeps its own copy of every context as a numpy
array. A step reads only the tokens that arrived since the previous step (and the last one before
them, to check that the context still starts the same), hashes the n-grams they end, every ``n``
at once as one ``[num_sizes, num_read]`` array, and sends them all to the table in one update:
the n-grams that now have a follower store their occurrence, and each request's suffixes (value
0) read what the table holds once this step's n-grams are in. Drafts are gathered from the copy.
About 70 numpy calls for the whole batch, and no per-request Python logic (per request, only
attribute reads in comprehensions and ``map`` calls that run in C; a step of the same requests as
the previous one reuses its per-request arrays). No position of a context is looked at twice,
except when the table fills: then a table twice as large is built from the copies in one
vectorised pass. Keys are 64-bit hashes and the table compares 31 bits of them; two different
n-grams pass for one with probability about ``2**-31`` per slot probed, which could only cost a
wrong guess (verification rejects it), never a wrong output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import getitem
from typing import Any

import numpy as np
import torch

from proposers.base import Proposal, Proposer, ProposerContext, ProposeRequest
from proposers.ngram_device import DeviceNgramIndex
from proposers.ngram_table import MAX_N, MAX_VALUE, NgramTable, life_salt, ngram_keys
from proposers.registry import register_proposer

PAD = -1  # the copies' token before position 0


class _TailSlices(dict):
    """``slice(-r, None)`` by ``r``: the slices of a step's reads, kept (a slice costs more to make
    than to look up, and a step reads the last few tokens of every context)."""

    def __missing__(self, r: int) -> slice:
        tail = slice(-r, None)
        if r <= 64:
            self[r] = tail
        return tail


@dataclass
class _Batch:
    """The requests of the last step, in order, and their per-request arrays. The next step of
    the same requests starts from them; ``tail`` is ahead of the proposer's per-slot positions
    until :meth:`NgramProposer._flush` writes it back."""

    ids: list[str | int]
    slots: np.ndarray  # [batch_size]
    base: np.ndarray  # [batch_size]: the copy index of position 0
    salt: np.ndarray  # [batch_size] uint64: the salt of the request's life
    tail: np.ndarray  # [batch_size]: the copy index of the last token copied


class NgramProposer(Proposer):
    """Prompt lookup decoding (one-hot drafts, no probabilities); see the module docstring."""

    drafts_are_free = True
    observes = True

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4,
                 table_capacity: int = 1 << 16, device: torch.device | None = None,
                 max_len: int = 0, max_rows: int = 8, graphs: bool = False) -> None:
        """``device``, ``max_len`` (the longest context), ``max_rows`` (the requests at once)
        and ``graphs`` (CUDA graphs): also draft on that device, from verification steps still
        there (:mod:`proposers.ngram_device`; None: on the host only)."""
        for name, value in (("prompt_lookup_min", prompt_lookup_min),
                            ("prompt_lookup_max", prompt_lookup_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
        if not prompt_lookup_min <= prompt_lookup_max <= MAX_N:
            raise ValueError(f"prompt_lookup_max={prompt_lookup_max} is invalid: allowed "
                             f"[prompt_lookup_min={prompt_lookup_min}, {MAX_N}]")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self._num_sizes = prompt_lookup_max - prompt_lookup_min + 1
        self._table = NgramTable(table_capacity)
        # Per request slot: the position of the last token copied (-1: slot free; a live request
        # has at least its first one), the salt of its life in the table, and a copy of the
        # context whose column c holds the token at position c - max_n (PAD before position 0).
        self._last = np.zeros(0, dtype=np.int64)  # [num_slots]
        self._salt = np.zeros(0, dtype=np.uint64)  # [num_slots]
        self._tokens = np.zeros((0, 2 * prompt_lookup_max), dtype=np.int64)  # [slots, width]
        self._set_tokens(self._tokens)
        self._slot_of: dict[str | int, int] = {}
        self._free: list[int] = []
        self._next_life = 1
        self._batch: _Batch | None = None
        self._tails = _TailSlices()
        self._ks: list[int] = []  # the last batch's num_spec_tokens, their max and min
        self._max_k = self._min_k = 0
        self._offsets = np.zeros((0, 1), dtype=np.int64)  # [max_k, 1]: 0 .. max_k - 1
        self._count = np.arange(1024)  # 0, 1, 2, .. (a view of its start is 0 .. n - 1)
        self._grow(16)
        self._device = (None if device is None else DeviceNgramIndex(
            prompt_lookup_min, prompt_lookup_max, max_len, device, max_rows, graphs))
        # contexts proposed for on the host since the device index last read them (their
        # tokens go to the device only if a step then drafts there: draft_after)
        self._unsynced: dict[str | int, Sequence[int]] = {}

    @property
    def drafts_on_device(self) -> bool:
        return self._device is not None

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        if not requests:
            return Proposal([], None)
        num_requests, max_n = len(requests), self.prompt_lookup_max
        contexts = [request.token_ids for request in requests]
        if self._device is not None:
            self._unsynced.update(zip([r.req_id for r in requests], contexts, strict=True))
        batch = self._batch_of(requests, contexts)
        length = np.fromiter(map(len, contexts), np.int64, num_requests)  # [batch_size]
        end = batch.base + length  # [batch_size]: the copy index after each context
        read = end - batch.tail  # [batch_size]: tokens to read, from the last one copied
        if np.minimum.reduce(read) < 1:  # shorter than what was copied: not the same context
            self._restart(batch, contexts, read < 1)
            return self.propose(requests)
        if np.maximum.reduce(length) + max_n > self._tokens.shape[1]:
            self._widen(int(np.maximum.reduce(length)))
            return self.propose(requests)

        # Read each context from its last copied token into the copy.
        ends = read.cumsum()  # [batch_size]: each request's end in `flat`
        num_read = int(ends[-1])
        flat = np.fromiter(chain.from_iterable(map(getitem, contexts, map(
            self._tails.__getitem__, read.tolist()))), np.int64, num_read)  # [num_read]
        starts = ends - read  # [batch_size]
        copy = self._copy
        # A request's context only grows while it lives (remove() resets it on preemption); one
        # whose last copied token changed is indexed from scratch.
        changed = flat.take(starts) != copy.take(batch.tail)  # [batch_size]
        if np.count_nonzero(changed):
            self._restart(batch, contexts, changed)
            return self.propose(requests)
        at = (batch.tail - starts).repeat(read)  # [num_read]: where each token read goes
        at += self._counting(num_read)
        copy[at] = flat
        batch.tail = end - 1

        # Each token read ends n-grams (one key per n). A request's last token ends its suffixes,
        # looked up (value 0); each other one ends n-grams that now have a follower, stored with
        # their end's index in the copy (so the drafts are read from the next one on).
        keys = ngram_keys(copy, at, batch.salt.repeat(read), self.prompt_lookup_min,
                          max_n)  # [num_sizes, num_read]
        ends -= 1  # [batch_size]: each request's last token in `flat`
        at[ends] = 0  # [num_read]: the values
        found = self._update(keys, at).take(ends, axis=1)  # [num_sizes, batch_size]
        # The matched length: an n-gram found means its shorter suffixes were found too.
        matched = np.count_nonzero(found, axis=0)  # [batch_size]
        matched += self.prompt_lookup_min - 1
        # An n-gram's occurrence ends an occurrence of its (n-1)-gram suffix too, so the most
        # recent one of a longer suffix is never later: the longest suffix found holds the
        # smallest nonzero value (0 - 1 wraps to the largest uint64, and back: 0 = none).
        found -= 1
        match = np.minimum.reduce(found.view(np.uint64), axis=0).view(np.int64)  # [batch_size]
        match += 1  # the copy index of the end of the occurrence, 0: none

        ks = [request.num_spec_tokens for request in requests]
        if ks != self._ks:
            self._ks, self._max_k, self._min_k = ks, max(ks), min(ks)
            self._offsets = np.arange(self._max_k)[:, None]
        if self._max_k == 0:
            return Proposal([[] for _ in range(num_requests)], None, [0] * num_requests)
        # The period P = L - f (f = the position after the occurrence; no match: dropped below).
        period = batch.tail - match  # [batch_size]
        np.maximum(period, 1, out=period)  # (only a hash collision could give less)
        at = self._offsets % period  # [max_k, batch_size]: d[j] = t[f + j mod P]
        at += match
        drafts = self._copy_next.take(at).T.tolist()
        unmatched = (match == 0).nonzero()[0].tolist()
        # (a step that may start a drafting flight verifies one width for all: where others
        # matched, an unmatched request's row drafts its newest token, which no match backs)
        fill = (self._device is not None and len(unmatched) < num_requests
                and all(request.uniform for request in requests))
        for i in unmatched:
            drafts[i] = [contexts[i][-1]] * self._max_k if fill else []
        if self._min_k < self._max_k:
            for i, k in enumerate(ks):
                del drafts[i][k:]
        backed = list(map(min, map(len, drafts), matched.tolist()))
        for i in unmatched:
            backed[i] = 0
        return Proposal(drafts, None, backed)

    def observe(self, requests: Sequence[ProposeRequest]) -> None:
        """Index the contexts (a proposal of no drafts: the same reads and table update)."""
        self.propose(requests)

    def _counting(self, n: int) -> np.ndarray:
        """``[0, 1, .. n - 1]``, a view of an array kept between steps."""
        if len(self._count) < n:
            self._count = np.arange(2 * n)
        return self._count[:n]

    def _update(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The table's update of ``keys [num_sizes, num_read]`` with ``values [num_read]``;
        when the table is full, index every live request again (from the copies, this step's
        tokens included) into a new one. Salts stay, so keys computed before a rebuild stay
        valid."""
        if self._table.needs_room(keys.size):
            self._rebuild(self._table.capacity)
        found = self._table.update(keys, values)
        while found is None:  # a crowded window
            self._rebuild(2 * self._table.capacity)
            found = self._table.update(keys, values)
        return found

    def _rebuild(self, capacity: int) -> None:
        """A table of at least ``capacity`` slots, an eighth full or less, holding every live
        request's n-grams that have a follower (they end at positions 0 .. last - 1)."""
        self._flush()
        live = np.flatnonzero(self._last >= 0)  # [num_live]
        count = self._last[live]  # [num_live]
        while capacity < 8 * self._num_sizes * int(count.sum()):
            capacity *= 2
        at = np.arange(count.sum()) + np.repeat(  # [num_ends]: where each end is in the copy
            live * self._tokens.shape[1] + self.prompt_lookup_max - (np.cumsum(count) - count),
            count)
        keys = ngram_keys(self._copy, at, np.repeat(self._salt[live], count),
                          self.prompt_lookup_min, self.prompt_lookup_max)  # [num_sizes, num_ends]
        self._table = NgramTable(capacity, self._table.window)
        while self._table.update(keys, at) is None:
            self._table = NgramTable(2 * self._table.capacity, self._table.window)

    def _widen(self, length: int) -> None:
        """Make the copies hold contexts of ``length`` tokens (doubling the width), and index
        them again: the table's values are indices into the copies."""
        self._flush()
        width = self._tokens.shape[1]
        while width < length + self.prompt_lookup_max:
            width *= 2
        self._check_size(len(self._tokens), width)
        wider = np.full((len(self._tokens), width), PAD, dtype=np.int64)
        wider[:, :self._tokens.shape[1]] = self._tokens
        self._set_tokens(wider)
        self._rebuild(self._table.capacity)

    def _set_tokens(self, tokens: np.ndarray) -> None:
        """Make ``tokens [num_slots, width]`` the copies."""
        self._tokens = tokens
        self._copy = tokens.reshape(-1)  # [num_slots * width], a view
        self._copy_next = self._copy[1:]  # [num_slots * width - 1]: _copy_next[i] = _copy[i + 1]

    def _check_size(self, num_slots: int, width: int) -> None:
        """The table's values index the copies: ``num_slots * width`` must fit in 32 bits."""
        if num_slots * width > MAX_VALUE:
            raise ValueError(f"{num_slots} requests with contexts of up to {width} tokens are too "
                             f"many for the n-gram proposer: allowed num_requests * context "
                             f"length <= {MAX_VALUE}")

    def _batch_of(self, requests: Sequence[ProposeRequest],
                  contexts: list[Sequence[int]]) -> _Batch:
        """The last step's batch when these are its requests, else a new one (each new request
        gets a fresh slot with its first token copied)."""
        ids = [request.req_id for request in requests]
        if self._batch is not None and ids == self._batch.ids:
            return self._batch
        self._flush()
        slots = []
        for req_id, context in zip(ids, contexts, strict=True):
            slot = self._slot_of.get(req_id)  # the same id twice in one batch: one slot
            if slot is None:
                slot = self._slot_of[req_id] = self._new_slot()
                self._reset(slot, context[0])
            slots.append(slot)
        slots = np.array(slots, dtype=np.int64)  # [batch_size]
        base = slots * self._tokens.shape[1] + self.prompt_lookup_max  # [batch_size]
        self._batch = _Batch(ids, slots, base, self._salt[slots], base + self._last[slots])
        return self._batch

    def _flush(self) -> None:
        """Write the batch's positions back to the slots, and forget the batch."""
        if self._batch is not None:
            self._last[self._batch.slots] = self._batch.tail - self._batch.base
            self._batch = None

    def _new_slot(self) -> int:
        """A free slot, doubling the number of slots when there is none."""
        if not self._free:
            self._grow(2 * len(self._last))
        return self._free.pop()

    def _grow(self, num_slots: int) -> None:
        """Make room for ``num_slots`` requests (the new slots free)."""
        self._flush()
        old = len(self._last)
        self._check_size(num_slots, self._tokens.shape[1])
        self._free = list(range(num_slots - 1, old - 1, -1))
        self._last = np.concatenate([self._last, np.full(num_slots - old, -1, np.int64)])
        self._salt = np.concatenate([self._salt, np.zeros(num_slots - old, np.uint64)])
        self._set_tokens(np.concatenate([self._tokens, np.full(
            (num_slots - old, self._tokens.shape[1]), PAD, dtype=np.int64)]))

    def _reset(self, slot: int, first_token: int) -> None:
        """Index the slot from scratch under a new life (the old one's entries are never asked
        again): only the context's first token copied."""
        self._flush()
        self._tokens[slot, self.prompt_lookup_max] = first_token
        self._last[slot] = 0
        self._salt[slot] = life_salt(self._next_life)
        self._next_life += 1

    def _restart(self, batch: _Batch, contexts: list[Sequence[int]], which: np.ndarray) -> None:
        """Index the requests where ``which [batch_size]`` is true from scratch."""
        slots = batch.slots.tolist()
        for i in np.flatnonzero(which).tolist():
            self._reset(slots[i], contexts[i][0])

    # ---- drafts on the device (overlapped drafting steps) ---------------------------------------

    def draft_after(self, req_ids: Sequence[str | int], features: torch.Tensor | None,
                    tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int], steps: int) -> torch.Tensor:
        """:meth:`Proposer.draft_after`: the contexts last proposed for on the host go to the
        device first (the step's fed tokens are their last), then the step's tokens, and the
        lookup runs there (:class:`~proposers.ngram_device.DeviceNgramIndex`)."""
        assert self._device is not None, "built without a device"
        pending = [(r, self._unsynced.pop(r)) for r in req_ids if r in self._unsynced]
        if pending:
            self._device.sync([r for r, _ in pending], [c for _, c in pending])
        return self._device.draft_after(req_ids, tokens, accepted, base, steps, max(base_hi))

    def ready_on_device(self, req_id: str | int, num_tokens: int) -> bool:
        """:meth:`Proposer.ready_on_device`: always (:meth:`flush` writes what is missing)."""
        return self._device is not None

    def flush(self, req_ids: Sequence[str | int], contexts: Sequence[Sequence[int]]) -> None:
        """:meth:`Proposer.flush`: the contexts' tokens the device does not hold yet."""
        assert self._device is not None, "built without a device"
        for req_id in req_ids:
            self._unsynced.pop(req_id, None)
        self._device.sync(req_ids, contexts)

    def advance(self, req_id: str | int, length: int, features: torch.Tensor | None, row: int,
                token: int) -> None:
        """:meth:`Proposer.advance`: the device holds the context of ``length + 1`` tokens."""
        if self._device is not None:
            self._device.advance(req_id, length + 1)

    def on_accepted(self, req_id: str | int, num_tokens: int) -> None:
        if self._device is not None:
            self._device.truncate(req_id, num_tokens)

    def remove(self, req_id: str | int) -> None:
        if self._device is not None:
            self._device.remove(req_id)
            self._unsynced.pop(req_id, None)
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._flush()
            self._last[slot] = -1
            self._free.append(slot)


@register_proposer("ngram")
def build_ngram(config: Any, ctx: ProposerContext) -> NgramProposer:
    """``SpeculativeConfig.prompt_lookup_min`` / ``prompt_lookup_max``; drafting on the device
    too where the engine's steps overlap, on CUDA only with CUDA graphs (launched op by op, a
    lookup costs the host more than the synchronous step it replaces: docs/history.md)."""
    on_device = ctx is not None and ctx.overlapped and (
        ctx.cuda_graphs or ctx.device.type != "cuda")
    return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max,
                         device=ctx.device if on_device else None,
                         max_len=0 if ctx is None else ctx.max_model_len,
                         max_rows=8 if ctx is None else ctx.max_num_seqs,
                         graphs=ctx is not None and ctx.cuda_graphs)
