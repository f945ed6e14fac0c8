"""The model side of the runner: the model prepared once, then each laid-out forward run on it.

Route. The model runs unchanged (its own attention code, ``sdpa`` or ``eager``) on a padded batch
``[batch_size, num_new]`` (:mod:`engine.runner.step_inputs`), with

- ``position_ids [batch_size, num_new]``: each token's own position;
- ``past_key_values`` (``cache`` in recent transformers): a
  :class:`~engine.runner.kv_cache.PagedKVCache`, whose ``update`` writes the new keys and values
  into preallocated token pools and returns each sequence's cached tokens gathered
  ``[batch_size, heads, kv_len, head_dim]`` in position order;
- ``attention_mask [batch_size, 1, num_new, kv_len]`` (:meth:`Executor.mask`): key column ``j``
  is visible to a chain token at position ``p`` iff ``j <= p``; a draft tree's nodes sit in
  columns of their own after the context and see only their ancestors' columns. transformers
  passes a prepared 4-D mask through as is. A *uniform* step (every sequence has one length and
  brings one number of new tokens, e.g. batch 1) passes no mask: transformers builds the causal
  mask from the cache's ``get_query_offset`` / ``get_mask_sizes``, and ``sdpa`` skips it for a
  decode step or a prefill from empty (its fused GQA kernels then run, with no ``repeat_kv``).

Logits come from ``lm_head`` applied only to the rows asked for, never to padding, except in a
decode bucket's CUDA graph (and a small verification bucket's), which runs the head and the
greedy argmax on each of its rows (:meth:`Executor._graph_body`: only the logits' float32 copy
follows its replay). On CPU in
float32 the head of several rows runs on a oneDNN-reordered copy of its weight
(:mod:`engine.runner.cpu_lm_head`), and the decoder's linear maps in a step of 1 to 64 rows
through the route measured fastest for that many rows when the runner was built
(:mod:`engine.runner.cpu_linears`). On CUDA, LLaMA-form RMSNorms and rotary embeddings run as
Triton kernels (:mod:`engine.runner.fused_ops`), the rotary's cos and sin read from a table
(:mod:`engine.runner.rotary_table`), and forwards of a graph bucket's sizes replay a
CUDA graph (:mod:`engine.runner.cuda_graphs`) whose body is :meth:`Executor.hidden` itself (and
the head, for one token a row or a few rows: :meth:`Executor._graph_body`).

Costs. A forward ships its index tensors in one host-to-device copy (through a persistent pinned
buffer on CUDA) and never waits for the device. Per layer the gather copies the batch's cached
keys and values (as ``DynamicCache``'s ``torch.cat`` does), except for one sequence on an
ascending run of pool rows, which is read as a view; a masked step reads the shared key and
value heads in place (:mod:`engine.runner.attention_backend`). With ``attention_backend="paged"``
neither the gather nor the mask is made: attention reads the pool through the slot table
(:mod:`engine.runner.paged_attention`), the lone sequence's view excepted.

Deterministic mode (``deterministic=True``). Every token's logits are bitwise the same whatever
else the forward holds: every ``nn.Linear`` of the model, the output head included, runs the
batch-invariant kernel (:mod:`engine.runner.invariant_matmul`: one tile shape and one reduction
order per row whatever the number of rows); attention is always the paged kernel, the lone
sequence's view included, in its chain order (one token a program, one split, a tree node's
ancestors read where a chain token's keys lie: :mod:`engine.runner.paged_attention`); RMSNorm and
rotary are the fused kernels (one row per program, elementwise). The rest of a layer is
elementwise or exact (embedding look-ups, residual sums, index selects). The CPU routes that
depend on the number of rows (:mod:`engine.runner.cpu_linears`, ``cpu_lm_head``) are off.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from itertools import chain

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig

from engine.runner.attention_backend import (
    GQA_SDPA,
    PagedStep,
    gqa_attention,
    install_gqa_attention,
    paged_attention_step,
    without_cudnn_attention,
)
from engine.runner.attention_support import check_model_supported
from engine.runner.chain_layout import write_chains
from engine.runner.cpu_linears import PackedLinears
from engine.runner.cpu_lm_head import output_head
from engine.runner.cuda_graphs import CudaGraphs, Key, kv_bucket
from engine.runner.forward_output import FedChains
from engine.runner.fused_layers import install_fused_attention, install_fused_layers
from engine.runner.fused_ops import fused_forward, install_fused_ops
from engine.runner.fused_projections import install_fused_projections, remove_fused_projections
from engine.runner.invariant_matmul import InvariantLinears, linear_modules
from engine.runner.kv_cache import ATTENTION_BACKENDS, PagedKVCache
from engine.runner.paged_attention import SplitPlan, split_bucket, split_plan
from engine.runner.paged_attention import warm_up as warm_up_paged
from engine.runner.rotary_table import install_rotary_table
from engine.runner.step_inputs import LAYOUT_ROWS, Scratch, StepInputs, scratch_inputs
from engine.runner.step_layout import MAX_TREE_NODES
from engine.runner.tp_head import gathered_head
from samplers.greedy import argmax_tokens
from samplers.metadata import PinnedStaging


def decoder_layers(model: nn.Module) -> nn.ModuleList:
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
    layers = decoder_layers(model)
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


def auto_backend(model: nn.Module, layer_devices: dict[int, torch.device],
                 config: PretrainedConfig, tensor_parallel_size: int) -> str:
    """``attention_backend="auto"``: ``paged`` where it runs (an ``sdpa`` model whose layers are
    all on the one CUDA device of its embeddings, no tensor parallelism), else ``gather``."""
    device = execution_device(model.get_input_embeddings())
    if (device.type == "cuda" and tensor_parallel_size == 1
            and config._attn_implementation == GQA_SDPA
            and set(layer_devices.values()) == {device}):
        return "paged"
    return "gather"


_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)
# A graph bucket of several new tokens a row runs the output head inside when its logits hold
# at most this many values (rows times the vocabulary): every such graph keeps its logits (and a
# folded step's prompt rows get the head too), 16 MiB a graph in bf16. That is 64 rows of a 128k
# vocabulary (a verification of 4 drafts at batch 12) and 170 of the default model's 49k (4
# drafts at batch 32, whose greedy chains are then decided from the graph's argmax in one
# launch: docs/performance.md, "A drafting step's host work").
HEAD_GRAPH_LOGITS = 64 * 131072


def check_deterministic(model: nn.Module, config: PretrainedConfig, attention_backend: str,
                        tensor_parallel_size: int, fused_ops: bool | None) -> None:
    """ValueError unless ``deterministic=True`` can hold for ``model``: the paged kernel and the
    fused norms (an ``sdpa`` model), no tensor parallelism, Triton where the model is (CUDA,
    or the interpreter on CPU), no hooks of accelerate on the products."""
    device = execution_device(model.get_input_embeddings())
    problems = []
    if device.type != "cuda" and not _INTERPRETED:
        problems.append(f"a CUDA device (or TRITON_INTERPRET=1 on CPU), got {device}")
    if attention_backend == "gather" or config._attn_implementation != GQA_SDPA:
        problems.append("paged attention of an sdpa model, got attention_backend="
                        f"{attention_backend!r} and attn_implementation="
                        f"{config._attn_implementation!r}")
    if tensor_parallel_size != 1:
        problems.append(f"tensor_parallel_size=1, got {tensor_parallel_size}")
    if fused_ops is False:
        problems.append("the fused RMSNorm and rotary kernels, got fused_ops=False")
    if spread_by_accelerate(model):
        problems.append("the whole model on one device (no accelerate hooks)")
    if problems:
        raise ValueError("deterministic=True needs " + "; ".join(problems))


class Executor:
    """``model`` (put in eval mode) prepared for the runner's forwards: its attention, fused
    kernels and CPU weight copies installed, its KV pools allocated for ``max_num_tokens``
    tokens of ``max_num_seqs`` slots of at most ``max_model_len``, its output head (gathered
    under tensor parallelism, :mod:`engine.runner.tp_head`). See :class:`ModelRunner
    <engine.runner.model_runner.ModelRunner>` for the arguments."""

    def __init__(self, model: nn.Module, max_num_seqs: int, max_num_tokens: int,
                 max_model_len: int, pack_cpu_weights: bool, tensor_parallel_size: int,
                 fused_ops: bool | None, attention_backend: str = "auto",
                 deterministic: bool = False) -> None:
        config = model.config
        check_model_supported(config, max_model_len)
        install_gqa_attention(config)
        if attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got "
                             f"{attention_backend!r}")
        layer_devices = attention_devices(model)
        self.deterministic = deterministic
        if deterministic:
            check_deterministic(model, config, attention_backend, tensor_parallel_size, fused_ops)
            attention_backend = "paged"
        # paged reads: the pool read in place by our attention function (engine.runner.
        # attention_backend), which an sdpa model calls; one device holds every pool and the
        # slot table (the kernel indexes the table from the pool's device)
        if attention_backend == "auto":
            attention_backend = auto_backend(model, layer_devices, config, tensor_parallel_size)
        self.paged = attention_backend == "paged"
        if self.paged and config._attn_implementation != GQA_SDPA:
            raise ValueError(f"attention_backend='paged' needs a model loaded with "
                             f"attn_implementation='sdpa', got {config._attn_implementation!r}")
        max_positions = getattr(config, "n_positions", None)  # absolute position tables (GPT-2)
        if config.model_type == "gpt2" and max_model_len > max_positions:
            raise ValueError(f"max_model_len must be <= n_positions={max_positions} for "
                             f"{config.model_type}, got {max_model_len}")
        self.model = model.eval()
        self.max_model_len = max_model_len
        self._cache_arg = cache_argument(model.base_model)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        tp = self._tp = tensor_parallel_size
        # oneDNN-packed on CPU in float32; a tensor-parallel head gathers the logits, from its
        # local rows where that is what the plan's head computes (engine/runner/tp_head.py)
        head = model.get_output_embeddings()
        self._lm_head = (head if deterministic else output_head(model) if tp == 1
                         else gathered_head(head) or head)
        self.gathered_head = tp > 1 and self._lm_head is not head
        # one product for q/k/v and one for gate/up in a CUDA forward's layers
        # (engine/runner/fused_projections.py); any other engine runs one map per nn.Linear, so
        # a model an earlier runner stacked gets its plain forwards back first
        stack = (fused_ops is not False and not deterministic and tp == 1
                 and execution_device(model.get_input_embeddings()).type == "cuda")
        if not stack:
            remove_fused_projections(model)
        if not isinstance(pack_cpu_weights, bool):
            raise ValueError(f"pack_cpu_weights must be True or False, got {pack_cpu_weights!r}")
        self._linears = PackedLinears(decoder_layers(model) if pack_cpu_weights and tp == 1
                                      and not deterministic else None)
        # (deterministic: every product of the model, the head's too, batch-invariant; else
        # nothing to enter per forward)
        self._invariant_products = (InvariantLinears(linear_modules(model)).use if deterministic
                                    else nullcontext)
        self.device = execution_device(model.get_input_embeddings())
        self.dtype = next(model.parameters()).dtype
        if fused_ops is not None and not isinstance(fused_ops, bool):
            raise ValueError(f"fused_ops must be None, True or False, got {fused_ops!r}")
        # {"norms": n, "rotary_modules": m, "layers": l, "attention": a, "rotary_table": t,
        # "qkv": q, "gate_up": g}: what the fused kernels replaced (empty: none)
        self.fused: dict[str, int] = {}
        if fused_ops or deterministic or (fused_ops is None and self.device.type == "cuda"):
            taken = install_fused_ops(model, self.device)
            taken["layers"] = install_fused_layers(model)
            taken["attention"] = install_fused_attention(model)
            # (past the last position: the padding of a graph's rows repeats positions)
            taken["rotary_table"] = install_rotary_table(model, max_model_len + 16)
            if stack:
                taken.update(install_fused_projections(model))
            self.fused = taken if any(taken.values()) else {}
        self._stacked = bool(self.fused.get("qkv") or self.fused.get("gate_up"))
        if deterministic and not self.fused.get("norms"):
            raise ValueError("deterministic=True needs the model's RMSNorms in the fused kernel "
                             "(LLaMA's form), found none")
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if kv_heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} must divide the model's "
                             f"num_key_value_heads={kv_heads}")
        if self.paged and set(layer_devices.values()) != {self.device}:
            raise ValueError("attention_backend='paged' needs the whole model on one device, got "
                             f"layers on {sorted(set(map(str, layer_devices.values())))}")
        self._heads, self._kv_heads = num_heads // tp, kv_heads // tp  # this rank's
        self._head_dim = head_dim
        self.cache = PagedKVCache(
            layer_devices, kv_heads // tp, head_dim, max_num_tokens, max_num_seqs,
            max_model_len, self.dtype, self.device, read_in_place=self.paged)
        self.scratch = Scratch(self.cache.scratch_slot, self.cache.scratch_row, max_model_len + 1)
        # [max_model_len + 16]: key columns of the mask, padded to a multiple of 16
        self._positions = torch.arange(max_model_len + 16, device=self.device)
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)  # []
        self._min = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype,
                                 device=self.device)  # []
        self._staging = PinnedStaging(self.device)  # the step layout's host-to-device copy
        # (the last fed-chains layout's device copy: (its StepInputs, its hidden rows, meta))
        self._chains_meta: tuple[StepInputs, int, torch.Tensor] | None = None
        self._order_staging = PinnedStaging(self.device)  # a split step's reordering indices
        self.graphs: CudaGraphs | None = None
        self._head_max_batch = 0  # decode buckets of at most this many rows run the head in
        # their graph (use_graph_buckets; 0: none)
        # the chains' writes into a forward's layout, one graph a layout (with self.graphs)
        # decoder layers whose inputs every forward also returns (an EAGLE-3 head's features)
        self.aux_layers: tuple[int, ...] = ()
        self.hidden_size: int = config.hidden_size

    def keep_aux_layers(self, layer_ids: Sequence[int]) -> None:
        """Make every forward also compute the inputs of decoder layers ``layer_ids`` (layer
        ``i``'s input is layer ``i - 1``'s output; 0: the embeddings'), inside the same
        forward, so that a CUDA graph captured afterwards returns them as outputs of its own.
        Called before any graph is captured (a captured graph has no room for them)."""
        num_layers = len(decoder_layers(self.model))
        ids = tuple(int(i) for i in layer_ids)
        if not ids or any(not 0 <= i < num_layers for i in ids):
            raise ValueError(f"aux layer ids must be 1 or more of 0 .. {num_layers - 1} (the "
                             f"target's decoder layers), got {list(layer_ids)}")
        if self.graphs is not None and self.graphs.num_graphs:
            raise RuntimeError("aux layers must be kept before any CUDA graph is captured")
        self.aux_layers = ids

    @property
    def can_capture(self) -> bool:
        """CUDA graphs can hold this model's forwards: one CUDA device, no accelerate hooks
        (a spread model's hooks move weights or activations)."""
        return (self.device.type == "cuda" and self.cache.single_device
                and not spread_by_accelerate(self.model))

    def use_graph_buckets(self, max_num_new: int, max_batch_size: int, twin_max_batch: int,
                          capture: bool, twin_width: Callable[[int], int] | None) -> None:
        """Run forwards of at most ``max_num_new`` tokens a row and ``max_batch_size`` rows
        through :class:`~engine.runner.cuda_graphs.CudaGraphs` (``capture=False``: their padded
        bucket layout eagerly, to check it off-GPU)."""
        # (a tensor-parallel head gathers across ranks: it stays after the replay; decode
        # buckets past the runner's sequences hold folded or packed rows: theirs too)
        self._head_max_batch = twin_max_batch if self._tp == 1 else 0
        self.graphs = CudaGraphs(self._graph_body, partial(scratch_inputs, self.scratch),
                                 max_batch_size, max_num_new, self.max_model_len + 1,
                                 self.device, capture, twin_width,
                                 split_bucket if self.paged else kv_bucket)
        self.graphs.twin_max_batch = twin_max_batch

    def warm_up(self) -> None:
        """Compile the paged kernel's variants before the first request waits for them (paged
        reads on CUDA only)."""
        if self.paged and self.device.type == "cuda":
            warm_up_paged(self.device, self.dtype, self._heads, self._kv_heads, self._head_dim,
                          chain_order=self.deterministic, max_kv_len=self.max_model_len + 1)

    def to_device(self, values: Sequence[int] | np.ndarray) -> torch.Tensor:
        """``values`` as a long tensor ``[len(values)]`` on the model's device, through a
        persistent pinned buffer on CUDA (page-locking a fresh tensor every step costs more
        than the copy; numpy builds the array several times faster than ``torch.tensor``). An
        int64 array goes as it is (``np.fromiter`` over one walks it an element at a time)."""
        if isinstance(values, np.ndarray):
            return self._staging(values.astype(np.int64, copy=False))
        return self._staging(np.fromiter(values, np.int64, len(values)))

    def order_to_device(self, values: np.ndarray) -> torch.Tensor:
        """A split step's reordering indices ``[n]`` on the device, through a pinned buffer of
        their own (sent before the step's forwards: nothing waits for the device)."""
        return self._order_staging(values)

    def point_cells(self, cells: list[int], rows: list[int]) -> None:
        """Point the slot table's ``cells`` at pool ``rows`` (one small copy: cells, then
        rows)."""
        change = self.to_device(cells + rows)
        self.cache.slot_table.view(-1).index_copy_(0, change[:len(cells)], change[len(cells):])

    def run(self, inputs: StepInputs, bucket: Key | None, kv_len: int,
            logits_indices: Sequence[int] | torch.Tensor | None, keep_hidden: bool,
            query_offset: int = 0, uniform: bool = False, run: int | None = None,
            feed: tuple[torch.Tensor, list[int], list[int]] | None = None,
            chains: FedChains | None = None,
            point: tuple[list[int], list[int]] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                       torch.Tensor | None, bool]:
        """One forward of ``inputs``: in graph bucket ``bucket`` (``CudaGraphs.bucket``'s
        answer) or eagerly (None, then ``query_offset``, ``uniform`` and ``run``: see
        :meth:`hidden`). Returns float32 logits ``[num_logits, vocab_size]`` of the new tokens
        ``logits_indices`` (None: all); their argmax ``[num_logits]`` where a decode bucket's
        graph computed it (:meth:`_graph_body`; else None); their final hidden states
        ``[num_tokens, hidden_size]`` and the inputs of the aux layers ``[num_tokens,
        len(aux_layers) * hidden_size]`` (None without aux layers) when ``keep_hidden`` (else
        None); and whether the forward timed like the steps after it (not a bucket's eager
        first step or capture). A graph's argmax is a view of its static output where the rows
        kept are its first ones: read it before the runner's next forward.
        ``feed``: ``(values, at, sources)``, input id ``at[i]`` of the layout becomes
        ``values[sources[i]]`` on the device (tokens an overlapped step has not brought back).
        ``chains``: the first ``len(base)`` rows' ids and positions are on the device
        (:func:`~engine.runner.chain_layout.write_chains`); ``point``: ``(cells, rows)`` to
        point the slot table's cells at first (:meth:`point_cells`, in the layout's copy)."""
        host, token_rows = inputs.host, inputs.token_rows
        on_device = isinstance(logits_indices, torch.Tensor)
        num_all = len(token_rows) if keep_hidden else 0
        kept = token_rows if logits_indices is None or on_device else [
            token_rows[i] for i in logits_indices]
        at, sources = (feed[1], feed[2]) if feed is not None else ([], [])
        cells, rows = point if point is not None else ([], [])
        # one host-to-device copy: layout, hidden rows, kept rows, fed positions and sources,
        # slot-table cells and their rows; none for a fed-chains layout that is the last
        # one's again with no cell to point (what the host wrote is on the device still, and
        # write_chains writes the rest again)
        reuse = self._chains_meta
        if (chains is not None and not cells and reuse is not None and reuse[0] is inputs
                and reuse[1] == num_all):
            meta = reuse[2]
        elif isinstance(host, np.ndarray):  # (a fed-chains layout: arrays)
            meta = self.to_device(np.concatenate([host, token_rows[:num_all], kept, np.fromiter(
                chain(at, sources, cells, rows), np.int64)]))
            if chains is not None and feed is None and logits_indices is None:
                self._chains_meta = (inputs, num_all, meta)
        else:
            meta = self.to_device(host + token_rows[:num_all] + kept + at + sources + cells
                                  + rows)
        num_fed = len(at)
        end = len(host) + num_all + len(kept)
        if cells:
            changes = meta[end + 2 * num_fed:]
            self.cache.slot_table.view(-1).index_copy_(0, changes[:len(cells)],
                                                       changes[len(cells):])
        rows_t = meta[len(host) + num_all:end]  # [num_logits] padded index of each kept row
        if num_fed and at == sources == list(range(num_fed)) and len(feed[0]) == num_fed:
            # (every value in order into the first ids: one kernel; a negative value, a row
            # the kernels marked invalid, is fed as id 0: its sequence fails at the commit)
            torch.clamp_min(feed[0], 0, out=meta[:num_fed])
        elif num_fed:  # (the layout's input ids are its first part)
            sources_t = meta[end + num_fed:end + 2 * num_fed]
            meta[:len(host)].index_copy_(0, meta[end:end + num_fed].clone(),
                                         feed[0].index_select(0, sources_t).clamp_min(0))
        layout = meta[:len(host)]
        if chains is not None:  # (the chains' rows of the layout, in one launch on CUDA)
            write_chains(layout, inputs.batch_size, inputs.num_new, chains.tokens, chains.base,
                         self.cache.slot_table)
        if on_device:
            rows_t = rows_t[logits_indices.to(self.device).long()]
        steady, head = True, (None, None)
        if bucket is not None:
            hidden, *head = self.graphs.replay(bucket, layout)
            steady = self.graphs.steady
        else:
            hidden = self.hidden(layout, inputs.batch_size, inputs.num_new, kv_len,
                                 query_offset, uniform, run)
        # (device_map="auto" may leave the last layer and the head on other devices than the
        # embeddings: hidden states and logits come back to the runner's device)
        size = self.hidden_size
        features = aux = None
        if keep_hidden:  # (a draft head reads the target's features)
            all_rows = meta[len(host):len(host) + num_all].to(hidden.device)
            features = hidden.index_select(0, all_rows).to(self.device)  # [num_tokens, width]
            if self.aux_layers:  # (the final states, then the aux layers' inputs)
                features, aux = features[:, :size], features[:, size:]
        # (the first rows: views; a fed-chains layout's rows increase from 0, so they are when
        # its last is theirs)
        first = not on_device and ((not len(kept) or kept[-1] == len(kept) - 1)
                                   if isinstance(kept, np.ndarray)
                                   else kept == list(range(len(kept))))
        logits, argmax = head
        if logits is not None:  # (the graph ran the head: only the float32 copy is left)
            if first:
                logits, argmax = logits[:len(kept)], argmax[:len(kept)]
            else:
                logits, argmax = logits.index_select(0, rows_t), argmax.index_select(0, rows_t)
            # (a copy, never a view: any replay of a graph sharing the pool may overwrite the
            # static output, e.g. a split step's second forward before its logits are joined)
            return (logits.to(torch.float32, copy=True), argmax, features, aux, steady)
        if self.aux_layers:
            hidden = hidden[:, :size]
        if first:
            hidden = hidden[:len(kept)]  # [num_logits, hidden_size]
        else:
            hidden = hidden.index_select(0, rows_t.to(hidden.device))
        with self._invariant_products():
            logits = self._lm_head(hidden)  # [num_logits, vocab_size]
        return logits.float().to(self.device), None, features, aux, steady

    def _graph_body(self, inputs: torch.Tensor, batch_size: int, num_new: int,
                    kv_len: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                          torch.Tensor | None]:
        """What a graph bucket runs: :meth:`hidden` (``[batch_size * num_new, width]``), and
        for a bucket of at most the runner's sequences (not under tensor parallelism) whose
        rows are one new token each, or whose logits hold at most ``HEAD_GRAPH_LOGITS`` values
        (a verification step of a few sequences), the output head on every row, ``[batch_size
        * num_new, vocab_size]`` in the model's dtype, and each row's argmax
        (:func:`samplers.greedy.argmax_tokens`: a plain greedy step's sample, and what a greedy
        drafting step verifies its chains from, :mod:`samplers.chain_accept`; the float32 cast
        the engine's logits get is exact, so the argmax is theirs). After such a replay only
        the logits' float32 copy is launched: the head, the cast and the argmax were four
        launches a step of host work on an overlapped step's critical path and of kernels on a
        drafting step's (docs/design.md, "Measured reasons behind the runner's choices"). Other
        buckets' head runs after the replay on the rows asked for (their logits would hold
        ``num_new`` times the rows, or a folded step's prompt rows, in every graph's memory)."""
        hidden = self.hidden(inputs, batch_size, num_new, kv_len)
        if batch_size > self._head_max_batch or (
                num_new != 1 and batch_size * num_new * self.vocab_size > HEAD_GRAPH_LOGITS):
            return hidden, None, None
        with self._invariant_products():
            logits = self._lm_head(hidden[:, :self.hidden_size])
        return hidden, logits, argmax_tokens(logits)

    def hidden(self, inputs: torch.Tensor, batch_size: int, num_new: int, kv_len: int,
               query_offset: int = 0, uniform: bool = False,
               run: int | None = None) -> torch.Tensor:
        """The model's last hidden states ``[batch_size * num_new, hidden_size]`` for a forward
        laid out in ``inputs`` (:mod:`engine.runner.step_inputs`), followed on each row by the
        inputs of the aux layers (:meth:`keep_aux_layers`: ``[batch_size * num_new, (1 +
        len(aux_layers)) * hidden_size]``); also the body of every CUDA graph, so a replay
        returns the aux layers' states as part of its static output. ``uniform``: pass no mask
        (see the module docstring), the queries starting at ``query_offset``; ``run``: the first
        pool row of a lone sequence whose rows are one ascending run (read as a view)."""
        padded = batch_size * num_new
        # each [batch_size, num_new]
        input_ids, positions, write_rows, cells, limits, ancestors = inputs[
            :LAYOUT_ROWS * padded].view(LAYOUT_ROWS, batch_size, num_new)
        slots_t = inputs[LAYOUT_ROWS * padded:]  # [batch_size]
        self.cache.prepare_step(slots_t, write_rows, cells.reshape(-1), kv_len, query_offset, run)
        paged = None  # (the fast path's lone run of rows is read as a view, paged or not)
        if self.paged and run is None:
            if self.deterministic:  # (one split, chain order: module docstring)
                paged = PagedStep(self.cache.slot_table, slots_t, limits, ancestors, kv_len,
                                  SplitPlan(1), chain_order=True)
            else:
                plan = split_plan(batch_size, self._heads, self._kv_heads, num_new, kv_len,
                                  self.device)
                paged = PagedStep(self.cache.slot_table, slots_t, limits, ancestors, kv_len,
                                  plan)
        mask = None if uniform or paged else self.mask(limits, ancestors, kv_len)
        # (engine/runner/attention_backend.py: no per-shape plan builds, no key/value head copies)
        with without_cudnn_attention(self.device), gqa_attention(mask is not None or num_new > 1), \
                paged_attention_step(paged), self._linears.use(padded), \
                self._invariant_products(), \
                fused_forward(bool(self.fused), projections=self._stacked):
            out = self.model.base_model(
                input_ids=input_ids, position_ids=positions, attention_mask=mask,
                use_cache=True, output_hidden_states=bool(self.aux_layers),
                **{self._cache_arg: self.cache})
        hidden = out.last_hidden_state  # [batch_size, num_new, hidden_size]
        if self.aux_layers:  # (hidden_states[i]: the input of decoder layer i)
            hidden = torch.cat([hidden] + [out.hidden_states[i] for i in self.aux_layers], -1)
        return hidden.reshape(padded, -1)  # [batch_size * num_new, (1 + aux) * hidden_size]

    def mask(self, limits: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> torch.Tensor:
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
