"""What a step does for the samples under a grammar (``SamplingParams.structured_outputs``).

Before the proposal, :func:`forced_drafts` asks each decoding sample's grammar for the tokens it
forces (``{"name": "`` after ``{`` in a JSON Schema's object); they are drafted with certainty
and a proposer whose drafts are free (n-gram) continues after them, from the context with them
appended (a model proposer is not asked for that sample in that step). After the proposal,
:func:`prepend_forced` puts them before the proposer's drafts. Then :class:`GrammarMasks` walks
each such sample's drafts through its grammar and fills the token mask of each verified
position (a refused draft stays: ``samplers.structured.walk_drafts`` says why that is lossless)
into one host buffer laid out as the kept logits rows; on a GPU the walk runs in a worker thread
while the forward is prepared, launched and run (xgrammar's calls release the GIL). At
verification :meth:`GrammarMasks.apply` joins the walk, ships the buffer in one copy and applies
it to the target's adjusted logits in one op, before temperature, top-k/p and the verification
sampler, so that accepted, recovered and bonus tokens all follow the masked target
distribution; at commit the engine advances each matcher by the tokens it kept.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch

from engine.step_records import SeqStep
from samplers import MAX_SPEC_LEN
from samplers.structured import Grammars, apply_bitmask, bitmask_words, walk_drafts


def forced_drafts(items: list[SeqStep], limit: int, max_model_len: int,
                  spare: int | None) -> dict[int, list[int]]:
    """The forced tokens of each decoding item under a grammar (index -> tokens), at most
    ``limit`` each, within the context length, the request's ``max_tokens`` and ``spare``
    KV rows over the whole step (None: no limit)."""
    forced: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        seq = item.seq
        if (seq.grammar is None or not item.samples or item.num_context_tokens != 1
                or limit <= 0):
            continue
        room = max_model_len - seq.num_tokens
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        if spare is not None:
            room = min(room, spare)
        tokens = seq.grammar.forced_tokens(min(limit, room, MAX_SPEC_LEN))
        if tokens:
            forced[i] = tokens
            if spare is not None:
                spare -= len(tokens)
    return forced


def prepend_forced(items: list[SeqStep], forced: dict[int, list[int]], vocab_size: int,
                   device: torch.device, max_drafts: int, max_model_len: int) -> None:
    """Put each item's forced tokens before its proposer drafts (in place; with one-hot rows
    where the proposer gave probabilities), at most ``max_drafts`` in all (and
    ``MAX_SPEC_LEN``) and none past the context length."""
    for i, head in forced.items():
        item = items[i]
        item.forced = len(head)
        room = min(MAX_SPEC_LEN, max_drafts, max_model_len - item.seq.num_tokens)
        item.drafts = (head + item.drafts)[:room]
        if item.draft_probs is not None:  # (forced drafts are certain: one-hot rows)
            item.draft_probs = torch.cat([one_hot(head, vocab_size, device),
                                          item.draft_probs])[:len(item.drafts)]
        item.depth = min(item.depth, len(item.drafts) - item.forced)
        if item.backed is not None:
            item.backed = min(item.backed, item.depth)


class GrammarMasks:
    """The grammar masks of a step's kept logits rows: one int32 host buffer ``[rows, words]``
    (pinned when the logits live on a GPU; grown by doubling) that the walk fills in the rows'
    order, the rows of samples without a grammar set to -1. ``overlap``: walk in a worker
    thread from :meth:`start` to :meth:`apply` (a GPU, where the host would otherwise wait);
    else in :meth:`start`. ``walk_seconds``: the walks' time in all, wherever they ran."""

    def __init__(self, grammars: Grammars, device: torch.device, overlap: bool) -> None:
        self.grammars, self.device, self.overlap = grammars, device, overlap
        self.words = bitmask_words(grammars.vocab_size)
        self.host: torch.Tensor | None = None  # [capacity, words] int32
        self.shipped: torch.cuda.Event | None = None  # (the last copy out of ``host``)
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future | None = None
        self.rows = 0  # rows of the step under way (0: no grammar in it)
        self.walk_seconds = 0.0

    def start(self, items: list[SeqStep], inline: bool = False) -> None:
        """Begin the masks of ``items``' sampling rows (``len(drafts) + 1`` each, in order);
        nothing when no sampling item has a grammar. ``inline``: walk in this thread even
        with ``overlap`` (the caller applies the masks next: a worker's hand-off would only
        add its wake-up)."""
        self.cancel()
        sampling = [item for item in items if item.samples]
        # (a sequence the commit before an overlapped step stopped: its row is dropped, so its
        # grammar is not walked)
        todo = [i for i, item in enumerate(sampling)
                if item.seq.grammar is not None and not item.seq.is_finished]
        if not todo:
            return
        offsets, rows = [], 0
        for item in sampling:
            offsets.append(rows)
            rows += len(item.drafts) + 1
        host = self._buffer(rows)
        words = host.numpy()  # (numpy's fill: torch's spreads a small fill over threads)
        walked = set(todo)
        for i, item in enumerate(sampling):
            if i not in walked:  # (no mask: every bit set)
                words[offsets[i]:offsets[i] + len(item.drafts) + 1] = -1
        self.rows = rows
        walk = partial(self._walk, [sampling[i].seq.grammar for i in todo],
                       [sampling[i].drafts for i in todo], host, [offsets[i] for i in todo])
        if self.overlap and not inline:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-walk")
            self.pending = self.pool.submit(walk)
        else:
            walk()

    def apply(self, logits: torch.Tensor) -> None:
        """Join the walk and apply its masks to ``logits [rows, vocab_size]`` in place (the
        kept rows :meth:`start` was given), in one copy and one op."""
        if not self.rows:
            return
        self._join()
        rows, self.rows = self.rows, 0
        mask = self.host[:rows]
        if logits.device.type == "cuda":
            mask = mask.to(logits.device, non_blocking=True)
            self.shipped = torch.cuda.Event()
            self.shipped.record()
        apply_bitmask(logits, mask)

    def cancel(self) -> None:
        """Drop the step under way (its forward was not run): join the walk; the matchers roll
        back what it accepted when next asked (``GrammarState.settle``)."""
        self._join()
        self.rows = 0

    def _join(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def _walk(self, states: list, drafts: list[list[int]], host: torch.Tensor,
              offsets: list[int]) -> None:
        start = time.perf_counter()
        walk_drafts(states, drafts, self.grammars.batcher, host.numpy(), offsets)
        self.walk_seconds += time.perf_counter() - start

    def _buffer(self, rows: int) -> torch.Tensor:
        """The host buffer's first ``rows`` rows, once the last copy out of it is done."""
        if self.host is None or self.host.shape[0] < rows:
            capacity = max(rows, 2 * (0 if self.host is None else self.host.shape[0]), 64)
            self.host = torch.empty(capacity, self.words, dtype=torch.int32,
                                    pin_memory=self.device.type == "cuda")
            self.shipped = None
        if self.shipped is not None:
            self.shipped.synchronize()
            self.shipped = None
        return self.host[:rows]


def one_hot(tokens: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """float32 ``[len(tokens), vocab_size]``: a certain draft's distribution per token."""
    rows = torch.zeros(len(tokens), vocab_size, dtype=torch.float32, device=device)
    rows[torch.arange(len(tokens), device=device),
         torch.tensor(tokens, dtype=torch.long, device=device)] = 1.0
    return rows
