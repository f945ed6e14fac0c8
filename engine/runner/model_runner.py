"""Batched forward of a Hugging Face causal LM over a per-sequence KV cache with rollback.

Route: the model runs unchanged (its own attention code, ``sdpa`` or ``eager``) on a padded batch
``[batch_size, num_new]`` where ``num_new`` is the largest number of new tokens in the step, with

- ``position_ids [batch_size, num_new]``: each token's own position ``seq_len(slot) + t``
  (padding repeats the sequence's last position, so absolute position tables stay in range);
- ``past_key_values`` (``cache`` in recent transformers): a
  :class:`~engine.runner.kv_cache.PagedKVCache`, whose ``update`` writes the
  new keys and values into preallocated token pools and returns each sequence's cached tokens
  gathered ``[batch_size, heads, kv_len, head_dim]`` in position order;
- ``attention_mask [batch_size, 1, num_new, kv_len]``: key column ``j`` is visible to a token at
  position ``p`` iff ``j <= p``. transformers passes a prepared 4-D mask through as is, so the
  mask covers causality, the columns past each sequence's length, and rows of other lengths.
  A *draft tree* (``forward(trees=...)``) puts its nodes in columns of their own after the
  context, each at its parent's position + 1 and seeing only its ancestors' columns
  (:meth:`ModelRunner._mask`); :meth:`ModelRunner.keep_path` then points the slot's columns at
  the accepted branch (no keys or values move).
  A *uniform* step (every sequence has the same length and brings the same number of tokens,
  e.g. batch 1) passes no mask: transformers builds the causal mask itself from the cache's
  ``get_query_offset`` / ``get_mask_sizes``, and ``sdpa`` skips it for a decode step or a prefill
  from empty (then the fused GQA kernels run, with no ``repeat_kv`` copies).

Logits come from ``lm_head`` applied only to the rows asked for, never to padding. On CPU in
float32 the head of several rows runs on a oneDNN-reordered copy of its weight
(:mod:`engine.runner.cpu_lm_head`), and the decoder's linear maps in a step of 1 to 64 rows (a
decode, a verification, a small batch) through the route measured fastest on this machine for
that many rows when the runner was built (:mod:`engine.runner.cpu_linears`): MKL's GEMM reads a
weight up to twice as slowly for a few rows as for one, and which copy does better is the CPU's
choice.

Costs: a host-side step builds its index tensors from Python lists (O(batch_size * num_new)) and
ships them in one host-to-device copy (through a persistent pinned buffer on CUDA); there is no
device-to-host sync. Per layer the gather copies the batch's cached keys/values (as
``DynamicCache``'s ``torch.cat`` does), except for one sequence on an ascending run of pool rows,
which is read as a view (see :mod:`engine.runner.kv_cache`); a masked step on a GQA model also pays
``repeat_kv`` in transformers' ``sdpa``. Shapes are static per (batch_size, num_new, kv_len):
on CUDA, small steps replay a CUDA graph captured for their bucket of those sizes
(:mod:`engine.runner.cuda_graphs`), which turns the few hundred kernel launches of a decode step
into one and leaves the host the plan and the copy. Rollback (:meth:`ModelRunner.truncate`) only
moves pool rows back to the free list: no recomputation, no device work, and the memory in use
tracks the tokens kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from engine.runner.attention_backend import (
    gqa_attention,
    install_gqa_attention,
    without_cudnn_attention,
)
from engine.runner.attention_support import check_model_supported
from engine.runner.cpu_linears import PackedLinears
from engine.runner.cpu_lm_head import output_head
from engine.runner.cuda_graphs import (
    NO_DECISION,
    CudaGraphs,
    Decision,
    batch_bucket,
    kv_bucket,
    new_bucket,
)
from engine.runner.fused_ops import fused_forward, install_fused_ops
from engine.runner.kv_cache import KVCacheFull, PagedKVCache
from engine.runner.tp_head import gathered_head
from samplers.metadata import PinnedStaging

__all__ = ["KVCacheFull", "ModelRunner", "Tree"]

# A draft tree among one slot's new tokens: ``(first, parents)``; the tokens from index ``first``
# on are its nodes, in an order where a parent comes before its children; ``parents[j]`` is the
# node index of node ``j``'s parent, -1 for the token at ``first - 1`` (the tree's root).
Tree = tuple[int, Sequence[int]]
MAX_TREE_NODES = 62  # a node's ancestors are bits of an int64 (and the shift stays defined)
# A step of short rows and long ones runs as two forwards (ModelRunner._mixed_groups) when the
# short rows' padding to the longest would be at least this many tokens; without CUDA graphs
# a row is short up to SPLIT_SHORT new tokens (with them: the graphs' max_num_new).
SPLIT_MIN_SAVED = 128
SPLIT_SHORT = 16
# With CUDA graphs a mixed step is first *folded* (ModelRunner._fold): each prompt chunk laid out
# as rows of the decodes' width, one forward of one graph bucket, when the rows fit
# FOLD_MIN_ROWS, or twice the slots where that is more, and gather at most twice the key cells
# of a full batch at the longest context.
FOLD_MIN_ROWS = 64
# With CUDA graphs a verification step whose sequences verify unequal numbers of drafts is
# *packed* (ModelRunner.packed_rows): every new token its own row on its slot, one decode bucket
# of that many rows, in a step of at least PACK_MIN_BATCH sequences whose drafts add at most
# PACK_MAX_EXTRA rows per sequence (the fold rows' limits apply). Elsewhere padding every
# sequence to the longest was measured cheaper (benchmarks/packed_step.py, docs/design.md).
PACK_MIN_BATCH = 64
PACK_MAX_EXTRA = 0.125
LAYOUT_ROWS = 6  # the host plan's per-token rows (ids, positions, pool rows, cells, limits,
# ancestors), before the slots


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    base = model.base_model
    for name in ("layers", "h"):
        layers = getattr(base, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise ValueError(f"{type(model).__name__} has no decoder layer list (layers or h)")


def cache_argument(module: nn.Module) -> str:
    """The name under which ``module.forward`` takes its KV cache: ``cache`` in recent
    transformers (5.24 warns on every forward given ``past_key_values``), else
    ``past_key_values``."""
    parameters = inspect.signature(module.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def execution_device(module: nn.Module) -> torch.device:
    """Where ``module`` computes: its weights' device, or for a module whose weights accelerate
    keeps off the accelerator (``device_map`` entries ``cpu`` / ``disk``: the weights wait on the
    ``meta`` device and are brought in per forward) its hook's execution device."""
    for sub in module.modules():
        device = getattr(getattr(sub, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    return next(module.parameters()).device


def attention_devices(model: nn.Module) -> dict[int, torch.device]:
    """layer_idx of every decoder layer's attention -> the device that layer computes on."""
    layers = _decoder_layers(model)
    num_layers = model.config.num_hidden_layers
    if len(layers) != num_layers:
        raise ValueError(f"config.num_hidden_layers={num_layers} but the model has {len(layers)} "
                         "decoder layers; a truncated model must set both")
    found: dict[int, torch.device] = {}
    for layer in layers:
        idx = next((m.layer_idx for m in layer.modules() if hasattr(m, "layer_idx")), None)
        if idx is None or idx in found:
            raise ValueError(f"decoder layer {type(layer).__name__} has a missing or repeated "
                             f"attention layer_idx ({idx})")
        found[idx] = execution_device(layer)
    return found


def spread_by_accelerate(model: nn.Module) -> bool:
    """The model was dispatched over several devices (``device_map``), with accelerate's hooks
    moving activations, or weights, between them on every forward."""
    return len(set(getattr(model, "hf_device_map", {}).values())) > 1


class ModelRunner:
    """One forward pass for a batch of sequences, each bringing its own number of new tokens.

    ``max_num_seqs`` slots, at most ``max_num_tokens`` cached tokens over all slots (the KV pool is
    allocated once for that budget), at most ``max_model_len`` tokens per sequence. The model is
    put in eval mode. See the module docstring for the route and its costs.
    ``cuda_graph_max_new``: on one CUDA device, steps of at most this many new tokens per
    sequence replay CUDA graphs (:mod:`engine.runner.cuda_graphs`); 0 runs every step eager.
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
    """

    def __init__(self, model: nn.Module, max_num_seqs: int, max_num_tokens: int,
                 max_model_len: int, cuda_graph_max_new: int = 0, pack_cpu_weights: bool = True,
                 tensor_parallel_size: int = 1, fused_ops: bool | None = None):
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        self.max_num_tokens = _positive("max_num_tokens", max_num_tokens)
        self.max_model_len = _positive("max_model_len", max_model_len)
        config = model.config
        check_model_supported(config, max_model_len)
        install_gqa_attention(config)
        max_positions = getattr(config, "n_positions", None)  # absolute position tables (GPT-2)
        if config.model_type == "gpt2" and max_model_len > max_positions:
            raise ValueError(f"max_model_len must be <= n_positions={max_positions} for "
                             f"{config.model_type}, got {max_model_len}")
        self.model = model.eval()
        self._cache_arg = cache_argument(model.base_model)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        tp = _positive("tensor_parallel_size", tensor_parallel_size)
        # oneDNN-packed on CPU in float32; a tensor-parallel head gathers the logits, from its
        # local rows where that is what the plan's head computes (engine/runner/tp_head.py)
        head = model.get_output_embeddings()
        self._lm_head = output_head(model) if tp == 1 else gathered_head(head) or head
        self.gathered_head = tp > 1 and self._lm_head is not head
        if not isinstance(pack_cpu_weights, bool):
            raise ValueError(f"pack_cpu_weights must be True or False, got {pack_cpu_weights!r}")
        self._linears = PackedLinears(_decoder_layers(model) if pack_cpu_weights and tp == 1
                                      else None)
        self.device = execution_device(model.get_input_embeddings())
        self.dtype = next(model.parameters()).dtype
        if fused_ops is not None and not isinstance(fused_ops, bool):
            raise ValueError(f"fused_ops must be None, True or False, got {fused_ops!r}")
        # {"norms": n, "rotary_modules": m}: what the fused kernels replaced (empty: none)
        self.fused: dict[str, int] = {}
        if fused_ops or (fused_ops is None and self.device.type == "cuda"):
            taken = install_fused_ops(model, self.device)
            self.fused = taken if any(taken.values()) else {}
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if kv_heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} must divide the model's "
                             f"num_key_value_heads={kv_heads}")
        self.cache = PagedKVCache(
            attention_devices(model), kv_heads // tp, head_dim, max_num_tokens, max_num_seqs,
            max_model_len, self.dtype, self.device)
        # [max_model_len + 16]: key columns of the mask, padded to a multiple of 16
        self._positions = torch.arange(max_model_len + 16, device=self.device)
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)  # []
        self._min = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype,
                                 device=self.device)  # []
        self._staging = PinnedStaging(self.device)  # the step layout's host-to-device copy
        self._order_staging = PinnedStaging(self.device)  # a split step's reordering indices
        self._free_rows: list[int] = list(range(max_num_tokens - 1, -1, -1))
        self._free_slots: list[int] = list(range(max_num_seqs - 1, -1, -1))
        self._rows: dict[int, list[int]] = {}  # slot -> pool row of each cached token
        self._ascending: dict[int, bool] = {}  # slot -> its rows are one ascending run
        self.graphs: CudaGraphs | None = None
        # the last forward timed like the steps after it (not a graph bucket's eager first step
        # or its capture): what the speculation controller's step costs may record
        self.last_step_steady = True
        # [total_new_tokens, hidden_size] the last forward's final hidden states of every new
        # token, slot order then token order (kept only after keep_features(True): a draft head)
        self.all_hidden: torch.Tensor | None = None
        self._keep_features = False
        if not isinstance(cuda_graph_max_new, int) or cuda_graph_max_new < 0:
            raise ValueError(f"cuda_graph_max_new must be an int >= 0, got {cuda_graph_max_new!r}")
        # (a spread model's hooks move weights or activations: not capturable; every step eager)
        if (cuda_graph_max_new and self.device.type == "cuda" and self.cache.single_device
                and not spread_by_accelerate(model)):
            self.use_graph_buckets(cuda_graph_max_new)
        # a step of decoding and prefilling sequences is folded into one graph bucket (_fold)
        # or else runs as two forwards (_mixed_groups); both off under tensor parallelism,
        # where the other ranks replay each forward as sent
        self.fold_mixed = True
        self.split_mixed = True
        # a verification step of unequal rows is packed, one token a row (packed_rows)
        self.pack_verifications = True
        self.last_packed_rows: int | None = None  # the last step's rows when it was packed
        self.last_kv_len = 0  # the last step's context: its longest sequence's tokens
        # called in each forward once its graph decision is made, before the device runs
        # anything of it (tensor parallelism: the leader sends the step to the other ranks)
        self.before_launch: Callable[[Decision], None] | None = None

    def use_graph_buckets(self, max_num_new: int, capture: bool = True) -> None:
        """Run steps of at most ``max_num_new`` new tokens per sequence through
        :class:`~engine.runner.cuda_graphs.CudaGraphs` (``capture=False``: their padded bucket
        layout eagerly, to check it off-GPU)."""
        # (batches past max_num_seqs: folded steps, whose prompt chunks take several rows)
        self.graphs = CudaGraphs(self._hidden, self._scratch_plan, self.fold_rows,
                                 _positive("max_num_new", max_num_new), self.max_model_len + 1,
                                 self.device, capture)
        self.graphs.twin_max_batch = batch_bucket(self.max_num_seqs)

    @property
    def fold_rows(self) -> int:
        """The most rows a folded step may take (:meth:`_fold`)."""
        return max(FOLD_MIN_ROWS, 2 * batch_bucket(self.max_num_seqs))

    @property
    def fold_cells(self) -> int:
        """The most key cells (rows x key length) a folded or packed step may gather: twice a
        full batch's at the longest context (graphs only)."""
        return 2 * batch_bucket(self.max_num_seqs) * self.graphs.max_kv_len

    def packed_rows(self, num_seqs: int, longest: int, total: int) -> int | None:
        """The rows of a verification step of ``num_seqs`` sequences bringing ``total`` new
        tokens, ``longest`` the most of one, when the runner *packs* it (None: it pads every
        sequence to ``longest``). Packed, each new token is a row of its own on its sequence's
        slot (as a folded prompt chunk's rows, :meth:`_fold`, and exact for the same reasons),
        so the step runs in the decode bucket of ``total`` rows instead of ``num_seqs`` rows of
        ``longest`` tokens: one sequence's drafts do not cost every sequence a padded row. With
        CUDA graphs only (each row gathers its slot's keys: without graphs a step is not mostly
        launches), chains only (a draft tree keeps its row), at most :attr:`fold_rows` rows,
        and only where it was measured to pay: on an H100 (``benchmarks/packed_step.py``, 256
        cached tokens, 4 drafts) a packed step took 0.86-0.96 of the padded one at 64 and 128
        sequences with up to an eighth more rows, and 0.98-1.25 at 8-32 sequences or with
        more rows (each row gathers its slot's keys, and padding is nearly free while the
        weights' reads dominate). The speculation controller reads this rule to price a step
        before it runs."""
        if (self.graphs is None or not self.pack_verifications or longest < 2
                or longest > self.graphs.max_num_new or total > self.fold_rows
                or num_seqs < PACK_MIN_BATCH or total >= num_seqs * longest):
            return None
        return total if total - num_seqs <= PACK_MAX_EXTRA * num_seqs else None

    # ---- slots and budget -------------------------------------------------------------------

    @property
    def num_free_tokens(self) -> int:
        return len(self._free_rows)

    @property
    def num_cached_tokens(self) -> int:
        return self.max_num_tokens - len(self._free_rows)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.cache.bytes_per_token

    def allocate_slot(self) -> int:
        """A fresh, empty slot; RuntimeError when all max_num_seqs slots are in use."""
        if not self._free_slots:
            raise RuntimeError(f"all max_num_seqs={self.max_num_seqs} slots are in use")
        slot = self._free_slots.pop()
        self._rows[slot] = []
        self._ascending[slot] = True
        return slot

    def free_slot(self, slot: int) -> None:
        """Release the slot and all its cached tokens."""
        self._free_rows.extend(reversed(self._slot_rows(slot)))
        del self._rows[slot], self._ascending[slot]
        self._free_slots.append(slot)

    def seq_len(self, slot: int) -> int:
        return len(self._slot_rows(slot))

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of the slot; the rest is forgotten."""
        rows = self._slot_rows(slot)
        if not isinstance(length, int) or not 0 <= length <= len(rows):
            raise ValueError(f"length must be an int in [0, {len(rows)}] for slot {slot}, "
                             f"got {length!r}")
        self._free_rows.extend(reversed(rows[length:]))  # the lowest row is handed out first
        del rows[length:]
        self._ascending[slot] = self._ascending[slot] or not rows

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
        width = self.max_model_len + 1
        for slot, first, path in paths:
            rows = self._slot_rows(slot)
            if (not isinstance(first, int) or not 0 <= first <= len(rows)
                    or len(set(path)) != len(path)
                    or any(not 0 <= j < len(rows) - first for j in path)):
                raise ValueError(f"keep_path: slot {slot} caches {len(rows) - first} tokens "
                                 f"from column {first!r}; path must be distinct indices among "
                                 f"them, got {list(path)}")
        cells: list[int] = []
        moved: list[int] = []
        for slot, first, path in paths:
            if list(path) == list(range(len(path))):
                continue  # (the first nodes already: nothing moves)
            rows = self._rows[slot]
            nodes = rows[first:]
            kept = [nodes[j] for j in path]
            chosen = set(path)
            rows[first:] = kept + [r for j, r in enumerate(nodes) if j not in chosen]
            self._ascending[slot] = False
            cells += range(slot * width + first, slot * width + first + len(kept))
            moved += kept
        if cells:  # (one small copy: the cells, then the rows they point at)
            change = self._to_device(cells + moved)
            self.cache.slot_table.view(-1).index_copy_(0, change[:len(cells)],
                                                       change[len(cells):])

    def _slot_rows(self, slot: int) -> list[int]:
        rows = self._rows.get(slot)
        if rows is None:
            raise ValueError(f"slot {slot!r} is not allocated (allocated: {sorted(self._rows)})")
        return rows

    # ---- forward ----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                logits_indices: Sequence[int] | torch.Tensor | None = None,
                trees: Sequence[Tree | None] | None = None) -> torch.Tensor:
        """Append each slot's new tokens at positions ``seq_len(slot) ...`` and score them.

        Returns float32 logits ``[total_new_tokens, vocab_size]``, rows in slot order then token
        order (or only the rows ``logits_indices`` of that layout). Raises :class:`KVCacheFull`
        before changing anything when the budget cannot hold the new tokens.

        ``trees[i]`` (None: a chain): ``(first, parents)``, the slot's new tokens from index
        ``first`` on are the nodes of a draft tree (see :data:`Tree`): each node sits one
        position past its parent and sees only the tokens before ``first`` and its own
        ancestors. The slot then caches every node, in node order, until :meth:`keep_path`.
        """
        starts = self._check_step(slots, token_ids)
        trees = self._check_trees(trees, token_ids)
        num_rows = sum(len(t) for t in token_ids)
        if num_rows > len(self._free_rows):
            raise KVCacheFull(num_rows, len(self._free_rows))
        on_device = isinstance(logits_indices, torch.Tensor)
        if logits_indices is not None and not on_device:
            logits_indices = self._check_logits_indices(logits_indices, num_rows)
        kv_len = max(start + len(ids) for start, ids in zip(starts, token_ids, strict=True))
        self.last_kv_len = kv_len
        fold = self._fold(token_ids, trees, kv_len) if self.fold_mixed else None
        self.last_packed_rows = None
        if fold is None:  # (a verification of unequal rows: one token a row, or None)
            fold = self._pack(token_ids, trees, kv_len)
        if fold is not None:  # (each prompt chunk as rows of the step's width, one slot each)
            slots, token_ids, starts, trees = self._folded(fold, slots, token_ids, starts, trees)
        groups = (self._mixed_groups(token_ids) if self.split_mixed and not on_device
                  and fold is None else None)
        if groups is not None:
            return self._forward_groups(groups, slots, token_ids, logits_indices, trees)
        batch_size, num_new = len(slots), max(len(t) for t in token_ids)
        bucket = None if self.graphs is None else self.graphs.bucket(batch_size, num_new, kv_len)
        if self.before_launch is not None:
            self.before_launch(NO_DECISION if self.graphs is None else self.graphs.decision)
        # a bucket pads with scratch sequences, and each sequence with scratch tokens
        rows_batch, rows_new = (batch_size, num_new) if bucket is None else bucket[:2]
        host, token_rows = self._plan_step(slots, token_ids, starts, rows_new, rows_batch, trees)
        # (a draft head's features: the rows of every new token, before the kept ones)
        num_all = len(token_rows) if self._keep_features else 0
        kept = token_rows if logits_indices is None or on_device else [
            token_rows[i] for i in logits_indices]
        meta = self._to_device(host + token_rows[:num_all] + kept)  # one host-to-device copy
        rows_t = meta[len(host) + num_all:]  # [num_logits] padded index of each kept row
        if on_device:
            rows_t = rows_t[logits_indices.to(self.device).long()]
        self.last_step_steady = True
        if bucket is not None:
            hidden = self.graphs.replay(bucket, meta[:len(host)])
            self.last_step_steady = self.graphs.steady
        else:
            # one length and one number of new tokens for all: transformers' causal mask is exact
            uniform = (len(set(starts)) == 1 and num_rows == batch_size * num_new
                       and not any(trees))
            run = self._rows[slots[0]][0] if batch_size == 1 and self._ascending[slots[0]] else None
            hidden = self._hidden(meta[:len(host)], batch_size, num_new, kv_len, starts[0],
                                  uniform, run)
        # (device_map="auto" may leave the last layer and the head on other devices than the
        # embeddings: hidden states and logits come back to the runner's device)
        if self._keep_features:  # (a draft head reads the target's features)
            all_rows = meta[len(host):len(host) + num_all].to(hidden.device)
            self.all_hidden = hidden.index_select(0, all_rows).to(self.device)
        hidden = hidden.index_select(0, rows_t.to(hidden.device))  # [num_logits, hidden_size]
        return self._lm_head(hidden).float().to(self.device)

    def _fold(self, token_ids: Sequence[Sequence[int]], trees: Sequence[Tree | None],
              kv_len: int) -> int | None:
        """The width of a *folded* step, or None: with CUDA graphs, a step of short rows
        (decodes, verifications: at most ``max_num_new`` tokens) and long ones (prompt chunks)
        runs as one forward in one graph bucket, each long row laid out as consecutive rows of
        that width on the same slot (positions and the causal mask as one row's: a row's keys
        and values are in the pool before any row reads them). Two forwards (:meth:`_mixed_groups`)
        cost about two steps on a GPU where a step is mostly launches; the folded one about one.
        The width: from the longest short row to ``max_num_new``, where the rows fit
        :attr:`fold_rows` and gather at most twice the key cells of a full batch at the longest
        context, one whose bucket a captured graph serves (its own or a cover: a bucket met
        first runs eager, about ten graph steps, and is captured the next time), then the
        fewest padded tokens in its bucket, then the fewest rows."""
        graphs = self.graphs
        if graphs is None:
            return None
        lens = [len(t) for t in token_ids]
        limit = graphs.max_num_new
        short = [n for n in lens if n <= limit]
        long = [n for n, tree in zip(lens, trees, strict=True) if n > limit and tree is None]
        if not short or not long or len(short) + len(long) < len(lens):
            return None  # (nothing to fold, or a long row that is a tree)
        most_rows, cells = self.fold_rows, self.fold_cells
        kv = kv_bucket(kv_len, graphs.max_kv_len)
        best: tuple[bool, int, int, int] | None = None  # (no graph, padded tokens, rows, width)
        for width in range(max(short), limit + 1):
            rows = len(short) + sum(-(-n // width) for n in long)
            if rows > most_rows or batch_bucket(rows) * kv > cells:
                continue
            option = (not graphs.ready(rows, width, kv_len), batch_bucket(rows) * width, rows,
                      width)
            best = option if best is None or option < best else best
        return None if best is None else best[3]

    def _pack(self, token_ids: Sequence[Sequence[int]], trees: Sequence[Tree | None],
              kv_len: int) -> int | None:
        """1 when the step is packed (:meth:`packed_rows`; :meth:`_folded` then cuts every row
        into rows of one token), else None; sets :attr:`last_packed_rows`. Never a step with a
        draft tree, nor one whose rows would gather more than twice the key cells of a full
        batch at the longest context (:meth:`_fold`'s bound)."""
        lens = [len(t) for t in token_ids]
        rows = self.packed_rows(len(lens), max(lens), sum(lens))
        if rows is None or any(tree is not None for tree in trees):
            return None
        if batch_bucket(rows) * kv_bucket(kv_len, self.graphs.max_kv_len) > self.fold_cells:
            return None
        self.last_packed_rows = rows
        return 1

    def _folded(self, width: int, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                starts: list[int], trees: Sequence[Tree | None]
                ) -> tuple[list[int], list[list[int]], list[int], list[Tree | None]]:
        """The step of :meth:`_fold`'s ``width``: every row longer than it cut into rows of
        ``width`` tokens (the last one shorter) on its slot, in place, so that the padded index
        of every new token stays in slot order then token order."""
        out: tuple[list, list, list, list] = ([], [], [], [])  # slots, ids, starts, trees
        for slot, ids, start, tree in zip(slots, token_ids, starts, trees, strict=True):
            # (a row of at most ``width`` tokens stays whole, with its tree; a longer one is a
            # prompt chunk, never a tree: _fold)
            cuts = [(ids, start, tree)] if len(ids) <= width else [
                (ids[at:at + width], start + at, None) for at in range(0, len(ids), width)]
            for piece, first, piece_tree in cuts:
                for column, value in zip(out, (slot, list(piece), first, piece_tree),
                                         strict=True):
                    column.append(value)
        return out

    def _mixed_groups(self, token_ids: Sequence[Sequence[int]]
                      ) -> tuple[list[int], list[int]] | None:
        """A step of short rows (decodes, verifications: at most the graphs' ``max_num_new``
        new tokens, ``SPLIT_SHORT`` without graphs) and long ones (prompt chunks) split in two
        forwards, ``(short, long)`` indices, when padding the short rows to the longest (to
        its graph bucket's width with graphs) saves at least ``SPLIT_MIN_SAVED`` padded tokens;
        None: one forward."""
        lens = [len(t) for t in token_ids]
        limit = self.graphs.max_num_new if self.graphs is not None else SPLIT_SHORT
        longest = max(lens)
        if longest <= limit or len(lens) < 2:
            return None
        short = [i for i, n in enumerate(lens) if n <= limit]
        if not short:
            return None
        long = [i for i, n in enumerate(lens) if n > limit]
        width = longest if self.graphs is None else new_bucket(longest, limit)
        saved = len(short) * (width - max(lens[i] for i in short))
        return (short, long) if saved >= SPLIT_MIN_SAVED else None

    def _forward_groups(self, groups: tuple[list[int], list[int]], slots: Sequence[int],
                        token_ids: Sequence[Sequence[int]], logits_indices: list[int] | None,
                        trees: Sequence[Tree | None]) -> torch.Tensor:
        """:meth:`forward` of a step as two forwards, one per group of :meth:`_mixed_groups`
        (the short rows first), their logits (and :attr:`all_hidden`) put back in the step's
        row order (the reordering indices go to the device before the forwards, through a
        pinned buffer of their own: nothing waits for the device)."""
        lens = [len(t) for t in token_ids]
        first = np.cumsum([0] + lens[:-1])  # [batch_size]: each sequence's first row
        order = np.concatenate([np.arange(first[i], first[i] + lens[i])
                                for group in groups for i in group])  # [num_rows]
        where = np.empty_like(order)  # [num_rows]: each row's place in the groups' rows
        where[order] = np.arange(len(order))
        wanted = np.arange(len(order)) if logits_indices is None else np.asarray(
            logits_indices, dtype=np.int64)  # [num_logits] rows asked for
        at = where[wanted]  # [num_logits]: their places in the groups' rows
        sizes = [sum(lens[i] for i in group) for group in groups]
        ends = np.cumsum(sizes)
        mine = [np.flatnonzero((at >= end - size) & (at < end))  # each group's asked-for rows
                for size, end in zip(sizes, ends, strict=True)]
        taken = np.concatenate(mine)  # [num_logits]: the asked-for place of each logits row
        back = np.empty_like(taken)  # [num_logits]: each asked-for row's place in the logits
        back[taken] = np.arange(len(taken))
        keep = self._keep_features
        indices = self._order_staging(np.concatenate([back, where]) if keep else back)
        logits, features, steady = [], [], True
        for group, asked, end, size in zip(groups, mine, ends, sizes, strict=True):
            logits.append(self.forward([slots[i] for i in group], [token_ids[i] for i in group],
                                       (at[asked] - (end - size)).tolist(),
                                       [trees[i] for i in group]))
            features.append(self.all_hidden)
            steady = steady and self.last_step_steady
        self.last_step_steady = steady
        out = torch.cat(logits)  # [num_logits, vocab_size], group by group
        out = out.index_select(0, indices[:len(back)])
        if keep:  # [num_rows, hidden_size], step order
            self.all_hidden = torch.cat(features).index_select(0, indices[len(back):])
        return out

    def keep_features(self, keep: bool) -> None:
        """Keep every forward's final hidden states of all new tokens in :attr:`all_hidden`."""
        self._keep_features = keep
        self.all_hidden = None

    def _hidden(self, inputs: torch.Tensor, batch_size: int, num_new: int, kv_len: int,
                query_offset: int = 0, uniform: bool = False,
                run: int | None = None) -> torch.Tensor:
        """The model's last hidden states ``[batch_size * num_new, hidden_size]`` for a step laid
        out in ``inputs`` (see :meth:`_plan_step`); also the body of every CUDA graph."""
        padded = batch_size * num_new
        # each [batch_size, num_new]
        input_ids, positions, write_rows, cells, limits, ancestors = inputs[
            :LAYOUT_ROWS * padded].view(LAYOUT_ROWS, batch_size, num_new)
        slots_t = inputs[LAYOUT_ROWS * padded:]  # [batch_size]
        self.cache.prepare_step(slots_t, write_rows, cells.reshape(-1), kv_len, query_offset, run)
        mask = None if uniform else self._mask(limits, ancestors, kv_len)
        # (engine/runner/attention_backend.py: no per-shape plan builds, no key/value head copies)
        with without_cudnn_attention(self.device), gqa_attention(mask is not None or num_new > 1), \
                self._linears.use(padded), fused_forward(bool(self.fused)):
            hidden = self.model.base_model(
                input_ids=input_ids, position_ids=positions, attention_mask=mask,
                use_cache=True, **{self._cache_arg: self.cache}).last_hidden_state
        return hidden.reshape(padded, -1)  # [batch_size * num_new, hidden_size]

    def _to_device(self, values: list[int]) -> torch.Tensor:
        """``values`` as a long tensor on the model's device, through a persistent pinned buffer
        on CUDA (page-locking a fresh tensor every step costs more than the copy)."""
        # (through numpy: torch.tensor of a list of Python ints took 171 us for 900 of them on
        # the development CPU, numpy 24 us; a drafting step at batch 32 has about 1000)
        return self._staging(np.fromiter(values, np.int64, len(values)))  # [len(values)]

    def _mask(self, limits: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> torch.Tensor:
        """``[batch_size, 1, num_new, kv_len]``: key column ``j`` visible to a new token iff
        ``j <= limit`` (its own column for a chain token: causal), or ``j = limit + 1 + b`` for
        a set bit ``b`` of its ``ancestors`` (a tree node's own column and its ancestors', the
        nodes' columns starting right after the last column before the tree); ``limits``,
        ``ancestors [batch_size, num_new]``. Additive (0 / dtype min) in the model's dtype, so
        that ``sdpa`` converts nothing per layer, on rows padded to 16 columns (its
        memory-efficient kernel copies a mask whose row stride is not a multiple of 16)."""
        width = -(-kv_len // 16) * 16
        columns = self._positions[:width].view(1, 1, 1, width)
        limit = limits[:, None, :, None]  # [batch_size, 1, num_new, 1]
        after = columns - limit - 1  # [batch_size, 1, num_new, width] bit of a column
        in_tree = (ancestors[:, None, :, None] >> after.clamp(0, MAX_TREE_NODES - 1)) & 1
        visible = (after < 0) | ((in_tree == 1) & (after < MAX_TREE_NODES))
        return torch.where(visible, self._zero, self._min)[..., :kv_len]

    def _plan_step(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                   starts: list[int], num_new: int, rows_batch: int,
                   trees: Sequence[Tree | None]) -> tuple[list[int], list[int]]:
        """Give every new token a pool row and lay out the step's index tensors on the host.

        Returns ``host``: input ids, positions, pool rows, slot-table cells, mask limits and
        ancestor bits (:meth:`_mask`) (each ``[rows_batch * num_new]``; padding: last
        position, scratch row, scratch column, last column, none; the ``rows_batch -
        len(slots)`` padding sequences are the scratch slot at position 0), then the
        ``rows_batch`` slots; ``token_rows``: the padded index of every new token.
        """
        width = self.max_model_len + 1
        padded = rows_batch * num_new
        host = self._scratch_plan(rows_batch, num_new)
        host[LAYOUT_ROWS * padded:LAYOUT_ROWS * padded + len(slots)] = slots
        token_rows: list[int] = []
        for b, (slot, ids, tree) in enumerate(zip(slots, token_ids, trees, strict=True)):
            start, n, base, pad = starts[b], len(ids), b * num_new, num_new - len(ids)
            rows = self._free_rows[-n:][::-1]  # ascending while the pool is unfragmented
            del self._free_rows[-n:]
            held = self._rows[slot]
            self._ascending[slot] = self._ascending[slot] and rows == list(
                range(held[-1] + 1 if held else rows[0], rows[-1] + 1))
            held.extend(rows)
            positions = [*range(start, start + n)]
            limits = positions  # (a chain token sees up to its own column; no tree bits)
            if tree is not None:
                limits, ancestors = list(positions), [0] * n
                first, parents = tree
                root = start + first - 1  # the last column (and position) before the nodes
                for j, parent in enumerate(parents):
                    up = ancestors[first + parent] if parent >= 0 else 0
                    ancestors[first + j] = up | 1 << j
                    positions[first + j] = (positions[first + parent] if parent >= 0
                                            else root) + 1
                    limits[first + j] = root
            host[base:base + n] = ids
            host[padded + base:padded + base + num_new] = positions + [positions[-1]] * pad
            host[2 * padded + base:2 * padded + base + n] = rows
            host[3 * padded + base:3 * padded + base + num_new] = [
                slot * width + p for p in range(start, start + n)] + [
                slot * width + self.cache.scratch_column] * pad
            host[4 * padded + base:4 * padded + base + num_new] = limits + [limits[-1]] * pad
            if tree is not None:  # (the scratch plan's ancestor bits are 0 already)
                host[5 * padded + base:5 * padded + base + n] = ancestors
            token_rows.extend(range(base, base + n))
        return host, token_rows

    def _scratch_plan(self, rows_batch: int, num_new: int) -> list[int]:
        """The host layout of a step of padding only: input id 0 at position 0, writing the
        scratch row through the scratch slot's scratch column."""
        padded = rows_batch * num_new
        cell = self.cache.scratch_slot * (self.max_model_len + 1) + self.cache.scratch_column
        return ([0] * (2 * padded) + [self.cache.scratch_row] * padded + [cell] * padded
                + [0] * (2 * padded) + [self.cache.scratch_slot] * rows_batch)

    def _check_step(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]]) -> list[int]:
        """Validate a step without changing anything; return each slot's seq_len."""
        if len(slots) != len(token_ids) or not slots:
            raise ValueError(f"slots and token_ids must be non-empty and of one length, got "
                             f"{len(slots)} and {len(token_ids)}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct, got {list(slots)}")
        starts = []
        for slot, ids in zip(slots, token_ids, strict=True):
            start = len(self._slot_rows(slot))
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
