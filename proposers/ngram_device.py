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
length: ``prompt_lookup_max`` comparisons of ``[batch, width]`` and about twenty other kernels,
no host synchronisation and no shape that depends on the lengths. The hash table of the host
proposer is not needed here: a GPU compares a batch's whole contexts in microseconds. Launched
one by one, those kernels cost the host more than the host proposer's whole step
(docs/history.md, "N-gram flights"), so on CUDA a step's writes and lookup are one CUDA graph
per padded batch size, width, ``k`` and span (captured the second time a layout is met; the
padding rows write and read the scratch row 0). The history is int32
and holds ``max_rows`` rows from the start, so that the graphs' addresses never move (more rows:
the history grows and the graphs are captured again). A step reads only the history's first
``span`` columns, a power of two past the batch's longest context (a graph per span): its cost
follows the contexts, not ``max_model_len``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from samplers.graph_capture import gc_paused
from samplers.metadata import PinnedStaging

PAD = -1  # a history position nothing was written to
_BEFORE = -2  # what a position before the context's start compares as (never a token)
_NO_SUFFIX = -3  # a suffix position before the context's start (never equal to anything)


def lookup_ngrams(history: torch.Tensor, lengths: torch.Tensor, min_n: int, max_n: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts ``[batch, k]`` (``history``'s dtype) for contexts ``history[b, :lengths[b]]``
    (``history [batch, width]`` of token ids, ``lengths [batch]`` int64 on the same device, each
    at least 1), and
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
    suffix = suffix.to(history.dtype)
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


@dataclass
class _StepGraph:
    """A captured step (:meth:`DeviceNgramIndex._step`) and its static inputs and output."""

    graph: torch.cuda.CUDAGraph
    rows: torch.Tensor  # [padded] int64
    tokens: torch.Tensor  # [padded, width] int64
    accepted: torch.Tensor  # [padded] int64
    base: torch.Tensor  # [padded] int64
    drafts: torch.Tensor  # [padded, k]


class DeviceNgramIndex:
    """The contexts of the requests drafting on the device, a row each (module docstring).
    ``max_len``: the longest context (the engine's ``max_model_len``); ``max_rows``: the
    requests that may draft at once (the engine's ``max_num_seqs``); ``graphs``: replay each
    step from a CUDA graph (CUDA only)."""

    def __init__(self, min_n: int, max_n: int, max_len: int, device: torch.device,
                 max_rows: int = 8, graphs: bool = True) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.width = max_len + 2  # (a step's writes past the context land in the last column)
        self.device = device
        # row 0: the scratch row that padding rows write and read
        self.history = torch.full((max_rows + 1, self.width), PAD, dtype=torch.int32,
                                  device=device)
        self._row_of: dict[str | int, int] = {}
        self._held: dict[str | int, int] = {}  # tokens of each context its row holds
        self._free = list(range(max_rows, 0, -1))
        self._to_device = PinnedStaging(device)
        # (padded batch, width, k, span) -> its captured step
        self._graphs: dict[tuple[int, int, int, int], _StepGraph] = {}
        self._met: Counter[tuple[int, int, int, int]] = Counter()
        self._capture = graphs and device.type == "cuda"
        self._pool = None

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
            self.history.view(-1).index_copy_(0, flat[0], flat[1].to(self.history.dtype))

    def draft_after(self, req_ids: Sequence[str | int], tokens: torch.Tensor,
                    accepted: torch.Tensor, base: torch.Tensor, k: int,
                    base_hi: int) -> torch.Tensor:
        """Drafts ``[batch, k]`` (int64) of each request's next step after a verification step
        on the device: ``tokens [batch, width]``: the token verification gave after each
        position ``base[b], base[b] + 1, ...`` (the accepted drafts, then the recovered or bonus
        token, then placeholders), ``accepted [batch]``, ``base_hi``: the most any ``base[b]``
        can be. Each row must hold the context up to ``base[b]`` (:meth:`sync`, or the step
        before's writes). The tokens past the bonus are written too, past the context, where
        nothing reads them; a negative token (a row the verifier marked invalid, whose request
        fails at its commit) is written and drafted as 0. On CUDA the result is a graph's
        static output: valid until the next call."""
        rows = [self._row(r) for r in req_ids]  # (before a layout: the history may grow)
        batch, width = tokens.shape
        span = min(1 << (base_hi + width).bit_length(), self.width)  # (> every position read)
        if not self._capture:
            rows_t = self._to_device(np.array(rows, dtype=np.int64))
            return self._step(rows_t, tokens, accepted, base, k, span)
        padded = 1 << (batch - 1).bit_length()
        rows_t = self._to_device(np.array(rows + [0] * (padded - batch), dtype=np.int64))
        key = (padded, width, k, span)
        graph = self._graphs.get(key)
        if graph is None:
            self._met[key] += 1
            if self._met[key] < 2:  # (a layout's first step runs eager)
                return self._step(rows_t[:batch], tokens, accepted, base, k, span)
            graph = self._graphs[key] = self._capture_step(padded, width, k, span)
        # (padding rows keep stale inputs: they write and read the scratch row only)
        graph.rows.copy_(rows_t)
        graph.tokens[:batch].copy_(tokens)
        graph.accepted[:batch].copy_(accepted)
        graph.base[:batch].copy_(base)
        graph.graph.replay()
        return graph.drafts[:batch]

    def _step(self, rows: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor,
              base: torch.Tensor, k: int, span: int) -> torch.Tensor:
        """The step's writes and lookup over the first ``span`` columns (every argument on the
        device; ``rows [batch]``)."""
        width = tokens.shape[1]
        positions = (base[:, None] + 1 + torch.arange(width, device=tokens.device)).clamp_max(
            self.width - 1)  # [batch, width]
        self.history.view(-1).index_copy_(0, (rows[:, None] * self.width + positions).view(-1),
                                          tokens.reshape(-1).clamp_min(0).to(self.history.dtype))
        lengths = base + accepted + 2  # [batch]: the context now ends with the bonus token
        drafts, _ = lookup_ngrams(self.history[:, :span].index_select(0, rows), lengths,
                                  self.min_n, self.max_n, k)
        return drafts.long()

    def _capture_step(self, padded: int, width: int, k: int, span: int) -> _StepGraph:
        zeros = torch.zeros(padded, dtype=torch.long, device=self.device)
        rows, accepted, base = zeros.clone(), zeros.clone(), zeros.clone()  # (scratch row 0)
        tokens = torch.zeros((padded, width), dtype=torch.long, device=self.device)
        side = torch.cuda.Stream(self.device)  # (warm-up off the capture, as CUDA graphs want)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._step(rows, tokens, accepted, base, k, span)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool):
            drafts = self._step(rows, tokens, accepted, base, k, span)
        return _StepGraph(graph, rows, tokens, accepted, base, drafts)

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
            if not self._free:  # (twice the rows, the old ones copied; graphs captured anew)
                old = self.history.shape[0]
                grown = torch.full((2 * old, self.width), PAD, dtype=self.history.dtype,
                                   device=self.device)
                grown[:old] = self.history
                self.history = grown
                self._free = list(range(grown.shape[0] - 1, old - 1, -1))
                self._graphs.clear()
                self._met.clear()
                self._pool = None
            row = self._row_of[req_id] = self._free.pop()
        return row
