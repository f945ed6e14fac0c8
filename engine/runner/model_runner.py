"""Batched forward of a Hugging Face causal LM over a per-sequence KV cache with rollback.

:class:`ModelRunner` is the front that the engine, the draft-model proposer and the
tensor-parallel leader (:class:`~engine.runner.tensor_parallel.LeaderRunner`) call. It checks
each call and hands the work to four parts:

- :mod:`engine.runner.slot_rows`: which pool rows hold each slot's tokens (allocate, free,
  truncate, keep a tree's path), on the host;
- :mod:`engine.runner.step_layout`: how a step's sequences become rows (padded, folded, packed,
  split), a pure host-side plan;
- :mod:`engine.runner.step_inputs`: one forward's index tensors, laid out on the host;
- :mod:`engine.runner.executor`: the model prepared once, the hidden-states forward, CUDA graph
  capture and replay (:mod:`engine.runner.cuda_graphs`), the output head.

A forward appends each slot's new tokens at positions ``seq_len(slot) ...`` and returns a
:class:`~engine.runner.forward_output.ForwardOutput` (logits of the rows asked for, optionally
every new token's hidden states, and the step's layout facts). It either runs whole or raises
before changing anything (a bad argument: ValueError; a budget that cannot hold the new tokens:
:class:`KVCacheFull`). Per step the host builds the index lists and ships them in one copy; there
is no device-to-host sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from engine.runner.cuda_graphs import NO_DECISION, CudaGraphs, Decision, batch_bucket
from engine.runner.executor import Executor, attention_devices, cache_argument, execution_device
from engine.runner.forward_output import FedChains, FedTokens, ForwardOutput
from engine.runner.kv_cache import KVCacheFull, PagedKVCache
from engine.runner.slot_rows import SlotRows
from engine.runner.step_inputs import StepInputs, lay_out, lay_out_chains
from engine.runner.step_layout import (
    MAX_TREE_NODES,
    LayoutLimits,
    StepPlan,
    Tree,
    cut_rows,
    packed_rows,
    plan_step,
    split_order,
)
from samplers.metadata import PinnedStaging

SPARE_ROWS = 16  # the spare rows a slot fed from chains takes with fresh ones (SlotRows.extend)

__all__ = ["FedTokens", "ForwardOutput", "KVCacheFull", "ModelRunner", "Tree", "attention_devices",
           "cache_argument", "execution_device"]


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class ModelRunner:
    """One forward pass for a batch of sequences, each bringing its own number of new tokens.

    ``max_num_seqs`` slots, at most ``max_num_tokens`` cached tokens over all slots (the KV pool is
    allocated once for that budget), at most ``max_model_len`` tokens per sequence. The model is
    put in eval mode.
    ``cuda_graph_max_new``: on one CUDA device, steps of at most this many new tokens per
    sequence replay CUDA graphs (:mod:`engine.runner.cuda_graphs`); 0 runs every step eager.
    ``twin_width(batch_size)``: the widest verification a batch of that many sequences runs
    (a decode bucket's capture also captures it); None: ``cuda_graph_max_new`` at every batch.
    ``pack_cpu_weights``: on CPU in float32, steps of a few rows run the decoder's linear maps
    through the route measured fastest for their rows (:mod:`engine.runner.cpu_linears`:
    reordered or transposed copies of the weights, at a cost in memory).
    ``tensor_parallel_size``: the model holds this rank's share of a tensor-parallel plan
    (:mod:`engine.runner.tensor_parallel`): its pools hold ``num_key_value_heads / size`` heads,
    its linear maps run on the model's own weights (nothing packed), and its CUDA graphs follow
    one rank's decisions (:attr:`before_launch`, :meth:`CudaGraphs.dictate`).
    ``fused_ops``: the model's LLaMA-form RMSNorms and rotary embedding run as one Triton kernel
    each inside this runner's forwards (:mod:`engine.runner.fused_ops`); None: on CUDA only
    (True on CPU needs Triton's interpreter, ``TRITON_INTERPRET=1``: for tests).
    ``prefix_caching``: rows of freed slots stay cached by their tokens
    (:mod:`engine.runner.prefix_cache`) for :meth:`attach_prefix`.
    ``attention_backend``: ``"gather"`` (each layer gathers the batch's cached keys and values,
    SDPA reads them under a 4-D mask) or ``"paged"`` (attention reads the pool in place through
    the slot table: :mod:`engine.runner.paged_attention`; a Triton kernel on CUDA, its PyTorch
    reference on CPU) or ``"auto"`` (paged where it runs on a CUDA device, else gather).
    ``deterministic``: batch-invariant kernels for every product, norm and attention read
    (``EngineConfig.deterministic``; :class:`~engine.runner.executor.Executor`).
    """

    takes_fed_tokens = True  # (forward's ``fed``: overlapped steps, engine.overlap)

    def __init__(self, model: nn.Module, max_num_seqs: int, max_num_tokens: int,
                 max_model_len: int, cuda_graph_max_new: int = 0, pack_cpu_weights: bool = True,
                 tensor_parallel_size: int = 1, fused_ops: bool | None = None,
                 twin_width: Callable[[int], int] | None = None, prefix_caching: bool = False,
                 attention_backend: str = "auto", deterministic: bool = False):
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        self.max_num_tokens = _positive("max_num_tokens", max_num_tokens)
        self.max_model_len = _positive("max_model_len", max_model_len)
        self._executor = executor = Executor(
            model, max_num_seqs, max_num_tokens, max_model_len, pack_cpu_weights,
            _positive("tensor_parallel_size", tensor_parallel_size), fused_ops, attention_backend,
            deterministic)
        self.model: nn.Module = executor.model
        self.vocab_size: int = executor.vocab_size
        self.device: torch.device = executor.device
        self.dtype: torch.dtype = executor.dtype
        self.cache: PagedKVCache = executor.cache
        self.fused: dict[str, int] = executor.fused  # what the fused kernels replaced
        self.gathered_head: bool = executor.gathered_head
        self._slots = SlotRows(max_num_seqs, max_num_tokens, max_model_len + 1, prefix_caching)
        self._staging = PinnedStaging(self.device)  # (the caller's indices: to_device)
        self.spare_rows = SPARE_ROWS  # (0: a fed-chains step takes only the rows it needs)
        # (the last fed-chains layout: (its key, its StepInputs), see forward_chains)
        self._chains_layout: tuple[tuple, StepInputs] | None = None
        self._twin_width = twin_width
        # a step of decoding and prefilling sequences is folded into one graph bucket, or else
        # runs as two forwards; a verification of unequal rows is packed, one token a row
        # (engine/runner/step_layout.py); all off under tensor parallelism, where the other
        # ranks replay each forward as sent
        self.fold_mixed = True
        self.split_mixed = True
        self.pack_verifications = True
        # called in each forward once its graph decision is made, before the device runs
        # anything of it (tensor parallelism: the leader sends the step to the other ranks)
        self.before_launch: Callable[[Decision], None] | None = None
        if not isinstance(cuda_graph_max_new, int) or cuda_graph_max_new < 0:
            raise ValueError(f"cuda_graph_max_new must be an int >= 0, got {cuda_graph_max_new!r}")
        if cuda_graph_max_new and executor.can_capture:
            self.use_graph_buckets(cuda_graph_max_new)
        executor.warm_up()

    @property
    def graphs(self) -> CudaGraphs | None:
        """The CUDA graphs of the small forwards (None: every step eager)."""
        return self._executor.graphs

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The decoder layers whose inputs a ``keep_hidden`` forward also returns."""
        return self._executor.aux_layers

    def keep_aux_layers(self, layer_ids: Sequence[int]) -> None:
        """From now on a ``keep_hidden`` forward also returns the inputs of decoder layers
        ``layer_ids`` (``ForwardOutput.aux_hidden``), computed inside the forward (and inside
        its CUDA graph); before the first forward."""
        self._executor.keep_aux_layers(layer_ids)

    def use_graph_buckets(self, max_num_new: int, capture: bool = True) -> None:
        """Run steps of at most ``max_num_new`` new tokens per sequence through
        :class:`~engine.runner.cuda_graphs.CudaGraphs` (``capture=False``: their padded bucket
        layout eagerly, to check it off-GPU)."""
        # (batches past max_num_seqs: folded steps, whose prompt chunks take several rows)
        self._executor.use_graph_buckets(_positive("max_num_new", max_num_new), self.fold_rows,
                                         batch_bucket(self.max_num_seqs), capture,
                                         self._twin_width)

    def _limits(self) -> LayoutLimits:
        graphs = self.graphs
        if graphs is None:
            return LayoutLimits(self.max_num_seqs, fold=self.fold_mixed, split=self.split_mixed,
                                pack=self.pack_verifications)
        return LayoutLimits(self.max_num_seqs, graphs.max_num_new, graphs.max_kv_len,
                            graphs.ready, self.fold_mixed, self.split_mixed,
                            self.pack_verifications)

    @property
    def fold_rows(self) -> int:
        """The most rows a folded or packed step may take."""
        return LayoutLimits(self.max_num_seqs).fold_rows

    def packed_rows(self, num_seqs: int, longest: int, total: int) -> int | None:
        """The rows of a verification step of ``num_seqs`` sequences bringing ``total`` new
        tokens, ``longest`` the most of one, when the runner packs it, one new token a row
        (None: it pads every sequence to ``longest``); see
        :func:`engine.runner.step_layout.packed_rows`. The speculation controller reads this
        rule to price a step before it runs."""
        return packed_rows(num_seqs, longest, total, self._limits())

    def to_device(self, values: Sequence[int] | np.ndarray) -> torch.Tensor:
        """``values`` as an int64 tensor on the runner's device, without waiting for the work
        queued there (a pinned buffer of the caller's: at most one such copy a step)."""
        if isinstance(values, np.ndarray):
            return self._staging(values.astype(np.int64, copy=False))
        return self._staging(np.fromiter(values, np.int64, len(values)))

    # ---- slots and budget -------------------------------------------------------------------

    @property
    def num_free_tokens(self) -> int:
        return self._slots.num_free_tokens

    @property
    def num_cached_tokens(self) -> int:
        return self._slots.num_cached_tokens

    @property
    def num_free_slots(self) -> int:
        return self._slots.num_free_slots

    @property
    def kv_bytes_per_token(self) -> int:
        return self.cache.bytes_per_token

    def allocate_slot(self) -> int:
        """A fresh, empty slot; RuntimeError when all max_num_seqs slots are in use."""
        return self._slots.allocate()

    def free_slot(self, slot: int, cache_tokens: Sequence[int] | None = None) -> None:
        """Release the slot and all its cached tokens; ``cache_tokens``: the committed tokens
        its first rows hold, which the prefix cache keeps (ignored without one)."""
        self._slots.free(slot, cache_tokens)

    @property
    def num_prefix_cached_tokens(self) -> int:
        """Rows the prefix cache holds (0 without one)."""
        return self._slots.num_prefix_cached_tokens

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """(the longest prefix of ``token_ids`` the prefix cache holds, how many of its rows
        count as free now); changes nothing. (0, 0) without a cache."""
        return self._slots.cached_prefix(token_ids)

    def attach_prefix(self, slot: int, token_ids: Sequence[int]) -> None:
        """An empty slot starts with the cached rows of ``token_ids`` (all cached: see
        :meth:`cached_prefix`): its ``seq_len`` becomes ``len(token_ids)``, the slot table's
        first columns point at those rows (one small copy) and they stay locked, never
        written, until the slot lets them go."""
        rows = self._slots.attach(slot, token_ids)
        if rows:
            base = slot * (self.max_model_len + 1)
            self._executor.point_cells(list(range(base, base + len(rows))), rows)

    def seq_len(self, slot: int) -> int:
        return len(self._slots.rows(slot))

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of the slot; the rest is forgotten."""
        self._slots.truncate(slot, length)

    def keep_path(self, slot: int, first: int, path: Sequence[int]) -> None:
        """After a tree step: the nodes ``path`` (node indices, root's child first) of the tree
        whose nodes the slot caches from column ``first`` on become the cached tokens at
        columns ``first, first + 1, ...`` (their keys were computed at those positions); the
        other nodes follow them, for :meth:`truncate` to forget. Moves no keys or values: the
        slot table's columns are pointed at the path's pool rows."""
        self.keep_paths([(slot, first, path)])

    def keep_paths(self, paths: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        """:meth:`keep_path` for several ``(slot, first, path)`` at once: one small host-to-
        device copy and one write into the slot table for all of them. Checks every one before
        changing anything."""
        cells, rows = self._slots.keep_paths(paths)
        if cells:
            self._executor.point_cells(cells, rows)

    # ---- forward ----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                logits_indices: Sequence[int] | torch.Tensor | None = None,
                trees: Sequence[Tree | None] | None = None,
                keep_hidden: bool = False, fed: FedTokens | None = None) -> ForwardOutput:
        """Append each slot's new tokens at positions ``seq_len(slot) ...`` and score them.

        The output's logits are float32 ``[total_new_tokens, vocab_size]``, rows in slot order
        then token order (or only the rows ``logits_indices`` of that layout); its hidden
        states, with ``keep_hidden``, every new token's final ones ``[total_new_tokens,
        hidden_size]`` in that order. Raises :class:`KVCacheFull` before changing anything when
        the budget cannot hold the new tokens.

        ``trees[i]`` (None: a chain): ``(first, parents)``, the slot's new tokens from index
        ``first`` on are the nodes of a draft tree (see :data:`Tree`): each node sits one
        position past its parent and sees only the tokens before ``first`` and its own
        ancestors. The slot then caches every node, in node order, until :meth:`keep_path`.

        ``fed``: some slots' first new token is still on the device (an overlapped step feeds
        the tokens the step before it sampled; their ``token_ids`` entries are stand-ins); the
        step must then run as one forward of chains without prompt chunks (ValueError). Where
        every slot is fed, the layout is written on the device (:meth:`_forward_fed_tokens`).
        """
        starts = self._check_step(slots, token_ids)
        if fed is not None and (len(fed.sources) != len(slots) or trees is not None
                                or any(len(t) != 1 for t in token_ids)):
            raise ValueError("fed tokens need one source per slot and one new token per slot, "
                             f"no trees; got {len(fed.sources)} sources for {len(slots)} slots")
        trees = self._check_trees(trees, token_ids)
        num_tokens = sum(len(t) for t in token_ids)
        if num_tokens > self._slots.num_free_tokens:
            raise KVCacheFull(num_tokens, self._slots.num_free_tokens)
        if fed is not None and logits_indices is None and self._lays_out_fed(slots, fed):
            return self._forward_fed_tokens(list(slots), starts, fed, keep_hidden)
        if logits_indices is not None and not isinstance(logits_indices, torch.Tensor):
            logits_indices = self._check_logits_indices(logits_indices, num_tokens)
        return self._forward(list(slots), token_ids, starts, trees, logits_indices, keep_hidden,
                             fed)

    @torch.inference_mode()
    def forward_chains(self, slots: Sequence[int], fed: FedChains,
                       keep_hidden: bool = False) -> ForwardOutput:
        """A forward of ``fed.width`` new tokens per slot whose ids and positions are on the
        device (:class:`FedChains`: an overlapped drafting step). Each slot first gets KV rows
        for every position it may write (up to ``fed.base_hi[b] + fed.width - 1``; the rows
        past what the step writes stay the slot's until :meth:`truncate`, which keeps them as
        the slot's spare rows: :class:`~engine.runner.slot_rows.SlotRows`), then the step runs
        as one padded forward, its layout's positions, pool rows, slot-table cells and mask
        limits computed on the device. Logits (and hidden states) of every new token, slot
        order then token order. Raises :class:`KVCacheFull` before changing anything when the
        rows do not fit, ``ValueError`` past ``max_model_len``."""
        width = fed.width
        if len(fed.base_hi) != len(slots) or fed.tokens.shape[0] != len(slots) or not slots:
            raise ValueError(f"fed chains need one row per slot; got {fed.tokens.shape[0]} rows "
                             f"and {len(fed.base_hi)} bounds for {len(slots)} slots")
        ends = [hi + width for hi in fed.base_hi]
        if max(ends) > self.max_model_len:
            raise ValueError(f"fed chains reach position {max(ends) - 1}; max_model_len is "
                             f"{self.max_model_len}")
        # (rows a slot lacks come with spare_rows more, already pointed at: the steps after
        # this one then mostly take rows the slot table points at, and point none)
        taken = self._slots.extend(slots, ends, self.spare_rows)
        if taken is None:
            needed = sum(max(0, end - self.seq_len(slot))
                         for slot, end in zip(slots, ends, strict=True))
            raise KVCacheFull(needed, self._slots.num_free_tokens)
        kv_len = max(ends)
        try:
            graphs = self.graphs
            bucket = None if graphs is None else graphs.bucket(len(slots), width, kv_len)
            if self.before_launch is not None:
                self.before_launch(NO_DECISION if graphs is None else graphs.decision)
            rows_batch, rows_new = (len(slots), width) if bucket is None else bucket[:2]
            # (the chains' rows are written on the device, in the executor; the host's part
            # is the last step's again while the batch and its layout stay: the executor
            # then reuses its device copy when no cell changes)
            key = (tuple(slots), width, rows_batch, rows_new)
            if self._chains_layout is None or self._chains_layout[0] != key:
                self._chains_layout = (key, lay_out_chains(slots, width, rows_batch, rows_new,
                                                           self._executor.scratch))
            inputs = self._chains_layout[1]
            logits, argmax, hidden, aux, steady = self._executor.run(
                inputs, bucket, kv_len, None, keep_hidden, chains=fed, point=taken)
        except BaseException:  # (the rows taken may not be pointed at: none kept as spare)
            self._slots.forget_spare(slots)
            raise
        return ForwardOutput(logits, hidden, steady, None, kv_len, aux, argmax)

    def forward_fed(self, slots: Sequence[int], tokens: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int]) -> ForwardOutput:
        """:meth:`forward_chains` of ``FedChains(tokens, base, base_hi)``: a draft model's
        forward from tokens on the device (``proposers.base.DraftRunner``)."""
        return self.forward_chains(slots, FedChains(tokens, base, list(base_hi)))

    def _lays_out_fed(self, slots: Sequence[int], fed: FedTokens) -> bool:
        """Whether a fed step of one token a slot is laid out on the device
        (:meth:`_forward_fed_tokens`): every slot fed, and not a lone sequence whose rows are
        one run of the pool (an eager step then reads its keys and values as a view, with no
        index kernel: the host's layout serves it)."""
        if min(fed.sources) < 0:
            return False
        return (len(slots) > 1 or self._executor.deterministic
                or self._slots.run_start(slots[0]) is None)

    def _forward_fed_tokens(self, slots: list[int], starts: list[int], fed: FedTokens,
                            keep_hidden: bool) -> ForwardOutput:
        """A fed step of one token a slot (an overlapped plain step, every slot's token still
        on the device) as :meth:`forward_chains` of width 1: the tokens and their positions go
        into the layout on the device (one copy: the positions, after the flight rows where
        the step takes some of the flight's tokens or another order), the
        slots' spare rows are pointed at already, and while the batch stays the layout's
        device copy is the last step's, so the host builds nothing per sequence."""
        n, values = len(slots), fed.values
        if len(values) == n and fed.sources == list(range(n)):  # (the whole flight, in order)
            base = self.to_device(starts)  # [n]
            tokens = values[:, None]  # [n, 1] (a negative one goes in as id 0: write_chains)
        else:
            index = self.to_device([*fed.sources, *starts])  # [2 * n]: flight rows, positions
            base, tokens = index[n:], values.index_select(0, index[:n])[:, None]
        return self.forward_chains(slots, FedChains(tokens, base, starts), keep_hidden)

    def _forward(self, slots: list[int], token_ids: Sequence[Sequence[int]], starts: list[int],
                 trees: list[Tree | None], logits_indices: list[int] | torch.Tensor | None,
                 keep_hidden: bool, fed: FedTokens | None = None) -> ForwardOutput:
        """A checked step, laid out as :func:`~engine.runner.step_layout.plan_step` says."""
        plan = plan_step([len(t) for t in token_ids], starts, trees, self._limits(),
                         can_split=not isinstance(logits_indices, torch.Tensor) and fed is None)
        if plan.groups is not None:
            return self._forward_split(plan, slots, token_ids, starts, trees, logits_indices,
                                       keep_hidden)
        if plan.width is not None:  # (each prompt chunk as rows of the step's width)
            slots, token_ids, starts, trees = cut_rows(plan.width, slots, token_ids, starts,
                                                       trees)
        logits, argmax, hidden, aux, steady = self._run(slots, token_ids, starts, trees,
                                                        plan.kv_len, logits_indices, keep_hidden,
                                                        fed)
        return ForwardOutput(logits, hidden, steady, plan.packed_rows, plan.kv_len, aux, argmax)

    def _forward_split(self, plan: StepPlan, slots: list[int],
                       token_ids: Sequence[Sequence[int]], starts: list[int],
                       trees: list[Tree | None], logits_indices: list[int] | None,
                       keep_hidden: bool) -> ForwardOutput:
        """A split step as two forwards, the short rows first, their logits and hidden states
        put back in the step's row order (the reordering indices go to the device before the
        forwards: nothing waits for the device). Steady when both forwards are."""
        order = split_order([len(t) for t in token_ids], plan.groups, logits_indices)
        num_logits = len(order.logits)
        indices = self._executor.order_to_device(
            np.concatenate([order.logits, order.hidden]) if keep_hidden else order.logits)
        outs = [self._forward([slots[i] for i in group], [token_ids[i] for i in group],
                              [starts[i] for i in group], [trees[i] for i in group], asked,
                              keep_hidden)
                for group, asked in zip(plan.groups, order.asked, strict=True)]
        # [num_logits, vocab_size], the groups' rows in the step's order
        logits = torch.cat([out.logits for out in outs]).index_select(0, indices[:num_logits])
        hidden = torch.cat([out.hidden for out in outs]).index_select(
            0, indices[num_logits:]) if keep_hidden else None  # [num_tokens, hidden_size]
        aux = torch.cat([out.aux_hidden for out in outs]).index_select(
            0, indices[num_logits:]) if keep_hidden and self.aux_layers else None
        return ForwardOutput(logits, hidden, all(out.steady for out in outs), None, plan.kv_len,
                             aux)

    def _run(self, slots: list[int], token_ids: Sequence[Sequence[int]], starts: list[int],
             trees: list[Tree | None], kv_len: int,
             logits_indices: list[int] | torch.Tensor | None, keep_hidden: bool,
             fed: FedTokens | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                        torch.Tensor | None, bool]:
        """One forward of rows ``token_ids`` (one per slot entry, a slot possibly on several
        consecutive rows): its graph decision, the launch hook, pool rows, index layout, run.
        ``fed``: row ``b``'s first token comes from the device (one row per slot)."""
        batch_size, num_new = len(slots), max(len(t) for t in token_ids)
        graphs = self.graphs
        bucket = None if graphs is None else graphs.bucket(batch_size, num_new, kv_len)
        if self.before_launch is not None:
            self.before_launch(NO_DECISION if graphs is None else graphs.decision)
        # a bucket pads with scratch sequences, and each sequence with scratch tokens
        rows_batch, rows_new = (batch_size, num_new) if bucket is None else bucket[:2]
        try:
            if num_new == 1:  # (one token a slot: its rows in one cut of the free list)
                pool_rows = [[row] for row in self._slots.take_each(slots)]
            else:
                pool_rows = [self._slots.take(slot, len(ids))
                             for slot, ids in zip(slots, token_ids, strict=True)]
            inputs = lay_out(slots, token_ids, starts, pool_rows, trees, rows_batch, rows_new,
                             self._executor.scratch)
            # one length and one number of new tokens for all: transformers' causal mask is
            # exact
            uniform = (len(set(starts)) == 1
                       and sum(len(t) for t in token_ids) == batch_size * num_new
                       and not any(trees))
            # (a lone sequence's rows read as one view go through SDPA: not in deterministic
            # mode)
            run = (self._slots.run_start(slots[0])
                   if batch_size == 1 and not self._executor.deterministic else None)
            feed = None
            if fed is not None:  # (row b's first token sits at index b * rows_new)
                rows = [b for b, source in enumerate(fed.sources) if source >= 0]
                feed = (fed.values, [b * rows_new for b in rows],
                        [fed.sources[b] for b in rows])
            return self._executor.run(inputs, bucket, kv_len, logits_indices, keep_hidden,
                                      starts[0], uniform, run, feed)
        except BaseException:  # (rows taken from the free list are pointed only as the step
            # runs: the caller's rollback must not keep them as spare rows, as forward_chains)
            self._slots.forget_spare(slots)
            raise

    def _check_step(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]]) -> list[int]:
        """Validate a step without changing anything; return each slot's seq_len."""
        if len(slots) != len(token_ids) or not slots:
            raise ValueError(f"slots and token_ids must be non-empty and of one length, got "
                             f"{len(slots)} and {len(token_ids)}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct, got {list(slots)}")
        if all(len(ids) == 1 for ids in token_ids):  # (a decode step: checked whole, below
            # row by row only to name what fails)
            starts = [len(self._slots.rows(slot)) for slot in slots]
            flat = [ids[0] for ids in token_ids]
            if (max(starts) < self.max_model_len and min(flat) >= 0
                    and max(flat) < self.vocab_size):
                return starts
        starts = []
        for slot, ids in zip(slots, token_ids, strict=True):
            start = len(self._slots.rows(slot))
            if not ids or start + len(ids) > self.max_model_len:
                raise ValueError(f"slot {slot}: seq_len {start} + new tokens {len(ids)} must be in "
                                 f"[{start + 1}, max_model_len={self.max_model_len}]")
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise ValueError(f"slot {slot}: token ids must be in [0, {self.vocab_size})")
            starts.append(start)
        return starts

    @staticmethod
    def _check_trees(trees: Sequence[Tree | None] | None,
                     token_ids: Sequence[Sequence[int]]) -> list[Tree | None]:
        """``trees`` validated (see :meth:`forward`), one per slot (None: all chains)."""
        if trees is None:
            return [None] * len(token_ids)
        if len(trees) != len(token_ids):
            raise ValueError(f"trees must have one entry per slot ({len(token_ids)}), got "
                             f"{len(trees)}")
        for ids, tree in zip(token_ids, trees, strict=True):
            if tree is None:
                continue
            first, parents = tree
            if (not 1 <= first <= len(ids) or len(parents) != len(ids) - first
                    or len(parents) > MAX_TREE_NODES
                    or any(not -1 <= p < j for j, p in enumerate(parents))):
                raise ValueError(f"a tree (first={first}, parents={list(parents)}) must start "
                                 f"after at least one token, give each of the {len(ids)} new "
                                 f"tokens from first on (at most {MAX_TREE_NODES}) a parent -1 "
                                 "or an earlier node")
        return list(trees)

    @staticmethod
    def _check_logits_indices(logits_indices: Sequence[int], num_rows: int) -> list[int]:
        indices = list(logits_indices)
        if any(not 0 <= i < num_rows for i in indices):
            raise ValueError(f"logits_indices must be in [0, {num_rows}), got {indices}")
        return indices
