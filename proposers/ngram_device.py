"""N-gram prompt lookup on the device, for overlapped drafting steps.

Why. An overlapped drafting step is launched before the host reads the step before it
(:mod:`engine.overlap`), so its drafts must be made where that step's verified tokens are: on
the device. The host proposer (:mod:`proposers.ngram`) needs those tokens on the host, which
would put the lookup and a device-to-host wait on every step's critical path.

What. Each request keeps a row of ``history [num_rows, width]`` (int64): the token at every
position of its context (``PAD`` where none was written). :meth:`DeviceNgramIndex.sync` writes a
context's tokens the row does not hold yet, from the host (one copy for the batch);
:meth:`DeviceNgramIndex.draft_after` writes a verification step's tokens (its accepted drafts and
the bonus token, from the device) and drafts the next step from them with
:func:`lookup_ngrams`, the rule of :mod:`proposers.ngram` (the longest suffix of
``prompt_lookup_min .. prompt_lookup_max`` tokens with an earlier occurrence followed by a
token, its most recent occurrence, the tokens after it, repeated with the occurrence's period
where the context ends first). Where no suffix has one, the drafts repeat the newest token: a
step of one width verifies something for every row, and a wrong draft costs only its column.

Cost. The lookup compares every row's ``width`` positions with its suffix once per suffix
length: ``prompt_lookup_max`` comparisons of ``[batch, width]`` and about fifteen other kernels,
no host synchronisation and no shape that depends on the lengths. The hash table of the host
proposer is not needed here: a GPU compares a batch's whole contexts in microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from samplers.metadata import PinnedStaging

PAD = -1  # a history position nothing was written to
_BEFORE = -2  # what a position before the context's start compares as (never a token)
_NO_SUFFIX = -3  # a suffix position before the context's start (never equal to anything)


def lookup_ngrams(history: torch.Tensor, lengths: torch.Tensor, min_n: int, max_n: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts ``[batch, k]`` for contexts ``history[b, :lengths[b]]`` (``history [batch,
    width]`` int64, ``lengths [batch]`` int64 on the same device, each at least 1), and
    ``found [batch]`` bool: whether a suffix of ``min_n .. max_n`` tokens had an earlier
    occurrence followed by a token (else the drafts repeat the newest token).

    ``run[b, j]``: how many tokens ending at position ``j`` equal the context's last ones
    (``history[b, j - i] == history[b, L - 1 - i]`` for ``i = 0, 1, ...``, at most ``max_n``).
    Occurrences must end at ``j <= L - 2`` (a token follows them). The longest run wins, then
    the latest ``j``: one ``max`` of ``run * width + j``."""
    batch, width = history.shape
    device = history.device
    columns = torch.arange(width, device=device)  # [width]
    last = lengths - 1  # [batch]
    back = last[:, None] - torch.arange(max_n, device=device)  # [batch, max_n]
    suffix = torch.where(back >= 0, history.gather(1, back.clamp_min(0)),
                         torch.full_like(back, _NO_SUFFIX))  # [batch, max_n]: newest first
    padded = torch.cat([history.new_full((batch, max_n - 1), _BEFORE), history], 1)
    alive = torch.ones((batch, width), dtype=torch.bool, device=device)
    run = torch.zeros((batch, width), dtype=torch.long, device=device)
    for i in range(max_n):  # (column j of this view: history[b, j - i])
        alive &= padded[:, max_n - 1 - i:max_n - 1 - i + width] == suffix[:, i:i + 1]
        run += alive
    eligible = (run >= min_n) & (columns[None] <= lengths[:, None] - 2)
    best = torch.where(eligible, run * width + columns[None], -1).amax(1)  # [batch]
    found = best >= 0
    follow = best.remainder(width) + 1  # [batch]: the position after the occurrence
    period = (lengths - follow).clamp_min(1)  # [batch]
    steps = torch.arange(k, device=device)
    index = follow[:, None] + steps[None] % period[:, None]  # [batch, k]
    drafts = history.gather(1, index.clamp(0, width - 1))
    newest = history.gather(1, last.clamp_min(0)[:, None]).expand(batch, k)
    return torch.where(found[:, None], drafts, newest), found


class DeviceNgramIndex:
    """The contexts of the requests drafting on the device, a row each (module docstring).
    ``max_len``: the longest context (the engine's ``max_model_len``)."""

    def __init__(self, min_n: int, max_n: int, max_len: int, device: torch.device) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.width = max_len + 2  # (a step's writes past the context land in the last column)
        self.device = device
        self.history = torch.full((0, self.width), PAD, dtype=torch.long, device=device)
        self._row_of: dict[str | int, int] = {}
        self._held: dict[str | int, int] = {}  # tokens of each context its row holds
        self._free: list[int] = []
        self._to_device = PinnedStaging(device)

    def holds(self, req_id: str | int) -> int:
        """How many of the request's context tokens its row holds (0: none, or no row)."""
        return self._held.get(req_id, 0)

    def sync(self, req_ids: Sequence[str | int], contexts: Sequence[Sequence[int]]) -> None:
        """Write each context's tokens its row does not hold yet (one copy for all)."""
        cells: list[int] = []
        tokens: list[int] = []
        for req_id, context in zip(req_ids, contexts, strict=True):
            row, held = self._row(req_id), self._held.get(req_id, 0)
            if len(context) > held:
                cells += range(row * self.width + held, row * self.width + len(context))
                tokens += context[held:]
                self._held[req_id] = len(context)
        if cells:
            flat = self._to_device(np.array([cells, tokens], dtype=np.int64))  # [2, n]
            self.history.view(-1).index_copy_(0, flat[0], flat[1])

    def draft_after(self, req_ids: Sequence[str | int], tokens: torch.Tensor,
                    accepted: torch.Tensor, base: torch.Tensor, k: int) -> torch.Tensor:
        """Drafts ``[batch, k]`` of each request's next step after a verification step on the
        device: ``tokens [batch, width]``: the token verification gave after each position
        ``base[b], base[b] + 1, ...`` (the accepted drafts, then the recovered or bonus token,
        then placeholders), ``accepted [batch]``. Each row must hold the context up to
        ``base[b]`` (:meth:`sync`, or the step before's writes). The tokens past the bonus are
        written too, past the context, where nothing reads them."""
        rows = self._to_device(np.array([self._row(r) for r in req_ids], dtype=np.int64))
        batch, width = tokens.shape
        positions = (base[:, None] + 1 + torch.arange(width, device=tokens.device)).clamp_max(
            self.width - 1)  # [batch, width]
        self.history.view(-1).index_copy_(0, (rows[:, None] * self.width + positions).view(-1),
                                          tokens.reshape(-1))
        lengths = base + accepted + 2  # [batch]: the context now ends with the bonus token
        drafts, _ = lookup_ngrams(self.history.index_select(0, rows), lengths, self.min_n,
                                  self.max_n, k)
        return drafts

    def advance(self, req_id: str | int, length: int) -> None:
        """A step drafted from the device was committed: the row holds the request's context
        of ``length`` tokens."""
        if req_id in self._row_of:
            self._held[req_id] = length

    def truncate(self, req_id: str | int, num_tokens: int) -> None:
        """The context was cut to ``num_tokens`` tokens: the row holds no more than that."""
        if req_id in self._held:
            self._held[req_id] = min(self._held[req_id], num_tokens)

    def remove(self, req_id: str | int) -> None:
        row = self._row_of.pop(req_id, None)
        self._held.pop(req_id, None)
        if row is not None:
            self._free.append(row)

    def _row(self, req_id: str | int) -> int:
        row = self._row_of.get(req_id)
        if row is None:
            if not self._free:  # (twice the rows; the old ones copied)
                old = self.history.shape[0]
                grown = torch.full((max(2 * old, 8), self.width), PAD, dtype=torch.long,
                                   device=self.device)
                grown[:old] = self.history
                self.history = grown
                self._free = list(range(grown.shape[0] - 1, old - 1, -1))
            row = self._row_of[req_id] = self._free.pop()
        return row
