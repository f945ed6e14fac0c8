"""A trained draft head on the target's own hidden states (EAGLE-style feature drafting).

The network is :class:`proposers.head_model.DraftHead` (one decoder layer). After every target
forward the engine hands the proposer the features of the positions it verified
(:meth:`DraftHeadProposer.on_features`); the proposer keeps them *pending* with the token that
followed each, and at the next proposal writes their keys and values into the head's KV cache
(:mod:`proposers.head_cache`) and queries the newest one: that gives the first draft; each further
draft feeds the head's predicted feature and its draft back in, one position further
(:mod:`proposers.head_drafting`: a chain, or a tree). A chain's drafts write their pairs into
the cache past each request's newest pair, where the next verified pairs overwrite them before
anything reads there (a tree's go into a copy of its requests' keys and values): a rejection
needs no rollback. Drafts are the head's argmax (one-hot drafts: rejection sampling stays exact
for sampled requests too).

Pending pairs are written lazily: a request that goes more than ``LAZY_PENDING`` positions without
a proposal (a prompt, or steps the controller left without drafts) has all but its newest pair
written at once, in one batched projection with every other such request of the step; a proposal
replayed from a CUDA graph first writes the same way the pairs past its layout's room
(``num_speculative_tokens + 1`` a request). On a GPU the engine shows the proposer each step
that asked for no drafts while its forward runs (:meth:`DraftHeadProposer.observe`): the
requests whose pairs fill that room are written there, in the forward's shadow, so a proposal
after plain steps finds no more than its layout holds. Writing at every plain step would cost
each plain step host time, and writing everything at the next proposal would make that
proposal more than twice a steady one (docs/design.md, "Measured reasons behind the runner's
choices"). An overlapped plain step hands its pairs on the device instead
(:meth:`DraftHeadProposer.write_after`): they wait there
(:class:`~proposers.deferred_pairs.DeferredPairs`, up to ``DEFER_STEPS`` steps) and go in with
the next steps' in one projection, before anything else reads or writes the cache.

On CUDA (graphs on) the whole proposal (writes, queries and every draft) replays one CUDA graph
per layout: batch rounded up to a power of two, pending rows padded to ``num_speculative_tokens +
1`` per request, every key of the cache read (:mod:`samplers.keyed_graphs`), and always
``num_speculative_tokens`` drafts (or tree levels), of which each request keeps the ones it asked
for. A layout per number of drafts as well would make new layouts in the last steps of a batch
(each request's cap shrinks as it nears ``max_tokens``), and a layout met for the first time
runs eager and the second time is captured, each many times a replay's cost (docs/design.md,
"Measured reasons behind the runner's choices").

The weights (``safetensors``) and a ``draft_head.json`` of its shape live in a directory; the
factory loads ``SpeculativeConfig.model`` when given, else the head shipped for the default
model (:data:`DEFAULT_HEAD_DIR`). Training: ``examples/train_draft_head.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from proposers.base import (
    FeatureUpdate,
    Proposal,
    Proposer,
    ProposerContext,
    ProposeRequest,
    Verification,
)
from proposers.chain_inputs import chain_inputs
from proposers.deferred_pairs import DeferredPairs
from proposers.head_cache import HeadKVCache
from proposers.head_drafting import (
    DraftTree,
    draft_chain,
    draft_tree,
    write_keys_values,
    write_pairs,
)
from proposers.head_kernels import draft_argmax
from proposers.head_model import DraftHead
from proposers.registry import register_proposer
from samplers.keyed_graphs import KeyedGraphs
from samplers.metadata import PinnedStaging

DEFAULT_HEAD_DIR = Path(__file__).resolve().parent / "heads" / "smollm2-135m"

__all__ = ["DEFAULT_HEAD_DIR", "DraftHead", "DraftHeadProposer", "DraftTree"]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


LAZY_PENDING = 64  # pending pairs a request may hold before they are written without a proposal
DEFER_STEPS = 8  # plain steps whose pairs wait on the device before they are written
TOP_CHUNK = 128  # top_indices: the columns of one chunk of its first pass
TOP_MAX_ROWS = 16  # top_indices: rows past which one topk is faster


def top_indices(logits: torch.Tensor, count: int) -> torch.Tensor:
    """The indices ``[..., count]`` of the ``count`` largest values of ``logits [..., size]``'s
    last dimension, largest first: ``logits.topk(count).indices`` (ties may come in another
    order). One row's ``topk`` on a GPU is one thread block's radix selection over the whole
    row, and a tree proposal calls it once a level. So for a long row it runs in two passes:
    each chunk of ``TOP_CHUNK`` columns keeps its ``count`` best (one block per chunk, in
    parallel), then the best of those; one draft (``count == 1``) is an ``argmax``."""
    if count == 1:
        return logits.argmax(dim=-1, keepdim=True)
    size = logits.shape[-1]
    # (two passes are faster up to about TOP_MAX_ROWS rows; with more, one topk has blocks
    # enough: docs/design.md, "Measured reasons behind the runner's choices")
    if (size % TOP_CHUNK or size < 4 * TOP_CHUNK or count > TOP_CHUNK
            or logits.numel() > TOP_MAX_ROWS * size):
        return logits.topk(count, dim=-1).indices
    # each [..., size / TOP_CHUNK, count]: every chunk's best, and where in its chunk
    part_values, part_index = logits.unflatten(-1, (size // TOP_CHUNK, TOP_CHUNK)).topk(
        count, dim=-1)
    best = part_values.flatten(-2).topk(count, dim=-1).indices  # [..., count] (chunk, j)
    within = part_index.flatten(-2).gather(-1, best)  # [..., count]
    return best // count * TOP_CHUNK + within


Chunk = tuple[torch.Tensor, int, int]  # (a step's features [rows, hidden_size], first, count)


class _Pending:
    """A request's verified pairs not yet in the head's cache: their features, as chunks of the
    steps' feature tensors (no view is cut per request and step: :func:`gather_rows` joins them
    when they are written or queried), and the token after each position."""

    def __init__(self, in_cache: bool = False) -> None:
        self.features: list[Chunk] = []
        self.tokens: list[int] = []
        # the pairs are in the cache already (written on the device: they stay pending for a
        # proposal from the host to query, where writing them again is the same write)
        self.in_cache = in_cache


def gather_rows(chunks: list[Chunk], copy: bool = False) -> torch.Tensor:
    """The chunks' rows, in order, ``[sum of counts, hidden_size]``, as few views as they allow:
    chunks of one tensor that lie end to end (the requests of a plain step, one row each) are
    one view, then one concatenation (``copy``: never a view). No index goes to the device (a
    copy queued behind the target's forward would wait for it, where
    :meth:`DraftHeadProposer.observe` writes)."""
    parts: list[torch.Tensor] = []
    source, first, end = None, 0, 0
    for tensor, start, count in chunks:
        if tensor is source and start == end:
            end += count
            continue
        if source is not None:
            parts.append(source[first:end])
        source, first, end = tensor, start, start + count
    if source is not None:
        parts.append(source[first:end])
    return torch.cat(parts) if copy or len(parts) > 1 else parts[0]  # (cat: always a copy)


class DraftHeadProposer(Proposer):
    """Chained greedy drafts from a :class:`DraftHead` over the target's features, or from an
    :class:`~proposers.eagle3_head.Eagle3Head` over its layers' states (method ``eagle3``:
    drafts read out over its draft vocabulary and mapped to target ids through ``d2t``).
    ``embed``: the token embedding (the target's); ``lm_head``: the target's output head;
    ``max_pending``: ``num_speculative_tokens + 1``."""

    needs_features = True
    observes = True  # (the pending pairs that fill a graph's room: written in the forward)

    def __init__(self, head: DraftHead, embed: nn.Module, lm_head: nn.Module, vocab_size: int,
                 max_num_seqs: int, max_model_len: int, max_pending: int,
                 graphs: bool = False, capture: bool = True,
                 tree: list[int] | None = None, defer_steps: int = DEFER_STEPS) -> None:
        self.head, self.embed, self.lm_head = head, embed, lm_head
        # candidates per node at each depth (1 past the list), or None: chains only
        self.branching = None if tree is None else list(tree)
        self._trees: dict[int, DraftTree] = {}  # depth -> its tree's static layout
        self.vocab_size, self.max_pending = vocab_size, max_pending
        # (observed at every plain step: the pairs of a request whose pending ones fill a
        # graph's room are written then, so that its next proposal replays without writing
        # first; a sparser cadence was not measured)
        self.observe_every = 1
        self.max_lazy = max(max_pending, LAZY_PENDING)  # pending pairs before a write
        self._readout_weight = self._readout_bias = self._vocab = None
        # an EAGLE-3 head reads the inputs of the target's layers ``feature_layers`` and reads
        # its drafts out through its own norm and output head over its draft vocabulary
        self.feature_layers = getattr(head, "aux_layers", None)
        self._own_readout = hasattr(head, "draft_logits")
        if self._own_readout:
            ids = head.target_ids  # [draft_vocab_size]: each draft token's target id
            if int(ids.max()) >= vocab_size:
                raise ValueError(f"the draft head's d2t maps to token id {int(ids.max())}; the "
                                 f"target has {vocab_size} tokens")
            self._vocab = ids
        elif head.vocab is not None:  # the draft vocabulary's rows of the output head
            weight = getattr(lm_head, "weight", None)
            if not isinstance(lm_head, nn.Linear) or weight is None:
                raise ValueError("a draft head with a draft vocabulary needs the target's "
                                 f"output head to be an nn.Linear, not {type(lm_head).__name__}")
            if int(head.vocab.max()) >= vocab_size:
                raise ValueError(f"the draft head's vocabulary has token id "
                                 f"{int(head.vocab.max())}; the target has {vocab_size} tokens")
            self._vocab = head.vocab.to(weight.device)  # [draft_vocab_size]
            self._readout_weight = weight.detach()[self._vocab].contiguous()  # [V', hidden]
            if lm_head.bias is not None:
                self._readout_bias = lm_head.bias.detach()[self._vocab]
        weight = head.fc.weight
        # (a tree's nodes sit past the newest pair, in node order)
        room = max_pending if tree is None else max_pending + DraftTree(
            tree, max_pending - 1, weight.device).num_nodes
        self.cache = HeadKVCache(max_num_seqs, head.num_kv_heads, head.head_dim, weight.dtype,
                                 weight.device, max_model_len + room + 1)
        self._pending: dict[str | int, _Pending] = {}
        # plain steps' pairs waiting on the device (write_after): made at the first, its width
        # the features'
        self.defer_steps = defer_steps
        self._deferred: DeferredPairs | None = None
        self._zero_rows: torch.Tensor | None = None  # [rows, hidden_size]: a graph's padding
        # a verify_and_draft layout -> its verification outputs' shapes past the batch
        self._verified_shapes: dict[tuple, list[torch.Size]] = {}
        # the last chain layout's slot columns on the device, by (slots, width, padded batch)
        self._slots_layout: tuple[tuple, torch.Tensor] | None = None
        self._broken: set[str | int] = set()  # requests whose features have a gap: no drafts
        self.graphs = KeyedGraphs(weight.device, capture) if graphs else None
        self._to_device = PinnedStaging(weight.device)  # index columns, without waiting
        # replayed from CUDA graphs a proposal of k drafts costs a small share of a target step
        # (docs/performance.md, "Draft head"): the controller then asks for every sequence's
        # cap and picks the width after, as for n-gram (eager, k drafts cost k runs of the
        # output head: planned before, as for a draft model)
        self.drafts_are_free = graphs
        self._generation = self.cache.generation

    # ---- features in ------------------------------------------------------------------------

    @torch.inference_mode()
    def on_features(self, updates: Sequence[FeatureUpdate], features: torch.Tensor) -> None:
        flush: list[str | int] = []  # requests whose pairs but the newest are written now
        offset = 0
        for u in updates:
            first = offset if u.row is None else u.row
            offset = first + u.count
            if u.req_id in self._broken or u.count == 0:
                continue
            if u.req_id not in self.cache.slot_of:
                if u.start != 0:  # (features of a request met mid-way: nothing to attend to)
                    self._broken.add(u.req_id)
                    continue
                self.cache.open(u.req_id)
                self._pending[u.req_id] = _Pending()
            pending = self._pending[u.req_id]
            if u.start != self.cache.length[u.req_id] + len(pending.tokens):
                self._broken.add(u.req_id)
                continue
            pending.features.append((features, first, u.count))
            pending.tokens.extend(u.token_ids[u.start + 1:u.start + 1 + u.count])
            pending.in_cache = False
            if len(pending.tokens) > self.max_lazy:
                flush.append(u.req_id)
        if flush:
            self._write_now(flush)

    @torch.inference_mode()
    def observe(self, requests: Sequence[ProposeRequest]) -> None:
        """A step without drafts (its forward running on the GPU): write the pending pairs,
        but each request's newest, of the requests that hold as many as a graph's layout has
        room for (the step's own pair comes after), so that their next proposal writes
        nothing eagerly first."""
        self._write_over([r.req_id for r in requests], self.max_pending - 1)

    def _write_over(self, req_ids: list[str | int], limit: int) -> None:
        """:meth:`_write_now` for those of ``req_ids`` holding more than ``limit`` pending
        pairs."""
        over = []
        for req_id in req_ids:
            pending = self._pending.get(req_id)
            if (pending is not None and req_id not in self._broken
                    and len(pending.tokens) > limit):
                over.append(req_id)
        if over:
            self._write_now(over)

    def _write_now(self, req_ids: list[str | int], keep_newest: bool = True) -> None:
        """Write each request's pending pairs but its newest into the cache, one batched
        projection (the newest stays pending: the next proposal queries it; ``keep_newest``
        False: it is written too, for drafts from the device, :meth:`draft_after`)."""
        self._write_deferred()  # (first: pairs are written in the order they came)
        feats: list[Chunk] = []  # every request's rows but its newest, in row order
        newest: list[Chunk] = []  # each request's newest row
        tokens, slots, positions = [], [], []
        for req_id in req_ids:
            pending = self._pending[req_id]
            n = len(pending.tokens) - keep_newest
            *older, (source, first, count) = pending.features
            feats += older
            if keep_newest:
                if count > 1:
                    feats.append((source, first, count - 1))
                newest.append((source, first + count - 1, 1))
            else:
                feats.append((source, first, count))
            start = self.cache.length[req_id]
            tokens += pending.tokens[:n]
            slots += [self.cache.slot_of[req_id]] * n
            positions += range(start, start + n)
            pending.tokens = pending.tokens[n:]
            self.cache.length[req_id] = start + n
        if keep_newest:
            # the newest rows copied, all at once: a view would keep its step's whole tensor
            kept = gather_rows(newest, copy=True)  # [len(req_ids), hidden_size]
            for j, req_id in enumerate(req_ids):
                self._pending[req_id].features = [(kept, j, 1)]
        else:
            for req_id in req_ids:
                self._pending[req_id] = _Pending()
        if not positions:
            return
        self._ensure(max(positions) + 1)
        index = self._to_device(np.array([tokens, slots, positions], dtype=np.int64))  # [3, rows]
        # (one concatenation of every request's rows: one per request cost a launch each)
        x = self.head.inputs(gather_rows(feats).to(self.cache.dtype), self.embed(index[0]))
        write_keys_values(self.head, x, index[2], self.cache.keys, self.cache.values, index[1])

    def _ensure(self, needed: int) -> None:
        self.cache.ensure(needed)
        if self.cache.generation != self._generation and self.graphs is not None:
            self.graphs.clear()  # (the graphs read the old tensors)
        self._generation = self.cache.generation

    def remove(self, req_id: str | int) -> None:
        self.cache.close(req_id)
        self._pending.pop(req_id, None)
        self._broken.discard(req_id)

    # ---- drafts out -------------------------------------------------------------------------

    def _readout(self, feature: torch.Tensor) -> torch.Tensor:
        """The greedy draft ``[batch]`` of each ``feature [batch, hidden_size]``: through the
        target's output head, or its draft vocabulary's rows only."""
        if self._vocab is None:
            return draft_argmax(self.lm_head(feature)[:, :self.vocab_size])
        return self._vocab[draft_argmax(self._draft_logits(feature))]  # [batch]: target ids

    def _draft_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., draft_vocab_size]`` of ``feature [..., hidden_size]`` over the draft
        vocabulary: the head's own output head (EAGLE-3) or the target's rows of it."""
        if self._own_readout:
            return self.head.draft_logits(feature)
        return nn.functional.linear(feature, self._readout_weight, self._readout_bias)

    def _candidates(self, feature: torch.Tensor, count: int) -> torch.Tensor:
        """The ``count`` likeliest drafts ``[..., count]`` (likeliest first) of each ``feature
        [..., hidden_size]``, as :meth:`_readout` reads them out."""
        if self._vocab is None:
            return top_indices(self.lm_head(feature)[..., :self.vocab_size], count)
        return self._vocab[top_indices(self._draft_logits(feature), count)]

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        # (held rows first; a write whose graph ran eager or was captured makes the proposal's
        # time not a steady one, as its own graph's would)
        held_steady = self._write_deferred()
        drafts: list[list[int]] = [[] for _ in requests]
        ready = [i for i, r in enumerate(requests) if r.num_spec_tokens > 0
                 and self._ready(r.req_id, len(r.token_ids))]
        if not ready:
            return Proposal(drafts, None)
        steps = max(requests[i].num_spec_tokens for i in ready)
        if self.graphs is not None:  # (a graph's layout holds max_pending pairs a request)
            steps = max(steps, self.max_pending - 1)  # (one layout a batch bucket: see above)
            self._write_over([requests[i].req_id for i in ready], self.max_pending)
        feats: list[Chunk] = []
        tokens, row_slots, row_pos, last_rows, slots, last_pos = [], [], [], [], [], []
        for i in ready:
            req_id = requests[i].req_id
            pending, start = self._pending[req_id], self.cache.length[req_id]
            n = len(pending.tokens)
            feats += pending.features
            tokens += pending.tokens
            row_slots += [self.cache.slot_of[req_id]] * n
            row_pos += range(start, start + n)
            last_rows.append(len(tokens) - 1)
            slots.append(self.cache.slot_of[req_id])
            last_pos.append(start + n - 1)
        generation = self.cache.generation
        tree = None
        if self.branching is not None and any(requests[i].tree for i in ready):
            tree = self._tree(steps)
        width = steps if tree is None else tree.num_nodes  # drafts per request
        self._ensure(max(last_pos) + width + 1)
        num_keys = max(last_pos) + width + (tree is not None)
        if tree is None:
            body = partial(draft_chain, self.head, self.cache, self.embed, self._readout)
        else:
            body = partial(draft_tree, self.head, self.cache, self.embed, self._candidates,
                           tree=tree)
        if self.graphs is None:
            out = body(gather_rows(feats).to(self.cache.dtype),
                       *self._index(tokens, row_slots, row_pos, last_rows, slots, last_pos),
                       steps=steps, num_keys=num_keys)
        else:
            out = self._draft_graphed(gather_rows(feats), tokens, row_slots, row_pos, last_rows,
                                      slots, last_pos, steps, num_keys, body, tree)
        self.last_proposal_steady = held_steady and generation == self.cache.generation and (
            self.graphs is None or self.graphs.last_steady)
        for i in ready:
            req_id = requests[i].req_id
            self.cache.length[req_id] += len(self._pending[req_id].tokens)
            self._pending[req_id] = _Pending()
        rows = out[:len(ready)].tolist()
        if not self.last_proposal_steady and tree is None and self.graphs is not None:
            self._capture_smaller(_pow2(len(ready)), steps, body)  # (after the drafts are read)
        if tree is None:
            for row, i in zip(rows, ready, strict=True):
                drafts[i] = row[:requests[i].num_spec_tokens]
            return Proposal(drafts, None)
        parents: list[list[int] | None] = [None] * len(requests)
        for row, i in zip(rows, ready, strict=True):
            k = requests[i].num_spec_tokens
            if requests[i].tree:  # (its first k levels: a prefix in level order)
                drafts[i], parents[i] = row[:tree.sizes[k]], tree.parents[:tree.sizes[k]]
            else:  # the likeliest child of each likeliest node: the chain
                drafts[i] = [row[j] for j in tree.chain[:k]]
        return Proposal(drafts, None, parents=parents)

    # ---- drafts on the device (overlapped drafting steps) ---------------------------------------

    @property
    def drafts_on_device(self) -> bool:
        """Chains drafted from a verification on the device: every draft is the head's argmax
        (no tree)."""
        return self.branching is None

    @property
    def pairs_on_device(self) -> bool:
        """A plain step's pairs written on the device (:meth:`write_after`): with chains."""
        return self.branching is None

    @torch.inference_mode()
    def write_after(self, req_ids: Sequence[str | int], features: torch.Tensor,
                    tokens: torch.Tensor, positions: Sequence[int]) -> None:
        """:meth:`Proposer.write_after`: the step's pairs (``features [batch, width]``, each
        with the token sampled after it, ``tokens [batch]``) to be written at ``positions``
        on the device; pairs still pending on the host (a step whose features came to
        :meth:`on_features`) are written first, from the host. The rows wait on the device
        (:class:`~proposers.deferred_pairs.DeferredPairs`) and are written with those of
        the next plain steps, in one projection, at the cache's next use. Each request's pair
        stays its newest until :meth:`advance` (a plain step without this cost a host write
        of every request's pairs every ``max_pending`` steps)."""
        self._write_behind(req_ids)
        self._ensure(max(positions) + 1)
        slots = [self.cache.slot_of[r] for r in req_ids]
        if self._deferred is None:  # (a step's rows: one a request, each in a slot of its own)
            self._deferred = DeferredPairs(self.cache.num_slots, self.defer_steps,
                                           features.shape[-1], self.cache.dtype,
                                           self.cache.device)
        if self._deferred.full:
            self._write_deferred()
        self._deferred.add(features, tokens, slots, list(positions))

    @torch.inference_mode()
    def _write_deferred(self) -> bool:
        """The pairs of plain steps held on the device, into the cache: one projection (one
        graph a bucket of rows, padding rows writing the scratch slot's position 0). Called
        before anything reads or writes the cache. Whether its time was a steady one: nothing
        held, or a captured graph's replay (not an eager first run or a capture)."""
        if not self._deferred:
            return True
        slots, positions = self._deferred.take()
        rows = len(slots)

        def body(f: torch.Tensor, t: torch.Tensor, s: torch.Tensor, p: torch.Tensor
                 ) -> torch.Tensor:  # (a row marked invalid is any token: its request fails)
            return write_pairs(self.head, self.cache, self.embed, f, t.clamp_min(0), s, p)

        if self.graphs is None:
            index = self._to_device(np.array(slots + positions, dtype=np.int64))
            body(self._deferred.features[:rows], self._deferred.tokens[:rows], index[:rows],
                 index[rows:])
            return True
        padded = _pow2(rows)  # (the held rows past ``rows`` are stale: they go to scratch)
        pad = padded - rows
        index = self._to_device(np.array(slots + [self.cache.scratch] * pad + positions
                                         + [0] * pad, dtype=np.int64))  # slots, positions
        self.graphs.run(("pairs", padded), lambda f, t, i: body(f, t, i[:padded], i[padded:]),
                        [self._deferred.features[:padded], self._deferred.tokens[:padded],
                         index])
        return self.graphs.last_steady

    @torch.inference_mode()
    def draft_after(self, req_ids: Sequence[str | int], features: torch.Tensor,
                    tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int], steps: int) -> torch.Tensor:
        """:meth:`Proposer.draft_after`: the step's pairs (its features, each with the token
        verification gave after it) are written at positions ``base[b] ...`` (the pairs past
        the accepted ones too: beyond the request's committed pairs, where the next step's
        overwrite them unread), and the pair at ``base[b] + accepted[b]`` (the recovered or
        bonus token's) queries the chain, as :meth:`propose` queries a request's newest
        pending pair. The head's host bookkeeping follows at :meth:`advance`."""
        self._write_deferred()
        batch, width = tokens.shape
        slots = [self.cache.slot_of[req_id] for req_id in req_ids]
        steps_run = steps if self.graphs is None else max(steps, self.max_pending - 1)
        num_keys = max(base_hi) + width + steps_run  # (the drafts' pairs past the step's)
        self._ensure(num_keys + 1)
        body = partial(draft_chain, self.head, self.cache, self.embed, self._readout)
        if self.graphs is None:
            rows = batch * width
            index = self._to_device(np.array([s for s in slots for _ in range(width)] + slots,
                                             dtype=np.int64))  # row slots, then slots
            flat = chain_inputs(tokens, accepted, base, index, rows, batch)
            out = body(features.to(self.cache.dtype), *flat.split([rows] * 3 + [batch] * 3),
                       steps=steps_run, num_keys=num_keys)
            return out[:, :steps]
        # the layout of _draft_graphed, its device columns padded on the device (one launch)
        padded = _pow2(batch)
        rows = padded * self.max_pending
        pad = rows - batch * width
        flat = chain_inputs(tokens, accepted, base, self._chain_slots(slots, width, padded),
                            rows, padded)
        sizes = [rows] * 3 + [padded] * 3
        if pad:  # (the padding rows' features: zeros)
            if self._zero_rows is None or self._zero_rows.shape[0] < rows:
                self._zero_rows = features.new_zeros((rows, features.shape[-1]))
            features = torch.cat([features, self._zero_rows[:pad]])
        feats = features.to(self.cache.dtype)
        num_keys = self.cache.capacity  # (every key: one layout a batch bucket, as proposals)
        key = (padded, steps_run, num_keys, False)
        out = self.graphs.run(key, lambda f, i: body(f, *i.split(sizes), steps=steps_run,
                                                     num_keys=num_keys), [feats, flat])
        return out[:batch, :steps]

    @torch.inference_mode()
    def verify_and_draft(self, req_ids: Sequence[str | int], features: torch.Tensor,
                         verify: Verification, inputs: Sequence[torch.Tensor],
                         base: torch.Tensor, base_hi: Sequence[int], steps: int
                         ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """:meth:`Proposer.verify_and_draft`: with graphs, the verification, the chains'
        inputs and the chain are one replay of a graph a layout (``(padded batch, width,
        steps)``); the verification's outputs and the drafts come back in one copy out of the
        graph's output. The inputs' padding rows hold what the layout's last larger call left
        (its static buffers are not cleared): their outputs are never read, and their pairs
        and drafts go to the scratch slot, at positions a chain of this layout wrote (within
        the cache: the layout's key holds its capacity)."""
        if self.graphs is None:
            return super().verify_and_draft(req_ids, features, verify, inputs, base, base_hi,
                                            steps)
        self._write_deferred()
        batch = len(req_ids)
        width = features.shape[0] // batch
        slots = [self.cache.slot_of[req_id] for req_id in req_ids]
        steps_run = max(steps, self.max_pending - 1)
        self._ensure(max(base_hi) + width + steps_run + 1)
        padded = _pow2(batch)
        rows = padded * self.max_pending
        index = self._chain_slots(slots, width, padded)
        sizes = [rows] * 3 + [padded] * 3
        num_keys = self.cache.capacity
        # (the verification's inputs, and base unless it is one of them: one copy each)
        at = next((i for i, x in enumerate(inputs) if x is base), None)
        key = ("verified", padded, width, steps_run, num_keys, len(inputs), at)
        shapes = self._verified_shapes

        def body(feats: torch.Tensor, index: torch.Tensor,
                 *given: torch.Tensor) -> torch.Tensor:  # -> [padded * (columns + steps_run)]
            outs = verify(*given[:len(inputs)])
            flat = chain_inputs(outs[0], outs[1], given[-1 if at is None else at], index, rows,
                                padded)
            drafts = draft_chain(self.head, self.cache, self.embed, self._readout, feats,
                                 *flat.split(sizes), steps=steps_run, num_keys=num_keys)
            shapes[key] = [o.shape[1:] for o in outs] + [drafts.shape[1:]]
            # (each output whole, one after the other: the batch's rows of each a prefix)
            return torch.cat([o.reshape(-1) for o in outs] + [drafts.reshape(-1)])

        given = [features.to(self.cache.dtype), index, *inputs] + ([base] if at is None else [])
        static_rows = [rows, index.shape[0]] + [x.shape[0] // batch * padded
                                                for x in given[2:]]
        # (one copy out of the graph's output, which its next replay overwrites; the slot
        # columns are copied in only when they are another tensor than the last replay's)
        packed = self.graphs.run(key, body, given, rows=static_rows, fixed=(1,)).clone()
        columns = [math.prod(shape) for shape in shapes[key]]
        parts = [part[:batch * n].view(batch, *shape) for part, n, shape in zip(
            packed.split([padded * n for n in columns]), columns, shapes[key], strict=True)]
        return tuple(parts[:-1]), parts[-1][:, :steps]

    def _chain_slots(self, slots: list[int], width: int, padded: int) -> torch.Tensor:
        """A chain layout's slot columns on the device (one copy): each of the ``padded *
        max_pending`` pair rows' slot (``width`` rows a chain), then each chain's; padding
        rows and chains write the scratch slot. The last one is kept: a batch drafting flight
        after flight has the same slots and width (read only, by copies into graph inputs)."""
        key = (tuple(slots), width, padded)
        if self._slots_layout is not None and self._slots_layout[0] == key:
            return self._slots_layout[1]
        scratch = self.cache.scratch
        pad = padded * self.max_pending - len(slots) * width
        columns = self._to_device(np.array([s for s in slots for _ in range(width)]
                                           + [scratch] * pad + slots
                                           + [scratch] * (padded - len(slots)), dtype=np.int64))
        self._slots_layout = (key, columns)
        return columns

    def ready_on_device(self, req_id: str | int, num_tokens: int) -> bool:
        """:meth:`Proposer.ready_on_device`: its features reach the newest host token."""
        return self.branching is None and self._ready(req_id, num_tokens)

    def flush(self, req_ids: Sequence[str | int], contexts: Sequence[Sequence[int]]) -> None:
        """:meth:`Proposer.flush`: every pending pair, the newest too, into the cache (the
        pairs hold the contexts' tokens already); pairs written on the device are only
        counted."""
        self._write_deferred()
        self._write_behind(req_ids)
        for req_id in req_ids:
            pending = self._pending[req_id]
            if pending.tokens:  # (in the cache: written on the device)
                self.cache.length[req_id] += len(pending.tokens)
                self._pending[req_id] = _Pending()

    def _write_behind(self, req_ids: Sequence[str | int]) -> None:
        """Every pending pair of those of ``req_ids`` whose pairs are not in the cache yet
        (handed on the host, :meth:`on_features`) written from the host, the newest too."""
        behind = [r for r in req_ids if self._pending[r].tokens and not self._pending[r].in_cache]
        if behind:
            self._write_now(behind, keep_newest=False)

    def advance(self, req_id: str | int, length: int, features: torch.Tensor, row: int,
                token: int) -> None:
        """:meth:`Proposer.advance`: the pairs up to position ``length - 1`` are in the cache
        (written by :meth:`draft_after` or :meth:`write_after`); the newest stays pending,
        with its feature row and token, so that a proposal from the host queries it (rewriting
        it there is the same write)."""
        if req_id not in self.cache.slot_of or req_id in self._broken:
            return
        self.cache.length[req_id] = length - 1
        pending = self._pending[req_id] = _Pending(in_cache=True)
        pending.features.append((features, row, 1))
        pending.tokens.append(token)

    def _tree(self, depth: int) -> DraftTree:
        tree = self._trees.get(depth)
        if tree is None:
            tree = self._trees[depth] = DraftTree(self.branching, depth, self.cache.device)
        return tree

    def _ready(self, req_id: str | int, num_tokens: int) -> bool:
        """Its features reach the newest token (every position before it is verified)."""
        pending = self._pending.get(req_id)
        return (req_id not in self._broken and pending is not None and bool(pending.tokens)
                and self.cache.length[req_id] + len(pending.tokens) == num_tokens - 1)

    def _index(self, *columns: list[int]) -> list[torch.Tensor]:
        """Index lists to device tensors in one copy."""
        flat, sizes = self._flat(*columns)
        return list(flat.split(sizes))

    def _flat(self, *columns: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Index lists as one device tensor (one host-to-device copy) and their lengths."""
        # (through numpy: torch.tensor of a list of Python ints costs several times the host
        # time; see samplers.metadata.host_to_device)
        flat = self._to_device(np.fromiter(chain.from_iterable(columns), np.int64))
        return flat, [len(c) for c in columns]

    def _draft_graphed(self, feats: torch.Tensor, tokens: list[int], row_slots: list[int],
                       row_pos: list[int], last_rows: list[int], slots: list[int],
                       last_pos: list[int], steps: int, num_keys: int, body,
                       tree: DraftTree | None) -> torch.Tensor:
        """``body`` (:func:`~proposers.head_drafting.draft_chain` or
        :func:`~proposers.head_drafting.draft_tree`) on ``feats [len(tokens), hidden_size]``
        (the pending rows, in order) padded to its layout's static shapes,
        through :class:`KeyedGraphs`: padding rows write into the scratch slot and query its
        position 0."""
        batch = _pow2(len(slots))
        rows = batch * self.max_pending  # the layout's pending rows
        pad = rows - len(tokens)
        # every key of the cache: a layout per (batch, steps) only (a bucket of keys per length
        # met each new bucket with a capture as a sequence grew), and reading all of them costs
        # microseconds (a head's cache is small)
        num_keys = self.cache.capacity
        pad_b = batch - len(slots)
        scratch = self.cache.scratch
        # [3 * rows + 3 * batch], one copy into the graph's input; sizes fixed by the layout
        flat, sizes = self._flat(tokens + [0] * pad, row_slots + [scratch] * pad,
                                 row_pos + [0] * pad, last_rows + [0] * pad_b,
                                 slots + [scratch] * pad_b, last_pos + [0] * pad_b)
        if self._zero_rows is None or self._zero_rows.shape[0] < rows:  # (kept: no fill a call)
            self._zero_rows = feats.new_zeros((rows, feats.shape[-1]))  # (pad <= rows)
        features = torch.cat([feats, self._zero_rows[:pad]])  # [batch * max_pending, hidden]
        key = (batch, steps, num_keys, tree is not None)
        return self.graphs.run(
            key, lambda f, i: body(f, *i.split(sizes), steps=steps, num_keys=num_keys),
            [features.to(self.cache.dtype), flat])[:len(slots)]

    def _capture_smaller(self, batch: int, steps: int, body) -> None:
        """After a chain layout's capture at ``batch``: capture every smaller batch bucket's
        now, on padding rows (they write the scratch slot). A batch shrinks as its requests
        finish, and a bucket first met in its last steps would run eager, then be captured,
        mid-run, each many times a replay's cost (docs/design.md, "Measured reasons behind the
        runner's choices")."""
        scratch, num_keys = self.cache.scratch, self.cache.capacity
        b = batch // 2
        while b >= 1:
            key = (b, steps, num_keys, False)
            if key not in self.graphs:
                rows = b * self.max_pending
                sizes = [rows] * 3 + [b] * 3
                flat, _ = self._flat([0] * rows, [scratch] * rows, [0] * rows, [0] * b,
                                     [scratch] * b, [0] * b)
                features = self._zero_rows[:rows].to(self.cache.dtype)  # (padding rows)
                self.graphs.ensure(key, lambda f, i, sizes=sizes: body(
                    f, *i.split(sizes), steps=steps, num_keys=num_keys), [features, flat])
            b //= 2


@register_proposer("eagle")
def build_draft_head(config: Any, ctx: ProposerContext) -> DraftHeadProposer:
    """``SpeculativeConfig.model``: a head directory (None: the one shipped for the default
    model); its hidden size must be the target's."""
    directory = DEFAULT_HEAD_DIR if config.model is None else Path(str(config.model))
    head = DraftHead.load(directory)
    target = ctx.target_model
    hidden = target.config.hidden_size
    if head.hidden_size != hidden:
        raise ValueError(f"draft head {str(directory)!r} has hidden_size {head.hidden_size}; "
                         f"the target's is {hidden}: it was trained for another model")
    embed, lm_head = ctx.embeddings()
    head = head.to(device=ctx.device, dtype=embed.weight.dtype).eval()
    return DraftHeadProposer(head, embed, lm_head, ctx.vocab_size, ctx.max_num_seqs,
                             ctx.max_model_len, config.num_speculative_tokens + 1,
                             graphs=ctx.cuda_graphs and beside(head, embed, lm_head),
                             tree=config.draft_tree)


def beside(head: nn.Module, *modules: nn.Module) -> bool:
    """Whether every weight of ``modules`` sits on ``head``'s device. Where one does not (a
    target spread over GPUs by accelerate, or offloaded: its hooks move inputs or weights
    between devices in every forward, which a CUDA graph's capture refuses: "dependency created
    on uncaptured work in another stream", seen on two GPUs), the head drafts eagerly."""
    device = next(head.parameters()).device
    return all(p.device == device for m in modules for p in m.parameters())
